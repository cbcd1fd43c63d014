"""`jigsaw export` and jigsaw_executor.onnx_policy: ONNX graph, metadata, parity with the SB3
model on real-episode and random observations (with their masks), onnxruntime + numpy only,
compatibility checks and bad input.

One tiny MaskablePPO run is trained once for the module through `jigsaw train` (test_train's
toy tables and arguments, one DummyVecEnv, 256 steps, two evaluations so that best/ exists);
a randomly initialised PPO with VecNormalize statistics fitted on real observations covers the
plain-SB3 path.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")
pytest.importorskip("sb3_contrib")

from jigsaw_env.cli import main  # noqa: E402
from train_helpers import tables_dir, tiny_args  # noqa: E402,F401  (module-scoped toy cost tables fixture)

ROOT = Path(__file__).resolve().parents[2]
# K window slots and 8 host slots of 27 features + 10; per slot: (5 menu options + 8 host options) x 7
# level/pattern combos + pause
K, D, A = 4, (4 + 8) * 27 + 10, 4 * 92 + 1


# ----------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def run_dir(tables_dir, tmp_path_factory):  # noqa: F811
    run = tmp_path_factory.mktemp("export_runs") / "mppo"
    rc = main(tiny_args(tables_dir, run, "--vec", "dummy", "--n-envs", "1", "--timesteps", "256",
                        "--eval-freq", "128", "--checkpoint-freq", "128", "--no-tensorboard", "--seed", "1"))
    assert rc == 0
    return run


@pytest.fixture(scope="module")
def onnx_path(run_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("onnx") / "policy.onnx"
    assert main(["export", str(run_dir), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def policy(onnx_path):
    from jigsaw_executor.onnx_policy import OnnxPolicy
    return OnnxPolicy(onnx_path)


@pytest.fixture(scope="module")
def sb3(run_dir, tables_dir):  # noqa: F811
    """The SB3 side: the model as saved by the trainer, and SB3's own VecNormalize rebuilt from
    the run's vecnormalize.npz."""
    import torch
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    from agents.vecnorm_file import read_vecnormalize, wrap_vecnormalize
    torch.set_num_threads(1)
    model = MaskablePPO.load(str(run_dir / "model.zip"), device="cpu")
    path = run_dir / "vecnormalize.npz"
    vn = wrap_vecnormalize(DummyVecEnv([lambda: _env(run_dir, tables_dir, 0)]), read_vecnormalize(path), path)
    return model, vn


def _env(run_dir, tables, seed):
    from agents.rl_env import make_env_fn
    cfg = json.loads((run_dir / "config.json").read_text())
    return make_env_fn(cfg["env"], split="eval", rank=0, seed=seed, tables=tables, monitor=False)()


@pytest.fixture(scope="module")
def episode_data(run_dir, tables_dir, policy):  # noqa: F811
    """>= 300 (observation, mask) pairs from real episodes, driven half by the exported policy and
    half by random feasible actions (so that the states are varied)."""
    rng = np.random.default_rng(0)
    obs_l, mask_l = [], []
    for ep in range(50):
        env = _env(run_dir, tables_dir, 100 + ep)
        obs, _ = env.reset(seed=100 + ep)
        done = False
        while not done and len(obs_l) < 320:
            mask = env.action_masks()
            obs_l.append(obs.copy())
            mask_l.append(mask.copy())
            a = policy.act(obs, mask) if rng.random() < 0.5 else int(rng.choice(np.flatnonzero(mask)))
            obs, _, term, trunc, _ = env.step(a)
            done = term or trunc
        if len(obs_l) >= 320:
            break
    obs, mask = np.stack(obs_l), np.stack(mask_l)
    assert len(obs) >= 256
    return obs, mask


def _sb3_actions(sb3, obs, mask):
    model, vn = sb3
    a, _ = model.predict(vn.normalize_obs(obs), action_masks=mask, deterministic=True)
    return np.asarray(a, dtype=np.int64)


# ----------------------------------------------------------------------------------------------- graph + metadata
def test_graph_is_valid_and_holds_normalization_mask_and_argmax(onnx_path):
    import onnx
    m = onnx.load(str(onnx_path))
    onnx.checker.check_model(m, full_check=True)
    assert max(o.version for o in m.opset_import if o.domain in ("", "ai.onnx")) >= 17
    ops = [n.op_type for n in m.graph.node]
    for op in ("Sub", "Div", "Gemm", "Where", "ArgMax"):
        assert op in ops, op
    assert [i.name for i in m.graph.input] == ["obs", "mask"]
    assert [o.name for o in m.graph.output] == ["action", "logits"]
    batch = m.graph.input[0].type.tensor_type.shape.dim[0]
    assert batch.dim_param and not batch.dim_value  # dynamic batch axis


def test_metadata_roundtrip(onnx_path, policy, run_dir):
    cfg = json.loads((run_dir / "config.json").read_text())
    sp = cfg["spaces"]
    md = policy.metadata
    assert md["format"] == "jigsaw-onnx-policy/1"
    for key in ("observation_size", "n_actions", "window_k", "spb_levels", "spb_slots", "placement_options",
                "level_pattern_combos", "job_features", "cluster_features"):
        assert md[key] == sp[key], key
    assert md["spaces"] == sp and md["env"] == cfg["env"] and md["observe_remaining"] is True
    assert (policy.observation_size, policy.n_actions, policy.window_k) == (D, A, K)
    assert md["config_sha256"] == hashlib.sha256((run_dir / "config.json").read_bytes()).hexdigest()
    assert md["model_sha256"] == hashlib.sha256((run_dir / "model.zip").read_bytes()).hexdigest()
    assert md["algo"] == "maskable_ppo" and md["obs_normalization"] == "vecnormalize"
    assert md["trained_timesteps"] == "256" and md["jigsaw_version"] not in ("", "unknown")
    assert float(md["mask_fill"]) == -1e8
    assert policy.config["env"]["observe_remaining"] is True and policy.config["spaces"] == sp


# ----------------------------------------------------------------------------------------------- parity
def test_parity_on_real_episode_observations(policy, sb3, episode_data, run_dir):
    from agents.rl import LearnedAgent
    obs, mask = episode_data
    want = _sb3_actions(sb3, obs, mask)
    got = policy.act_batch(obs, mask)
    assert len(obs) >= 256 and np.array_equal(got, want)
    assert all(mask[i, a] for i, a in enumerate(got))
    # single-observation path, and the evaluation's LearnedAgent, on every one of them
    agent = LearnedAgent(run_dir, prefer_onnx=False)
    for i in range(len(obs)):
        a = policy.act(obs[i], mask[i])
        assert a == want[i] == agent.act(obs[i], mask[i]), i
    # the observations really vary (not one state repeated)
    assert len(np.unique(obs.round(4), axis=0)) > 100 and len(np.unique(want)) > 3


def test_parity_on_random_observations(policy, sb3, run_dir):
    from jigsaw_executor.export import random_inputs
    model, _ = sb3
    rng = np.random.default_rng(7)
    obs1, mask1 = random_inputs(D, A, 300, rng)
    obs2 = np.stack([model.observation_space.sample() for _ in range(300)])  # uniform in [-1, 10]
    mask2 = rng.random((300, A)) < 0.05
    mask2[np.arange(300), rng.integers(0, A, 300)] = True
    mask2[:20] = False
    mask2[np.arange(20), rng.integers(0, A, 20)] = True  # exactly one feasible action
    for obs, mask in ((obs1, mask1), (obs2, mask2)):
        assert mask.any(axis=1).all()
        assert np.array_equal(policy.act_batch(obs, mask), _sb3_actions(sb3, obs, mask))
    assert np.array_equal(policy.act_batch(obs2[:20], mask2[:20]), np.flatnonzero(mask2[:20])[:20] % A)
    # the graph clips raw observations to the observation space, as the env does before the agent
    wild = obs1[:50] * 40.0 - 20.0
    assert np.array_equal(policy.act_batch(wild, mask1[:50]),
                          _sb3_actions(sb3, np.clip(wild, -1.0, 10.0).astype(np.float32), mask1[:50]))


def test_plain_ppo_random_init_with_fitted_normalization(tables_dir, tmp_path):  # noqa: F811
    """A randomly initialised PPO (larger logits than SB3's init) with VecNormalize statistics
    fitted on real observations, saved as a RUN_DIR by hand: the export masks it like
    LearnedAgent does."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    from agents.rl import RUN_FORMAT, LearnedAgent, spaces_signature
    from agents.vecnorm_file import write_vecnormalize
    from agents.rl_env import make_env_fn
    from jigsaw_executor.onnx_policy import OnnxPolicy

    env_kw = dict(gpus=8, gpus_per_node=8, trace="synthetic:models=rlA+rlB", max_jobs=6, window_k=K)
    venv = VecNormalize(DummyVecEnv([make_env_fn(env_kw, split="train", rank=0, seed=3, tables=tables_dir)]),
                        norm_reward=False)
    rng = np.random.default_rng(3)
    venv.reset()
    seen = []
    for _ in range(200):
        m = venv.env_method("action_masks")[0]
        obs, *_ = venv.step(np.array([int(rng.choice(np.flatnonzero(m)))]))
        seen.append((venv.get_original_obs()[0].copy(), m.copy()))
    assert np.ptp(venv.obs_rms.mean) > 0.1 and not np.allclose(venv.obs_rms.var, 1.0)
    model = PPO("MlpPolicy", venv, seed=0, device="cpu", policy_kwargs=dict(net_arch=[32, 32]))
    with torch.no_grad():
        model.policy.action_net.weight.mul_(100.0)
    run = tmp_path / "ppo"
    run.mkdir()
    model.save(str(run / "model.zip"))
    with open(run / "vecnormalize.npz", "wb") as f:
        write_vecnormalize(venv, f)
    venv.close()
    (run / "config.json").write_text(json.dumps({"format": RUN_FORMAT, "algo": "ppo", "env": env_kw,
                                                  "spaces": spaces_signature(K, 3, 4), "normalize_obs": True}))
    assert main(["export", str(run), "--check", "64"]) == 0
    pol = OnnxPolicy(run / "policy.onnx")
    agent = LearnedAgent(run, prefer_onnx=False)
    obs = np.stack([o for o, _ in seen])
    mask = np.stack([m for _, m in seen])
    got = pol.act_batch(obs, mask)
    assert np.array_equal(got, [agent.act(o, m) for o, m in zip(obs, mask)])
    assert pol.metadata["algo"] == "ppo" and pol.metadata["policy_class"] == "ActorCriticPolicy"


def test_best_model_export_uses_its_own_statistics(run_dir, tmp_path):
    from jigsaw_executor.onnx_policy import OnnxPolicy
    out = tmp_path / "best.onnx"
    assert main(["export", str(run_dir), "--best", "--out", str(out)]) == 0
    md = OnnxPolicy(out).metadata
    assert md["model_file"] == "best/best_model.zip"
    assert md["normalization_source"] == "best/vecnormalize.npz"
    # the statistics saved with the best model are the ones checkpointed at its timestep
    from agents.vecnorm_file import read_vecnormalize
    t = json.loads((run_dir / "best" / "config.json").read_text())["trained_timesteps"]
    got = read_vecnormalize(run_dir / "best" / "vecnormalize.npz")
    want = read_vecnormalize(run_dir / "checkpoints" / f"rl_model_vecnormalize_{t}_steps.npz")
    assert np.array_equal(got.obs_mean, want.obs_mean) and np.array_equal(got.obs_var, want.obs_var)
    # a best/ without its statistics: the checkpoint of the best timestep
    (run_dir / "best" / "vecnormalize.npz").rename(tmp_path / "kept.npz")
    try:
        assert main(["export", str(run_dir), "--best", "--out", str(tmp_path / "old.onnx")]) == 0
        assert OnnxPolicy(tmp_path / "old.onnx").metadata["normalization_source"] == \
            f"checkpoints/rl_model_vecnormalize_{t}_steps.npz"
    finally:
        (tmp_path / "kept.npz").rename(run_dir / "best" / "vecnormalize.npz")


# ----------------------------------------------------------------------------------------------- deployment
def test_runs_with_onnxruntime_and_numpy_alone(onnx_path, episode_data, sb3, tmp_path):
    obs, mask = episode_data
    np.savez(tmp_path / "io.npz", obs=obs, mask=mask)
    code = (
        "import sys, json\n"
        "for name in ('torch', 'stable_baselines3', 'sb3_contrib', 'gymnasium', 'pandas', 'scipy', 'onnx',\n"
        "             'jigsaw_env', 'agents', 'traces'):\n"
        "    sys.modules[name] = None  # any import of these now fails\n"
        "import numpy as np\n"
        "from jigsaw_executor.onnx_policy import OnnxPolicy\n"
        f"d = np.load({str(tmp_path / 'io.npz')!r})\n"
        f"p = OnnxPolicy({str(onnx_path)!r})\n"
        "p.check_compatible(obs_size=d['obs'].shape[1], n_actions=d['mask'].shape[1])\n"
        "batch = p.act_batch(d['obs'], d['mask']).tolist()\n"
        "single = [p.act(o, m) for o, m in zip(d['obs'], d['mask'])]\n"
        "third = sorted(m for m in sys.modules if sys.modules[m] is not None and '.' not in m\n"
        "               and m in ('numpy', 'onnxruntime', 'torch', 'onnx'))\n"
        "print(json.dumps({'batch': batch, 'single': single, 'modules': third}))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT),
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    want = _sb3_actions(sb3, obs, mask).tolist()
    assert out["batch"] == want and out["single"] == want
    assert out["modules"] == ["numpy", "onnxruntime"]


def test_scheduler_drives_the_simulator_like_the_run_dir(onnx_path, run_dir, tables_dir):  # noqa: F811
    """The same LearnedScheduler (encoder, masks, one action per step until advance) with the ONNX
    policy plays exactly the episode the RUN_DIR plays."""
    from agents.rl import LearnedScheduler
    from jigsaw_env.cluster import ClusterSpec
    from jigsaw_env.cost_table import register_tables_dir
    from jigsaw_env.simulator import SimConfig, Simulator
    from jigsaw_env.spb import SPBConfig
    from jigsaw_executor.onnx_policy import make_scheduler
    from traces import load_trace
    register_tables_dir(tables_dir)
    jobs = load_trace("synthetic:models=rlA+rlB,jobs=8,seed=11", cluster_gpus=8).jobs
    sims = []
    for sched in (LearnedScheduler(run_dir), make_scheduler(onnx_path, spb=SPBConfig())):
        sim = Simulator(ClusterSpec.from_gpus(8), jobs, SimConfig(round_s=300.0))
        sim.run(sched.schedule)
        assert sim.num_finished == len(jobs)
        sims.append(sim)
    pd.testing.assert_frame_equal(sims[0].jobs_frame(), sims[1].jobs_frame())


def test_scheduler_needs_no_torch(onnx_path, tables_dir):  # noqa: F811
    code = (
        "import sys\n"
        "for name in ('torch', 'stable_baselines3', 'sb3_contrib'):\n"
        "    sys.modules[name] = None\n"
        "from jigsaw_env.cost_table import register_tables_dir\n"
        "from jigsaw_env.cluster import ClusterSpec\n"
        "from jigsaw_env.simulator import SimConfig, Simulator\n"
        "from jigsaw_env.spb import SPBConfig\n"
        "from jigsaw_executor.onnx_policy import make_scheduler\n"
        "from traces import load_trace\n"
        f"register_tables_dir({tables_dir!r})\n"
        "jobs = load_trace('synthetic:models=rlA+rlB,jobs=5,seed=4', cluster_gpus=8).jobs\n"
        "sim = Simulator(ClusterSpec.from_gpus(8), jobs, SimConfig(round_s=300.0))\n"
        f"sim.run(make_scheduler({str(onnx_path)!r}, spb=SPBConfig()).schedule)\n"
        "print(sim.num_finished)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT),
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "5"


def test_check_compatible(policy, onnx_path):
    from agents.rl import EvalSpaces
    from jigsaw_env.cluster import ClusterSpec
    from jigsaw_env.simulator import SimConfig, Simulator
    from jigsaw_env.spb import SPBConfig
    from jigsaw_executor.onnx_policy import make_scheduler
    policy.check_compatible(obs_size=D, n_actions=A, window_k=K, spb_levels=3, spb_slots=4,
                            placement_options=["keep", "consolidated", "spread", "packed", "paired"]
                            + [f"host:{r}" for r in range(8)], observe_remaining=True)
    policy.check_compatible(EvalSpaces(None, 3, 4))
    policy.check_compatible(EvalSpaces(K, 3, 4))
    cases = [
        (dict(obs_size=D + 16), f"observation size expected {D + 16}, found {D}"),
        (dict(n_actions=A - 1), f"action count expected {A - 1}, found {A}"),
        (dict(window_k=8), "window K expected 8, found 4"),
        (dict(spb_levels=2), "SPB levels expected 2, found 3"),
        (dict(spb_slots=2), "SPB slots expected 2, found 4"),
        (dict(placement_options=["keep", "packed"]), "placement menu"),
        (dict(observe_remaining=False), "observe_remaining expected False, found True"),
    ]
    for kw, msg in cases:
        with pytest.raises(ValueError) as e:
            policy.check_compatible(**kw)
        assert msg in str(e.value) and "\n" not in str(e.value), kw
    with pytest.raises(ValueError, match=rf"observation size expected {(8 + 8) * 27 + 10} \(feature groups "
                                         rf"base,oracle,history,las,fill\), found {D}"):
        policy.check_compatible(EvalSpaces(8, 3, 4))
    with pytest.raises(ValueError, match="action count expected 265, found 369"):
        policy.check_compatible(EvalSpaces(None, 2, 4))
    # before any job starts: at construction with the deployment's SPB config, else at the first round
    with pytest.raises(ValueError, match="action count expected 265, found 369"):
        make_scheduler(onnx_path, spb=SPBConfig(max_level=2))
    from traces import load_trace
    jobs = load_trace("synthetic:jobs=3,seed=1", cluster_gpus=8).jobs
    sim = Simulator(ClusterSpec.from_gpus(8), jobs, SimConfig(round_s=300.0, spb=SPBConfig(max_level=2)))
    with pytest.raises(ValueError, match="action count expected 265"):
        sim.run(make_scheduler(onnx_path).schedule)
    assert all(j.attained_gpu_s == 0 for j in sim.state.jobs.values())


def test_act_rejects_bad_inputs(policy):
    obs = np.zeros(D, np.float32)
    mask = np.zeros(A, bool)
    with pytest.raises(ValueError, match="no feasible action"):
        policy.act(obs, mask)
    mask[-1] = True
    assert policy.act(obs, mask) == A - 1
    with pytest.raises(ValueError, match=f"observation of {D} values"):
        policy.act(np.zeros(D + 1, np.float32), mask)
    with pytest.raises(ValueError, match="non-finite"):
        policy.act(np.full(D, np.nan, np.float32), mask)
    with pytest.raises(ValueError, match=r"mask \[N, 369\]"):
        policy.act_batch(np.zeros((2, D), np.float32), np.ones((3, A), bool))
    assert policy.logits(obs).shape == (1, A)


def test_bad_onnx_files(onnx_path, tmp_path):
    import onnx
    from onnx import TensorProto, helper

    from jigsaw_executor.onnx_policy import OnnxPolicy
    with pytest.raises(FileNotFoundError, match="not found"):
        OnnxPolicy(tmp_path / "missing.onnx")
    bad = tmp_path / "garbage.onnx"
    bad.write_bytes(b"this is not a protobuf \x00\x01\x02" * 10)
    trunc = tmp_path / "truncated.onnx"
    trunc.write_bytes(onnx_path.read_bytes()[: onnx_path.stat().st_size // 2])
    for p in (bad, trunc):
        with pytest.raises(ValueError) as e:
            OnnxPolicy(p)
        assert str(p) in str(e.value) and "not a valid ONNX model" in str(e.value) and "\n" not in str(e.value)
    # a valid ONNX model that is not a jigsaw policy
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    other = tmp_path / "other.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(other))
    with pytest.raises(ValueError, match="not a jigsaw policy"):
        OnnxPolicy(other)
    # metadata that does not match the graph (a policy whose observation size or action space
    # does not match its configuration)
    for key, val, msg in (("observation_size", "90", f"observation size expected 90 (metadata), found {D}"),
                          ("n_actions", "370", "action count expected 370 (metadata), found 369")):
        m = onnx.load(str(onnx_path))
        for p in m.metadata_props:
            if p.key == key:
                p.value = val
        f = tmp_path / f"tampered-{key}.onnx"
        onnx.save(m, str(f))
        with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(")", r"\)")):
            OnnxPolicy(f)
    # the window order and pause mode the policy was trained with: its env's, checked; the
    # defaults when absent
    assert (OnnxPolicy(onnx_path).window_order, OnnxPolicy(onnx_path).pause) == ("attained", "leave")
    for field, value, allowed in (("window_order", "las", None), ("window_order", "arrival", "'attained', 'las', 'remaining'"),
                                  ("pause", "requeue", None), ("pause", "drop", "'leave', 'requeue'"),
                                  ("pause", None, None)):
        m = onnx.load(str(onnx_path))
        for p in m.metadata_props:
            if p.key == "env":
                env = json.loads(p.value)
                env.pop(field, None)
                p.value = json.dumps(env if value is None else dict(env, **{field: value}))
        f = tmp_path / f"{field}-{value}.onnx"
        onnx.save(m, str(f))
        if value is None:
            assert OnnxPolicy(f).pause == "leave"
        elif allowed is None:
            assert getattr(OnnxPolicy(f), field) == value
        else:
            with pytest.raises(ValueError, match=fr"env.{field} expected one of \[{allowed}\], got '{value}'"):
                getattr(OnnxPolicy(f), field)
    # whether its env spilled waiting jobs on advance: false when absent, a boolean otherwise
    assert OnnxPolicy(onnx_path).spill is False
    for value in (True, "yes"):
        m = onnx.load(str(onnx_path))
        for p in m.metadata_props:
            if p.key == "env":
                p.value = json.dumps(dict(json.loads(p.value), spill=value))
        f = tmp_path / f"spill-{value}.onnx"
        onnx.save(m, str(f))
        if value is True:
            assert OnnxPolicy(f).spill is True
        else:
            with pytest.raises(ValueError, match=r"env.spill expected true or false, got 'yes'"):
                OnnxPolicy(f).spill


def test_export_bad_run_dirs_one_line_exit_2(run_dir, tmp_path, capsys):
    def err_of(*argv):
        rc = main(["export", *map(str, argv)])
        lines = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(lines) == 1, (rc, lines)
        return lines[0]

    assert err_of(tmp_path / "nope") == f"jigsaw export: error: run directory not found: {tmp_path / 'nope'}"
    (tmp_path / "empty").mkdir()
    assert err_of(tmp_path / "empty") == (f"jigsaw export: error: {tmp_path / 'empty'} is not a training run: expected "
                                          "config.json, model.zip and vecnormalize.npz (written by `jigsaw train`)")

    def copy(name):
        d = tmp_path / name
        shutil.copytree(run_dir, d, ignore=shutil.ignore_patterns("checkpoints", "*.png", "*.onnx"))
        return d

    d = copy("nomodel")
    (d / "model.zip").unlink()
    assert err_of(d) == f"jigsaw export: error: {d}: expected the trained model model.zip (is training finished?)"
    corrupt = "not a stable-baselines3 model (not a zip archive; corrupted?)"
    d = copy("corrupt")
    (d / "model.zip").write_bytes(b"PK\x03\x04 truncated")
    assert err_of(d) == f"jigsaw export: error: {d / 'model.zip'}: {corrupt}"
    d = copy("corrupt2")
    (d / "model.zip").write_bytes((run_dir / "model.zip").read_bytes()[:4000])
    assert err_of(d) == f"jigsaw export: error: {d / 'model.zip'}: {corrupt}"
    import zipfile
    d = copy("foreignzip")
    with zipfile.ZipFile(d / "model.zip", "w") as z:
        z.writestr("data", "not the SB3 data file")
    assert "cannot load it as a maskable_ppo model" in err_of(d)
    d = copy("badvn")
    (d / "vecnormalize.npz").write_bytes(b"\x80\x04garbage")
    assert err_of(d).startswith(f"jigsaw export: error: {d / 'vecnormalize.npz'}: cannot read the VecNormalize statistics")
    d = copy("novn")
    (d / "vecnormalize.npz").unlink()
    assert err_of(d) == f"jigsaw export: error: {d}: expected vecnormalize.npz (the observation statistics)"
    d = copy("pklvn")
    (d / "vecnormalize.npz").rename(d / "vecnormalize.pkl")
    assert "vecnormalize.pkl: VecNormalize statistics as a pickle" in err_of(d)
    d = copy("nobest")
    shutil.rmtree(d / "best")
    assert "best/best_model.zip" in err_of(d, "--best")
    # config.json says K = 5 (consistent with this code's encoder), the model was trained with K = 4
    from agents.rl import spaces_signature
    d = copy("mismatch")
    cfg = json.loads((d / "config.json").read_text())
    cfg["spaces"] = spaces_signature(5, 3, 4)
    (d / "config.json").write_text(json.dumps(cfg))
    assert "observation size expected 361 (config.json), found (334,)" in err_of(d)
    # same observation size, another action count (SPB levels 2)
    cfg["spaces"] = spaces_signature(4, 2, 4)
    (d / "config.json").write_text(json.dumps(cfg))
    assert "action count expected 265 (config.json), found 369" in err_of(d)
    # config.json out of step with this code's codec
    cfg["spaces"] = dict(spaces_signature(4, 3, 4), n_actions=999)
    (d / "config.json").write_text(json.dumps(cfg))
    assert "action count expected 369, found 999 in config.json" in err_of(d)
    # a run of the action space without host slots (5 placement options, no host blocks in the
    # observation): refused, the sizes named
    cfg["spaces"] = dict(spaces_signature(4, 3, 4), placement_options=["keep", "consolidated", "spread", "packed",
                                                                       "paired"], observation_size=118, n_actions=145)
    del cfg["spaces"]["host_slots"]
    (d / "config.json").write_text(json.dumps(cfg))
    assert err_of(d).endswith("the run was trained for another observation/action layout than this code's: "
                              "observation size expected 334 (feature groups base,oracle,history,las,fill), "
                              "found 118 in config.json")
    assert "--opset" in err_of(run_dir, "--opset", "9", "--out", tmp_path / "x.onnx")
    (tmp_path / "adir").mkdir()
    assert "directory" in err_of(run_dir, "--out", tmp_path / "adir")
    assert not list(tmp_path.rglob("*.onnx"))


def test_benchmark_reports_the_latency_statistics(policy, record_property):
    """OnnxPolicy.benchmark (what `jigsaw export --bench` and `python -m bench` report) times
    every call: n calls, ordered statistics. The numbers themselves belong to bench/results.md,
    not to an assertion."""
    r = policy.benchmark(300, warmup=10)
    record_property("onnx_act_median_ms", r["median_ms"])
    assert set(r) == {"n", "median_ms", "p99_ms", "mean_ms"} and r["n"] == 300
    assert 0 < r["median_ms"] <= r["p99_ms"] and r["mean_ms"] > 0


def test_a_run_folder_with_its_export_acts_with_the_onnx_graph(run_dir, episode_data, sb3, tables_dir, tmp_path,  # noqa: F811
                                                               capsys):
    """``jigsaw evaluate`` and ``deploy`` use RUN_DIR/policy.onnx when it was exported from the
    folder's model.zip (or there is no model.zip), and model.zip when the export is stale."""
    from agents.rl import LearnedAgent
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    assert main(["export", str(run), "--check", "0"]) == 0
    agent = LearnedAgent(run)
    assert agent.policy_file == "policy.onnx" and agent.model is None
    obs, mask = episode_data
    want = _sb3_actions(sb3, obs, mask)
    assert [agent.act(o, m) for o, m in zip(obs, mask)] == want.tolist()
    # without model.zip (a run folder shared as config.json + policy.onnx): the graph alone
    (run / "model.zip").unlink()
    assert LearnedAgent(run).policy_file == "policy.onnx"
    out = tmp_path / "eval"
    capsys.readouterr()
    assert main(["evaluate", "--agents", f"fifo,{run}", "--tables", str(tables_dir), "--gpus", "8",
                 "--max-jobs", "3", "--seeds", "1", "--workers", "1", "--no-progress", "--out", str(out)]) == 0
    md = json.loads((out / "metadata.json").read_text())
    assert md["learned_agents"]["run"]["policy_file"] == "policy.onnx"
    # a model.zip the export was not made from: the export is stale, model.zip is loaded
    shutil.copy(run_dir / "best" / "best_model.zip", run / "model.zip")
    assert LearnedAgent(run).policy_file == "model.zip"
