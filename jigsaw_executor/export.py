"""``jigsaw export RUN_DIR --out policy.onnx``: a trained policy as one self-contained ONNX graph.

The graph takes the raw observation of :class:`~jigsaw_env.encoder.ObservationEncoder` and the
exact action mask of :class:`~jigsaw_env.actions.RoundBuilder` and returns the action, so a
deployment needs onnxruntime and numpy only (:mod:`jigsaw_executor.onnx_policy`)::

    inputs   obs    float32 [N, D]   raw encoder observation (D = (K + H) * 27 + 10 with every
                                     feature group, H = 8 host slots)
             mask   bool    [N, A]   True = feasible action (A = K * ((5 + H) * (1 + 2L) + 1) + 1)
    outputs  action int64   [N]      argmax of the masked logits
             logits float32 [N, A]   the policy's logits, before masking

    obs -> clip to the observation space [-1, 10]          (what the env does before the agent)
        -> (obs - mean) / sqrt(var + eps), clip +-clip_obs  (VecNormalize, float64 as SB3 does)
        -> features extractor -> mlp_extractor.policy_net -> action_net  (float32 logits)
        -> where(mask, logits, -1e8) -> argmax              (sb3-contrib MaskableCategorical)

The ONNX model's metadata (``metadata_props``) records the layout the policy was trained for
(observation size, action count, window K, SPB levels and slots, placement menu, encoder feature
counts and feature groups ``obs_features``, observe_remaining), the normalization, the jigsaw version and the sha256 of the run's
config.json and model file, so a deployment checks compatibility before any job starts
(:meth:`jigsaw_executor.onnx_policy.OnnxPolicy.check_compatible`). docs/export.md has the details.

torch, onnx and stable-baselines3 are imported inside the functions, so registering the
subcommand costs nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import time
import warnings
import zipfile
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces as gspaces

from agents.rl import algo_class, read_run_config, run_features, spaces_signature
from agents.shipped import is_shipped_name, shipped_policy
from agents.vecnorm_file import FILE_NAME as VECNORM_FILE
from jigsaw_env.cli_args import file_above
from jigsaw_env.digest import file_sha256
from agents.vecnorm_file import read_vecnormalize, stats_path

from .onnx_policy import OnnxPolicy

FORMAT = "jigsaw-onnx-policy/1"
MASK_FILL = -1e8  # sb3-contrib MaskableCategorical's HUGE_NEG
DEFAULT_OPSET = 17
INPUT_NAMES = ("obs", "mask")
OUTPUT_NAMES = ("action", "logits")
MIN_OPSET = 13


# ----------------------------------------------------------------------------------------------- loading
@dataclass
class LoadedRun:
    """What the exporter reads from RUN_DIR."""

    run_dir: Path
    config: dict
    model: Any                      # the SB3 / sb3-contrib algorithm
    model_path: Path
    obs_mean: np.ndarray | None     # float64 [D] (None: the run does not normalize observations)
    obs_var: np.ndarray | None
    epsilon: float = 1e-8
    clip_obs: float = 10.0
    normalization_source: str = "none"
    notes: list[str] = field(default_factory=list)
    #: the observation's feature groups (config.json's spaces.obs_features; default every group)
    features: tuple = ()


def _best_timestep(run_dir: Path) -> int | None:
    """The timestep at which EvalCallback saved best/best_model.zip (first strict maximum of the
    mean evaluation return in best/evaluations.npz), or None."""
    npz = run_dir / "best" / "evaluations.npz"
    if not npz.is_file():
        return None
    try:
        with np.load(npz) as d:
            ts, res = np.asarray(d["timesteps"]), np.asarray(d["results"], dtype=np.float64)
    except (OSError, KeyError, ValueError):
        return None
    if len(ts) == 0 or res.ndim != 2:
        return None
    return int(ts[int(np.argmax(res.mean(axis=1)))])


def _statistics_path(run_dir: Path, best: bool, notes: list[str]) -> Path | None:
    """The VecNormalize statistics file of the exported model: ``vecnormalize.npz`` for model.zip;
    with ``best``, ``best/vecnormalize.npz`` (saved with the best model), else the checkpoint of
    the best model's timestep, else the final statistics (with a note). ValueError when only a
    pickled ``.pkl`` is there (agents/vecnorm_file.py)."""
    if best:
        found = stats_path(run_dir / "best")
        if found is not None:
            return found
        t = _best_timestep(run_dir)
        found = stats_path(run_dir / "checkpoints", f"rl_model_vecnormalize_{t}_steps") if t is not None else None
        if found is not None:
            return found
        notes.append("best model exported with the final observation statistics (no checkpoint of "
                     "the statistics at the best model's timestep)")
    return stats_path(run_dir)


def load_run(run_dir: str | Path, *, best: bool = False) -> LoadedRun:
    """Load RUN_DIR's model (``model.zip`` or, with ``best``, ``best/best_model.zip``), its
    observation statistics and config.json, and check that they agree with each other and with
    this code's observation encoder and action codec. Raises FileNotFoundError / ValueError with
    one line."""
    run_dir = Path(run_dir)
    cfg = read_run_config(run_dir)  # FileNotFoundError / ValueError, one line
    spaces = cfg["spaces"]
    if not isinstance(spaces, dict):
        raise ValueError(f"{run_dir / 'config.json'}: field 'spaces' must be an object")
    model_path = run_dir / ("best/best_model.zip" if best else "model.zip")
    if not model_path.is_file():
        hint = "(was the run evaluated? best/ is written by the evaluation callback)" if best \
            else "(is training finished?)"
        raise FileNotFoundError(f"{run_dir}: expected the trained model {model_path.relative_to(run_dir)} {hint}")
    if not zipfile.is_zipfile(model_path):
        raise ValueError(f"{model_path}: not a stable-baselines3 model (not a zip archive; corrupted?)")

    import torch
    torch.set_num_threads(1)
    cls = algo_class(str(cfg["algo"]))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = cls.load(str(model_path), device="cpu")
    except Exception as e:  # noqa: BLE001 - a corrupted or foreign zip: one line for the user
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ValueError(f"{model_path}: cannot load it as a {cfg['algo']} model ({type(e).__name__}: {first})") from None

    # normalization statistics
    loaded = LoadedRun(run_dir, cfg, model, model_path, None, None,
                       features=run_features(cfg, run_dir / "config.json"))
    vn_path = _statistics_path(run_dir, best, loaded.notes)
    if vn_path is not None:
        st = read_vecnormalize(vn_path)  # numpy arrays only (allow_pickle=False)
        if st.norm_obs:
            loaded.obs_mean, loaded.obs_var = st.obs_mean.reshape(-1), st.obs_var.reshape(-1)
            loaded.epsilon, loaded.clip_obs = st.epsilon, st.clip_obs
            loaded.normalization_source = str(vn_path.relative_to(run_dir))
    elif cfg.get("normalize_obs", True):
        raise FileNotFoundError(f"{run_dir}: expected {VECNORM_FILE} (the observation statistics)")

    _check_layout(loaded, spaces_signature)
    return loaded


def _check_layout(run: LoadedRun, spaces_signature) -> None:
    """config.json vs this code's encoder/codec, and model.zip / vecnormalize.npz vs config.json."""
    sp = run.config["spaces"]
    cfg_path = run.run_dir / "config.json"
    try:
        want = spaces_signature(int(sp["window_k"]), int(sp["spb_levels"]), int(sp["spb_slots"]), run.features)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{cfg_path}: bad 'spaces' ({type(e).__name__}: {e})") from None
    groups = f" (feature groups {','.join(run.features)})"
    # the sizes before the placement menu: a run of another action space (e.g. without the host
    # slots) is refused naming the sizes expected and found
    for key, label in (("level_pattern_combos", "level/pattern combos"),
                       ("job_features", "per-job features"), ("cluster_features", "cluster features"),
                       ("observation_size", "observation size"), ("n_actions", "action count"),
                       ("placement_options", "placement menu"), ("host_slots", "host slots")):
        if sp.get(key) != want[key]:
            note = groups if key in ("job_features", "observation_size") else ""
            raise ValueError(f"{run.run_dir}: the run was trained for another observation/action layout than this "
                             f"code's: {label} expected {want[key]}{note}, found {sp.get(key)} in config.json")
    d, a = int(sp["observation_size"]), int(sp["n_actions"])
    model = run.model
    if not isinstance(model.observation_space, gspaces.Box) or tuple(model.observation_space.shape) != (d,):
        raise ValueError(f"{run.model_path}: observation size expected {d} (config.json), "
                         f"found {getattr(model.observation_space, 'shape', model.observation_space)} in the model")
    if not isinstance(model.action_space, gspaces.Discrete) or int(model.action_space.n) != a:
        found = getattr(model.action_space, "n", model.action_space)
        raise ValueError(f"{run.model_path}: action count expected {a} (config.json), found {found} in the model")
    if run.obs_mean is not None and (run.obs_mean.shape != (d,) or run.obs_var.shape != (d,)):
        raise ValueError(f"{run.run_dir / run.normalization_source}: observation size expected {d} "
                         f"(config.json), found {run.obs_mean.shape[0]} in the VecNormalize statistics")
    policy = model.policy
    for attr in ("mlp_extractor", "action_net"):
        if not hasattr(policy, attr):
            raise ValueError(f"{run.model_path}: policy {type(policy).__name__} has no {attr}; only the "
                             f"MlpPolicy actor-critic policies (MaskablePPO, PPO, A2C) can be exported")
    if getattr(policy, "squash_output", False):
        raise ValueError(f"{run.model_path}: squashed-output policies cannot be exported")


# ----------------------------------------------------------------------------------------------- graph
def build_module(run: LoadedRun):
    """The torch.nn.Module that becomes the ONNX graph: (obs, mask) -> (action, logits)."""
    import torch
    from torch import nn

    policy = run.model.policy
    space = run.model.observation_space

    class PolicyGraph(nn.Module):
        def __init__(self):
            super().__init__()
            fe = getattr(policy, "pi_features_extractor", None)
            self.features_extractor = fe if fe is not None else policy.features_extractor
            self.mlp_extractor = policy.mlp_extractor
            self.action_net = policy.action_net
            self.register_buffer("obs_low", torch.as_tensor(np.asarray(space.low, dtype=np.float32)))
            self.register_buffer("obs_high", torch.as_tensor(np.asarray(space.high, dtype=np.float32)))
            self.normalize = run.obs_mean is not None
            if self.normalize:
                self.register_buffer("obs_mean", torch.as_tensor(run.obs_mean, dtype=torch.float64))
                # np.sqrt(var + eps) here is bit-identical to VecNormalize's own (correct rounding)
                self.register_buffer("obs_std", torch.as_tensor(np.sqrt(run.obs_var + run.epsilon),
                                                                dtype=torch.float64))
                self.register_buffer("clip_lo", torch.tensor(-run.clip_obs, dtype=torch.float64))
                self.register_buffer("clip_hi", torch.tensor(run.clip_obs, dtype=torch.float64))
            self.register_buffer("mask_fill", torch.tensor(MASK_FILL, dtype=torch.float32))

        def forward(self, obs, mask):
            x = torch.minimum(torch.maximum(obs, self.obs_low), self.obs_high)
            if self.normalize:
                z = (x.to(torch.float64) - self.obs_mean) / self.obs_std
                x = torch.minimum(torch.maximum(z, self.clip_lo), self.clip_hi).to(torch.float32)
            features = self.features_extractor(x)
            logits = self.action_net(self.mlp_extractor.forward_actor(features))
            masked = torch.where(mask, logits, self.mask_fill)
            return torch.argmax(masked, dim=1), logits

    return PolicyGraph().eval()


def _onnx_export(module, d: int, a: int, path: Path, opset: int) -> None:
    import torch

    obs = torch.zeros(2, d, dtype=torch.float32)
    mask = torch.ones(2, a, dtype=torch.bool)
    axes = {"obs": {0: "batch"}, "mask": {0: "batch"}, "action": {0: "batch"}, "logits": {0: "batch"}}
    kw = dict(input_names=list(INPUT_NAMES), output_names=list(OUTPUT_NAMES), opset_version=opset)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.no_grad():
            try:
                # the TorchScript exporter: no onnxscript needed, and exact for this small graph
                torch.onnx.export(module, (obs, mask), str(path), dynamo=False, dynamic_axes=axes,
                                  do_constant_folding=True, **kw)
            except TypeError:  # a torch without the legacy exporter: the torch.export-based one
                batch = torch.export.Dim("batch")
                torch.onnx.export(module, (obs, mask), str(path), dynamo=True, external_data=False,
                                  dynamic_shapes={"obs": {0: batch}, "mask": {0: batch}}, **kw)


def _versions() -> dict[str, str]:
    out = {}
    for pkg in ("jigsaw", "torch", "stable-baselines3", "sb3-contrib", "onnx"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "unknown"
    return out


def metadata_for(run: LoadedRun, opset: int, run_label: str | None = None) -> dict[str, str]:
    """The ONNX metadata_props (all values strings; lists and objects as JSON); ``run_label``
    names the run folder in ``run_dir`` (default: its absolute path)."""
    sp = run.config["spaces"]
    env = run.config.get("env") or {}
    v = _versions()
    md = {
        "format": FORMAT,
        "observation_size": str(int(sp["observation_size"])),
        "n_actions": str(int(sp["n_actions"])),
        "window_k": str(int(sp["window_k"])),
        "spb_levels": str(int(sp["spb_levels"])),
        "spb_slots": str(int(sp["spb_slots"])),
        "placement_options": json.dumps(list(sp["placement_options"])),
        "level_pattern_combos": json.dumps(list(sp["level_pattern_combos"])),
        "job_features": str(int(sp["job_features"])),
        "cluster_features": str(int(sp["cluster_features"])),
        "observe_remaining": json.dumps(bool(env.get("observe_remaining", True))),
        "obs_features": json.dumps(list(run.features)),
        "spaces": json.dumps(sp, sort_keys=True),
        "env": json.dumps(env, sort_keys=True, default=str),
        "algo": str(run.config["algo"]),
        "policy_class": type(run.model.policy).__name__,
        "net_arch": json.dumps((run.config.get("hyperparameters") or {}).get("net_arch")),
        "obs_low": json.dumps(float(np.min(run.model.observation_space.low))),
        "obs_high": json.dumps(float(np.max(run.model.observation_space.high))),
        "obs_normalization": "vecnormalize" if run.obs_mean is not None else "none",
        "normalization_source": run.normalization_source,
        "clip_obs": repr(float(run.clip_obs)),
        "epsilon": repr(float(run.epsilon)),
        "mask_fill": repr(MASK_FILL),
        "inputs": "obs float32 [N, observation_size] raw encoder observation; mask bool [N, n_actions] True=feasible",
        "outputs": "action int64 [N] argmax of the masked logits; logits float32 [N, n_actions] before masking",
        "jigsaw_version": v["jigsaw"],
        "config_sha256": file_sha256(run.run_dir / "config.json"),
        "model_sha256": file_sha256(run.model_path),
        "model_file": str(run.model_path.relative_to(run.run_dir)),
        "run_dir": run_label if run_label is not None else str(run.run_dir.resolve()),
        "trained_timesteps": str(int(getattr(run.model, "num_timesteps", 0) or 0)),
        "seed": json.dumps(run.config.get("seed")),
        "git_commit": str(run.config.get("git_commit", "unknown")),
        "torch_version": v["torch"],
        "sb3_version": v["stable-baselines3"],
        "sb3_contrib_version": v["sb3-contrib"],
        "onnx_opset": str(int(opset)),
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if run.notes:
        md["notes"] = json.dumps(run.notes)
    return md


def reference_actions(run: LoadedRun, obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The SB3 model's own deterministic masked choice on raw observations, normalized the way
    VecNormalize does (float64, then float32): MaskablePPO ``predict(..., action_masks=mask,
    deterministic=True)``; for PPO/A2C (trained without masks) the argmax of the masked logits."""
    import torch
    obs = np.clip(np.asarray(obs, dtype=np.float32), run.model.observation_space.low,
                  run.model.observation_space.high)
    if run.obs_mean is not None:
        obs = np.clip((obs - run.obs_mean) / np.sqrt(run.obs_var + run.epsilon),
                      -run.clip_obs, run.clip_obs).astype(np.float32)
    mask = np.asarray(mask, dtype=bool)
    if str(run.config["algo"]) == "maskable_ppo":
        a, _ = run.model.predict(obs, action_masks=mask, deterministic=True)
        return np.asarray(a, dtype=np.int64).reshape(-1)
    policy = run.model.policy
    with torch.no_grad():
        t, _ = policy.obs_to_tensor(obs)
        logits = policy.get_distribution(t).distribution.logits.cpu().numpy()
    return np.argmax(np.where(mask, logits, MASK_FILL), axis=1).astype(np.int64)


def random_inputs(d: int, a: int, n: int, rng: np.random.Generator, low: float = -1.0,
                  high: float = 10.0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` random observations in [low, high] (mostly in [0, 1], where encoder features live)
    and random masks with at least one feasible action each."""
    obs = rng.uniform(0.0, 1.0, size=(n, d)).astype(np.float32)
    wide = rng.random((n, d)) < 0.1
    obs[wide] = rng.uniform(low, high, size=int(wide.sum())).astype(np.float32)
    p = rng.uniform(0.02, 0.6, size=(n, 1))
    mask = rng.random((n, a)) < p
    mask[np.arange(n), rng.integers(0, a, size=n)] = True
    return obs, mask


def max_opset() -> int:
    """The highest ONNX opset this installation can export: torch's limit (``torch.onnx.export``
    raises "Unsupported onnx_opset_version" above it) and the onnx package's, the lower."""
    import onnx

    top = onnx.defs.onnx_opset_version()
    try:
        from torch.onnx import _constants as c  # private, but where torch keeps its limits
    except ImportError:  # pragma: no cover - a torch that moved it: the onnx package's limit alone
        return int(top)
    lim = getattr(c, "ONNX_MAX_OPSET", None)
    return int(min(top, lim)) if isinstance(lim, int) else int(top)


def _check_out(out: Path) -> None:
    """``--out`` must name a file whose folder is (or can become) a folder: ValueError when it is
    a folder itself, NotADirectoryError when a path above it is a file (mkdir would say only
    "File exists")."""
    if out.is_dir():
        raise ValueError(f"--out {out} is a directory; give a file name such as {out / 'policy.onnx'}")

    above = file_above(out)
    if above is not None:
        raise NotADirectoryError(f"--out {out}: {above} is a file, not a directory; give a path in a folder")


def export_policy(run_dir: str | Path, out: str | Path | None = None, *, best: bool = False,
                  opset: int = DEFAULT_OPSET, check: int = 256, seed: int = 0, run_label: str | None = None) -> dict:
    """Export RUN_DIR's policy to ``out`` (default RUN_DIR/policy.onnx, policy-best.onnx with
    ``best``); verify it with onnx.checker and, on ``check`` random observations and masks, that
    onnxruntime picks the SB3 model's actions. ``run_label``: how the metadata's ``run_dir``
    names the run (default its absolute path; the shipped policies use their folder in the
    project). Returns a summary dict."""
    if opset < MIN_OPSET:
        raise ValueError(f"--opset must be >= {MIN_OPSET}, got {opset}")
    try:
        import onnx
        import torch  # noqa: F401
    except ImportError as e:
        raise ValueError(f"jigsaw export needs torch and onnx ({e.name} is not installed; "
                         f"pip install 'jigsaw[rl,executor]')") from None
    top = max_opset()
    if opset > top:
        raise ValueError(f"--opset must be between {MIN_OPSET} and {top}, got {opset} ({top}: the highest opset "
                         f"the installed torch and onnx export)")
    rd = Path(run_dir)
    if rd.exists() and not rd.is_dir():
        raise NotADirectoryError(f"RUN_DIR {rd} is a file, not a directory: expected a training run folder "
                                 f"(config.json, model.zip and vecnormalize.npz, written by `jigsaw train`)")
    if out is not None:
        _check_out(Path(out))  # before the model is loaded
    run = load_run(run_dir, best=best)
    out = Path(out) if out is not None else run.run_dir / ("policy-best.onnx" if best else "policy.onnx")
    _check_out(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    d, a = int(run.config["spaces"]["observation_size"]), int(run.config["spaces"]["n_actions"])

    module = build_module(run)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        _onnx_export(module, d, a, tmp, opset)
        model = onnx.load(str(tmp))
        del model.metadata_props[:]
        for k, v in metadata_for(run, opset, run_label).items():
            model.metadata_props.add(key=k, value=v)
        # the model file by name (its digest is in the metadata): no path of the exporting machine
        model.doc_string = (f"jigsaw policy from {run.model_path.name}: obs float32 [N, {d}] + mask bool [N, {a}] -> "
                            f"action int64 [N] (masked argmax), logits float32 [N, {a}]")
        model.producer_name = "jigsaw export"
        onnx.checker.check_model(model, full_check=True)
        onnx.save(model, str(tmp))
        summary = {"out": str(out), "run_dir": str(run.run_dir), "model_file": str(run.model_path.name),
                   "algo": run.config["algo"], "observation_size": d, "n_actions": a, "opset": opset,
                   "normalization": run.normalization_source, "notes": run.notes}
        if check > 0:
            summary["checked"] = verify_export(run, tmp, check, seed)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    summary["bytes"] = out.stat().st_size
    return summary


def verify_export(run: LoadedRun, path: str | Path, n: int, seed: int = 0) -> int:
    """onnxruntime vs the SB3 model on ``n`` random observations and masks; raises RuntimeError
    (an exporter bug, not a user error) if any action differs. Returns ``n``."""
    d, a = int(run.config["spaces"]["observation_size"]), int(run.config["spaces"]["n_actions"])
    obs, mask = random_inputs(d, a, n, np.random.default_rng(seed))
    got = OnnxPolicy(path).act_batch(obs, mask)
    want = reference_actions(run, obs, mask)
    bad = np.flatnonzero(got != want)
    if len(bad):
        i = int(bad[0])
        raise RuntimeError(f"exported graph disagrees with the SB3 model on {len(bad)}/{n} random observations "
                           f"(first: #{i}, onnx {got[i]} vs sb3 {want[i]})")
    return n


# ----------------------------------------------------------------------------------------------- CLI
def register(subparsers) -> None:
    p = subparsers.add_parser(
        "export", help="export a trained policy (RUN_DIR) to ONNX: normalization, masking and argmax in the graph",
        description="Export RUN_DIR's policy to one ONNX graph (obs, mask) -> action that runs with onnxruntime "
                    "and numpy alone; see docs/export.md.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a training run (config.json, model.zip, vecnormalize.npz), "
                                                       "or a shipped policy's name (learned; default --out learned.onnx)")
    p.add_argument("--out", default=None,
                   help="the ONNX file to write (default: RUN_DIR/policy.onnx, RUN_DIR/policy-best.onnx with --best)")
    p.add_argument("--best", action="store_true", help="export best/best_model.zip instead of model.zip")
    p.add_argument("--opset", type=int, default=DEFAULT_OPSET, help=f"ONNX opset (default {DEFAULT_OPSET})")
    p.add_argument("--check", type=int, default=256,
                   help="random observations on which onnxruntime must pick the SB3 model's action after the export "
                        "(default 256; 0: skip)")
    p.add_argument("--bench", type=int, default=0, metavar="N",
                   help="then time N single-observation decisions with onnxruntime (1 thread) and report the latency")
    p.set_defaults(func=run)


def run(args) -> int:
    run_dir, out = args.run_dir, args.out
    if is_shipped_name(run_dir) and (folder := shipped_policy(run_dir)) is not None:  # a policy shipped in the package
        run_dir, out = folder, out or f"{run_dir}.onnx"  # never over the shipped file
    summary = export_policy(run_dir, out, best=args.best, opset=args.opset, check=max(0, args.check))
    if args.bench and args.bench > 0:
        summary["latency_ms"] = OnnxPolicy(summary["out"]).benchmark(args.bench)
    print(json.dumps(summary))
    return 0
