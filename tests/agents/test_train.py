"""train_agent.py / `jigsaw train`: a few thousand steps end to end, reload and act with masks,
--resume, PPO/A2C without masks, masks through SubprocVecEnv, bad input.

The toy cost tables are written to a folder and passed with --tables, because SubprocVecEnv
workers are separate processes and do not see tables registered in the test process.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest

from jigsaw_env.cli import main

from train_helpers import assert_acts_masked, tables_dir, tiny_args  # noqa: F401  (tables_dir: a module-scoped fixture)


@pytest.fixture(scope="module")
def trained(tables_dir, tmp_path_factory):
    """MaskablePPO, 2 SubprocVecEnv workers, ~2,000 steps after a 2-second FIFO clone: a policy
    from random weights may run nothing for 1,000 rounds (PolicyStalled), and whether it does
    changes with any change to the observation; the clone starts jobs."""
    run = tmp_path_factory.mktemp("runs") / "mppo"
    rc = main(tiny_args(tables_dir, run, "--n-envs", "2", "--timesteps", "2000", "--eval-freq", "1000",
                        "--checkpoint-freq", "1000", "--seed", "3", "--warm-start", "fifo", "--warm-start-s", "2",
                        "--dagger-rounds", "1", "--dagger-s", "1"))  # the default 2 x 60 s of DAgger play is most of the time
    assert rc == 0
    return run


@pytest.mark.slow
def test_training_writes_the_run_dir(trained):
    for name in ("model.zip", "vecnormalize.npz", "config.json", "eval.csv", "eval.png", "best/best_model.zip"):
        assert (trained / name).is_file(), name
    assert list((trained / "checkpoints").glob("rl_model_*_steps.zip"))
    assert list((trained / "checkpoints").glob("rl_model_vecnormalize_*_steps.npz"))
    assert list((trained / "tb").rglob("events.out.tfevents.*"))
    cfg = json.loads((trained / "config.json").read_text())
    assert cfg["algo"] == "maskable_ppo" and cfg["n_envs"] == 2 and cfg["vec"] == "subproc"
    assert cfg["trained_timesteps"] >= 2000 and cfg["seed"] == 3
    sp = cfg["spaces"]
    assert sp["window_k"] == 4 and sp["observation_size"] == (4 + 8) * 27 + 10 and sp["n_actions"] == 4 * 92 + 1
    ev = pd.read_csv(trained / "eval.csv")
    assert len(ev) >= 2 and ev["timesteps"].is_monotonic_increasing
    assert ev["mean_reward"].notna().all() and (ev["mean_avg_jct_s"] > 0).all()
    # validation by default; Tiresias's and Jigsaw's values on the same episodes, in TensorBoard too
    assert cfg["sampling"]["select_on"] == "val"
    ref = json.loads((trained / "reference.json").read_text())
    assert ref["split"] == "val" and set(ref["agents"]) == {"tiresias", "jigsaw"}
    assert all(r["mean_avg_jct_s"] > 0 and r["episodes"] == 1 for r in ref["agents"].values())
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(next((trained / "tb").rglob("events.out.tfevents.*")).parent))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"eval/mean_reward_tiresias", "eval/mean_avg_jct_s_jigsaw"} <= tags
    assert [e.value for e in acc.Scalars("eval/mean_reward_jigsaw")][-1] == pytest.approx(
        ref["agents"]["jigsaw"]["mean_reward"])


@pytest.mark.slow
def test_saved_model_loads_and_acts_with_masks(trained):
    from sb3_contrib import MaskablePPO

    from agents.rl import EvalSpaces, LearnedAgent, LearnedScheduler
    from jigsaw_env.simulator import SimConfig

    model = MaskablePPO.load(str(trained / "model.zip"), device="cpu")
    agent = LearnedAgent(trained)
    agent.check_compatible(EvalSpaces(4, 3, 4))
    env = agent.make_env(cluster_kwargs=dict(num_gpus=8, gpus_per_node=8, gpu_type="v100", gpu_memory_gib=None),
                         sim_config=SimConfig(round_s=300.0))
    from traces import load_trace
    jobs = load_trace("synthetic:models=rlA+rlB,jobs=8,seed=11", cluster_gpus=8).jobs
    obs, _ = env.reset(seed=0, options={"jobs": jobs})
    # sb3-contrib's own predict with masks only ever picks a feasible action
    for _ in range(20):
        mask = env.action_masks()
        a, _ = model.predict(agent.normalize(obs), action_masks=mask, deterministic=True)
        assert mask[int(a)]
        assert int(a) == agent.act(obs, mask)  # the adapter's masked argmax agrees
        obs, _, term, trunc, _ = env.step(int(a))
        if term or trunc:
            break
    # a whole episode (env raises on any masked action), and the same decisions as a scheduler
    sim = agent.play(env, jobs, seed=0)
    assert sim.num_finished == len(jobs)
    from jigsaw_env.cluster import ClusterSpec
    from jigsaw_env.simulator import Simulator
    sim2 = Simulator(ClusterSpec.from_gpus(8), jobs, SimConfig(round_s=300.0))
    sim2.run(LearnedScheduler(agent=agent).schedule)
    pd.testing.assert_frame_equal(sim.jobs_frame(), sim2.jobs_frame())


@pytest.mark.slow
def test_resume_reaches_the_requested_total(trained, tables_dir, capsys):
    ev = pd.read_csv(trained / "eval.csv")
    before = len(ev)
    # best/ is the first evaluation with the highest return...
    best_at = int(ev["timesteps"].iloc[int(ev["mean_reward"].to_numpy().argmax())])
    assert json.loads((trained / "best" / "config.json").read_text())["trained_timesteps"] == best_at
    # ...and stays so across a resume: make that row unbeatable; no evaluation of the resumed
    # run may then replace best/ (a fresh callback alone would take its first evaluation)
    ev.loc[ev["timesteps"] == best_at, "mean_reward"] = 1e9
    ev.to_csv(trained / "eval.csv", index=False)
    rc = main(["train", "--run-dir", str(trained), "--resume", "--timesteps", "3000", "--no-progress"])
    assert rc == 0
    cfg = json.loads((trained / "config.json").read_text())
    assert cfg["trained_timesteps"] >= 3000 and cfg["timesteps"] == 3000
    assert cfg["resumed"][-1]["from_timesteps"] >= 2000
    assert len(pd.read_csv(trained / "eval.csv")) > before
    assert json.loads((trained / "best" / "config.json").read_text())["trained_timesteps"] == best_at
    # already there: nothing to do, still exit 0
    assert main(["train", "--run-dir", str(trained), "--resume", "--timesteps", "2500", "--no-progress"]) == 0
    assert "nothing to do" in capsys.readouterr().out


def test_masks_reach_maskable_ppo_through_vecnormalize(tables_dir, trained):
    """MaskablePPO fetches masks with env_method("action_masks") through VecNormalize; the
    SubprocVecEnv case is the trained fixture (MaskablePPO refuses to train without masks, and
    the trainer records that every worker answered)."""
    from sb3_contrib.common.maskable.utils import get_action_masks, is_masking_supported
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    from agents.rl_env import make_env_fn
    assert json.loads((trained / "config.json").read_text())["masking_supported"] is True
    env_kw = dict(gpus=8, gpus_per_node=8, trace="synthetic:models=rlA+rlB", max_jobs=6, window_k=4)
    venv = VecNormalize(DummyVecEnv([make_env_fn(env_kw, split="train", rank=i, seed=0, tables=tables_dir)
                                     for i in range(2)]))
    try:
        venv.reset()
        assert is_masking_supported(venv)
        m = get_action_masks(venv)
        assert m.shape == (2, 4 * 92 + 1) and m.dtype == bool and m[:, -1].all()
        direct = venv.venv.envs[0].unwrapped.action_masks()
        assert np.array_equal(m[0], direct)
        venv.env_method("set_difficulty", 0.0)
        assert venv.get_attr("difficulty") == [0.0, 0.0]
    finally:
        venv.close()


def test_train_and_eval_splits_are_disjoint(tables_dir):
    from agents.rl_env import SYNTHETIC_SEED_SPLIT, TrainingEnv
    from jigsaw_env.cost_table import register_tables_dir
    register_tables_dir(tables_dir)
    seen = {}
    for split in ("train", "eval"):
        env = TrainingEnv(split=split, gpus=8, trace="synthetic:models=rlA+rlB", max_jobs=5, window_k=4)
        env.reset(seed=1)
        rng_seeds = []
        import agents.rl_env as rl_env  # where the training env loads its traces
        orig = rl_env.load_trace

        def spy(spec, **kw):
            rng_seeds.append(int(spec.rsplit("seed=", 1)[1]))
            return orig(spec, **kw)
        rl_env.load_trace = spy
        try:
            for s in range(5):
                env.reset(seed=s)
        finally:
            rl_env.load_trace = orig
        seen[split] = rng_seeds
    assert len(seen["train"]) == len(seen["eval"]) == 5  # one trace per reset
    assert all(s < SYNTHETIC_SEED_SPLIT for s in seen["train"])
    assert all(s >= SYNTHETIC_SEED_SPLIT for s in seen["eval"])
    # curriculum: small, light episodes at difficulty 0
    env = TrainingEnv(split="train", gpus=8, trace="synthetic:models=rlA+rlB", max_jobs=8, window_k=4, difficulty=0.0)
    env.reset(seed=0)
    assert len(env.sim.state.jobs) == 2 and env.episode_size() == (2, 0.5)


def test_real_trace_windows_come_from_the_right_split(tables_dir, tmp_path):
    from agents.rl_env import TrainingEnv
    from jigsaw_env.cost_table import register_tables_dir
    register_tables_dir(tables_dir)
    n = 50
    pd.DataFrame({"job_id": np.arange(n), "arrival_s": np.arange(n) * 60.0, "num_gpus": 1,
                  "duration_s": 600.0, "model": np.where(np.arange(n) % 2, "rlA", "rlB"), "batch_size": 8}
                 ).to_csv(tmp_path / "t.csv", index=False)
    for split, lo, hi in (("train", 0, 39), ("eval", 40, 49)):
        env = TrainingEnv(split=split, gpus=8, trace=f"csv:{tmp_path / 't.csv'}", max_jobs=5, window_k=4, load=None)
        for s in range(6):
            env.reset(seed=s)
            ids = sorted(env.sim.state.jobs)
            assert lo <= ids[0] and ids[-1] <= hi and len(ids) == 5
    # with a validation fraction of 0.2: train = first floor(50 x 0.6) = 30, val = the next 10
    parts = {}
    for split in ("train", "val", "eval"):
        env = TrainingEnv(split=split, val=0.2, gpus=8, trace=f"csv:{tmp_path / 't.csv'}", max_jobs=5, window_k=4)
        parts[split] = env.split_jobs()["job_id"].tolist()
    assert parts == {"train": list(range(30)), "val": list(range(30, 40)), "eval": list(range(40, 50))}
    from agents.rl_env import training_job_ids
    cfg = {"env": {"trace": f"csv:{tmp_path / 't.csv'}", "gpus": 8}, "sampling": {"holdout": 0.2, "val": 0.2}}
    assert training_job_ids(cfg) == frozenset(range(40))  # trained on 0..29, selected on 30..39: both seen
    # bad fractions and a val split without a fraction: one clear error each
    for kw, msg in ((dict(val=0.8), "val must be in"), (dict(val=-0.1), "val must be in"),
                    (dict(split="val"), "needs a validation fraction")):
        with pytest.raises(ValueError, match=msg):
            TrainingEnv(gpus=8, trace=f"csv:{tmp_path / 't.csv'}", max_jobs=5, window_k=4, **{"split": "train", **kw})


def test_wide_share_builds_training_windows_around_wide_jobs(tables_dir, tmp_path):
    """100 jobs of 1 GPU but two of 8 (positions 10 and 70), windows of 5: with wide_share 1 every
    training window holds one of them, and each is drawn about half the time; evaluation splits
    keep uniform windows."""
    from agents.rl_env import TrainingEnv
    from jigsaw_env.cost_table import register_tables_dir
    register_tables_dir(tables_dir)
    n = 100
    g = np.ones(n, dtype=int)
    g[[10, 70]] = 8
    pd.DataFrame({"job_id": np.arange(n), "arrival_s": np.arange(n) * 60.0, "num_gpus": g, "duration_s": 600.0,
                  "model": "rlA", "batch_size": 8}).to_csv(tmp_path / "t.csv", index=False)
    spec = f"csv:{tmp_path / 't.csv'}"
    env = TrainingEnv(split="train", holdout=0.1, wide_share=1.0, gpus=8, trace=spec, max_jobs=5, window_k=4, load=None)
    hits = []
    for s in range(60):
        env.reset(seed=s)
        ids = set(env.sim.state.jobs)
        assert len(ids) == 5 and (10 in ids) != (70 in ids)
        hits.append(10 in ids)
    assert 15 <= sum(hits) <= 45
    ev = TrainingEnv(split="eval", holdout=0.5, wide_share=1.0, gpus=8, trace=spec, max_jobs=5, window_k=4, load=None)
    assert ev.wide_share == 0.0
    with pytest.raises(ValueError, match="wide_share"):
        TrainingEnv(split="train", wide_share=1.5, gpus=8, trace=spec, max_jobs=5, window_k=4)


def test_warm_started_run_selects_best_on_the_validation_split(tables_dir, tmp_path):
    """--val: the callback plays validation episodes, the clone is evaluated before any update,
    and best/ is a RUN_DIR of its own that LearnedAgent loads."""
    from agents.rl import LearnedAgent
    from agents.rl_env import SYNTHETIC_VAL_BASE

    run = tmp_path / "val"
    rc = main(tiny_args(tables_dir, run, "--vec", "dummy", "--n-envs", "1", "--timesteps", "128", "--n-steps", "64",
                        "--eval-freq", "100000", "--eval-episodes", "1", "--no-tensorboard", "--val", "0.1",
                        "--warm-start", "fifo", "--warm-start-s", "0.5", "--bc-epochs", "1", "--dagger-rounds", "0"))
    assert rc == 0
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["sampling"]["val"] == 0.1 and cfg["sampling"]["select_on"] == "val"
    ev = pd.read_csv(run / "eval.csv")
    # the clone before the first update (freq 100000), then the final model when learning ends
    assert ev["timesteps"].tolist() == [1, cfg["trained_timesteps"]] and cfg["trained_timesteps"] >= 128
    best = json.loads((run / "best" / "config.json").read_text())
    assert best["selected_on"] == "val"
    # best/ is the first evaluation with the highest return, and holds that model's weights
    chosen = int(ev["timesteps"].iloc[int(ev["mean_reward"].to_numpy().argmax())])
    assert best["trained_timesteps"] == chosen
    import torch
    a, b = LearnedAgent(run / "best"), LearnedAgent(run / "warm_start" if chosen == 1 else run)
    for (k, x), (_, y) in zip(a.model.policy.state_dict().items(), b.model.policy.state_dict().items()):
        assert torch.equal(x, y), k
    # the validation episodes came from the validation seeds
    from agents.rl_env import TrainingEnv
    env = TrainingEnv(split="val", val=0.1, gpus=8, trace="synthetic:models=rlA+rlB", max_jobs=5, window_k=4)
    import agents.rl_env as rl_env  # where the training env loads its traces
    seen, orig = [], rl_env.load_trace
    rl_env.load_trace = lambda spec, **kw: (seen.append(int(spec.rsplit("seed=", 1)[1])), orig(spec, **kw))[1]
    try:
        env.reset(seed=3)
    finally:
        rl_env.load_trace = orig
    assert seen and all(SYNTHETIC_VAL_BASE <= x < SYNTHETIC_VAL_BASE + 2**30 for x in seen)


@pytest.mark.parametrize("verbose", [0, 1])
def test_a_run_without_tensorboard_leaves_nothing_in_the_temp_folder(verbose, tables_dir, tmp_path, monkeypatch,
                                                                      capsys):
    """SB3 left to itself makes an empty $TMPDIR/SB3-<timestamp> folder on each learn() without
    TensorBoard; the run's own logger makes none and still prints SB3's table when verbose."""
    import tempfile

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.delenv("SB3_LOGDIR", raising=False)
    run = tmp_path / "run"
    rc = main(tiny_args(tables_dir, run, "--vec", "dummy", "--n-envs", "1", "--timesteps", "64", "--n-steps", "32",
                        "--batch-size", "32", "--n-epochs", "1", "--eval-freq", "100000", "--no-tensorboard",
                        "--verbose", str(verbose)))
    assert rc == 0
    assert [p.name for p in tmp.iterdir() if p.name.startswith("SB3-")] == []  # (torch may cache there)
    assert not (run / "tb").exists()
    out = capsys.readouterr().out
    assert ("total_timesteps" in out) == bool(verbose)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["ppo", "a2c"])
def test_plain_ppo_and_a2c_train_and_act(algo, tables_dir, tmp_path):
    from agents.rl import LearnedAgent

    run = tmp_path / algo
    extra = ["--n-steps", "8"] if algo == "a2c" else []
    # no evaluation during training: an untrained unmasked policy wastes whole rounds on no-ops
    rc = main(tiny_args(tables_dir, run, "--algo", algo, "--vec", "dummy", "--n-envs", "1", "--timesteps", "256",
                        "--eval-freq", "100000", "--no-tensorboard", *extra))
    assert rc == 0
    agent = LearnedAgent(run)
    assert agent.algo == algo
    # trained without masks, it acts masked. Whether 256 steps of learning start jobs depends on
    # the initial weights, so finishing the episode is not asserted (an untrained a2c advanced
    # for ever).
    assert_acts_masked(agent)


def test_bad_input_one_line_exit_2(tables_dir, tmp_path, capsys):
    rc = main(["train", "--run-dir", str(tmp_path / "nothing"), "--resume", "--timesteps", "10"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "config.json" in err[0]
    rc = main(tiny_args(tables_dir, tmp_path / "r", "--trace", "synthetic:models=nosuchmodel", "--timesteps", "64"))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "nosuchmodel" in err[0]
    (tmp_path / "exists").mkdir()
    (tmp_path / "exists" / "config.json").write_text("{}")
    rc = main(tiny_args(tables_dir, tmp_path / "exists", "--timesteps", "64"))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--resume" in err[0]
    rc = main(tiny_args(tables_dir, tmp_path / "w", "--timesteps", "64", "--warm-start", "fifo", "--bc-width-power", "-1"))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--bc-width-power" in err[0] and ">= 0" in err[0]
    rc = main(tiny_args(tables_dir, tmp_path / "v", "--timesteps", "64", "--val", "0.85"))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--val must be in [0, 1 - --holdout) = [0, 0.8), got 0.85" in err[0]
    assert not (tmp_path / "v").exists()
    assert not (tmp_path / "w").exists()  # refused before anything is written


def test_train_agent_script_entry_point(tables_dir, tmp_path):
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, os.path.join(root, "train_agent.py"), "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--algo" in r.stdout and "--resume" in r.stdout


def test_train_gpus_draws_the_cluster_per_training_episode(tables_dir, tmp_path):
    """cluster_sizes (train_agent --train-gpus): each training episode runs on one of the sizes,
    drawn per episode; jobs wider than it are capped to it; the same seed draws the same jobs
    whatever the sizes; validation episodes (--val-gpus) draw theirs the same way; the held-out
    split keeps ``gpus``; each size keeps its own cost model."""
    from agents.rl_env import TrainingEnv
    from jigsaw_env.cost_table import register_tables_dir
    register_tables_dir(tables_dir)
    n = 100
    g = np.where(np.arange(n) % 3 == 0, 16, 1)
    pd.DataFrame({"job_id": np.arange(n), "arrival_s": np.arange(n) * 60.0, "num_gpus": g, "duration_s": 600.0,
                  "model": "rlA", "batch_size": 8}).to_csv(tmp_path / "t.csv", index=False)
    spec = f"csv:{tmp_path / 't.csv'}"
    kw = dict(holdout=0.2, gpus=16, trace=spec, max_jobs=6, window_k=4, load=1.0)
    mixed = TrainingEnv(split="train", cluster_sizes=[8, 16], **kw)
    plain = TrainingEnv(split="train", **kw)
    seen, costs = {}, {}
    for s in range(40):
        mixed.reset(seed=s)
        plain.reset(seed=s)
        size = mixed.cluster.num_gpus
        seen[size] = seen.get(size, 0) + 1
        jobs = mixed.sim.state.jobs
        assert sorted(jobs) == sorted(plain.sim.state.jobs)  # the cluster draw does not move the window
        widest = max(jobs[j].num_gpus for j in jobs)
        assert widest <= size and (widest == size) == any(plain.sim.state.jobs[j].num_gpus >= size for j in jobs)
        assert mixed.sim.state.cluster.num_gpus == size
        assert costs.setdefault(size, mixed.sim.costs) is mixed.sim.costs  # one cost model per size, reused
        assert mixed.observation_space.contains(mixed._obs())
    assert set(seen) == {8, 16} and min(seen.values()) >= 10
    with pytest.raises(ValueError, match=r"cluster_sizes: the held-out evaluation split keeps the env's own"):
        TrainingEnv(split="eval", cluster_sizes=[8], **kw)
    val = TrainingEnv(split="val", val=0.2, cluster_sizes=[8, 16], **kw)
    sizes = set()
    for s in range(12):
        val.reset(seed=s)
        sizes.add(val.cluster.num_gpus)
        assert max(j.num_gpus for j in val.sim.state.jobs.values()) <= val.cluster.num_gpus
    assert sizes == {8, 16}
    with pytest.raises(ValueError, match=r"cluster_sizes: 12 GPUs: gpus \(12\) must be a multiple of gpus_per_node \(8\)"):
        TrainingEnv(split="train", cluster_sizes=[12], **kw)
    # train_agent passes config.json's sampling.train_gpus to the training envs only, and
    # sampling.val_gpus to the validation envs only
    import train_agent
    cfg = {"env": dict(gpus=16, trace=spec, max_jobs=6, window_k=4, load=1.0), "seed": 0,
           "sampling": {"holdout": 0.2, "val": 0.1, "loads": None, "train_gpus": [8, 16]}}
    tr = train_agent.env_factories(cfg, "train", 1, 0)[0]().unwrapped
    va = train_agent.env_factories(cfg, "val", 1, 0)[0]().unwrapped
    assert tr.cluster_sizes == [8, 16] and va.cluster_sizes is None and va.cluster.num_gpus == 16
    cfg["sampling"]["val_gpus"] = [8]
    tr = train_agent.env_factories(cfg, "train", 1, 0)[0]().unwrapped
    va = train_agent.env_factories(cfg, "val", 1, 0)[0]().unwrapped
    ev = train_agent.env_factories(cfg, "eval", 1, 0)[0]().unwrapped
    assert tr.cluster_sizes == [8, 16] and va.cluster_sizes == [8] and va.cluster.num_gpus == 8
    assert ev.cluster_sizes is None and ev.cluster.num_gpus == 16


def test_train_gpus_bad_values_one_line_exit_2(tables_dir, tmp_path, capsys):
    rc = main(tiny_args(tables_dir, tmp_path / "a", "--timesteps", "64", "--train-gpus", "12"))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "--train-gpus: a cluster of 12 GPUs: gpus (12) must be a multiple of gpus_per_node (8)" in err[0]
    with pytest.raises(SystemExit) as e:
        main(tiny_args(tables_dir, tmp_path / "b", "--timesteps", "64", "--train-gpus", "8,0"))
    assert e.value.code == 2 and "--train-gpus must be comma-separated GPU counts >= 1, got '8,0'" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    # --val-gpus: the same checks, and it needs a validation split
    rc = main(tiny_args(tables_dir, tmp_path / "c", "--timesteps", "64", "--val", "0", "--val-gpus", "8"))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == ["jigsaw train: error: --val-gpus needs a validation split: pass --val F with F > 0"]
    rc = main(tiny_args(tables_dir, tmp_path / "d", "--timesteps", "64", "--val", "0.1", "--val-gpus", "8,12"))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "--val-gpus: a cluster of 12 GPUs: gpus (12) must be a multiple of gpus_per_node (8)" in err[0]
    assert not (tmp_path / "c").exists() and not (tmp_path / "d").exists()


def test_a_job_capped_to_a_smaller_episode_cluster_keeps_its_duration(tmp_path):
    """With cluster_sizes, a job wider than an episode's cluster is capped to it and its iterations
    computed at the capped width (as load_trace does): alone it runs its trace duration."""
    from agents.rl_env import TrainingEnv
    from jigsaw_env.spb import isolated_throughput

    n = 40
    pd.DataFrame({"job_id": np.arange(n), "arrival_s": np.arange(n) * 60.0,
                  "num_gpus": np.where(np.arange(n) % 4 == 0, 16, 2), "duration_s": 3600.0,
                  "model": "resnet50", "batch_size": 32}).to_csv(tmp_path / "t.csv", index=False)
    env = TrainingEnv(split="train", gpus=16, cluster_sizes=[8, 16], trace=f"csv:{tmp_path / 't.csv'}",
                      max_jobs=8, window_k=4, load=None)
    widths = set()
    for s in range(12):
        env.reset(seed=s)
        g, gpu_type = env.cluster.num_gpus, env.cluster.main_gpu_type
        for j in env.sim.state.jobs.values():
            widths.add((g, j.num_gpus))
            alone = j.iterations / isolated_throughput(j.model, j.batch_size, j.num_gpus, gpu_type)
            assert alone == pytest.approx(3600.0, rel=1e-3), (g, j.job_id, j.num_gpus)
    assert {(8, 8), (16, 16), (8, 2), (16, 2)} <= widths  # both clusters, capped and uncapped wide jobs
