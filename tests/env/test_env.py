"""The Gymnasium environment: API checks, exact masks, and invariants under random masked play."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import pandas as pd
import pytest

import jigsaw_env
from jigsaw_env.actions import InvalidAction, RoundBuilder
from jigsaw_env.env import JigsawClusterEnv
from jigsaw_env.state import JobStatus
from train_helpers import registered_toy_tables

# envA: 4 groups, full peak 5 + 4*0.5 = 7 GiB (two fit on a 16 GiB GPU)
# envB: 6 groups, full peak 6 + 6*1 = 12 GiB; a static light worker keeps fewer activations
toy_tables = registered_toy_tables("envA", "envB")


def _jobs(n: int = 12, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "job_id": np.arange(n),
        "arrival_s": np.sort(rng.uniform(0, 600, n)).round(1),
        "num_gpus": rng.choice([1, 1, 2, 4], n),
        "model": rng.choice(["envA", "envB"], n),
        "batch_size": 8,
        "iterations": rng.uniform(300, 3000, n).round(),
    })


def make_env(**kw) -> JigsawClusterEnv:
    cfg = dict(gpus=8, gpus_per_node=4, trace=_jobs(), max_jobs=12, window_k=6, round_s=60.0, restart_s=20.0)
    cfg.update(kw)
    return JigsawClusterEnv(**cfg)


def test_gymnasium_and_sb3_check_env():
    from gymnasium.utils.env_checker import check_env as gym_check
    from stable_baselines3.common.env_checker import check_env as sb3_check

    gym_check(make_env(), skip_render_check=False)
    env = gym.make("jigsaw_env:JigsawCluster-v0", gpus=8, gpus_per_node=4, trace=_jobs(), max_jobs=12, window_k=6)
    gym_check(env.unwrapped)
    gym_check(env)
    sb3_check(make_env(), warn=True)


def test_registration_is_idempotent(caplog):
    # a second registration would replace the spec (gymnasium only logs "Overriding environment")
    import importlib
    import logging
    import warnings

    spec = gym.registry["JigsawCluster-v0"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with caplog.at_level(logging.DEBUG):
            importlib.reload(jigsaw_env)
            importlib.reload(jigsaw_env)
    assert gym.registry["JigsawCluster-v0"] is spec
    assert spec.entry_point == "jigsaw_env.env:JigsawClusterEnv"
    assert not [r for r in caplog.records if "Overriding" in r.getMessage()]


def test_observation_shape_does_not_depend_on_cluster_size():
    small = make_env(gpus=4, gpus_per_node=4)
    big = make_env(gpus=64, gpus_per_node=8)
    o1, _ = small.reset(seed=0)
    o2, _ = big.reset(seed=0)
    assert o1.shape == o2.shape == small.observation_space.shape
    assert small.action_space.n == big.action_space.n


def _masked_random_episode(env: JigsawClusterEnv, rng: np.random.Generator, stats: dict, max_steps: int) -> int:
    env.reset(seed=int(rng.integers(1 << 30)))
    steps = 0
    cap = env.cluster.memory_of(0)
    while steps < max_steps:
        mask = env.action_masks()
        assert mask[env.codec.advance]
        a = int(rng.choice(np.flatnonzero(mask)))
        kind = env.codec.decode(a)
        if kind[0] == "run":
            stats["levels"].add((kind[3], kind[4].value if kind[3] else "rotating"))
            stats["options"].add(kind[2])
        if a == env.codec.advance:
            led = env.builder.ledger
            # invariants of the decision about to be applied, at each process's peak
            assert np.all(led.mem <= led.capacity + 1e-6), "GPU memory exceeded"
            assert np.all(led.workers <= env.sim.state.max_workers_per_gpu)
            stats["shared_rounds"] += int((led.workers > 1).any())
        _, _, term, trunc, info = env.step(a)
        steps += 1
        sim = env.sim
        # no GPU computes more than the time that has passed since the first arrival
        elapsed = sim.state.time_s - sim.first_arrival_s
        assert np.all(sim.busy_per_gpu() <= elapsed + 1e-6)
        if term or trunc:
            assert term, "random play should finish the episode, not truncate"
            jf = sim.jobs_frame()
            assert (jf["status"] == JobStatus.DONE.value).all()
            assert np.allclose(jf["progress"], jf["iterations"])
            stats["preemptions"] += int(jf["preemptions"].sum())
            stats["episodes"] += 1
            stats["metrics"].append(info["episode_metrics"])
            break
    return steps


@pytest.mark.slow
def test_random_masked_play_invariants_and_coverage():
    stats = {"levels": set(), "options": set(), "shared_rounds": 0, "preemptions": 0, "episodes": 0, "metrics": []}
    env = make_env()
    rng = np.random.default_rng(7)
    total = 0
    while total < 10_000:
        total += _masked_random_episode(env, rng, stats, 10_000)
    assert stats["episodes"] >= 3
    # the random play really exercises co-location, preemption and every SPB level and pattern
    combos = {(0, "rotating")} | {(l, p) for l in (1, 2, 3) for p in ("rotating", "static")}
    assert stats["levels"] == combos, stats["levels"]
    menu = {"keep", "consolidated", "spread", "packed", "paired"}
    assert menu <= stats["options"] and stats["options"] - menu, stats["options"]  # and pair-with-host options
    assert all(o.startswith("host:") for o in stats["options"] - menu)
    assert stats["shared_rounds"] > 10
    assert stats["preemptions"] > 10


def test_same_seed_same_results():
    def play(seed):
        env = make_env()
        rng = np.random.default_rng(seed)
        stats = {"levels": set(), "options": set(), "shared_rounds": 0, "preemptions": 0, "episodes": 0, "metrics": []}
        env.reset(seed=seed)
        _masked_random_episode(env, rng, stats, 10_000)
        return env.sim.jobs_frame()

    pd.testing.assert_frame_equal(play(3), play(3))


def test_round_log_is_kept_only_when_asked_and_changes_nothing_else():
    # log_rounds=True keeps the simulator's per-job-per-round log; the default keeps none of it, and
    # the episode (observations, rewards, jobs, per-round cluster log) is the same either way
    def play(**kw):
        env = make_env(**kw)
        obs, _ = env.reset(seed=5)
        rng = np.random.default_rng(5)
        seen = [obs]
        rewards = []
        while True:
            mask = env.action_masks()
            obs, r, term, trunc, _ = env.step(int(rng.choice(np.flatnonzero(mask))))
            seen.append(obs)
            rewards.append(r)
            if term or trunc:
                return env.sim, np.array(seen), rewards

    quiet, obs_q, rew_q = play()
    logged, obs_l, rew_l = play(log_rounds=True)
    assert len(quiet.rounds_frame()) == 0
    rf = logged.rounds_frame()
    assert len(rf) > 0 and set(rf["job_id"]) == set(logged.jobs_frame()["job_id"])
    # every job's logged progress adds up to its iterations (all finished)
    jf = logged.jobs_frame().set_index("job_id")
    np.testing.assert_allclose(rf.groupby("job_id")["progress"].sum().sort_index(), jf["iterations"].sort_index())
    np.testing.assert_array_equal(obs_q, obs_l)
    assert rew_q == rew_l
    pd.testing.assert_frame_equal(quiet.jobs_frame(), logged.jobs_frame())
    pd.testing.assert_frame_equal(quiet.cluster_frame(), logged.cluster_frame())


@pytest.mark.slow
def test_masks_are_exact_in_both_directions():
    env = make_env(invalid_action="raise")
    rng = np.random.default_rng(1)
    env.reset(seed=1)
    checked_states = 0
    while checked_states < 25 and not env.sim.done:
        mask = env.action_masks()
        # a rejected action changes nothing (asserted after each), so one copy serves every one
        rejecting = env.copy()
        before = rejecting.builder.ledger.decision.copy()
        for a in range(env.action_space.n):
            if a == env.codec.advance:
                continue
            if mask[a]:
                env.copy().step(a)  # must apply cleanly
            else:
                with pytest.raises(InvalidAction):
                    rejecting.step(a)
                assert rejecting.builder.ledger.decision == before
        np.testing.assert_array_equal(rejecting.action_masks(), mask)  # nor what the agent sees
        checked_states += 1
        env.step(int(rng.choice(np.flatnonzero(mask))))
    assert checked_states == 25


def test_episode_return_is_minus_total_jct():
    env = make_env(reward_scale=1.0)
    env.reset(seed=0)
    ret = 0.0
    rng = np.random.default_rng(0)
    while True:
        mask = env.action_masks()
        _, r, term, trunc, info = env.step(int(rng.choice(np.flatnonzero(mask))))
        ret += r
        if term or trunc:
            break
    jct_sum = env.sim.jobs_frame()["jct_s"].sum()
    assert ret == pytest.approx(-jct_sum, rel=1e-6)


def test_ansi_render_and_bad_config():
    env = make_env(render_mode="ansi")
    env.reset(seed=0)
    text = env.render()
    assert "node 0" in text and "t=" in text
    with pytest.raises(ValueError, match="reward"):
        make_env(reward="speed")
    with pytest.raises(ValueError, match="gpus"):
        make_env(gpus=0)
    with pytest.raises(ValueError, match="render_mode"):
        make_env(render_mode="human")
    with pytest.raises(ValueError, match=r"pause must be one of \['leave', 'requeue'\], got 'drop'"):
        make_env(pause="drop")
    with pytest.raises(ValueError, match=r"spill must be True or False, got 'yes'"):
        make_env(spill="yes")


def test_window_slides_so_one_round_starts_a_whole_burst():
    """K=2 and six 1-GPU jobs that all arrive at t=0 on 8 free GPUs: the window slides as jobs are
    decided, so six "run" steps in one round start all six (without sliding only two could)."""
    burst = pd.DataFrame({"job_id": np.arange(6), "arrival_s": 0.0, "num_gpus": 1, "model": "envA",
                          "batch_size": 8, "iterations": 1000.0})
    env = make_env(trace=burst, max_jobs=6, window_k=2)
    env.reset(seed=0)
    if not env.builder.window:      # arrivals are admitted at the end of the first round
        env.step(env.codec.advance)
    b = env.builder
    assert len(b.window) == 2 and b.step_cap == 2 * 2 + 2 + 4
    seen = []
    for _ in range(6):
        slot = next(i for i, j in enumerate(b.window) if j not in b.acted)
        assert slot == (0 if len(seen) < 5 else 1)  # slot 0 shows the next job until the queue is empty
        seen.append(b.window[slot])
        a = env.codec.encode(slot, "consolidated", 0)
        assert env.action_masks()[a]
        _, _, _, _, info = env.step(a)
        assert "round" not in info  # still the same round
    assert seen == [0, 2, 3, 4, 5, 1]               # arrival order, slot 1 kept its job
    assert set(b.acted) == set(range(6))
    assert not env.action_masks()[: env.codec.advance].any()  # nothing left to decide: only advance
    env.step(env.codec.advance)
    assert len(env.sim.state.running()) == 6


@pytest.mark.parametrize("pause", ["leave", "requeue"])
def test_a_paused_job_goes_to_the_back_of_the_line_and_can_be_placed_again(pause):
    """K=2, four 1-GPU jobs running on GPUs 0-3 of 8 (jobs 0, 2, 3, 1 in GPU order: placed as the
    window showed them). Pausing job 0 frees GPU 0 and slides the window (job 2 shows in its
    slot). Under ``pause="leave"`` job 0 is decided for the round: once jobs 1-3 are decided there
    is nothing left but advance, and job 0 waits. Under ``requeue`` it shows again, undecided and
    out of the decision: ``keep`` and a second pause are masked, ``consolidated`` places it on the
    lowest free GPU, 0, so the round ends where it began."""
    jobs = pd.DataFrame({"job_id": np.arange(4), "arrival_s": 0.0, "num_gpus": 1, "model": "envA",
                         "batch_size": 8, "iterations": 1e6})
    env = make_env(trace=jobs, max_jobs=4, window_k=2, pause=pause)
    env.reset(seed=0)
    if not env.builder.window:
        env.step(env.codec.advance)
    c = env.codec
    for _ in range(4):
        env.step(c.encode(next(i for i, j in enumerate(env.builder.window) if j not in env.builder.acted),
                          "consolidated", 0))
    env.step(c.advance)
    b = env.builder
    assert {j: jd.gpus for j, jd in b.ledger.decision.items()} == {0: (0,), 2: (1,), 3: (2,), 1: (3,)}
    assert b.window == [0, 1] and b.step_cap == (2 * (2 + 2) + 2 if pause == "requeue" else 2 * 2 + 2 + 2)
    env.step(c.encode(0, None))                              # pause job 0
    assert 0 not in b.ledger.decision and (0 in b.acted) == (pause == "leave") and b.window == [2, 1]
    for jid in (2, 1, 3):
        env.step(c.encode(b.window.index(jid), "keep", 0))
    if pause == "leave":
        assert b.window == [3, 1] and not env.action_masks()[: c.advance].any()
        env.step(c.advance)
        assert sorted(j.job_id for j in env.sim.state.running()) == [1, 2, 3]
        return
    assert b.window == [3, 0]                                # job 0 came back in job 1's slot
    mask = env.action_masks()
    assert not mask[c.encode(1, "keep", 0)] and not mask[c.encode(1, None)]
    assert mask[c.encode(1, "consolidated", 0)] and mask[c.advance]  # it may also wait
    env.step(c.encode(1, "consolidated", 0))
    assert b.ledger.decision[0].gpus == (0,) and 0 in b.acted
    assert not env.action_masks()[: c.advance].any()
    env.step(c.advance)
    assert len(env.sim.state.running()) == 4


def test_window_shows_waiting_jobs_by_least_attained_service():
    """K=2, rounds of 60 s: job 0 (8 GPUs) runs one round and is paused; jobs 1 and 2 (1 GPU)
    arrive meanwhile. The next window shows 1 and 2 (no service yet) and keeps job 0 (8 x 60 =
    480 GPU-s) behind them; in arrival order job 0 would take a slot and hide job 2."""
    jobs = pd.DataFrame({"job_id": np.arange(3), "arrival_s": [0.0, 90.0, 90.0], "num_gpus": [8, 1, 1],
                         "model": "envA", "batch_size": 8, "iterations": 1e6})
    env = make_env(trace=jobs, max_jobs=3, window_k=2)
    env.reset(seed=0)
    if not env.builder.window:
        env.step(env.codec.advance)
    assert env.builder.window == [0]
    env.step(env.codec.encode(0, "consolidated", 0))
    env.step(env.codec.advance)                       # job 0 runs a round
    b = env.builder
    assert b.window[0] == 0 and env.sim.state.jobs[0].status is JobStatus.RUNNING
    env.step(env.codec.encode(0, None))               # pause it
    env.step(env.codec.advance)
    st = env.sim.state
    assert st.jobs[0].attained_gpu_s == pytest.approx(8 * 60.0) and st.jobs[0].status is not JobStatus.RUNNING
    assert env.builder.window == [1, 2] and env.builder._queue == [0]


def test_a_las_window_lists_waiting_jobs_in_2d_las_order():
    """The case above with ``window_order="las"``: job 0's 480 GPU-s keep it in the first 2D-LAS
    queue (below 3,600 GPU-s) with jobs 1 and 2, where jobs are served by arrival, so the window
    shows 0 and 1 (job 2 behind them): the order Tiresias and Jigsaw start them in."""
    jobs = pd.DataFrame({"job_id": np.arange(3), "arrival_s": [0.0, 90.0, 90.0], "num_gpus": [8, 1, 1],
                         "model": "envA", "batch_size": 8, "iterations": 1e6})
    env = make_env(trace=jobs, max_jobs=3, window_k=2, window_order="las")
    env.reset(seed=0)
    if not env.builder.window:
        env.step(env.codec.advance)
    env.step(env.codec.encode(0, "consolidated", 0))
    env.step(env.codec.advance)
    env.step(env.codec.encode(0, None))
    env.step(env.codec.advance)
    st = env.sim.state
    assert st.jobs[0].attained_gpu_s == pytest.approx(8 * 60.0) and st.jobs[0].status is not JobStatus.RUNNING
    assert env.builder.window == [0, 1] and env.builder._queue == [2]
    rank = env.encoder.las_rank(st)
    assert [rank[j] for j in (0, 1, 2)] == [0, 1, 2]


def test_a_remaining_window_lists_waiting_jobs_by_least_remaining_gpu_seconds():
    """``window_order="remaining"``: three jobs arrive together with remaining GPU-seconds
    8 x 100 x t8, 1 x 300 x t1 and 2 x 50 x t2 (t_g: the model's isolated iteration time on g
    GPUs); the window lists them from the least up, and the builder's host ranks are the same
    order (2D-SRTF, jigsaw_env.remaining)."""
    jobs = pd.DataFrame({"job_id": np.arange(3), "arrival_s": 0.0, "num_gpus": [8, 1, 2],
                         "model": "envA", "batch_size": 8, "iterations": [100.0, 300.0, 50.0]})
    env = make_env(trace=jobs, max_jobs=3, window_k=3, window_order="remaining")
    env.reset(seed=0)
    if not env.builder.window:
        env.step(env.codec.advance)
    st = env.sim.state
    need = {j.job_id: j.remaining * st.costs.isolated_iteration_s(j) * j.num_gpus for j in st.active()}
    assert env.builder.window == sorted(need, key=need.__getitem__)
    assert env.builder.priority == {j: i for i, j in enumerate(env.builder.window)}


def test_window_order_is_checked():
    with pytest.raises(ValueError, match=r"window_order must be one of \['attained', 'las', 'remaining'\], got 'arrival'"):
        make_env(window_order="arrival")
    with pytest.raises(ValueError, match="window_order='remaining' orders the window by the jobs' remaining work, "
                                         "which observe_remaining=False hides"):
        make_env(window_order="remaining", observe_remaining=False)
    env = make_env()
    env.reset(seed=0)
    for order in ("las", "remaining"):
        with pytest.raises(ValueError, match=f"order='{order}' needs priority"):
            RoundBuilder(env.sim.state, env.codec, order=order)


def _hand_built_env(num_gpus: list[int], models: list[str]) -> JigsawClusterEnv:
    """The small env of the hand-built cases (8 GPUs in nodes of 4, 16 GiB) with four jobs arriving
    at 0 (ids 0-3, these widths and toy models, batch 8), reset to its first round with jobs."""
    jobs = pd.DataFrame({"job_id": np.arange(4), "arrival_s": 0.0, "num_gpus": num_gpus,
                         "model": models, "batch_size": 8, "iterations": 1000.0})
    env = make_env(trace=jobs, max_jobs=4, window_k=4, invalid_action="raise")
    env.reset(seed=0)
    if not env.builder.window:
        env.step(env.codec.advance)
    return env


def test_paired_puts_a_job_on_one_hosts_gpus():
    """Hand-built: A (4 GPUs, envA: 7 GiB per worker) and B (2 GPUs, envB: 12 GiB) run alone on
    16 GiB GPUs. C (2 GPUs, envA) paired: B is the narrower host, but 12 + 7 GiB does not fit, so C
    takes A's last two GPUs, last first. D (2 GPUs, envA) paired: A now shares (no host), B still
    does not fit, so paired is masked at every level; packed is not: it takes A's other two GPUs
    (shared, least-loaded first) and joins A, C and D into one lockstep group."""
    env = _hand_built_env([4, 2, 2, 2], ["envA", "envB", "envA", "envA"])
    b, c = env.builder, env.codec
    slot = {jid: s for s, jid in enumerate(b.window)}
    env.step(c.encode(slot[0], "consolidated"))
    env.step(c.encode(slot[1], "consolidated"))
    assert b.ledger.decision[0].gpus == (0, 1, 2, 3) and b.ledger.decision[1].gpus == (4, 5)
    assert b.ledger.hosts() == [(0, (0, 1, 2, 3)), (1, (4, 5))]
    a = c.encode(slot[2], "paired")
    assert env.action_masks()[a]
    env.step(a)
    assert b.ledger.decision[2].gpus == (3, 2)
    assert b.ledger.hosts() == [(1, (4, 5))]
    mask = env.action_masks()
    for level, pattern in c.combos:
        assert not mask[c.encode(slot[3], "paired", level, pattern)]
    assert mask[c.encode(slot[3], "packed")]
    with pytest.raises(InvalidAction, match="paired"):
        env.step(c.encode(slot[3], "paired"))
    env.step(c.encode(slot[3], "packed"))
    assert b.ledger.decision[3].gpus == (0, 1)
    env.step(c.advance)
    placed = {j: env.sim.state.jobs[j].placement for j in range(4)}
    assert placed == {0: (0, 1, 2, 3), 1: (4, 5), 2: (3, 2), 3: (0, 1)}


def test_a_policy_that_only_advances_is_truncated_as_stalled():
    env = make_env(max_stalled_rounds=5)
    env.reset(seed=0)
    for step in range(1, 10_000):
        _, r, term, trunc, info = env.step(env.codec.advance)
        if term or trunc:
            break
    assert trunc and not term and "policy_stalled" in info
    assert "5 rounds in a row" in info["policy_stalled"]
    # the first round may end before any job arrives (not a stall); after that, 5 stalled rounds
    assert env.sim.state.round <= 5 + 1 + 12
    with pytest.raises(ValueError, match="max_stalled_rounds"):
        make_env(max_stalled_rounds=0)


def _advance_when_allowed(env) -> int:
    """The policy that stalls an env: advance whenever the mask allows it, else the first
    feasible action."""
    mask = env.action_masks()
    return env.codec.advance if mask[env.codec.advance] else int(np.flatnonzero(mask)[0])


def test_work_conserving_masks_advance_only_while_the_decision_is_empty_and_a_job_fits():
    # a 2-GPU job at 0 s and another at 1000 s on the 8-GPU cluster (60 s rounds)
    jobs = pd.DataFrame({"job_id": [0, 1], "arrival_s": [0.0, 1000.0], "num_gpus": [2, 2], "model": ["envA"] * 2,
                         "batch_size": [8, 8], "iterations": [5000.0, 500.0]})
    env = make_env(trace=jobs, max_jobs=2, work_conserving=True, invalid_action="raise")
    env.reset(seed=0)
    adv = env.codec.advance
    mask = env.action_masks()
    assert env.builder.window == [0] and not mask[adv] and mask.any()
    # advancing anyway: raised (nothing changed) or, with invalid_action="noop", refused
    with pytest.raises(InvalidAction, match="work_conserving=True"):
        env.step(adv)
    assert env.sim.state.time_s == 0.0 and env._steps_in_round == 0
    probe = env.copy()
    probe.invalid_action = "noop"
    _, r, _, _, info = probe.step(adv)
    assert "work_conserving=True" in info["invalid_action"] and r == 0.0 and probe.sim.state.time_s == 0.0
    # once the decision runs the job, advance is allowed
    env.step(int(np.flatnonzero(mask)[0]))
    assert env.action_masks()[adv]
    env.step(adv)
    assert env.sim.state.time_s == 60.0 and env.sim.state.jobs[0].placement
    # pausing it empties the decision, but no window job could start (job 0 is decided for this
    # round, job 1 has not arrived): advance stays allowed, and the round runs nothing
    pause = env.codec.encode(0, None)
    env.step(pause)
    mask = env.action_masks()
    assert not env.builder.ledger.decision and mask[adv] and mask.sum() == 1
    env.step(adv)
    assert not env.sim.state.jobs[0].placement
    # the default env lets the policy advance with the job waiting
    plain = make_env(trace=jobs, max_jobs=2, invalid_action="raise")
    plain.reset(seed=0)
    assert plain.action_masks()[adv]


def test_work_conserving_masks_stay_exact_and_the_advancing_policy_finishes():
    env = make_env(work_conserving=True, invalid_action="raise")
    env.reset(seed=3)
    rng = np.random.default_rng(3)
    refused = 0
    for _ in range(25):
        mask = env.action_masks()
        probe = env.copy()
        if mask[env.codec.advance]:
            probe.step(env.codec.advance)
        else:
            refused += 1
            with pytest.raises(InvalidAction):
                probe.step(env.codec.advance)
        env.step(int(rng.choice(np.flatnonzero(mask))))
    assert refused > 0
    # the policy that only advances stalls the default env; work-conserving masks make it run
    # every job (each round its decision runs at least one job while any waits)
    stalled = make_env(max_stalled_rounds=5)
    stalled.reset(seed=0)
    conserving = make_env(max_stalled_rounds=5, work_conserving=True)
    conserving.reset(seed=0)
    for env, want in ((stalled, "stalled"), (conserving, "finished")):
        while True:
            _, _, term, trunc, info = env.step(_advance_when_allowed(env))
            if term or trunc:
                break
        assert ("policy_stalled" in info) == (want == "stalled")
        assert term == (want == "finished")
    assert conserving.sim.num_finished == 12
    with pytest.raises(ValueError, match="work_conserving must be True or False, got 'yes'"):
        make_env(work_conserving="yes")


def test_pair_with_host_slot_puts_a_job_on_the_named_hosts_gpus():
    """Hand-built, as above: A (4 GPUs, envA: 7 GiB per worker) and B (2 GPUs, envB: 12 GiB) run
    alone on 16 GiB GPUs. The host slots list them lowest 2D-LAS priority first: both arrived at 0
    with no service, so B (the later id) is slot 0 and A slot 1, and the observation's host blocks
    show their widths. C (2 GPUs, envA) ``host:0`` (B): 12 + 7 GiB does not fit, masked at every
    level. ``host:1`` (A) at level 0: every order of two identical level-0 workers over A's GPUs
    gives the same lockstep step, so the search keeps the first, A's GPUs 0 and 1. A then shares
    and leaves the host slots: D's ``host:1`` names no job and is masked."""
    from jigsaw_env.encoder import JOB_FEATURES

    env = _hand_built_env([4, 2, 2, 2], ["envA", "envB", "envA", "envA"])
    b, c = env.builder, env.codec
    slot = {jid: s for s, jid in enumerate(b.window)}
    env.step(c.encode(slot[0], "consolidated"))
    obs, *_ = env.step(c.encode(slot[1], "consolidated"))
    assert b.hosts() == [1, 0]
    k = c.window_k
    host_width = [obs[(k + r) * JOB_FEATURES + 4] for r in range(c.host_slots)]
    assert host_width == pytest.approx([np.log2(3) / 8, np.log2(5) / 8] + [0.0] * (c.host_slots - 2))
    mask = env.action_masks()
    for level, pattern in c.combos:
        assert not mask[c.encode(slot[2], "host:0", level, pattern)]
    a = c.encode(slot[2], "host:1")
    assert mask[a]
    env.step(a)
    assert b.ledger.decision[2].gpus == (0, 1)
    assert b.hosts() == [1]
    mask = env.action_masks()
    assert not mask[c.encode(slot[3], "host:1")]
    with pytest.raises(InvalidAction, match="host:1"):
        env.step(c.encode(slot[3], "host:1"))
    env.step(c.advance)
    assert env.sim.state.jobs[2].placement == (0, 1)


def test_a_job_wider_than_a_host_slot_is_placed_around_it():
    """8 GPUs in nodes of 4, 16 GiB each. R and Q (2 GPUs, envA: 7 GiB workers) run alone on
    GPUs 0-1 and 2-3. J (4 GPUs, envA) ``host:r`` with R: with R's GPUs counted free, the
    consolidated choice is node 1 (4 free against 2), which leaves R out, so it is masked at every
    level. With Q paused, node 0 holds 4 free GPUs with R's (the lower node on a tie): J goes on
    GPUs 0-3 around R, 7 + 7 GiB on R's two, and R stays where it runs, as J's guest, without a
    migration. J2 (envB, 12 GiB at full depth) around R does not fit at level 0: 12 + 7 > 16."""
    env = _hand_built_env([2, 2, 4, 4], ["envA", "envA", "envA", "envB"])
    b, c = env.builder, env.codec
    slot = {jid: s for s, jid in enumerate(b.window)}
    env.step(c.encode(slot[0], "consolidated"))
    env.step(c.encode(slot[1], "consolidated"))
    env.step(c.advance)
    b = env.builder
    assert b.ledger.decision[0].gpus == (0, 1) and b.ledger.decision[1].gpus == (2, 3)
    slot = {jid: s for s, jid in enumerate(b.window)}
    around_r = f"host:{b.hosts().index(0)}"
    mask = env.action_masks()
    assert not any(mask[c.encode(slot[2], around_r, level, pattern)] for level, pattern in c.combos)
    assert mask[c.encode(slot[2], "consolidated")]
    env.step(c.encode(slot[1], None))  # pause Q
    slot = {jid: s for s, jid in enumerate(b.window)}
    around_r = f"host:{b.hosts().index(0)}"
    mask = env.action_masks()
    assert not mask[c.encode(slot[3], around_r)]  # J2: 12 + 7 GiB on GPUs 0 and 1
    a = c.encode(slot[2], around_r)
    assert mask[a]
    env.step(a)
    assert b.ledger.decision[2].gpus == (0, 1, 2, 3) and b.ledger.decision[0].gpus == (0, 1)
    env.step(c.advance)
    r = env.sim.state.jobs[0]
    assert env.sim.state.jobs[2].placement == (0, 1, 2, 3) and r.placement == (0, 1) and r.migrations == 0


def test_a_synthetic_spec_is_recognised_in_any_case_and_spacing():
    """The loader reads the kind case- and space-insensitively; the env draws a new synthetic
    trace per reset for every spelling (not one fixed trace cut into windows)."""
    def jobs(spec):
        env = JigsawClusterEnv(gpus=8, max_jobs=10, trace=spec, load=2.0)
        env.reset(seed=3)
        return env.sim.jobs_frame()[["job_id", "num_gpus", "arrival_s", "model"]]

    ref = jobs("synthetic")
    assert ref["job_id"].tolist() == list(range(10))
    for spec in ("Synthetic", " synthetic", "SYNTHETIC"):
        pd.testing.assert_frame_equal(jobs(spec), ref)
