"""VecNormalize statistics as plain NumPy arrays (``vecnormalize.npz``), never as a pickle.

A training run keeps stable-baselines3's ``VecNormalize`` statistics in ``vecnormalize.npz``
(``RUN_DIR/``, ``best/``, ``warm_start/``, and ``checkpoints/rl_model_vecnormalize_<t>_steps.npz``).
The file holds only numeric arrays, read back with ``numpy.load(..., allow_pickle=False)``:

    obs_mean, obs_var  float64 [D]  running mean and variance of the raw observations
    obs_count          float64 []   how many observations they were computed from
    ret_mean, ret_var  float64 []   running mean and variance of the discounted returns
    ret_count          float64 []   how many returns they were computed from
    clip_obs           float64 []   normalized observations are clipped to +-clip_obs
    clip_reward        float64 []   normalized rewards are clipped to +-clip_reward
    epsilon            float64 []   added to the variance before the square root
    gamma              float64 []   the discount of the return statistics
    norm_obs, norm_reward, training  bool []  VecNormalize's switches
    format_version     int64 []     FORMAT_VERSION

:func:`write_vecnormalize` writes one from a VecNormalize, :func:`read_vecnormalize` reads and
checks one (ValueError, one line naming the file and the field), :func:`wrap_vecnormalize`
rebuilds a VecNormalize around a vec env with exactly those statistics (``train --resume``).
A folder holding only ``vecnormalize.pkl`` is refused by :func:`stats_path` without reading it.
"""
from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FILE_NAME = "vecnormalize.npz"
LEGACY_FILE_NAME = "vecnormalize.pkl"
FORMAT_VERSION = 1
_VECTORS = ("obs_mean", "obs_var")
_SCALARS = ("obs_count", "ret_mean", "ret_var", "ret_count", "clip_obs", "clip_reward", "epsilon", "gamma")
_FLAGS = ("norm_obs", "norm_reward", "training")


@dataclass
class VecNormStats:
    """VecNormalize's statistics and settings (module docstring for the units)."""

    obs_mean: np.ndarray
    obs_var: np.ndarray
    obs_count: float
    ret_mean: float
    ret_var: float
    ret_count: float
    clip_obs: float
    clip_reward: float
    epsilon: float
    gamma: float
    norm_obs: bool
    norm_reward: bool
    training: bool


def legacy_refusal(path: Path) -> str:
    """The one-line refusal of a pickled statistics file (never unpickled)."""
    return (f"{path}: VecNormalize statistics as a pickle (written by an earlier version of jigsaw train), "
            f"which can run code when read and is not loaded; retrain the run, or convert the file where you "
            f"trust its origin with `python tools/convert_vecnormalize.py {path}` (writes the .npz beside it)")


def stats_path(folder: Path, stem: str = "vecnormalize") -> Path | None:
    """``folder/<stem>.npz`` if it exists; None if neither it nor ``<stem>.pkl`` does; ValueError
    (:func:`legacy_refusal`) if only the pickle does."""
    npz, pkl = Path(folder) / f"{stem}.npz", Path(folder) / f"{stem}.pkl"
    if npz.is_file():
        return npz
    if pkl.is_file():
        raise ValueError(legacy_refusal(pkl))
    return None


def stats_of(venv) -> VecNormStats:
    """The statistics of a stable-baselines3 VecNormalize (a Box observation space)."""
    rms = venv.obs_rms
    if isinstance(rms, dict):
        raise ValueError("VecNormalize with a Dict observation space cannot be saved as vecnormalize.npz")
    return VecNormStats(np.asarray(rms.mean, np.float64).copy(), np.asarray(rms.var, np.float64).copy(),
                        float(rms.count), float(np.asarray(venv.ret_rms.mean)), float(np.asarray(venv.ret_rms.var)),
                        float(venv.ret_rms.count), float(venv.clip_obs), float(venv.clip_reward),
                        float(venv.epsilon), float(venv.gamma), bool(venv.norm_obs), bool(venv.norm_reward),
                        bool(venv.training))


def write_vecnormalize(venv, f) -> None:
    """Write ``venv``'s statistics as an .npz to the binary file object ``f``."""
    s = stats_of(venv)
    arrays = {k: np.asarray(getattr(s, k), np.float64) for k in _VECTORS + _SCALARS}
    arrays.update({k: np.asarray(getattr(s, k), np.bool_) for k in _FLAGS})
    buf = io.BytesIO()
    np.savez(buf, format_version=np.asarray(FORMAT_VERSION, np.int64), **arrays)
    f.write(buf.getvalue())


def _field(data, path: Path, key: str, kind: str) -> np.ndarray:
    """One array of the file, checked: ``kind`` is "vector" (float [D]), "scalar" (float) or "flag" (bool)."""
    if key not in data.files:
        raise ValueError(f"{path}: field {key!r} missing (expected the VecNormalize statistics of jigsaw train)")
    a = data[key]
    want_shape_ok = a.ndim == 1 if kind == "vector" else a.ndim == 0
    want_dtype_ok = a.dtype == np.bool_ if kind == "flag" else np.issubdtype(a.dtype, np.floating)
    if not (want_shape_ok and want_dtype_ok):
        what = {"vector": "a float array [D]", "scalar": "a float scalar", "flag": "a bool scalar"}[kind]
        raise ValueError(f"{path}: field {key!r}: expected {what}, found {a.dtype} {list(a.shape)}")
    return a


def read_vecnormalize(path: str | Path) -> VecNormStats:
    """Read and check ``path`` (numpy.load with allow_pickle=False: data only). ValueError, one
    line naming the file and the field, for anything else."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            if not isinstance(data, np.lib.npyio.NpzFile):
                raise ValueError("a single .npy array, not an .npz archive")
            version = _read_version(data, path)
            if version != FORMAT_VERSION:
                raise ValueError(f"format_version {version} (expected {FORMAT_VERSION})")
            vals = {k: _field(data, path, k, "vector") for k in _VECTORS}
            vals.update({k: float(_field(data, path, k, "scalar")) for k in _SCALARS})
            vals.update({k: bool(_field(data, path, k, "flag")) for k in _FLAGS})
    except ValueError as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else "corrupted"
        raise ValueError(msg if msg.startswith(str(path)) else
                         f"{path}: cannot read the VecNormalize statistics ({msg})") from None
    except (OSError, EOFError, zipfile.BadZipFile) as e:
        raise ValueError(f"{path}: cannot read the VecNormalize statistics ({type(e).__name__}: "
                         f"{str(e).strip().splitlines()[0] if str(e).strip() else 'corrupted'})") from None
    stats = VecNormStats(**vals)
    _check_consistent(stats, path)
    return stats


def _read_version(data, path: Path) -> int:
    if "format_version" not in data.files:
        raise ValueError(f"{path}: field 'format_version' missing (expected the VecNormalize statistics of "
                         f"jigsaw train)")
    a = data["format_version"]
    if a.ndim != 0 or not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{path}: field 'format_version': expected an integer scalar, found {a.dtype} {list(a.shape)}")
    return int(a)


def _check_consistent(s: VecNormStats, path: Path) -> None:
    """Mean and variance of one length, finite, variance >= 0; positive clip values and epsilon."""
    if s.obs_mean.shape != s.obs_var.shape:
        raise ValueError(f"{path}: fields 'obs_mean' and 'obs_var': expected one length, found "
                         f"{s.obs_mean.shape[0]} and {s.obs_var.shape[0]}")
    for key in ("obs_mean", "obs_var"):
        a = getattr(s, key)
        if not np.isfinite(a).all() or (key == "obs_var" and (a < 0).any()):
            raise ValueError(f"{path}: field {key!r}: expected finite values" + (" >= 0" if key == "obs_var" else ""))
    for key in ("clip_obs", "clip_reward", "epsilon"):
        if not getattr(s, key) > 0:
            raise ValueError(f"{path}: field {key!r}: expected a positive number, found {getattr(s, key)}")


def wrap_vecnormalize(venv, stats: VecNormStats, path: Path):
    """A stable-baselines3 VecNormalize around ``venv`` with exactly ``stats`` (what
    ``VecNormalize.load`` would rebuild from a pickle; its per-env running returns start at zero
    there too). ValueError if the observation size differs from ``venv``'s."""
    from stable_baselines3.common.vec_env import VecNormalize

    shape = tuple(venv.observation_space.shape or ())
    if shape != stats.obs_mean.shape:
        raise ValueError(f"{path}: observation size expected {shape} (the env's), found {stats.obs_mean.shape}")
    vn = VecNormalize(venv, training=stats.training, norm_obs=stats.norm_obs, norm_reward=stats.norm_reward,
                      clip_obs=stats.clip_obs, clip_reward=stats.clip_reward, gamma=stats.gamma, epsilon=stats.epsilon)
    vn.obs_rms.mean, vn.obs_rms.var, vn.obs_rms.count = stats.obs_mean.copy(), stats.obs_var.copy(), stats.obs_count
    vn.ret_rms.mean = np.float64(stats.ret_mean)  # the scalar type RunningMeanStd.update leaves there
    vn.ret_rms.var = np.float64(stats.ret_var)
    vn.ret_rms.count = stats.ret_count
    return vn
