"""The live executor's lockstep barrier: what a co-located step costs beyond its jobs' work (eq. X3).

Jobs that share a slot run in lockstep: before every step their rank 0s meet at a store barrier
(docs/deploy.md section 4). The simulator's step of such a component (eq. K2) is the sum of the
jobs' compute on the shared slot plus the slowest sync; the barrier's round trip, and the switches
between the processes that share the core, are not in it. ``jigsaw calibrate --device cpu
--executor`` measures them, pair by pair:

    b_p = T_pair,p - T1_a - T1_b                                                    (eq. X3)

with ``T_pair,p`` the median over the repeats of pair ``p``'s mean level-0 step (both jobs alone on
one slot together, in lockstep) and ``T1_a``, ``T1_b`` the two models' median level-0 iterations
alone on a slot (the ``T1`` of eq. X1, which already holds the executor overhead). The barrier is
the mean of ``b_p`` over the pairs, clipped at 0, written to ``OUT/lockstep.json``; the decision-log
replay (``replay_decision_log(log, tables=OUT)``) gives it to the simulator as
``SimConfig.lockstep_s`` (eq. K3). Units: seconds.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from jigsaw_env.cost_table import LOCKSTEP_FILE  # the file's name, known to table_files
from jigsaw_env.jsonfile import read_json_file


def fit_lockstep(points: list[tuple[float, float, float]]) -> float:
    """Eq. X3 over pairs ``(T_pair, T1_a, T1_b)`` (seconds): the mean of ``T_pair - T1_a - T1_b``,
    clipped at 0. Raises ValueError with no points or a value that is not a finite number >= 0."""
    if not points:
        raise ValueError("fitting the lockstep barrier needs at least one co-located pair")
    for p in points:
        if len(p) != 3 or any(isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0
                              for x in p):
            raise ValueError(f"a lockstep point must be (T_pair, T1_a, T1_b) in seconds >= 0, got {p!r}")
    return max(0.0, sum(t - a - b for t, a, b in points) / len(points))


def save_lockstep(path: str | Path, lockstep_s: float, source: str, extra: dict | None = None) -> None:
    """Write the barrier to ``path`` (JSON: lockstep_s, lockstep_ms, source, and ``extra``)."""
    d = {"lockstep_s": float(lockstep_s), "lockstep_ms": float(lockstep_s) * 1e3, "source": source}
    d.update(extra or {})
    Path(path).write_text(json.dumps(d, indent=1) + "\n")


def load_lockstep(path: str | Path) -> float:
    """The barrier in a file written by :func:`save_lockstep` (seconds). A missing file, bad JSON
    or a ``lockstep_s`` that is not a finite number >= 0 raises one line naming the file and field."""
    p = Path(path)
    d = read_json_file(p, "lockstep file")
    if not isinstance(d, dict):
        raise ValueError(f"{p}: expected a JSON object with lockstep_s")
    v = d.get("lockstep_s")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ValueError(f"{p}: field lockstep_s must be a finite number >= 0 (seconds per co-located step), got {v!r}")
    return float(v)


def lockstep_in_tables(folder: str | Path) -> float | None:
    """The barrier ``jigsaw calibrate --executor`` wrote next to its tables (``folder/lockstep.json``),
    or None when the folder has none. A bad file raises as :func:`load_lockstep`."""
    f = Path(folder) / LOCKSTEP_FILE
    return load_lockstep(f) if f.is_file() else None
