"""The ``proposal`` feature group (jigsaw_env/proposal.py): a heuristic's round decision shown per
job slot after the cluster features. Hand-computed values on a three-job round, the per-step
columns as the decision is built, the rest of the observation unchanged, the real Jigsaw as
proposer (asked once per round, the same decision the expert translates), bad arguments refused
with one line, and a run trained with the group evaluates, exports and deploys with it."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from train_helpers import registered_toy_tables, toy_tables_fixture

from jigsaw_env.encoder import CLUSTER_FEATURES, HOST_SLOTS, JOB_FEATURES, ObservationEncoder, observation_size
from jigsaw_env.env import JigsawClusterEnv
from jigsaw_env.proposal import PROPOSAL_FEATURES, proposal_slot_features
from jigsaw_env.spb import Pattern
from jigsaw_env.state import Decision, JobDecision

GROUPS = "base,oracle,history,las,fill,proposal"
P = PROPOSAL_FEATURES + HOST_SLOTS  # values per slot

tables_dir = toy_tables_fixture("prC", "prD")  # table files for the training test (--tables)


toy_tables = registered_toy_tables("prA", "prB")


class FixedProposer:
    """Proposes the same decision every round and counts the rounds it was asked."""

    def __init__(self, decision: Decision):
        self.decision = decision
        self.calls = 0
        self.resets = 0

    def __call__(self, state) -> Decision:
        self.calls += 1
        return self.decision

    def reset(self) -> None:
        self.resets += 1


def _three_jobs() -> pd.DataFrame:
    return pd.DataFrame({"job_id": [0, 1, 2], "arrival_s": 0.0, "num_gpus": [2, 2, 1], "model": "prA",
                         "batch_size": 8, "iterations": 1e6})


def _block(env, obs) -> np.ndarray:
    start = (env.codec.window_k + HOST_SLOTS) * JOB_FEATURES + CLUSTER_FEATURES
    return obs[start:].reshape(env.codec.window_k + HOST_SLOTS, P)


def _first_round_with_jobs(env):
    obs, _ = env.reset(seed=0)
    if not env.builder.window:
        obs, *_ = env.step(env.codec.advance)
    return obs


def test_block_by_hand_and_its_per_step_columns():
    """Jobs 0 and 1 (2 GPUs) proposed on GPUs 0-1 together, job 0 at level 1 static; job 2 not
    proposed. 8 GPUs in 2 nodes, L = 3."""
    proposal = Decision({0: JobDecision((0, 1), 1, Pattern.STATIC), 1: JobDecision((1, 0), 0)})
    proposer = FixedProposer(proposal)
    env = JigsawClusterEnv(gpus=8, gpus_per_node=4, trace=_three_jobs(), max_jobs=3, window_k=4, round_s=60.0,
                           obs_features=GROUPS, proposer=proposer)
    assert env.observation_space.shape == (observation_size(4, GROUPS),) == ((4 + 8) * (27 + P) + 10,)
    obs = _first_round_with_jobs(env)
    assert proposer.resets == 1
    b = env.builder
    nodes = math.log2(2) / math.log2(3)  # one node of the cluster's two
    want = {0: [1, 1 / 3, 1, 1, 0, nodes, 0], 1: [1, 0, 0, 1, 0, nodes, 0], 2: [0, 0, 0, 0, 0, 0, 1]}
    block = _block(env, obs)
    assert sorted(b.window) == [0, 1, 2] and b.hosts() == []
    for slot, jid in enumerate(b.window):
        np.testing.assert_allclose(block[slot], want[jid] + [0] * HOST_SLOTS, rtol=1e-6)
    assert not block[len(b.window):].any()  # the empty window slot and every host slot
    # job 0 placed as proposed: it agrees, and as a host (alone on its GPUs) it is job 1's partner
    slot0 = b.window.index(0)
    obs, *_ = env.step(env.codec.encode(slot0, "consolidated", 1, Pattern.STATIC))
    assert b.ledger.decision[0] == proposal[0] and b.hosts() == [0]
    block = _block(env, obs)
    rows = {jid: block[slot] for slot, jid in enumerate(b.window)}
    host_row = block[4]
    np.testing.assert_allclose(host_row, [1, 1 / 3, 1, 1, 0, nodes, 1] + [0] * HOST_SLOTS, rtol=1e-6)
    np.testing.assert_allclose(rows[1], want[1] + [1] + [0] * (HOST_SLOTS - 1), rtol=1e-6)
    np.testing.assert_allclose(rows[2], want[2] + [0] * HOST_SLOTS)
    calls = proposer.calls
    env.step(env.codec.advance)
    assert proposer.calls == calls + 1  # once per round


def test_the_rest_of_the_observation_is_the_default_one():
    """The proposal group appends its block and changes nothing before it (same random actions)."""
    from agents import make_scheduler
    plain = JigsawClusterEnv(gpus=16, max_jobs=12, window_k=4)
    shown = JigsawClusterEnv(gpus=16, max_jobs=12, window_k=4, obs_features=GROUPS, proposer=make_scheduler("jigsaw"))
    o1, _ = plain.reset(seed=5)
    o2, _ = shown.reset(seed=5)
    n = o1.shape[0]
    assert o2.shape == (n + (4 + HOST_SLOTS) * P,)
    rng = np.random.default_rng(0)
    for _ in range(300):
        assert np.array_equal(o1, o2[:n])
        assert ((o2[n:] >= 0.0) & (o2[n:] <= 1.0)).all()
        a = int(rng.choice(np.flatnonzero(plain.action_masks())))
        o1, _, t1, tr1, _ = plain.step(a)
        o2, _, t2, tr2, _ = shown.step(a)
        if t1 or tr1:
            break


def test_jigsaw_proposes_what_the_expert_translates():
    """With Jigsaw as proposer, each round's proposal is the decision the Jigsaw expert builds
    towards (both asked once per round on the same state); where the expert reaches it, every
    window job's agreement column reads 1 at advance."""
    from agents import make_scheduler
    from agents.imitation import HeuristicExpert
    env = JigsawClusterEnv(gpus=16, max_jobs=30, window_k=8, obs_features=GROUPS, window_order="las",
                           proposer=make_scheduler("jigsaw"))
    expert = HeuristicExpert("jigsaw")
    obs, _ = env.reset(seed=3)
    rounds = reached = 0
    builder = None
    for _ in range(5000):
        a = expert.act(env)
        if env.builder is not builder:
            builder = env.builder
            rounds += 1
            assert env.proposal == expert.target
        if a == env.codec.advance and env.builder.ledger.decision == env.proposal:
            reached += 1
            k = len(env.builder.window[:8])
            assert (_block(env, obs)[:k, 6] == 1.0).all()
        obs, _, term, trunc, _ = env.step(a)
        if term or trunc:
            break
    assert term and rounds > 20 and reached > rounds // 2


def test_an_expert_reading_the_proposal_acts_as_one_asking_its_own_heuristic():
    """HeuristicExpert(use_proposal=True) takes the env's proposal as its target: the same actions
    over a whole episode as an expert that asks its own Jigsaw; another proposer is refused."""
    from agents import make_scheduler
    from agents.imitation import HeuristicExpert

    def actions(use_proposal: bool) -> list[int]:
        env = JigsawClusterEnv(gpus=16, max_jobs=30, window_k=8, obs_features=GROUPS, window_order="las",
                               proposer=make_scheduler("jigsaw"))
        expert = HeuristicExpert("jigsaw", use_proposal=use_proposal)
        env.reset(seed=4)
        out = []
        while True:
            out.append(expert.act(env))
            _, _, term, trunc, _ = env.step(out[-1])
            if term or trunc:
                return out

    own = actions(False)
    assert len(own) > 100 and actions(True) == own
    env = JigsawClusterEnv(gpus=16, max_jobs=10, window_k=8, obs_features=GROUPS, proposer=make_scheduler("tiresias"))
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"^expert 'jigsaw' reads the env's proposal, but the env's proposer is "
                                         r"'tiresias'$"):
        HeuristicExpert("jigsaw", use_proposal=True).act(env)


def test_bad_arguments_one_line():
    from agents import make_scheduler
    with pytest.raises(ValueError) as e:
        JigsawClusterEnv(obs_features=GROUPS)
    assert str(e.value) == ("obs_features includes 'proposal': give proposer, the scheduler whose round decision "
                            "the observation shows (e.g. agents.make_scheduler('jigsaw'))")
    with pytest.raises(ValueError) as e:
        JigsawClusterEnv(proposer=make_scheduler("jigsaw"))
    assert str(e.value) == ("proposer is given but obs_features ['base', 'oracle', 'history', 'las', 'fill'] has "
                            "no 'proposal' group to show its decision; add 'proposal' or leave proposer out")
    with pytest.raises(ValueError) as e:
        JigsawClusterEnv(obs_features=GROUPS, proposer="jigsaw")
    assert str(e.value) == "proposer must be a callable state -> Decision (a scheduler), got 'jigsaw'"
    env = JigsawClusterEnv(gpus=8, max_jobs=6, window_k=4)
    env.reset(seed=0)
    enc = ObservationEncoder(4, features=GROUPS)
    b = env.builder
    with pytest.raises(ValueError, match=r"^the observation has the 'proposal' feature group: encode\(\) needs"):
        enc.encode(env.sim.state, b.window, b.ledger, b.acted)
    assert proposal_slot_features(HOST_SLOTS) == P


def test_run_config_names_the_proposer():
    from agents.rl_env import make_proposer, proposer_name
    assert proposer_name({"obs_features": ["base", "proposal"]}) == "jigsaw"
    assert proposer_name({"obs_features": ["base", "proposal"], "proposer": "tiresias"}) == "tiresias"
    assert proposer_name({"obs_features": ["base"]}) is None and proposer_name({}) is None
    assert make_proposer({"obs_features": ["base", "proposal"]}).name == "jigsaw"
    with pytest.raises(ValueError) as e:
        proposer_name({"obs_features": ["base"], "proposer": "jigsaw"}, ("--proposer", "--obs-features"))
    assert str(e.value) == ("--proposer is 'jigsaw' but --obs-features has no 'proposal' group to show its "
                            "decision; add 'proposal' there or leave the proposer out")
    with pytest.raises(ValueError, match=r"^field 'env.proposer': expected a scheduler name from \[.*'jigsaw'.*\], "
                                         r"got 'nope'$"):
        proposer_name({"obs_features": ["base", "proposal"], "proposer": "nope"})


@pytest.mark.slow
def test_a_run_with_the_proposal_evaluates_exports_and_deploys_with_it(tmp_path, tables_dir):
    """Train the slot policy with the proposal group: config.json names the proposer; the env path
    (LearnedAgent.play), the round-by-round scheduler and the exported ONNX policy play the same
    episode; the scheduler's state carries the proposer's."""
    from agents.rl import LearnedAgent, LearnedScheduler
    from jigsaw_env.cli import main
    from jigsaw_env.cluster import ClusterSpec
    from jigsaw_env.simulator import SimConfig, Simulator
    from jigsaw_env.spb import SPBConfig
    from jigsaw_executor.onnx_policy import make_scheduler as onnx_scheduler
    from traces import load_trace

    run = tmp_path / "run"
    rc = main(["train", "--tables", tables_dir, "--trace", "synthetic:models=prC+prD", "--gpus", "8", "--window-k", "4", "--max-jobs", "8",
               "--n-steps", "64", "--batch-size", "32", "--n-epochs", "1", "--eval-episodes", "1", "--no-progress",
               "--no-tensorboard", "--vec", "dummy", "--n-envs", "1", "--timesteps", "128", "--eval-freq", "100000",
               "--val", "0", "--obs-features", GROUPS, "--policy", "slots", "--run-dir", str(run)])
    assert rc == 0
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["env"]["proposer"] == "jigsaw" and cfg["env"]["obs_features"] == GROUPS.split(",")
    assert cfg["spaces"]["observation_size"] == (4 + 8) * (27 + P) + 10
    agent = LearnedAgent(run, prefer_onnx=False)
    jobs = load_trace("synthetic:models=prC+prD,jobs=6,seed=2", cluster_gpus=8).jobs
    sim_cfg = SimConfig(round_s=300.0, max_time_s=3e5)
    env = agent.make_env(cluster_kwargs=dict(num_gpus=8, gpus_per_node=8, gpu_type="v100", gpu_memory_gib=None),
                         sim_config=sim_cfg)
    assert env.proposer.name == "jigsaw"
    frames = [agent.play(env, jobs).jobs_frame()]
    out = tmp_path / "policy.onnx"
    assert main(["export", str(run), "--out", str(out)]) == 0
    for sched in (LearnedScheduler(agent=agent), onnx_scheduler(out, spb=SPBConfig())):
        sim = Simulator(ClusterSpec.from_gpus(8), jobs, sim_cfg)
        sim.run(sched.schedule)
        frames.append(sim.jobs_frame())
        state = sched.state_dict()
        assert state["proposer"]["scheduler"] == "jigsaw"
        sched.load_state_dict(json.loads(json.dumps(state)))
        assert sched.state_dict() == state
        with pytest.raises(ValueError, match=r"^scheduler state: field 'proposer'"):
            sched.load_state_dict({k: v for k, v in state.items() if k != "proposer"})
    pd.testing.assert_frame_equal(frames[0], frames[1])
    pd.testing.assert_frame_equal(frames[1], frames[2])
