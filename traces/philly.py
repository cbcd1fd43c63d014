"""Microsoft Philly traces: the Pollux-processed CSV (``philly:``) and the raw ``cluster_job_log``
JSON of msr-fiddle/philly-traces (``philly-json:``). Mapping rules: docs/traces.md."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from ._io import parse_number, parse_time, read_delimited, read_text, check_status
from ._loader import LoaderResult, build_jobs
from .schema import BadRows, TraceFormatError

#: GPU type whose throughput turns Philly durations into iterations. Philly's own GPUs are only
#: described by memory size (12 GB / 24 GB, Jeon et al. ATC'19); we follow Gavel, which generates
#: Philly-derived jobs with ``reference_worker_type='v100'`` (scheduler/utils.py generate_job).
PHILLY_GPU_TYPE = "v100"
PHILLY_JSON_STATUS = {"Pass": "completed", "Killed": "killed", "Failed": "failed"}


def load_philly_csv(path: str | Path, *, skip_bad_rows: bool = False) -> LoaderResult:
    """``philly:PATH`` -- columns timestamp, duration (s), num_gpus, gpu_time, cluster.

    arrival = timestamp; duration_s = duration; vc = cluster; no status (every job is kept).
    """
    bad = BadRows(str(path), skip_bad_rows)
    raw = read_delimited(path, bad, sep=",", header=True, required=("timestamp", "duration", "num_gpus"))
    df, lines = raw.df, raw.lines
    ts = parse_time(df["timestamp"], lines, bad, "timestamp")
    dur = parse_number(df["duration"], lines, bad, "duration")
    gpus = parse_number(df["num_gpus"], lines, bad, "num_gpus", integer=True)
    keep = ~np.isin(lines, bad.resolve())
    vc = df["cluster"].to_numpy(dtype=object)[keep] if "cluster" in df.columns else ""
    ts, dur, gpus = ts[keep], dur[keep], gpus[keep]
    return build_jobs(
        "philly", str(path), bad, rows_read=raw.rows_read, arrival=ts, num_gpus=gpus, duration_s=dur,
        vc=vc, extras={"philly_timestamp": df["timestamp"].to_numpy(dtype=object)[keep]},
        drop={"no_gpus": gpus == 0, "zero_duration": dur == 0},
        clock="epoch", default_gpu_type=PHILLY_GPU_TYPE, has_status=False, has_vc="cluster" in df.columns)


def iter_json_records(path: str | Path, text: str):
    """Yield (line, record) for each top-level record of a JSON array, or of a JSON-lines /
    concatenated-objects file. Malformed JSON raises TraceFormatError with its line."""
    dec = json.JSONDecoder()
    n = len(text)
    pos = 0
    line = 1

    def skip_ws(p: int) -> int:
        while p < n and text[p] in " \t\r\n":
            p += 1
        return p

    pos = skip_ws(pos)
    in_array = pos < n and text[pos] == "["
    if in_array:
        pos = skip_ws(pos + 1)
    last = 0
    while pos < n:
        if in_array and text[pos] == "]":
            return
        line += text.count("\n", last, pos)
        last = pos
        try:
            obj, end = dec.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raise TraceFormatError(path, e.lineno, "<json>", f"malformed JSON: {e.msg}", hint=False) from None
        yield line, obj
        pos = skip_ws(end)
        if in_array and pos < n and text[pos] == ",":
            pos = skip_ws(pos + 1)


def _str_or_empty(v) -> str:
    return "" if v is None else str(v)


def load_philly_json(path: str | Path, *, skip_bad_rows: bool = False) -> LoaderResult:
    """``philly-json:PATH`` -- the raw ``cluster_job_log`` (a JSON list of jobs).

    arrival = submitted_time; num_gpus = GPUs of the first attempt (summed over its machines, as
    the trace's own notebook does); duration_s = sum over attempts of (end_time - start_time), the
    time the job held GPUs; status Pass/Killed/Failed -> completed/killed/failed.
    Jobs with no attempt are dropped as ``never_started``; an attempt without a start time as
    ``missing_start_time``; without an end time (still running at the snapshot, or a logging
    gap) as ``missing_end_time``.
    """
    bad = BadRows(str(path), skip_bad_rows)
    text = read_text(path)
    j_line, j_id, j_status, j_vc, j_user, j_sub, j_gpus, j_natt = [], [], [], [], [], [], [], []
    a_job, a_idx, a_start, a_end, a_line = [], [], [], [], []
    for line, rec in iter_json_records(path, text):
        k = len(j_line)
        j_line.append(line)
        if not isinstance(rec, dict):
            bad.add([line], "<record>", "malformed job record", [type(rec).__name__])
            rec = {}
        j_id.append(_str_or_empty(rec.get("jobid")))
        j_status.append(_str_or_empty(rec.get("status")))
        j_vc.append(_str_or_empty(rec.get("vc")))
        j_user.append(_str_or_empty(rec.get("user")))
        j_sub.append(_str_or_empty(rec.get("submitted_time")))
        attempts = rec.get("attempts", [])
        if attempts is None:
            attempts = []
        if not isinstance(attempts, list):
            bad.add([line], "attempts", "malformed attempts (expected a list)", [attempts])
            attempts = []
        gpus = 0
        for i, att in enumerate(attempts):
            if not isinstance(att, dict):
                bad.add([line], f"attempts[{i}]", "malformed attempt (expected an object)", [att])
                continue
            a_job.append(k)
            a_idx.append(i)
            a_line.append(line)
            a_start.append(_str_or_empty(att.get("start_time")))
            a_end.append(_str_or_empty(att.get("end_time")))
            if i == 0:
                detail = att.get("detail", [])
                if not isinstance(detail, list):
                    bad.add([line], "attempts[0].detail", "malformed detail (expected a list)", [detail])
                    detail = []
                for d in detail:
                    g = d.get("gpus") if isinstance(d, dict) else None
                    if not isinstance(g, list):
                        bad.add([line], "attempts[0].detail.gpus", "malformed GPU list", [g])
                        continue
                    gpus += len(g)
        j_gpus.append(gpus)
        j_natt.append(len(attempts))

    nj = len(j_line)
    lines = np.asarray(j_line, dtype=np.int64)
    sub = parse_time(pd.Series(j_sub, dtype=object), lines, bad, "submitted_time")
    status = check_status(pd.Series(j_status, dtype=object), lines, bad, "status", PHILLY_JSON_STATUS)
    a_job = np.asarray(a_job, dtype=np.int64)
    a_lines = np.asarray(a_line, dtype=np.int64)
    st = parse_time(pd.Series(a_start, dtype=object), a_lines, bad, "attempts.start_time", required=False)
    en = parse_time(pd.Series(a_end, dtype=object), a_lines, bad, "attempts.end_time", required=False)
    back = en < st
    if back.any():
        for ln, i, v in zip(a_lines[back], np.asarray(a_idx)[back], np.asarray(a_end, dtype=object)[back]):
            bad.add([ln], f"attempts[{i}].end_time", "end before start", [v])
    keep = ~np.isin(lines, bad.resolve())

    natt = np.asarray(j_natt, dtype=np.int64)
    no_start = np.bincount(a_job, weights=np.isnan(st), minlength=nj) > 0
    no_end = np.bincount(a_job, weights=np.isnan(en), minlength=nj) > 0
    run = np.where(np.isnan(st) | np.isnan(en), 0.0, en - st)
    dur = np.bincount(a_job, weights=run, minlength=nj).astype(np.float64)
    gpus = np.asarray(j_gpus, dtype=np.float64)
    first_start = np.full(nj, "", dtype=object)
    last_end = np.full(nj, "", dtype=object)
    if a_job.size:
        a_start_arr = np.asarray(a_start, dtype=object)
        a_end_arr = np.asarray(a_end, dtype=object)
        firsts = np.asarray(a_idx) == 0
        first_start[a_job[firsts]] = a_start_arr[firsts]
        last_pos = np.r_[a_job[1:] != a_job[:-1], True]
        last_end[a_job[last_pos]] = a_end_arr[last_pos]

    def k(a):
        return np.asarray(a, dtype=object)[keep]

    drop = {
        "never_started": (natt == 0)[keep],
        "missing_start_time": no_start[keep],
        "missing_end_time": no_end[keep],
        "no_gpus": (gpus == 0)[keep],
        "zero_duration": (dur == 0)[keep],
    }
    return build_jobs(
        "philly-json", str(path), bad, rows_read=nj, arrival=sub[keep], num_gpus=gpus[keep],
        duration_s=dur[keep], status=status[keep], vc=k(j_vc),
        extras={"philly_jobid": k(j_id), "philly_user": k(j_user), "philly_status": k(j_status),
                "philly_submitted_time": k(j_sub), "philly_attempts": k([str(x) for x in j_natt]),
                "philly_first_start": first_start[keep], "philly_last_end": last_end[keep]},
        drop=drop, clock="epoch", default_gpu_type=PHILLY_GPU_TYPE, has_status=True, has_vc=True)
