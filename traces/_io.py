"""Reading delimited trace files with line numbers, and vectorized field parsing.

Every parsing helper reports malformed values to a :class:`~traces.schema.BadRows` collector
with the file line of each row, so an error can name the file, the line and the field.
"""
from __future__ import annotations

import csv
import gzip
import io
import re
import zlib
from decimal import Decimal, InvalidOperation
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from .schema import BadRows, TraceFormatError

_EPOCH = pd.Timestamp("1970-01-01")


def read_text(path: str | Path) -> str:
    """The text of a trace file (``.gz`` is decompressed). FileNotFoundError names the path."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"trace file not found: {p}")
    if p.is_dir():
        raise FileNotFoundError(f"trace path is a directory, expected a file: {p}")
    data = p.read_bytes()
    if p.suffix == ".gz":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:  # BadGzipFile is an OSError; a cut file is an EOFError
            raise ValueError(f"{p}: not a valid gzip file ({e}); expected gzip-compressed text (or drop the .gz "
                             f"suffix for plain text)") from None
    # utf-8-sig: a leading byte-order mark (Excel's "CSV UTF-8" export) is not part of the first column's name
    return data.decode("utf-8-sig", errors="replace")


@dataclass
class RawTable:
    """Rows of a delimited file as text: ``df`` (one str column per field) and ``lines``
    (the 1-based file line of each row). Rows with a wrong field count are already reported."""

    df: pd.DataFrame
    lines: np.ndarray
    rows_read: int


def _split_csv_line(line: str, sep: str) -> list[str]:
    return next(csv.reader([line], delimiter=sep))


def read_delimited(path: str | Path, bad: BadRows, *, sep: str = ",", columns: Sequence[str] | None = None,
                   header: bool = True, required: Sequence[str] = (), quoting: bool = True,
                   layouts: dict[int, Sequence[str]] | None = None) -> RawTable:
    """Read a delimited file into text columns, reporting rows with a wrong number of fields.

    ``header=True``: the first non-blank line names the columns and must contain ``required``.
    ``header=False``: ``columns`` names them; a first line equal to those names is skipped.
    ``layouts`` (headerless only): field count -> column names, for formats with several layouts;
    the first row's field count picks the layout for the whole file.
    Blank lines are ignored (they are not rows).
    """
    text = read_text(path)
    # split on "\n" only (str.splitlines would also split on \u2028, \x1c, ... inside fields)
    lines = pd.Series(text.split("\n"), dtype=object).str.removesuffix("\r")
    nonblank = (lines.str.strip() != "").to_numpy()
    data_idx = np.flatnonzero(nonblank)
    if header:
        if data_idx.size == 0:
            raise TraceFormatError(path, 1, required[0] if required else "header",
                                   "empty file: expected a header line", hint=False)
        h = int(data_idx[0])
        names = [c.strip() for c in (_split_csv_line(lines[h], sep) if quoting else lines[h].split(sep))]
        seen: dict[str, int] = {}
        for k, c in enumerate(names):
            if c in seen:
                raise TraceFormatError(path, h + 1, c, f"column appears twice in the header (columns {seen[c] + 1} "
                                       f"and {k + 1}); expected each column once", detail=f"the header has {names}",
                                       hint=False)
            seen[c] = k
        for r in required:
            if r not in names:
                raise TraceFormatError(path, h + 1, r, "missing column in the header",
                                       detail=f"the header has {names}", hint=False)
        data_idx = data_idx[1:]
    else:
        if layouts is not None:
            columns = max(layouts.values(), key=len)
        assert columns is not None
        names = list(columns)
        if data_idx.size:
            first = lines[int(data_idx[0])].split(sep)
            if first and first[0].strip() == names[0]:
                data_idx = data_idx[1:]
    rows_read = int(data_idx.size)
    data = lines.iloc[data_idx]
    sep_count = (data.str.count(re.escape(sep)).to_numpy() + 1) if rows_read else np.empty(0, dtype=np.int64)
    unbalanced = np.zeros(rows_read, dtype=bool)
    if quoting and rows_read:
        quoted = data.str.contains('"', regex=False).to_numpy()
        for k in np.flatnonzero(quoted):
            line = data.iloc[k]
            if line.count('"') % 2:
                unbalanced[k] = True
            else:
                sep_count[k] = len(_split_csv_line(line, sep))
    if layouts is not None:
        first_count = int(sep_count[0]) if rows_read else len(names)
        ncols = first_count if first_count in layouts else len(names)
        names = list(layouts[ncols])
    else:
        ncols = len(names)
    file_lines = data_idx + 1
    if unbalanced.any():
        bad.add(file_lines[unbalanced], names[0], "unbalanced quote",
                data[unbalanced].str.slice(0, 60).tolist())
    wrong = (sep_count != ncols) & ~unbalanced
    if wrong.any():
        wl = file_lines[wrong]
        cnt = sep_count[wrong]
        if layouts is not None:
            exp = f"{ncols} (the layout of the first row; layouts: {sorted(layouts)} fields)"
        else:
            exp = str(ncols)
        # name the first missing field, or the first extra one
        for ln, c in zip(wl, cnt):
            fld = names[c] if c < ncols else f"#{ncols + 1} (extra field)"
            bad.add([ln], fld, "wrong column count", [f"{c} fields, expected {exp}"])
    good = ~wrong & ~unbalanced
    used_names = names
    if good.any():
        body = "\n".join(data[good].tolist())
        df = pd.read_csv(io.StringIO(body), sep=sep, header=None, names=used_names, dtype=str,
                         keep_default_na=False, na_filter=False, skip_blank_lines=False,
                         quoting=csv.QUOTE_MINIMAL if quoting else csv.QUOTE_NONE, engine="c")
    else:
        df = pd.DataFrame({c: pd.Series([], dtype=str) for c in used_names})
    if len(df) != int(good.sum()):  # pragma: no cover - a quoting case the checks above missed
        raise TraceFormatError(path, None, "<file>", "rows and lines do not match (multi-line quoted field?)",
                               hint=False)
    return RawTable(df=df, lines=file_lines[good], rows_read=rows_read)


# ----------------------------------------------------------------------------------------------
# vectorized field parsing


_INT64_MIN, _INT64_MAX = -(2 ** 63), 2 ** 63 - 1
_FLOAT_EXACT = 2.0 ** 53  # every integer below this (in magnitude) is exact in a float64
# a number written in <= 15 characters has <= 15 significant digits, so its float64 is a whole number
# exactly when the text is one; longer texts ("5.0000000000000001") are decided from the text
_SHORT_TEXT = 15


def _parse(s: pd.Series, lines: np.ndarray, bad: BadRows, field: str, required: bool, integer: bool,
           allow_negative: bool) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """The shared body of :func:`parse_number` and :func:`parse_integer`: (float64 values, exact
    int64 values, mask of rows with a valid integer); the last two are None unless ``integer``."""
    st = s.str.strip()
    num = pd.to_numeric(st, errors="coerce")
    if not integer:
        x = num.to_numpy(dtype=np.float64, copy=True)
    elif num.dtype.kind == "i":
        # every value a plain integer literal that fits int64 (pandas read them exactly): the fast path
        exact = num.to_numpy(dtype=np.int64, copy=True)
        x = exact.astype(np.float64)
        if not allow_negative:
            bad.add_mask(exact < 0, lines, field, f"negative {field}", st)
        return x, exact, np.ones(len(x), dtype=bool) if allow_negative else exact >= 0
    else:
        x = num.to_numpy(dtype=np.float64, copy=True)
    empty = (st == "").to_numpy()
    nonnum = (~np.isfinite(x)) & ~empty
    bad.add_mask(nonnum, lines, field, f"non-numeric {field}", st)
    if required:
        bad.add_mask(empty, lines, field, f"missing {field}")
    x[nonnum] = np.nan
    exact = ok = None
    if integer:
        finite = np.isfinite(x)
        # a float64 cannot tell 9007199254740993 from ...992, nor 2**63 - 1 from 2**63: decide those
        # rows (large values, and long texts that may hide a fraction) from the text, exactly
        slow = finite & (np.abs(x) >= _FLOAT_EXACT)
        if finite.any() and not slow.all():
            long_text = st.str.len().to_numpy(dtype=np.float64, na_value=0.0) > _SHORT_TEXT
            slow |= finite & long_text
        fast = finite & ~slow
        nonint = fast & (x != np.floor(x))
        exact = np.zeros(len(x), dtype=np.int64)
        ok = fast & ~nonint
        exact[ok] = x[ok].astype(np.int64)
        out_of_range = np.zeros(len(x), dtype=bool)
        texts = st.to_numpy(dtype=object)
        for k in np.flatnonzero(slow):
            try:
                d = Decimal(str(texts[k]))
            except InvalidOperation:  # pragma: no cover - pandas read it as a number
                nonint[k] = True
                continue
            if d != d.to_integral_value():
                nonint[k] = True
            elif not _INT64_MIN <= int(d) <= _INT64_MAX:
                out_of_range[k] = True
            else:
                exact[k] = int(d)
                ok[k] = True
        bad.add_mask(nonint, lines, field, f"non-integer {field}", st)
        bad.add_mask(out_of_range, lines, field, "integer out of range", st)
    if not allow_negative:
        neg = x < 0
        bad.add_mask(neg, lines, field, f"negative {field}", st)
        if ok is not None:
            ok &= ~neg
    return x, exact, ok


def parse_number(s: pd.Series, lines: np.ndarray, bad: BadRows, field: str, *, required: bool = True,
                 integer: bool = False, allow_negative: bool = False) -> np.ndarray:
    """Parse a text column as float64 (NaN where empty). Reports non-numeric, missing (when
    ``required``), non-integer and out-of-int64-range (when ``integer``, both decided exactly from
    the text) and negative values as bad rows."""
    return _parse(s, lines, bad, field, required, integer, allow_negative)[0]


def parse_integer(s: pd.Series, lines: np.ndarray, bad: BadRows, field: str, *, required: bool = True,
                  allow_negative: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Parse a text column of integers exactly (a float64 would turn 9007199254740993 into
    ...992): (int64 values, mask of the rows that hold a valid integer; their value is 0 elsewhere).
    Reports the bad rows as :func:`parse_number` with ``integer=True`` does, among them values
    outside the int64 range ("integer out of range")."""
    _, exact, ok = _parse(s, lines, bad, field, required, True, allow_negative)
    assert exact is not None and ok is not None
    return exact, ok


_MISSING_TIME = ("", "none", "null", "nan", "nat")


def parse_time(s: pd.Series, lines: np.ndarray, bad: BadRows, field: str, *,
               required: bool = True) -> np.ndarray:
    """Parse a date-time text column ("YYYY-MM-DD HH:MM:SS", ISO 8601) to epoch seconds (float64,
    NaN where empty/None). Unparsable values are bad rows; so are missing ones when ``required``."""
    st = s.str.strip()
    missing = st.str.lower().isin(_MISSING_TIME).to_numpy()
    ts = pd.to_datetime(st.where(~missing, None), format="ISO8601", errors="coerce")
    x = ((ts - _EPOCH) / pd.Timedelta(seconds=1)).to_numpy(dtype=np.float64, copy=True)
    unparsable = np.isnan(x) & ~missing
    bad.add_mask(unparsable, lines, field, f"bad time {field}", st)
    if required:
        bad.add_mask(missing, lines, field, f"missing {field}")
    return x


def check_status(s: pd.Series, lines: np.ndarray, bad: BadRows, field: str,
                 mapping: dict[str, str]) -> np.ndarray:
    """Map raw status values to canonical ones; unknown values are bad rows ("unknown status")."""
    st = s.str.strip()
    known = st.isin(list(mapping)).to_numpy()
    bad.add_mask(~known, lines, field, "unknown status", st)
    return st.map(mapping).fillna("").to_numpy(dtype=object)


def drop_lines(df: pd.DataFrame, lines: np.ndarray, bad_lines: np.ndarray) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """Rows of ``df`` whose line is not in ``bad_lines``: (df, lines, keep-mask)."""
    if bad_lines.size == 0:
        return df, lines, np.ones(len(df), dtype=bool)
    keep = ~np.isin(lines, bad_lines)
    return df[keep].reset_index(drop=True), lines[keep], keep
