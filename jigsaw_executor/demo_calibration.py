"""The deploy demo's calibration of the machine it runs on, measured once and cached.

``jigsaw deploy --demo`` replays its own decision log through the simulator and compares simulated
with live per-iteration time. The shipped CPU tables measure a plain training loop on another
machine; the live executor here pays its own overhead, talks over loopback gloo and shares the
cores with Ray. So the demo calibrates what its replay needs on this machine, with the same
measurement as ``jigsaw calibrate --device cpu --executor`` (docs/deploy.md section 5: the tiny
models' plain-loop CPU tables, the executor overhead of eq. X1, the loopback link of eq. X2 with
two or more slots, and the lockstep barrier of eq. X3 when the demo runs at ``--pace lockstep``),
and uses the result for the scheduler's cost model, the workers' sync choice and the replay.

**The cache.** The result is written to ``<cache>/<key digest>/tables/`` (``<cache>``: ``$JIGSAW_CACHE_DIR``
or the user cache folder of :mod:`platformdirs`, then ``demo-calibration``). The key
(:func:`machine_key`) names what the numbers depend on: the CPU model, the usable cores, the slot
count, the pace's barrier, torch's and jigsaw's versions, the measurement's settings and the tiny
models' parameter shapes. A later demo with the same key reuses the folder without measuring;
``--recalibrate`` measures again. Beside ``tables/``, ``key.json`` holds the key and
``calibration.json`` the measurement's summary (every run's value, the medians, the load). The folder is filled in a temporary sibling and renamed into
place when complete, so an interrupted calibration leaves nothing that a later run would read.

Units: seconds (tables, ``link.json``, ``lockstep.json``).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Callable

from jigsaw_env.calibrate import SHIPPED

from .calibrate_executor import calibrate_executor
from .cluster_ray import physical_cores

__all__ = ["CACHE_ENV", "DEMO_MODELS", "REPEATS", "ITERATIONS", "cache_root", "machine_key", "key_digest",
           "cached_calibration", "demo_calibration"]

CACHE_ENV = "JIGSAW_CACHE_DIR"
#: the demo's models (``jigsaw_executor.deploy.demo_jobs``)
DEMO_MODELS = ("tiny_cnn", "tiny_mlp", "tiny_transformer")
#: separate live runs per measurement and iterations per run: with 3 runs of 300 iterations a tiny
#: model's median moved by 15 % between calibrations on 2 shared cores (docs/deploy.md section 5)
REPEATS = 5
ITERATIONS = 1000
#: the layout of the cache folder and the measurement's protocol (``calibrate_executor._layout``);
#: a change of either is a new key
CACHE_FORMAT = 2
KEY_FILE = "key.json"
SUMMARY_FILE = "calibration.json"
TABLES = "tables"  # the subfolder of tables, link.json and lockstep.json (``jigsaw deploy --tables``)


def cache_root() -> Path:
    """The folder that holds the demo calibrations: ``$JIGSAW_CACHE_DIR/demo-calibration`` or the
    user cache folder's (``platformdirs.user_cache_dir("jigsaw")``)."""
    base = os.environ.get(CACHE_ENV)
    if not base:
        import platformdirs

        base = platformdirs.user_cache_dir("jigsaw")
    return Path(base) / "demo-calibration"


def _model_shapes(models: tuple[str, ...]) -> dict[str, str]:
    """Per model, a short digest of its parameters' names and shapes (a changed model is a new key)."""
    from jigsaw_env.zoo import build_model

    out = {}
    for m in models:
        shapes = [(name, list(p.shape)) for name, p in build_model(m).named_parameters()]
        out[m] = hashlib.sha256(json.dumps(shapes).encode()).hexdigest()[:12]
    return out


def machine_key(slots: int, lockstep: bool, models: tuple[str, ...] = DEMO_MODELS) -> dict:
    """What a demo calibration depends on (module docstring), as a JSON-able dict."""
    import torch

    from jigsaw_env.table_builder import cpu_name

    try:
        jigsaw_version = version("jigsaw")
    except PackageNotFoundError:  # run from a source tree that is not installed
        jigsaw_version = "source"
    return {"format": CACHE_FORMAT, "cpu": cpu_name(), "physical_cores": physical_cores(),
            "slots": min(2, slots), "lockstep": bool(lockstep), "torch": torch.__version__,
            "jigsaw": jigsaw_version, "repeats": REPEATS, "iterations": ITERATIONS,
            "models": _model_shapes(models)}


def key_digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def cached_calibration(key: dict, root: Path | None = None) -> Path | None:
    """The complete cached folder for ``key``, or None. A folder whose ``key.json`` is missing,
    unreadable or names another key is not used."""
    folder = (root or cache_root()) / key_digest(key)
    try:
        found = json.loads((folder / KEY_FILE).read_text())
    except (OSError, ValueError):
        return None
    return folder / TABLES if found == key and (folder / TABLES).is_dir() else None


def _measure(folder: Path, key: dict, log: Callable[[str], None]) -> dict:
    """Run the calibration (``jigsaw calibrate --device cpu --executor``'s measurement) into ``folder``."""
    models = list(key["models"])
    link = key["slots"] >= 2
    cmd = (f"jigsaw calibrate --device cpu --executor --only {' '.join(models)} --executor-repeats {REPEATS} "
           f"--executor-iterations {ITERATIONS}" + ("" if link else " --no-link")
           + ("" if key["lockstep"] else " --no-lockstep") + " (run by jigsaw deploy --demo)")
    return calibrate_executor(models, {m: SHIPPED[m] for m in models}, folder, repeats=REPEATS,
                              iterations=ITERATIONS, link=link, lockstep=key["lockstep"], slots=key["slots"],
                              log=log, command=cmd)


def demo_calibration(slots: int, *, lockstep: bool = False, recalibrate: bool = False, root: Path | None = None,
                     log: Callable[[str], None] = print, measure: Callable[[Path, dict, Callable], dict] | None = None
                     ) -> tuple[Path, bool]:
    """The tables folder of this machine's demo calibration (``<cache>/<key digest>/tables``) and
    whether it was measured now (False: the cache's). Measures (``measure(folder, key, log)``, by default :func:`_measure`) when the cache
    has none for this machine's key, or with ``recalibrate``."""
    measure = measure or _measure
    key = machine_key(slots, lockstep)
    root = root or cache_root()
    found = None if recalibrate else cached_calibration(key, root)
    if found is not None:
        log(f"demo calibration of this machine: {found} (cached; --recalibrate measures again)")
        return found, False
    root.mkdir(parents=True, exist_ok=True)
    folder = root / key_digest(key)
    log(f"demo calibration of this machine (once, a few minutes; cached in {folder}):")
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=root))
    try:
        summary = measure(tmp / TABLES, key, log)
        (tmp / SUMMARY_FILE).write_text(json.dumps(summary, indent=1, default=str) + "\n")
        (tmp / KEY_FILE).write_text(json.dumps(key, indent=1) + "\n")  # last: it marks the folder complete
        if folder.exists():
            shutil.rmtree(folder)
        tmp.rename(folder)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return folder / TABLES, True
