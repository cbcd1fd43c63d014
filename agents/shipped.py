"""Policies shipped in the package, by name.

``learned`` is a training run of ``jigsaw train --preset learned`` packed by
``python -m tools.ship_policy``: ``agents/policies/learned/`` holds ``config.json`` (the run's
config: training command, preset, split, and ``shipped``: the trace's SHA-256, the run it came
from, which model was kept), ``model.zip`` and ``vecnormalize.npz`` (a RUN_DIR that
``jigsaw evaluate`` and ``jigsaw export`` read) and ``policy.onnx`` (what ``jigsaw deploy`` runs).
Results: docs/results.md.
"""
from __future__ import annotations

from pathlib import Path

__all__ = ["POLICIES_DIR", "SHIPPED_NAMES", "is_shipped_name", "shipped_policy", "shipped_onnx"]

POLICIES_DIR = Path(__file__).parent / "policies"
SHIPPED_NAMES = ("learned",)


def is_shipped_name(name: str) -> bool:
    """Whether ``name`` means a shipped policy: one of :data:`SHIPPED_NAMES` with no file or folder
    of that name here (a local path of the same name wins)."""
    return name in SHIPPED_NAMES and not Path(name).exists()


def shipped_policy(name: str) -> Path | None:
    """The RUN_DIR of the shipped policy ``name``, or None when ``name`` is not one (or its files
    are not installed)."""
    if name not in SHIPPED_NAMES:
        return None
    folder = POLICIES_DIR / name
    return folder if (folder / "config.json").is_file() and (folder / "model.zip").is_file() else None


def shipped_onnx(name: str) -> Path | None:
    """The exported ONNX policy of the shipped policy ``name``, or None."""
    folder = shipped_policy(name)
    return None if folder is None or not (folder / "policy.onnx").is_file() else folder / "policy.onnx"
