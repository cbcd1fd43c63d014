"""Gavel's measured throughputs (``gavel/simulation_throughputs.json`` in the reference data
folder), read where they are needed, never copied: the tables' anchors, the co-location fit and
Gandiva's measured pairs. No torch here: the light core install reads them too."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from traces.api import data_dir

PROJECT_ROOT = Path(__file__).resolve().parents[1]
GAVEL_FILE = "gavel/simulation_throughputs.json"


@lru_cache(maxsize=4)
def _load_gavel(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(
            f"Gavel throughputs not found at {p}; set JIGSAW_DATA to the data folder "
            f"(it must contain {GAVEL_FILE})")
    return json.loads(p.read_text())


def gavel_throughputs(path: str | Path | None = None) -> dict[str, Any]:
    """Gavel's ``simulation_throughputs.json`` (read from the data folder, never copied)."""
    return _load_gavel(str(path or data_dir() / GAVEL_FILE))


def gavel_key(job: str, batch_size: int, scale_factor: int = 1) -> str:
    """The key Gavel uses, e.g. ``"('ResNet-18 (batch size 64)', 1)"``."""
    return str((f"{job} (batch size {batch_size})", scale_factor))


def gavel_alone_throughput(job: str | None, batch_size: int, gpu: str,
                           path: str | Path | None = None) -> tuple[str, float] | None:
    """(key, iterations/s alone at scale factor 1) or None when Gavel has no such entry."""
    if job is None:
        return None
    table = gavel_throughputs(path)
    if gpu not in table:
        raise ValueError(f"Gavel throughputs have no GPU type {gpu!r}; allowed: {sorted(table)}")
    key = gavel_key(job, batch_size)
    entry = table[gpu].get(key)
    if entry is None or not entry.get("null"):
        return None
    return key, float(entry["null"])


