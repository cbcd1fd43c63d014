"""Files a user hands to the CLI are data: no code runs from them (docs/security.md).

Known answers: a doctored ``scheduler_state.json`` whose ``scheduler_pickle`` would create a marker
file when unpickled is refused in one line and the marker is never created; so is a RUN_DIR whose
only VecNormalize statistics are a ``vecnormalize.pkl`` that would create a marker (``evaluate``,
``export``, ``deploy``, ``train --resume``); ``vecnormalize.npz`` is read with ``allow_pickle=False``;
and, statically, no user-reachable module calls ``pickle.load(s)``, ``VecNormalize.load`` or
``torch.load(..., weights_only=False)``.
"""
from __future__ import annotations

import ast
import base64
import json
import pickle
from pathlib import Path

import pytest

from jigsaw_env.cli import main

ROOT = Path(__file__).resolve().parents[2]


class _Marker:
    """Unpickling it opens (creates) a file: what a hostile pickle could do."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def _doctored_run(tmp_path: Path, marker: Path) -> Path:
    out = tmp_path / "run"
    out.mkdir()
    blob = base64.b64encode(pickle.dumps(_Marker(marker))).decode("ascii")
    (out / "scheduler_state.json").write_text(json.dumps({"format": "jigsaw-live-state/1", "scheduler_pickle": blob}))
    return out


def test_the_doctored_pickle_would_run_code(tmp_path):
    """The known answer has teeth: unpickling the blob does create the marker."""
    marker = tmp_path / "would"
    out = _doctored_run(tmp_path, marker)
    blob = json.loads((out / "scheduler_state.json").read_text())["scheduler_pickle"]
    pickle.loads(base64.b64decode(blob)).close()
    assert marker.exists()


def test_deploy_resume_refuses_a_pickled_scheduler_and_runs_nothing(tmp_path, capsys):
    marker = tmp_path / "marker"
    out = _doctored_run(tmp_path, marker)
    assert main(["deploy", "--resume", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"jigsaw deploy: error: {out}/scheduler_state.json: written by an earlier version")
    assert "scheduler_pickle" in err and "\n" not in err
    assert not marker.exists()


def test_restore_from_a_state_with_the_field_anywhere_is_refused(tmp_path):
    """Even with the current format, a state carrying ``scheduler_pickle`` is refused unread."""
    from jigsaw_executor.live import SNAPSHOT_FORMAT, LiveExecutor

    marker = tmp_path / "marker"
    out = _doctored_run(tmp_path, marker)
    snap = json.loads((out / "scheduler_state.json").read_text())
    snap["format"] = SNAPSHOT_FORMAT
    (out / "scheduler_state.json").write_text(json.dumps(snap))
    with pytest.raises(ValueError, match="written by an earlier version"):
        LiveExecutor.restore(out)
    assert not marker.exists()


# ------------------------------------------------------------------------------------------ VecNormalize statistics
def _ppo_run(path: Path) -> Path:
    """A RUN_DIR with a randomly initialised PPO, config.json, observation statistics expected."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    from agents.rl import RUN_FORMAT, spaces_signature
    from agents.rl_env import make_env_fn

    env_kw = dict(gpus=4, gpus_per_node=4, trace="synthetic:models=tiny_mlp+tiny_cnn", max_jobs=4, window_k=4)
    venv = DummyVecEnv([make_env_fn(env_kw, split="train", rank=0, seed=0, monitor=False)])
    model = PPO("MlpPolicy", venv, seed=0, device="cpu", n_steps=8, batch_size=8, policy_kwargs=dict(net_arch=[8]))
    path.mkdir()
    model.save(str(path / "model.zip"))
    venv.close()
    (path / "config.json").write_text(json.dumps({"format": RUN_FORMAT, "algo": "ppo", "env": env_kw,
                                                  "spaces": spaces_signature(4, 3, 4), "normalize_obs": True,
                                                  "seed": 0}))
    return path


@pytest.fixture(scope="module")
def doctored_run(tmp_path_factory):
    """A RUN_DIR whose only statistics file is a ``vecnormalize.pkl`` that creates a marker when unpickled."""
    pytest.importorskip("stable_baselines3")
    base = tmp_path_factory.mktemp("doctored")
    run = _ppo_run(base / "run")
    marker = base / "marker"
    (run / "vecnormalize.pkl").write_bytes(pickle.dumps(_Marker(marker)))
    return run, marker


def test_the_doctored_vecnormalize_would_run_code(doctored_run, tmp_path):
    run, _ = doctored_run
    would = tmp_path / "would"
    pickle.loads(pickle.dumps(_Marker(would))).close()
    assert would.exists()


@pytest.mark.parametrize("command", ["evaluate", "export", "deploy"])
def test_a_pickled_vecnormalize_is_refused_unread(doctored_run, command, tmp_path, capsys):
    run, marker = doctored_run
    argv = {"evaluate": ["evaluate", "--agents", str(run), "--gpus", "8", "--max-jobs", "3", "--out", str(tmp_path / "o")],
            "export": ["export", str(run)],
            "deploy": ["deploy", "--policy", str(run), "--demo", "--slots", "2", "--allow-oversubscribe",
                       "--out", str(tmp_path / "o")]}[command]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"jigsaw {command}: error: {run}/vecnormalize.pkl: VecNormalize statistics as a pickle")
    assert "retrain the run, or convert" in err and "\n" not in err
    assert not marker.exists()


def test_train_resume_refuses_a_pickled_checkpoint_unread(doctored_run):
    import train_agent

    run, marker = doctored_run
    steps, model_path, vn_path = train_agent._latest_checkpoint(run)
    assert vn_path == run / "vecnormalize.pkl"
    with pytest.raises(ValueError, match="VecNormalize statistics as a pickle"):
        train_agent._resume_venv(None, vn_path)
    assert not marker.exists()


def test_a_pickle_named_npz_and_an_object_array_are_refused(tmp_path):
    """``allow_pickle=False``: neither a pickle under the .npz name nor an .npz holding an object
    array (a pickle inside) is unpickled."""
    import numpy as np

    from agents.vecnorm_file import read_vecnormalize

    marker = tmp_path / "marker"
    fake = tmp_path / "vecnormalize.npz"
    fake.write_bytes(pickle.dumps(_Marker(marker)))
    with pytest.raises(ValueError, match="cannot read the VecNormalize statistics"):
        read_vecnormalize(fake)
    inner = tmp_path / "inner.npz"
    np.savez(inner, obs_mean=np.array([_Marker(marker)], dtype=object))
    with pytest.raises(ValueError, match="cannot read the VecNormalize statistics|format_version"):
        read_vecnormalize(inner)
    assert not marker.exists()


def test_statistics_round_trip_through_npz(tmp_path):
    """vecnormalize.npz rebuilds the VecNormalize it was written from, field for field."""
    import gymnasium as gym
    import numpy as np
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    from agents.vecnorm_file import read_vecnormalize, wrap_vecnormalize, write_vecnormalize

    vn = VecNormalize(DummyVecEnv([lambda: gym.make("CartPole-v1")]), gamma=0.9, clip_obs=5.0, clip_reward=3.0)
    vn.reset()
    for _ in range(40):
        vn.step(np.array([vn.action_space.sample()]))
    path = tmp_path / "vecnormalize.npz"
    with open(path, "wb") as f:
        write_vecnormalize(vn, f)
    back = wrap_vecnormalize(DummyVecEnv([lambda: gym.make("CartPole-v1")]), read_vecnormalize(path), path)
    for rms in ("obs_rms", "ret_rms"):
        for k in ("mean", "var", "count"):
            want, got = getattr(getattr(vn, rms), k), getattr(getattr(back, rms), k)
            assert np.array_equal(want, got) and type(want) is type(got), (rms, k)
    for k in ("clip_obs", "clip_reward", "epsilon", "gamma", "norm_obs", "norm_reward", "training"):
        assert getattr(vn, k) == getattr(back, k), k


# ------------------------------------------------------------------------------------------ static check
#: packages and scripts whose code runs on files a user names on the command line
USER_REACHABLE = ["agents", "jigsaw_env", "jigsaw_executor", "train_agent.py"]


def _modules() -> list[Path]:
    out = []
    for name in USER_REACHABLE:
        p = ROOT / name
        out += [p] if p.is_file() else sorted(p.rglob("*.py"))
    return out


def _unsafe_calls(path: Path) -> list[str]:
    """``pickle.load``/``pickle.loads``/``pickle.Unpickler``, ``VecNormalize.load`` (a pickle) and
    ``torch.load`` calls without ``weights_only=True``."""
    found = []
    name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        owner = node.func.value.id if isinstance(node.func.value, ast.Name) else None
        if owner == "pickle" and node.func.attr in ("load", "loads", "Unpickler"):
            found.append(f"{name}:{node.lineno}: pickle.{node.func.attr}")
        if owner == "VecNormalize" and node.func.attr == "load":
            found.append(f"{name}:{node.lineno}: VecNormalize.load")
        if owner == "torch" and node.func.attr == "load":
            kw = {k.arg: k.value for k in node.keywords}
            safe = isinstance(kw.get("weights_only"), ast.Constant) and kw["weights_only"].value is True
            if not safe:
                found.append(f"{name}:{node.lineno}: torch.load without weights_only=True")
        if owner == "np" and node.func.attr == "load":
            kw = {k.arg: k.value for k in node.keywords}
            if isinstance(kw.get("allow_pickle"), ast.Constant) and kw["allow_pickle"].value is True:
                found.append(f"{name}:{node.lineno}: np.load with allow_pickle=True")
    return found


def test_no_user_reachable_module_unpickles():
    assert [c for p in _modules() for c in _unsafe_calls(p)] == []


def test_the_static_check_finds_what_it_looks_for(tmp_path):
    """The check has teeth: each unsafe call it names is found in a module that makes it."""
    mod = tmp_path / "unsafe_sample.py"
    mod.write_text("import pickle, torch, numpy as np\nfrom x import VecNormalize\n"
                   "pickle.load(f)\ntorch.load(p)\nVecNormalize.load(p, v)\nnp.load(p, allow_pickle=True)\n")
    assert len(_unsafe_calls(mod)) == 4
