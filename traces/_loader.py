"""What every format loader returns, and the shared last step that builds the canonical table."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import pandas as pd

from .schema import BadRows, validate_jobs


@dataclass
class LoaderResult:
    """A loader's output: the canonical jobs (arrival_s from the trace start, ids assigned) and
    the account of every row read: bad rows skipped and jobs dropped by the format's own rules."""

    jobs: pd.DataFrame
    kind: str
    path: str
    rows_read: int
    jobs_read: int
    bad_rows: dict[str, int] = field(default_factory=dict)
    bad_row_examples: list[str] = field(default_factory=list)
    filtered: dict[str, int] = field(default_factory=dict)
    trace_start: str | None = None
    default_gpu_type: str = "v100"
    has_status: bool = False
    has_vc: bool = False
    notes: dict[str, Any] = field(default_factory=dict)


def _text(v: Any, n: int) -> np.ndarray:
    if isinstance(v, str):
        return np.full(n, v, dtype=object)
    a = np.asarray(v, dtype=object)
    return a


def build_jobs(kind: str, path: str, bad: BadRows, *, rows_read: int, arrival: np.ndarray,
               num_gpus: np.ndarray, duration_s: np.ndarray | None = None,
               iterations: np.ndarray | None = None, model: Any = "", batch_size: np.ndarray | None = None,
               status: Any = "", vc: Any = "", gpu_type: Any = "",
               extras: Mapping[str, Any] | None = None, drop: Mapping[str, np.ndarray] | None = None,
               job_id: np.ndarray | None = None,
               clock: str = "epoch", default_gpu_type: str = "v100", has_status: bool = False,
               has_vc: bool = False, notes: dict | None = None) -> LoaderResult:
    """Assemble a loader's canonical table.

    ``arrival`` is each job's submission time on the source's clock (seconds); the trace start is
    the earliest of them. ``drop`` maps a reason to a mask of jobs the format does not keep (each
    job counted once, under the first reason that applies). Remaining jobs are sorted by arrival
    (stable in file order) and numbered 0..n-1 in that order, unless ``job_id`` gives ids. ``clock="epoch"``: the source's
    times are calendar times (the summary shows the start as a date); ``"trace"``: a relative or
    desensitized clock (shown in seconds).
    """
    n = len(arrival)
    arrival = np.asarray(arrival, dtype=np.float64)
    finite = np.isfinite(arrival)
    start = float(np.min(arrival[finite])) if finite.any() else 0.0
    nan = np.full(n, np.nan)
    data: dict[str, Any] = {
        "arrival_s": arrival - start,
        "num_gpus": np.asarray(num_gpus, dtype=np.float64),
        "duration_s": nan if duration_s is None else np.asarray(duration_s, dtype=np.float64),
        "iterations": nan if iterations is None else np.asarray(iterations, dtype=np.float64),
        "model": _text(model, n),
        "batch_size": pd.array(pd.Series(nan if batch_size is None else batch_size, dtype="float64").round(),
                               dtype="Int64"),
        "status": _text(status, n),
        "vc": _text(vc, n),
        "gpu_type": _text(gpu_type, n),
    }
    for k, v in (extras or {}).items():
        data[k] = _text(v, n)
    df = pd.DataFrame(data)
    if job_id is not None:
        ids = np.asarray(job_id)
        if ids.dtype.kind not in "iu":  # floats (or objects): no silent rounding or wrap-around in the cast
            f = np.asarray(ids, dtype=np.float64)
            wrong = ~np.isfinite(f) | (f != np.floor(f)) | (f < -(2.0 ** 63)) | (f >= 2.0 ** 63)
            if wrong.any():
                k = int(np.flatnonzero(wrong)[0])
                raise ValueError(f"{kind}:{path}: column 'job_id': job #{k}: expected an integer in the int64 range, "
                                 f"got {ids[k]!r}")
        elif ids.dtype.kind == "u" and ids.size and int(ids.max()) > 2 ** 63 - 1:
            k = int(np.argmax(ids))
            raise ValueError(f"{kind}:{path}: column 'job_id': job #{k}: expected an integer in the int64 range, "
                             f"got {ids[k]!r}")
        df.insert(0, "job_id", ids.astype(np.int64))
    keep = np.ones(n, dtype=bool)
    filtered: dict[str, int] = {}
    for reason, mask in (drop or {}).items():
        m = np.asarray(mask, dtype=bool) & keep
        if m.any():
            filtered[reason] = int(m.sum())
            keep &= ~m
    df = df[keep]
    order = np.argsort(df["arrival_s"].to_numpy(), kind="stable")
    df = df.iloc[order].reset_index(drop=True)
    if job_id is None:
        df.insert(0, "job_id", np.arange(len(df), dtype=np.int64))
    df["num_gpus"] = df["num_gpus"].astype(np.int64)
    jobs = validate_jobs(df, origin=f"{kind}:{path}")
    if clock == "epoch":
        trace_start = iso_or_none(start if finite.any() else None)
    else:
        trace_start = f"{start:g} s on the trace's clock"
    return LoaderResult(jobs=jobs, kind=kind, path=str(path), rows_read=rows_read, jobs_read=n,
                        bad_rows=dict(bad.counts), bad_row_examples=list(bad.examples),
                        filtered=filtered, trace_start=trace_start, default_gpu_type=default_gpu_type,
                        has_status=has_status, has_vc=has_vc, notes=dict(notes or {}))


def iso_or_none(epoch_s: float | None) -> str | None:
    if epoch_s is None or not np.isfinite(epoch_s):
        return None
    return pd.Timestamp(epoch_s, unit="s").isoformat(sep=" ")
