"""Observation feature groups (``obs_features``): sizes, the kept columns are exactly the full
observation's, bad names refused with one line, and a run trained on some groups is evaluated,
exported and deployed with the same groups (a mismatch is refused naming the groups and sizes).
The default observation itself is pinned by tests/sim/test_golden.py and tests/env/test_env_speed_parity.py."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from jigsaw_env.encoder import (CLUSTER_FEATURES, DEFAULT_FEATURES, FEATURE_GROUPS, HOST_SLOTS, JOB_FEATURES,
                                check_features, job_feature_indices, observation_size)
from jigsaw_env.env import JigsawClusterEnv


def test_groups_partition_the_job_features():
    idx = sorted(i for g in FEATURE_GROUPS.values() for i in g)
    assert idx == list(range(JOB_FEATURES))
    assert FEATURE_GROUPS["proposal"] == ()  # a block of its own (tests/env/test_proposal.py)
    assert DEFAULT_FEATURES == ("base", "oracle", "history", "las", "fill")
    # K window slots and H = 8 host slots of per-job features, then the cluster features
    assert observation_size(16) == (16 + 8) * 27 + 10 == 658
    assert observation_size(16, ["base"]) == (16 + 8) * 15 + 10
    assert observation_size(4, "base,las,fill") == (4 + 8) * 22 + 10
    # order and repeats do not matter: canonical order
    assert check_features(["las", "base", "las"]) == ("base", "las")


@pytest.mark.parametrize("groups", [("base",), ("base", "oracle"), ("base", "history", "las"), ("base", "fill")])
def test_kept_columns_equal_the_full_observation(groups):
    full = JigsawClusterEnv(gpus=16, max_jobs=12, window_k=4)
    part = JigsawClusterEnv(gpus=16, max_jobs=12, window_k=4, obs_features=groups)
    assert part.obs_features == check_features(groups)
    keep = list(job_feature_indices(groups))
    blocks = 4 + HOST_SLOTS  # window slots, then host slots
    n = blocks * len(keep) + CLUSTER_FEATURES
    assert part.observation_space.shape == (n,)

    def select(o):
        return np.concatenate([o[s * JOB_FEATURES:(s + 1) * JOB_FEATURES][keep] for s in range(blocks)]
                              + [o[blocks * JOB_FEATURES:]])

    o1, _ = full.reset(seed=5)
    o2, _ = part.reset(seed=5)
    rng = np.random.default_rng(0)
    for _ in range(300):
        assert o2.shape == (n,) and np.array_equal(select(o1), o2)
        a = int(rng.choice(np.flatnonzero(full.action_masks())))
        o1, _, t1, tr1, _ = full.step(a)
        o2, _, t2, tr2, _ = part.step(a)
        if t1 or tr1:
            break


@pytest.mark.parametrize("bad, message", [
    (("base", "nope"), "obs_features: unknown feature group 'nope'; allowed: ['base', 'oracle', 'history', 'las', 'fill', 'proposal']"),
    (("las",), "obs_features must include 'base' (the job's size, state and model features and every cluster "
               "feature), got ['las']; allowed groups: ['base', 'oracle', 'history', 'las', 'fill', 'proposal']"),
    (5, "obs_features must be a list of feature groups from ['base', 'oracle', 'history', 'las', 'fill', 'proposal'], got 5"),
])
def test_bad_groups_one_line(bad, message):
    with pytest.raises(ValueError) as e:
        JigsawClusterEnv(obs_features=bad)
    assert str(e.value) == message


def test_export_refuses_a_config_whose_size_does_not_match_its_groups(tmp_path):
    """A config.json that says 'base' but records the full observation size: refused with the
    groups and both sizes named."""
    from agents.rl import spaces_signature
    from jigsaw_executor.export import LoadedRun, _check_layout
    sp = spaces_signature(4, 3, 4)  # every group: 118
    sp["obs_features"] = ["base"]
    run = LoadedRun(tmp_path, {"spaces": sp}, None, tmp_path / "model.zip", None, None, features=("base",))
    with pytest.raises(ValueError) as e:
        _check_layout(run, spaces_signature)
    assert str(e.value) == (f"{tmp_path}: the run was trained for another observation/action layout than this "
                            f"code's: per-job features expected 15 (feature groups base), found 27 in config.json")


def test_run_features_reads_the_config():
    from agents.rl import run_features
    assert run_features({"spaces": {}, "env": {}}) == DEFAULT_FEATURES  # a run recorded without the field
    assert run_features({"spaces": {"obs_features": ["base", "las"]}, "env": {"obs_features": ["las", "base"]}}) \
        == ("base", "las")
    with pytest.raises(ValueError, match=r"^c.json: field 'env.obs_features' \['base'\] differs from "
                                         r"'spaces.obs_features' \['base', 'las'\]$"):
        run_features({"spaces": {"obs_features": ["base", "las"]}, "env": {"obs_features": ["base"]}}, "c.json")


@pytest.mark.slow
def test_a_run_on_some_groups_evaluates_exports_and_deploys_with_them(tmp_path):
    """Train on base+las, then: config.json records the groups, LearnedAgent's env and
    LearnedScheduler's encoder use them, the ONNX export records them and its scheduler plays the
    same episode as the RUN_DIR; an ONNX policy whose metadata names other groups is refused."""
    from train_helpers import _toy

    from agents.rl import EvalSpaces, LearnedAgent, LearnedScheduler
    from jigsaw_env.cli import main
    from jigsaw_env.cluster import ClusterSpec
    from jigsaw_env.cost_table import register_tables_dir, unregister_table
    from jigsaw_env.simulator import SimConfig, Simulator
    from jigsaw_env.spb import SPBConfig
    from jigsaw_executor.onnx_policy import OnnxPolicy, make_scheduler
    from traces import load_trace

    tables = tmp_path / "tables"
    tables.mkdir()
    _toy("ofA", 4, 5.0, 0.5, 0.05).save(tables / "ofA-bs8-v100.json")
    _toy("ofB", 6, 6.0, 1.0, 0.08).save(tables / "ofB-bs8-v100.json")
    try:
        run = tmp_path / "run"
        rc = main(["train", "--tables", str(tables), "--trace", "synthetic:models=ofA+ofB", "--gpus", "8",
                   "--window-k", "4", "--max-jobs", "8", "--n-steps", "64", "--batch-size", "32", "--n-epochs", "1",
                   "--eval-episodes", "1", "--no-progress", "--no-tensorboard", "--vec", "dummy", "--n-envs", "1",
                   "--timesteps", "128", "--eval-freq", "100000", "--val", "0", "--obs-features", "las,base",
                   "--run-dir", str(run)])
        assert rc == 0
        cfg = json.loads((run / "config.json").read_text())
        assert cfg["env"]["obs_features"] == ["base", "las"] == cfg["spaces"]["obs_features"]
        assert cfg["spaces"]["job_features"] == 18 and cfg["spaces"]["observation_size"] == (4 + 8) * 18 + 10
        agent = LearnedAgent(run, prefer_onnx=False)
        agent.check_compatible(EvalSpaces(None, 3, 4))
        env = agent.make_env(cluster_kwargs=dict(num_gpus=8, gpus_per_node=8, gpu_type="v100", gpu_memory_gib=None),
                             sim_config=SimConfig(round_s=300.0))
        assert env.observation_space.shape == (226,)
        out = tmp_path / "policy.onnx"
        assert main(["export", str(run), "--out", str(out)]) == 0
        pol = OnnxPolicy(out)
        assert pol.obs_features == ("base", "las") and pol.observation_size == 226
        register_tables_dir(str(tables))
        jobs = load_trace("synthetic:models=ofA+ofB,jobs=6,seed=2", cluster_gpus=8).jobs
        frames = []
        for sched in (LearnedScheduler(agent=agent), make_scheduler(out, spb=SPBConfig())):
            sim = Simulator(ClusterSpec.from_gpus(8), jobs, SimConfig(round_s=300.0, max_time_s=3e5))
            sim.run(sched.schedule)
            frames.append(sim.jobs_frame())
        pd.testing.assert_frame_equal(frames[0], frames[1])
        # an ONNX policy whose metadata names other groups than its size: refused, groups named
        pol.raw_metadata["obs_features"] = json.dumps(["base"])
        with pytest.raises(ValueError) as e:
            pol.check_layout(3, 4)
        assert str(e.value) == (f"{out} does not fit the deployment: observation size expected 190 (feature groups "
                                f"base), found 226 in the ONNX policy")
    finally:
        for m in ("ofA", "ofB"):
            unregister_table(m, 8, "v100")
