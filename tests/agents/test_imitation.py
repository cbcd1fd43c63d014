"""Imitation warm start (agents/imitation.py, train_agent.py --warm-start): the expert translation
reproduces a heuristic exactly where the codec can express it, hand-built expert actions, the
return arithmetic against VecNormalize's own, cloning fits, and the train command end to end."""
from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pandas as pd
import pytest

import agents  # noqa: F401  (registers the heuristics)
from agents.base import Scheduler, make_scheduler
from agents.imitation import (Demonstrations, HeuristicExpert, behaviour_clone, collect, collect_on_policy,
                              concat, discounted_returns, episode_seed_base, expert_action, play_expert, policy_actor,
                              vecnormalize_reward_scale, work_conserving_action)
from agents.rl_env import make_env_fn
from data_helpers import require_data
from jigsaw_env.actions import RoundBuilder
from jigsaw_env.env import JigsawClusterEnv
from jigsaw_env.simulator import Simulator
from jigsaw_env.state import Decision, JobDecision


def _jobs(rows):
    return pd.DataFrame(rows, columns=["job_id", "arrival_s", "num_gpus", "model", "batch_size", "iterations"])


def _rounds_and_differing(env, expert) -> tuple[int, int]:
    """Play ``expert`` on ``env`` (reset) to the episode's end: the rounds, and how many of their
    decisions differ from the heuristic's (``expert.target``)."""
    rounds = differing = 0
    while True:
        a = expert.act(env)
        if a == env.codec.advance:
            rounds += 1
            differing += dict(env.builder.ledger.decision) != dict(expert.target)
        _, _, term, trunc, _ = env.step(a)
        if term or trunc:
            return rounds, differing


def test_tiresias_expert_in_the_env_reproduces_tiresias_in_the_simulator():
    """Tiresias places jobs exclusively and consolidated, which the codec expresses exactly: the
    translated expert must give the very same JCTs as the heuristic run by the simulator."""
    from traces import load_trace

    env = JigsawClusterEnv(gpus=16, window_k=8)
    jobs = load_trace("synthetic:jobs=24,load=1.2,seed=3", cluster_gpus=16, max_gpus=16).jobs
    sim_env = play_expert(env, HeuristicExpert("tiresias"), jobs)
    ref = Simulator(env.cluster, jobs, env.sim_config)
    ref.run(make_scheduler("tiresias"))
    a, b = sim_env.metrics(), ref.metrics()
    assert a["avg_jct_s"] == pytest.approx(b["avg_jct_s"], rel=1e-12)
    assert a["makespan_s"] == pytest.approx(b["makespan_s"], rel=1e-12)


@pytest.mark.parametrize("seed", [3, 6])
def test_with_requeue_translated_tiresias_makes_tiresias_decision_every_round(seed):
    """Synthetic episodes on 16 GPUs with a window of 4 (30 jobs): on seed 3, Tiresias preempts
    two running jobs that sit behind the window while the window's jobs stay as they are, so the
    expert first decides those (``keep``: the window slides) to reach and pause them, then places
    the new job exclusively; seed 6 likewise. Every round's decision is Tiresias's."""
    env = JigsawClusterEnv(gpus=16, window_k=4, pause="requeue", trace="synthetic", max_jobs=30)
    expert = HeuristicExpert("tiresias")
    env.reset(seed=seed)
    rounds, differing = _rounds_and_differing(env, expert)
    assert rounds > 100 and differing == 0


def test_expert_lands_exact_placements_first_then_pauses_then_follows_its_order():
    env = JigsawClusterEnv(gpus=8, window_k=4, spb_levels=1)
    jobs = _jobs([(0, 0.0, 4, "resnet18", 64, 10_000), (1, 0.0, 4, "resnet18", 64, 10_000),
                  (2, 0.0, 8, "resnet18", 64, 10_000)])
    env.reset(seed=0, options={"jobs": jobs})
    codec = env.codec
    b = env.builder
    slot = {jid: s for s, jid in enumerate(b.window)}
    # nothing runs yet: a target of jobs 1 then 0 (same size). An action that lands exactly where
    # the heuristic puts a job comes first, in either order: with GPUs 0-7 free, consolidated gives
    # job 0 its GPUs 0-3, not job 1 its 4-7
    target = Decision({1: JobDecision((4, 5, 6, 7)), 0: JobDecision((0, 1, 2, 3))})
    for order in ("heuristic", "slot"):
        a = expert_action(b, target, 8, order=order)
        assert codec.decode(a)[:3] == ("run", slot[0], "consolidated")
    # no option gives either job its GPUs: the closest placement of the first job in the order,
    # job 1 in the heuristic's order, job 0 in the default canonical one (larger first, then by
    # window slot)
    odd = Decision({1: JobDecision((2, 3, 4, 5)), 0: JobDecision((0, 1, 6, 7))})
    assert slot[0] < slot[1]
    assert codec.decode(expert_action(b, odd, 8, order="heuristic"))[:2] == ("run", slot[1])
    assert codec.decode(expert_action(b, odd, 8))[:2] == ("run", slot[0])
    b.apply(a)
    a = expert_action(b, target, 8)
    assert codec.decode(a)[:3] == ("run", slot[1], "consolidated")
    b.apply(a)
    assert expert_action(b, target, 8) == codec.advance
    # a larger job goes first in the canonical order whatever its slot
    target8 = Decision({0: JobDecision((0, 1, 2, 3)), 2: JobDecision(tuple(range(8)))})
    env2 = JigsawClusterEnv(gpus=16, window_k=4, spb_levels=1)
    env2.reset(seed=0, options={"jobs": jobs})
    b2 = env2.builder
    a = expert_action(b2, target8, 8)
    assert codec.decode(a)[:2] == ("run", b2.window.index(2))
    with pytest.raises(ValueError, match="order must be"):
        expert_action(b2, target8, 8, order="random")
    env.step(codec.advance)
    # next round: the target keeps job 0 as it is and drops job 1: one pause, then advance
    b = env.builder
    slot = {jid: s for s, jid in enumerate(b.window)}
    running = env.sim.state.current_decision()
    target = Decision({0: running[0]})
    a = expert_action(b, target, 8)
    assert codec.decode(a)[:2] == ("pause", slot[1])
    b.apply(a)
    assert expert_action(b, target, 8) == codec.advance  # job 0 runs as wanted: no action needed


def test_expert_pairs_on_one_host_and_defers_a_move_that_lands_only_later():
    """Four 4-GPU jobs run alone (0-3, 4-7, 8-11, 12-15); the target makes job 1 the guest of job 2
    and job 3 the guest of job 0. ``paired`` picks among equal hosts the lowest id, so job 1 (the
    first mover) would land on job 0: it is deferred, job 3 goes to job 0, and then job 1 lands on
    job 2, the only host left. Without the deferral job 1 would have stayed where it was."""
    env = JigsawClusterEnv(gpus=16, window_k=8, spb_levels=1)
    jobs = _jobs([(j, 0.0, 4, "resnet18", 64, 100_000) for j in range(4)])
    env.reset(seed=0, options={"jobs": jobs})
    codec = env.codec
    for j in range(4):
        env.step(codec.encode(env.builder.window.index(j), "consolidated"))
    env.step(codec.advance)
    cur = env.sim.state.current_decision()
    assert [cur[j].gpus for j in range(4)] == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15)]
    b = env.builder
    target = Decision({0: cur[0], 2: cur[2], 1: JobDecision((11, 10, 9, 8)), 3: JobDecision((3, 2, 1, 0))})
    assert b.window.index(1) < b.window.index(3)
    a = expert_action(b, target, 8)
    assert codec.decode(a)[:3] == ("run", b.window.index(3), "paired")
    env.step(a)
    assert b.ledger.decision[3].gpus == (3, 2, 1, 0)
    a = expert_action(b, target, 8)
    assert codec.decode(a)[:3] == ("run", b.window.index(1), "paired")
    env.step(a)
    assert b.ledger.decision[1].gpus == (11, 10, 9, 8)
    assert expert_action(b, target, 8) == codec.advance


def test_expert_actions_are_always_feasible_and_episodes_finish():
    env = JigsawClusterEnv(gpus=16, window_k=6, trace="synthetic", max_jobs=20, load=1.5)
    for name in ("jigsaw", "gandiva+spb", "srtf"):
        ex = HeuristicExpert(name)
        env.reset(seed=1)
        n = 0
        while True:
            a = ex.act(env)
            assert env.action_masks()[a]
            _, _, term, trunc, _ = env.step(a)
            n += 1
            if term or trunc:
                break
        assert term and env.sim.num_finished == 20, name


def test_discounted_returns_restart_after_each_episode():
    r = np.array([1.0, 1.0, 1.0, 2.0, 2.0])
    d = np.array([False, False, True, False, True])
    assert discounted_returns(r, d, 0.5).tolist() == [1.75, 1.5, 1.0, 3.0, 2.0]


class _Scripted(gym.Env):
    """Pays a fixed reward sequence, episode ends where ``dones`` says."""

    observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, rewards, dones):
        self.r, self.d, self.t = rewards, dones, 0

    def reset(self, *, seed=None, options=None):
        return np.zeros(1, np.float32), {}

    def step(self, action):
        r, d = self.r[self.t], self.d[self.t]
        self.t += 1
        return np.zeros(1, np.float32), float(r), bool(d), False, {}


def test_reward_scale_matches_what_vecnormalize_computes():
    from stable_baselines3.common.running_mean_std import RunningMeanStd
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    rng = np.random.default_rng(0)
    rewards = -rng.exponential(2.0, 40)
    dones = np.zeros(40, bool)
    dones[[9, 25, 39]] = True
    vn = VecNormalize(DummyVecEnv([lambda: _Scripted(rewards, dones)]), gamma=0.9)
    vn.reset()
    for _ in range(40):
        vn.step(np.array([0]))
    ours = RunningMeanStd(shape=())
    scale = vecnormalize_reward_scale(rewards, dones, 0.9, ours)
    # DummyVecEnv keeps rewards in a float32 buffer; ours stay float64
    assert ours.var == pytest.approx(float(vn.ret_rms.var), rel=1e-6)
    assert ours.mean == pytest.approx(float(vn.ret_rms.mean), rel=1e-6)
    assert scale == pytest.approx(float(np.sqrt(vn.ret_rms.var + 1e-8)), rel=1e-6)


def _maskable(env):
    import torch
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    torch.set_num_threads(1)
    venv = VecNormalize(DummyVecEnv([lambda: env]), gamma=0.99)
    return MaskablePPO("MlpPolicy", venv, seed=0, device="cpu", n_steps=64, batch_size=32), venv


@pytest.fixture(scope="module")
def cloned():
    """A policy cloned from Tiresias on small synthetic episodes, then one DAgger round."""
    def make():
        return JigsawClusterEnv(gpus=8, window_k=4, spb_levels=1, trace="synthetic", max_jobs=10, load=1.0)

    demos = collect(make, HeuristicExpert("tiresias"), episodes=6, seed=0)
    model, venv = _maskable(make())
    hist = behaviour_clone(model, demos, venv=venv, epochs=40, batch_size=128, learning_rate=3e-3, seed=0)
    return make, demos, model, venv, hist


@pytest.mark.slow
def test_cloning_fits_the_expert_and_sets_the_statistics(cloned):
    make, demos, model, venv, hist = cloned
    assert len(demos) == sum(e["steps"] for e in demos.episodes) and demos.dones.sum() == 6
    assert hist[-1]["nll"] < hist[0]["nll"]
    assert hist[-1]["accuracy"] >= 0.95
    # VecNormalize's observation statistics are those of the demonstrations
    assert np.allclose(venv.obs_rms.mean, demos.obs.astype(np.float64).mean(0), atol=1e-6)
    # the reported accuracy is the argmax agreement recomputed through the acting path
    act = policy_actor(model, venv)
    agree = np.mean([act(o, m) == a for o, m, a in zip(demos.obs, demos.masks, demos.actions)])
    assert agree == pytest.approx(hist[-1]["accuracy"], abs=1e-9)


def test_observation_statistics_and_normalization_in_chunks_equal_the_whole_array_at_once():
    """The chunked scan (bounded float64 temporaries) gives what one pass over the whole array
    gives: the statistics up to rounding, the normalized observations exactly (the same
    element-wise float64 arithmetic, rounded to float32 once); chunks of 3 rows over 10 rows."""
    from stable_baselines3.common.running_mean_std import RunningMeanStd

    from agents.imitation import normalized_observations, observation_statistics

    rng = np.random.default_rng(0)
    obs = (rng.normal(size=(10, 4)) * [1.0, 10.0, 0.1, 1e3]).astype(np.float32)
    whole = RunningMeanStd(shape=(4,))
    whole.update(obs.astype(np.float64))
    chunked = observation_statistics(obs, RunningMeanStd(shape=(4,)), chunk=3)
    assert np.allclose(chunked.mean, whole.mean, rtol=1e-12, atol=0)
    assert np.allclose(chunked.var, whole.var, rtol=1e-9, atol=0)
    assert chunked.count == pytest.approx(whole.count)
    expect = np.clip((obs.astype(np.float64) - whole.mean) / np.sqrt(whole.var + 1e-8), -1.5, 1.5).astype(np.float32)
    got = normalized_observations(obs, whole.mean, whole.var, 1e-8, 1.5, chunk=3)
    assert got.dtype == np.float32 and np.array_equal(got, expect)
    assert (np.abs(got) == 1.5).any()  # the clip is exercised


def test_demonstrations_record_the_widest_undecided_job(cloned):
    make, demos, *_ = cloned
    env = make()
    # replay the first episode with the recorded actions: each step's width is the widest job in
    # the window not yet decided in that state
    env.reset(seed=0)
    for a, w in zip(demos.actions[: demos.episodes[0]["steps"]], demos.widths):
        b = env.builder
        undecided = [env.sim.state.jobs[j].num_gpus for j in b.window if j not in b.acted]
        assert w == max(undecided, default=0)
        kind, slot, *_ = env.codec.decode(int(a))
        if kind != "advance":
            assert w >= env.sim.state.jobs[b.window[slot]].num_gpus
        env.step(int(a))
    assert set(np.unique(demos.widths[demos.widths > 0])) <= {1, 2, 4, 8}


def _fit_probs(make, demos, power: float) -> np.ndarray:
    import torch

    model, _ = _maskable(make())
    behaviour_clone(model, demos, epochs=300, batch_size=len(demos), learning_rate=1e-2, seed=0, width_power=power)
    obs, masks = demos.obs[:1], demos.masks[:1]
    with torch.no_grad():
        dist = model.policy.get_distribution(torch.as_tensor(obs))
        dist.apply_masking(masks)
        return dist.distribution.probs[0, :2].numpy()


@pytest.mark.slow
def test_width_power_weighs_states_not_actions(cloned):
    """Known answers of the weighted maximum likelihood on one observation (100 steps, actions 0
    and 1, 50 each): labels of one state (the same widest job, 4 GPUs) keep their 0.5/0.5 whatever
    the power; labels from two states the observation cannot tell apart (widest job 1 GPU with
    action 0, 4 GPUs with action 1) give pi(1) = 4 x 50 / (4 x 50 + 50) = 0.8 at power 1 and 0.5
    at power 0: the wide-job state has more say."""
    make, *_ = cloned
    n_act = make().codec.n
    obs = np.zeros((100, make().observation_space.shape[0]), dtype=np.float32)
    masks = np.zeros((100, n_act), dtype=bool)
    masks[:, :2] = True
    actions = np.repeat([0, 1], 50)
    dones = np.arange(100) % 10 == 9
    one_state = Demonstrations(obs, masks, actions, np.zeros(100), dones, np.full(100, 4))
    two_states = Demonstrations(obs, masks, actions, np.zeros(100), dones, np.repeat([1, 4], 50))
    assert _fit_probs(make, one_state, 1.0)[1] == pytest.approx(0.5, abs=0.01)
    assert _fit_probs(make, two_states, 0.0)[1] == pytest.approx(0.5, abs=0.01)
    assert _fit_probs(make, two_states, 1.0)[1] == pytest.approx(0.8, abs=0.01)
    model, _ = _maskable(make())
    with pytest.raises(ValueError, match="width_power"):
        behaviour_clone(model, two_states, epochs=1, width_power=-1.0)


def test_dagger_labels_the_learners_states_with_the_expert(cloned):
    make, demos, model, venv, _ = cloned
    ex = HeuristicExpert("tiresias")
    new = collect_on_policy(make, ex, policy_actor(model, venv), max_wall_s=0.5, seed=50)
    assert len(new) > 0 and new.dones[-1]
    # every label is feasible in the state it labels
    assert all(m[a] for m, a in zip(new.masks, new.actions))
    both = concat([demos, new])
    assert len(both) == len(demos) + len(new) and both.dones.sum() == demos.dones.sum() + new.dones.sum()


def test_each_training_seed_and_stage_plays_episodes_of_its_own():
    """Stages play seeds base, base + 1, ...: for 4 training seeds and 6 stages (recording and 5
    DAgger rounds) the first 10,000 episode seeds of any two never meet; the bases are 32-bit
    and the same on every call."""
    bases = sorted(episode_seed_base(run, stage) for run in range(4) for stage in range(6))
    assert len(bases) == 24 and all(b2 - b1 >= 10_000 for b1, b2 in zip(bases, bases[1:]))
    assert all(0 <= b < 2**32 for b in bases) and episode_seed_base(1, 2) == episode_seed_base(1, 2)
    with pytest.raises(ValueError, match="run_seed and stage must be >= 0, got -1 and 0"):
        episode_seed_base(-1, 0)


@pytest.mark.slow
def test_train_with_warm_start_end_to_end(tmp_path, monkeypatch):
    import torch

    import train_agent
    from jigsaw_env.cli import main
    from agents.rl import LearnedAgent

    threads = {"fit": [], "play": []}  # torch threads seen by each fit and each recording / DAgger play
    play_seeds = []  # the first episode seed of the recording and of each DAgger round

    def spy(name, key):  # the warm start's steps, where train_agent calls them
        fn = getattr(train_agent, name)

        def wrapped(*a, **kw):
            threads[key].append(torch.get_num_threads())
            if key == "play":
                play_seeds.append(kw["seed"])
            return fn(*a, **kw)
        monkeypatch.setattr(train_agent, name, wrapped)

    spy("behaviour_clone", "fit")
    spy("collect", "play")
    spy("collect_on_policy", "play")

    run = tmp_path / "run"
    rc = main(["train", "--trace", "synthetic", "--gpus", "8", "--max-jobs", "6", "--window-k", "4",
               "--spb-levels", "1", "--timesteps", "256", "--n-steps", "128", "--batch-size", "64", "--n-envs", "1",
               "--vec", "dummy", "--eval-freq", "100000", "--checkpoint-freq", "100000", "--no-progress",
               "--no-tensorboard", "--warm-start", "tiresias", "--warm-start-s", "1", "--bc-epochs", "2",
               "--dagger-rounds", "1", "--dagger-s", "0.5", "--dagger-epochs", "1", "--bc-threads", "2",
               "--seed", "5", "--run-dir", str(run)])
    assert rc == 0
    assert play_seeds == [episode_seed_base(5, 0), episode_seed_base(5, 1)]
    # the fits get --bc-threads; recording, DAgger play and RL afterwards keep train_agent's one thread
    assert threads == {"fit": [2, 2], "play": [1, 1]}
    assert torch.get_num_threads() == 1
    cfg = json.loads((run / "config.json").read_text())
    ws = cfg["warm_start"]
    assert ws["expert"] == "tiresias" and ws["steps"] > 0 and len(ws["dagger"]) == 1 and ws["threads"] == 2
    assert ws["total_steps"] == ws["steps"] + ws["dagger"][0]["steps"]
    assert ws["first_episode_seed"] == episode_seed_base(5, 0) and ws["dagger"][0]["first_episode_seed"] == play_seeds[1]
    assert len(ws["dagger"][0]["policy_avg_jct_s"]) == ws["dagger"][0]["episodes"]
    assert cfg["train_wall_s"] >= ws["wall_s"]  # the warm start counts against --max-wall-s
    csv = pd.read_csv(run / "warm_start.csv")
    assert csv["stage"].tolist() == ["clone", "clone", "dagger1"]
    for d in (run, run / "warm_start"):
        agent = LearnedAgent(d)
        env = JigsawClusterEnv(gpus=8, window_k=4, spb_levels=1, trace="synthetic", max_jobs=6)
        obs, _ = env.reset(seed=0)
        mask = env.action_masks()
        assert mask[agent.act(obs, mask)]


@pytest.mark.parametrize(("pace", "seed"), [("lockstep", 0), ("lockstep", 3), ("lockstep", 9), ("lockstep", 23),
                                             ("free", 0), ("free", 3), ("free", 9), ("free", 14), ("free", 19),
                                             ("free", 23)])
def test_jigsaw_as_env_actions_makes_jigsaws_decisions(pace, seed):
    """Twelve jobs of 1-8 GPUs (four models) on 16 GPUs: Jigsaw pairs 2-, 4- and 8-GPU guests on
    its hosts, each on the worker order its search scores best. The translated expert expresses
    every one of its round decisions with the env's actions (the pair-with-host options name the
    host), so the env's episode makes the very decisions of the simulator's Jigsaw run, round for
    round, and ends with the same JCTs. Seeds 9 (both paces) and 14 (free) pair a new job with a
    running one of the same width on the running one's GPUs: Jigsaw keeps the running guest's worker
    order (agents.jigsaw.guest_keeps_its_order), which the env builds as that job kept and the new
    one paired with it. Seed 19 (free) gives a new 8-GPU job the GPUs of a preempted pair and
    pairs a running 4-GPU job onto it. On seeds 23 (both paces), 0 and 3 (free) Jigsaw moves a
    running job onto GPUs it will share with another while a job's new GPUs include some the moving
    job leaves: no order of placements alone builds that, so the expert pauses the moving job
    first and places it again once it is back in the window (``exact_plan`` searches the order):
    the env requeues paused jobs (``pause="requeue"``)."""
    import random

    rng = random.Random(seed)
    rows = [(j, rng.uniform(0, 3600), rng.choice([1, 2, 4, 4, 8]), rng.choice(["resnet50", "vgg16", "resnet18",
                                                                              "bert_base"]),
             32, rng.choice([2000, 5000, 20000])) for j in range(12)]
    jobs = _jobs(rows)
    env = JigsawClusterEnv(gpus=16, window_k=8, pace=pace, pause="requeue")
    want: list[dict] = []
    jigsaw = make_scheduler("jigsaw")

    def recorded(state):
        d = jigsaw.schedule(state)
        want.append(dict(d))
        return d

    ref = Simulator(env.cluster, jobs, env.sim_config)
    ref.run(recorded)
    expert = HeuristicExpert("jigsaw")
    got: list[dict] = []
    wide_pairs = 0
    env.reset(seed=0, options={"jobs": jobs})
    while True:
        a = expert.act(env)
        kind, slot, option, _, _ = env.codec.decode(a)
        if kind == "advance":
            got.append(dict(env.builder.ledger.decision))
        elif kind == "run" and option.startswith("host:") and env.sim.state.jobs[env.builder.window[slot]].num_gpus > 1:
            wide_pairs += 1
        _, _, term, trunc, _ = env.step(a)
        if term or trunc:
            break
    assert wide_pairs >= 3
    assert len(got) == len(want) and got == want
    assert env.sim.metrics()["avg_jct_s"] == ref.metrics()["avg_jct_s"]
    assert env.sim.metrics()["makespan_s"] == ref.metrics()["makespan_s"]


def test_translated_jigsaw_makes_jigsaws_decisions_on_the_crowded_study_window():
    """Held-out window 2 of ``bench.ppo_study`` (80 Philly jobs on 64 GPUs, load 1.0), the one with
    two 32-GPU jobs: in one round Jigsaw places a new 32-GPU job on GPUs 0-31 around a running
    8-GPU job and moves another running 8-GPU job from GPUs 16-23 to 32-39, as the guest of a
    second new 32-GPU job. The first placement needs GPUs 16-23 empty, and ``consolidated`` puts
    the moving job on 32-39 only once GPUs 24-31 are taken, so the expert pauses it, places the
    new job, then places it again (``pause="requeue"``). Every round's decision is Jigsaw's, and so
    is the mean JCT."""
    require_data("philly/philly.csv")
    from bench.ppo_study import _default_trace, build_windows, heldout_split

    _, held = heldout_split(_default_trace(), 64, 0.2)
    jobs, info = build_windows(held, 80, 12, 64, 1.0)[2]
    assert info["window"] == 2 and info["max_gpus"] == 32
    env = JigsawClusterEnv(gpus=64, window_k=16, pause="requeue")
    expert = HeuristicExpert("jigsaw")
    env.reset(seed=0, options={"jobs": jobs})
    rounds, differing = _rounds_and_differing(env, expert)
    assert rounds > 2000 and differing == 0
    ref = Simulator(env.cluster, jobs, env.sim_config)
    ref.run(make_scheduler("jigsaw"))
    assert env.sim.metrics()["avg_jct_s"] == ref.metrics()["avg_jct_s"]


class _IdleScheduler(Scheduler):
    """A heuristic whose decision runs nothing (its translation is always advance)."""

    name = "idle"

    def schedule(self, state):
        return Decision()


def test_under_work_conserving_masks_the_expert_never_labels_a_masked_advance():
    jobs = _jobs([(0, 0.0, 4, "resnet18", 64, 2_000), (1, 0.0, 2, "resnet18", 64, 2_000)])
    # default masks: the idle heuristic's translation advances with both jobs waiting
    env = JigsawClusterEnv(gpus=8, window_k=4, spb_levels=1)
    env.reset(seed=0, options={"jobs": jobs})
    assert HeuristicExpert(_IdleScheduler()).act(env) == env.codec.advance
    # work-conserving masks: advance is masked, so the expert runs the window's first job
    env = JigsawClusterEnv(gpus=8, window_k=4, spb_levels=1, work_conserving=True, invalid_action="raise")
    env.reset(seed=0, options={"jobs": jobs})
    a = HeuristicExpert(_IdleScheduler()).act(env)
    assert env.action_masks()[a] and env.codec.decode(a)[:2] == ("run", 0)
    # a target job it cannot land exactly still goes before the window's first job: job 1 at
    # GPUs 6-7, which no option gives it on the empty cluster, lands on the closest placement
    b = env.builder
    target = Decision({1: JobDecision((6, 7))})
    a = work_conserving_action(b, target, env.action_masks(), 8)
    assert env.codec.decode(a)[:2] == ("run", b.window.index(1))
    # a whole episode: every label is feasible, and every job finishes
    sim = play_expert(env, HeuristicExpert(_IdleScheduler()), jobs)
    assert sim.num_finished == 2


@pytest.mark.slow
def test_in_a_las_window_translated_jigsaw_reaches_the_jobs_jigsaw_starts():
    """The training split's episode of seed 318 (a 16-GPU cluster; docs/results.md, "Where the
    clone learns to idle"): Jigsaw swaps two running 8-GPU jobs for two waiting ones that sit
    behind 16 one-GPU jobs with less attained service. In a window ordered by attained service
    its translation cannot start them and takes over three times Jigsaw's mean JCT; in a window
    ordered by 2D-LAS rank (Jigsaw's own order) the two jobs are in view, and it lands within 1 %
    of Jigsaw."""
    require_data("philly/philly.csv")
    jct = {}
    for order in ("attained", "las"):
        env = make_env_fn({"trace": "philly", "gpus": 64, "max_jobs": 80, "load": 1.0, "work_conserving": True,
                           "window_order": order}, split="train", rank=0, seed=0, holdout=0.2, val=0.1,
                          loads=[1.0], cluster_sizes=[16], monitor=False)()
        u = env.unwrapped
        env.reset(seed=318)
        expert = HeuristicExpert("jigsaw")
        while True:
            _, _, term, trunc, _ = env.step(expert.act(u))
            if term or trunc:
                break
        assert term and u.cluster.num_gpus == 16
        jct[order] = u.sim.metrics()["avg_jct_s"]
        jobs = u.sim.jobs_frame()[["job_id", "arrival_s", "num_gpus", "model", "batch_size", "iterations"]]
        ref = Simulator(u.cluster, jobs, u.sim_config)
        ref.run(make_scheduler("jigsaw"))
        jct["jigsaw"] = ref.metrics()["avg_jct_s"]
    assert jct["attained"] > 3 * jct["jigsaw"]
    assert jct["las"] == pytest.approx(jct["jigsaw"], rel=0.01)
