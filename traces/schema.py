"""The canonical job table: its schema, its one validation function and its CSV form.

Every loader in :mod:`traces` produces a :class:`pandas.DataFrame` with these columns (in this
order), and every loader's output goes through :func:`validate_jobs`:

==============  =========  ==================================================================
column          dtype      meaning
==============  =========  ==================================================================
``job_id``      int64      unique id (the position in the source's arrival order, or the id
                           of a canonical CSV)
``arrival_s``   float64    submission time, seconds from the trace start (after
                           :func:`traces.load_trace`: from the first kept job, so it starts
                           at 0)
``num_gpus``    int64      GPUs the job asks for, >= 1
``duration_s``  float64    run time in the original cluster, seconds, > 0; NaN when the
                           source gives only iterations (Gavel)
``iterations``  float64    training iterations (whole numbers), > 0; NaN when unknown
``model``       str        a zoo model name, or "" when the source names none
``batch_size``  Int64      per-job batch size; <NA> when unknown
``status``      str        final status: completed, failed, killed, running, pending, or ""
                           when the format records none
``vc``          str        virtual cluster (Philly ``cluster``/``vc``, Helios ``vc``), or ""
``gpu_type``    str        GPU type of the original cluster (k80, p100, v100, ...); the type
                           iterations were computed on
==============  =========  ==================================================================

Every row has a ``duration_s`` or an ``iterations`` (or both). Source-specific columns follow,
named with a source prefix (see :data:`SOURCE_PREFIXES`), kept as text (``str``).

Errors in an input file raise :class:`TraceFormatError`, naming the file, the line and the field.
"""
from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

CANONICAL_COLUMNS: dict[str, str] = {
    "job_id": "int64",
    "arrival_s": "float64",
    "num_gpus": "int64",
    "duration_s": "float64",
    "iterations": "float64",
    "model": "str",
    "batch_size": "Int64",
    "status": "str",
    "vc": "str",
    "gpu_type": "str",
}
STRING_COLUMNS = ("model", "status", "vc", "gpu_type")
STATUSES = ("completed", "failed", "killed", "running", "pending")
SOURCE_PREFIXES = ("philly_", "ali20_", "ali23_", "helios_", "gavel_", "syn_", "src_")


class TraceFormatError(ValueError):
    """A malformed row in a trace file. ``str(e)`` names the file, the line and the field."""

    def __init__(self, path: str | Path, line: int | None, field: str, reason: str,
                 value: Any = None, hint: bool = True, detail: str | None = None):
        self.path = str(path)
        self.line = line
        self.field = field
        self.reason = reason
        self.value = value
        where = f"{self.path}: line {line}" if line is not None else self.path
        msg = f"{where}: field '{field}': {reason}"
        if value is not None:
            v = str(value)
            if len(v) > 120:
                v = v[:117] + "..."
            msg += f" (got {v!r})"
        if detail:
            msg += f"; {detail}"
        if hint:
            msg += " [--skip-bad-rows skips such rows]"
        super().__init__(msg)


@dataclass
class _Issue:
    lines: np.ndarray
    field: str
    reason: str
    values: np.ndarray | None


@dataclass
class BadRows:
    """Collects malformed rows of one file; either raises on the first or counts them by reason.

    Checks add whole masks at once (vectorized); :meth:`resolve` then raises a
    :class:`TraceFormatError` for the earliest bad line in the file (``skip=False``) or returns
    the set of bad lines, counting each line once, under its first problem (``skip=True``).
    """

    path: str
    skip: bool = False
    issues: list[_Issue] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)

    def add(self, lines: Iterable[int] | np.ndarray, field_name: str, reason: str,
            values: Iterable[Any] | np.ndarray | None = None) -> None:
        lines = np.asarray(lines, dtype=np.int64).ravel()
        if lines.size == 0:
            return
        vals = None if values is None else np.asarray(list(values) if not isinstance(values, (np.ndarray, pd.Series)) else values, dtype=object).ravel()
        self.issues.append(_Issue(lines, field_name, reason, vals))

    def add_mask(self, mask: np.ndarray | pd.Series, lines: np.ndarray, field_name: str, reason: str,
                 values: pd.Series | np.ndarray | None = None) -> None:
        m = np.asarray(mask, dtype=bool)
        if not m.any():
            return
        vals = None if values is None else np.asarray(values, dtype=object)[m]
        self.add(np.asarray(lines)[m], field_name, reason, vals)

    def resolve(self) -> np.ndarray:
        """Raise on the first bad line (not skipping), else return the bad lines (sorted, unique)."""
        if not self.issues:
            return np.empty(0, dtype=np.int64)
        all_lines = np.concatenate([i.lines for i in self.issues])
        which = np.concatenate([np.full(i.lines.size, k) for k, i in enumerate(self.issues)])
        pos = np.concatenate([np.arange(i.lines.size) for i in self.issues])
        order = np.lexsort((which, all_lines))
        all_lines, which, pos = all_lines[order], which[order], pos[order]
        first = np.ones(all_lines.size, dtype=bool)
        first[1:] = all_lines[1:] != all_lines[:-1]
        if not self.skip:
            k, p = which[0], pos[0]
            iss = self.issues[k]
            raise TraceFormatError(self.path, int(all_lines[0]), iss.field, iss.reason,
                                   None if iss.values is None else iss.values[p])
        for k, p, ln in zip(which[first], pos[first], all_lines[first]):
            iss = self.issues[k]
            self.counts[iss.reason] = self.counts.get(iss.reason, 0) + 1
            if len(self.examples) < 5:
                v = "" if iss.values is None else f" (got {str(iss.values[p])[:40]!r})"
                self.examples.append(f"line {int(ln)}: field '{iss.field}': {iss.reason}{v}")
        self.issues.clear()
        return all_lines[first]


# ----------------------------------------------------------------------------------------------
# validation


def _fail(origin: str, column: str, df: pd.DataFrame, mask: np.ndarray, what: str) -> None:
    idx = np.flatnonzero(mask)[0]
    jid = df["job_id"].iloc[idx] if "job_id" in df.columns else idx
    val = df[column].iloc[idx]
    if isinstance(val, np.generic):  # 1e+20, not np.float64(1e+20)
        val = val.item()
    raise ValueError(f"{origin}: column '{column}': job_id {jid}: {what}, got {val!r}")


def is_source_column(name: str) -> bool:
    return any(name.startswith(p) and len(name) > len(p) for p in SOURCE_PREFIXES)


def _check_columns(df: pd.DataFrame, origin: str) -> None:
    """Check a job table's columns: a DataFrame with ``arrival_s``, ``num_gpus``, a
    ``duration_s`` or an ``iterations``, and no column that is neither canonical nor
    source-specific. Raises ValueError naming ``origin``."""
    if not isinstance(df, pd.DataFrame):
        raise ValueError(f"{origin}: expected a pandas DataFrame, got {type(df).__name__}")
    missing = [c for c in ("arrival_s", "num_gpus") if c not in df.columns]
    if missing:
        raise ValueError(f"{origin}: missing required column(s) {missing}; canonical columns: "
                         f"{list(CANONICAL_COLUMNS)}")
    if "duration_s" not in df.columns and "iterations" not in df.columns:
        raise ValueError(f"{origin}: needs a 'duration_s' or an 'iterations' column")
    unknown = [c for c in df.columns if c not in CANONICAL_COLUMNS and not is_source_column(str(c))]
    if unknown:
        raise ValueError(f"{origin}: unknown column(s) {unknown}; source-specific columns must start "
                         f"with one of {list(SOURCE_PREFIXES)}")


def _add_missing_columns(out: pd.DataFrame) -> None:
    """Add the optional canonical columns a table lacks (in place): ``job_id`` as 0..n-1,
    ``duration_s``/``iterations`` as NaN, ``batch_size`` as <NA>, the text columns as ""."""
    n = len(out)
    if "job_id" not in out.columns:
        out["job_id"] = np.arange(n, dtype=np.int64)
    for c in ("duration_s", "iterations"):
        if c not in out.columns:
            out[c] = np.nan
    if "batch_size" not in out.columns:
        out["batch_size"] = pd.array([pd.NA] * n, dtype="Int64")
    for c in STRING_COLUMNS:
        if c not in out.columns:
            out[c] = ""


def _parse_numbers(out: pd.DataFrame, origin: str) -> None:
    """Turn the numeric columns into numbers (in place); a value that is not a number, or a
    missing ``job_id``/``arrival_s``/``num_gpus``, raises ValueError naming the job."""
    for c in ("job_id", "arrival_s", "num_gpus", "duration_s", "iterations", "batch_size"):
        raw = out[c]
        num = pd.to_numeric(raw, errors="coerce")
        lost = num.isna().to_numpy() & raw.notna().to_numpy()
        if lost.any():
            _fail(origin, c, out, lost, "not a number")
        out[c] = num
    for c in ("job_id", "arrival_s", "num_gpus"):
        bad = out[c].isna().to_numpy()
        if bad.any():
            _fail(origin, c, out, bad, "missing value")


def _check_job_ids(out: pd.DataFrame, origin: str) -> None:
    """``job_id`` as int64 (in place): whole numbers within int64's range, no two alike."""
    jid = out["job_id"].to_numpy(dtype=np.float64)
    bad = jid != np.floor(jid)
    if bad.any():
        _fail(origin, "job_id", out, bad, "must be an integer")
    kind = out["job_id"].dtype.kind
    if kind not in "iu":  # float ids: no silent wrap-around in the int64 cast (integer dtypes are exact)
        bad = ~np.isfinite(jid) | (jid < -(2.0 ** 63)) | (jid >= 2.0 ** 63)
        if bad.any():
            _fail(origin, "job_id", out, bad, "integer out of range (expected -2**63 .. 2**63-1)")
    elif kind == "u":
        bad = out["job_id"].to_numpy() > np.uint64(2 ** 63 - 1)
        if bad.any():
            _fail(origin, "job_id", out, bad, "integer out of range (expected -2**63 .. 2**63-1)")
    out["job_id"] = out["job_id"].astype(np.int64)
    dup = out["job_id"].duplicated().to_numpy()
    if dup.any():
        _fail(origin, "job_id", out, dup, "duplicate job_id")


def _check_job_sizes(out: pd.DataFrame, origin: str) -> None:
    """Check and cast (in place) ``arrival_s`` (seconds, finite, >= 0), ``num_gpus`` (a whole
    number >= 1), ``duration_s`` (seconds) and ``iterations`` (each > 0 or NaN, not both NaN)
    and ``batch_size`` (a whole number >= 1, or <NA>)."""
    arr = out["arrival_s"].to_numpy(dtype=np.float64)
    bad = ~np.isfinite(arr) | (arr < 0)
    if bad.any():
        _fail(origin, "arrival_s", out, bad, "must be a finite number >= 0")
    out["arrival_s"] = arr
    g = out["num_gpus"].to_numpy(dtype=np.float64)
    bad = (g != np.floor(g)) | (g < 1) | ~(g < 2.0 ** 63)  # too large for int64 (or inf): not a GPU count
    if bad.any():
        _fail(origin, "num_gpus", out, bad, "must be an integer >= 1")
    out["num_gpus"] = g.astype(np.int64)
    for c in ("duration_s", "iterations"):
        v = out[c].to_numpy(dtype=np.float64)
        bad = ~np.isnan(v) & (~np.isfinite(v) | (v <= 0))
        if bad.any():
            _fail(origin, c, out, bad, "must be a finite number > 0 (or empty)")
        out[c] = v
    neither = np.isnan(out["duration_s"].to_numpy()) & np.isnan(out["iterations"].to_numpy())
    if neither.any():
        _fail(origin, "duration_s", out, neither, "each job needs a duration_s or iterations")
    bs = out["batch_size"].to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isnan(bs) & ((bs != np.floor(bs)) | (bs < 1) | ~(bs < 2.0 ** 63))
    if bad.any():
        _fail(origin, "batch_size", out, bad, "must be an integer >= 1 (or empty)")
    out["batch_size"] = pd.Series(bs, index=out.index).astype("Int64")


def _normalize_text(out: pd.DataFrame, origin: str) -> list[str]:
    """The text columns as ``str`` with "" for missing (in place), ``status`` one of
    :data:`STATUSES` or ""; return the source-specific columns, in the table's order."""
    for c in STRING_COLUMNS:
        out[c] = out[c].fillna("").astype(str)
    st = out["status"]
    bad = (~st.isin(("",) + STATUSES)).to_numpy()
    if bad.any():
        _fail(origin, "status", out, bad, f"unknown status (allowed: {list(STATUSES)} or empty)")
    extras = [c for c in out.columns if c not in CANONICAL_COLUMNS]
    for c in extras:
        if out[c].dtype != "str" or out[c].isna().any():
            out[c] = out[c].astype(object).where(out[c].notna(), "").astype(str)
    return extras


def validate_jobs(df: pd.DataFrame, origin: str = "<jobs>", sort: bool = True) -> pd.DataFrame:
    """Check a job table against the canonical schema; return it normalized and sorted.

    Normalizing means: canonical columns in canonical order with canonical dtypes, missing
    optional columns added (``model``/``status``/``vc``/``gpu_type`` as "", ``batch_size`` as
    <NA>, ``duration_s``/``iterations`` as NaN, ``job_id`` as 0..n-1), source-specific columns
    after them as text, rows stably sorted by ``arrival_s`` (``sort=False``: in the table's order).

    Raises ValueError naming ``origin``, the column and the first offending job.
    """
    _check_columns(df, origin)
    out = df.copy()
    _add_missing_columns(out)
    _parse_numbers(out, origin)
    _check_job_ids(out, origin)
    _check_job_sizes(out, origin)
    extras = _normalize_text(out, origin)

    out = out[list(CANONICAL_COLUMNS) + extras]
    if sort:
        order = np.argsort(out["arrival_s"].to_numpy(), kind="stable")
        if not np.all(order == np.arange(len(out))):
            out = out.iloc[order]
    return out.reset_index(drop=True)


# ----------------------------------------------------------------------------------------------
# canonical CSV


def canonical_csv_bytes(df: pd.DataFrame) -> bytes:
    """The canonical CSV form of a (validated) job table, as bytes."""
    buf = io.StringIO()
    df.to_csv(buf, index=False, lineterminator="\n")
    return buf.getvalue().encode("utf-8")


def to_canonical_csv(df: pd.DataFrame, path: str | Path) -> Path:
    """Write a job table as canonical CSV (readable back with ``csv:PATH``). Returns the path."""
    df = validate_jobs(df, origin=str(path))
    for c in df.columns:
        if df[c].dtype == "str" and df[c].str.contains("[\r\n]", regex=True).any():
            raise ValueError(f"{path}: column '{c}' holds a line break; the canonical CSV is one job a line")
    p = Path(path)
    p.write_bytes(canonical_csv_bytes(df))
    return p


def digest_of(df: pd.DataFrame) -> str:
    """sha256 of the canonical CSV bytes, first 16 hex digits."""
    return hashlib.sha256(canonical_csv_bytes(df)).hexdigest()[:16]
