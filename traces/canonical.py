"""The canonical job table as CSV (``csv:PATH``), as written by :func:`traces.to_canonical_csv`."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ._io import parse_integer, parse_number, read_delimited
from ._loader import LoaderResult, build_jobs
from .schema import CANONICAL_COLUMNS, SOURCE_PREFIXES, STATUSES, BadRows, TraceFormatError, is_source_column

CANONICAL_DEFAULT_GPU_TYPE = "v100"


def load_canonical_csv(path: str | Path, *, skip_bad_rows: bool = False) -> LoaderResult:
    """``csv:PATH`` -- the canonical schema itself (docs/traces.md). Required columns: arrival_s,
    num_gpus and duration_s and/or iterations; job_id is kept when present (else 0..n-1 in arrival
    order); source-specific columns must carry a prefix and are kept as text."""
    bad = BadRows(str(path), skip_bad_rows)
    raw = read_delimited(path, bad, sep=",", header=True, required=("arrival_s", "num_gpus"))
    df, ln = raw.df, raw.lines
    cols = list(df.columns)
    for c in cols:
        if c not in CANONICAL_COLUMNS and not is_source_column(c):
            raise TraceFormatError(path, 1, c, "unknown column", hint=False,
                                   detail=f"canonical columns: {list(CANONICAL_COLUMNS)}; source-specific "
                                          f"ones need a prefix from {list(SOURCE_PREFIXES)}")
    if "duration_s" not in cols and "iterations" not in cols:
        raise TraceFormatError(path, 1, "duration_s", "the header needs a duration_s or an iterations column",
                               hint=False)
    n = len(df)
    jid = None
    if "job_id" in cols:
        # exactly (int64): a float64 would merge 9007199254740992 and ...993 and wrap ids beyond 2**63
        jid, jid_ok = parse_integer(df["job_id"], ln, bad, "job_id", allow_negative=True)
        dup = np.zeros(n, dtype=bool)
        ok_rows = np.flatnonzero(jid_ok)
        dup[ok_rows] = pd.Series(jid[ok_rows]).duplicated().to_numpy()
        bad.add_mask(dup, ln, "job_id", "duplicate job_id", df["job_id"])
    arr = parse_number(df["arrival_s"], ln, bad, "arrival_s")
    gpus = parse_number(df["num_gpus"], ln, bad, "num_gpus", integer=True)
    dur = parse_number(df["duration_s"], ln, bad, "duration_s", required=False) if "duration_s" in cols else np.full(n, np.nan)
    it = parse_number(df["iterations"], ln, bad, "iterations", required=False) if "iterations" in cols else np.full(n, np.nan)
    bad.add_mask(np.isnan(dur) & np.isnan(it), ln, "duration_s", "missing duration_s and iterations")
    bs = None
    if "batch_size" in cols:
        bs = parse_number(df["batch_size"], ln, bad, "batch_size", required=False, integer=True)
        bad.add_mask(bs == 0, ln, "batch_size", "batch_size must be >= 1", df["batch_size"])
    if "status" in cols:
        st = df["status"].str.strip()
        bad.add_mask(~st.isin(("",) + STATUSES).to_numpy(), ln, "status", "unknown status", st)
    keep = ~np.isin(ln, bad.resolve())

    def text(c):
        return df[c].str.strip().to_numpy(dtype=object)[keep] if c in cols else ""

    status = text("status")
    vc = text("vc")
    extras = {c: df[c].to_numpy(dtype=object)[keep] for c in cols if is_source_column(c)}
    d, i, g = dur[keep], it[keep], gpus[keep]
    return build_jobs(
        "csv", str(path), bad, rows_read=raw.rows_read, arrival=arr[keep], num_gpus=g, duration_s=d,
        iterations=i, model=text("model"), batch_size=None if bs is None else bs[keep], status=status,
        vc=vc, gpu_type=text("gpu_type"), extras=extras, job_id=None if jid is None else jid[keep],
        drop={"no_gpus": g == 0, "zero_duration": (d == 0) | (i == 0)}, clock="trace",
        default_gpu_type=CANONICAL_DEFAULT_GPU_TYPE,
        has_status=not isinstance(status, str) and any(s != "" for s in status),
        has_vc=not isinstance(vc, str) and any(v != "" for v in vc))
