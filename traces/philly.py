"""Microsoft Philly traces: the Pollux-processed CSV (``philly:``) and the raw ``cluster_job_log``
JSON of msr-fiddle/philly-traces (``philly-json:``). Mapping rules: docs/traces.md."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
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


@dataclass
class _JsonLog:
    """The fields of a ``cluster_job_log`` as text, one list entry per job and per attempt.

    Per job (in file order): ``line`` (the file line of its record), ``jobid``, ``status``,
    ``vc``, ``user``, ``submitted_time``, ``gpus`` (GPUs of its first attempt) and
    ``attempts`` (how many). Per attempt (job by job, in order): ``attempt_job`` (the job's
    position above), ``attempt_index`` (0 for a job's first attempt), ``attempt_line``,
    ``start_time`` and ``end_time``.
    """

    line: list[int] = field(default_factory=list)
    jobid: list[str] = field(default_factory=list)
    status: list[str] = field(default_factory=list)
    vc: list[str] = field(default_factory=list)
    user: list[str] = field(default_factory=list)
    submitted_time: list[str] = field(default_factory=list)
    gpus: list[int] = field(default_factory=list)
    attempts: list[int] = field(default_factory=list)
    attempt_job: list[int] = field(default_factory=list)
    attempt_index: list[int] = field(default_factory=list)
    attempt_line: list[int] = field(default_factory=list)
    start_time: list[str] = field(default_factory=list)
    end_time: list[str] = field(default_factory=list)


def _first_attempt_gpus(att: dict, line: int, bad: BadRows) -> int:
    """GPUs of a job's first attempt: the GPUs listed for each of its machines, summed.
    Malformed ``detail`` entries are reported to ``bad``."""
    detail = att.get("detail", [])
    if not isinstance(detail, list):
        bad.add([line], "attempts[0].detail", "malformed detail (expected a list)", [detail])
        return 0
    gpus = 0
    for d in detail:
        g = d.get("gpus") if isinstance(d, dict) else None
        if not isinstance(g, list):
            bad.add([line], "attempts[0].detail.gpus", "malformed GPU list", [g])
            continue
        gpus += len(g)
    return gpus


def _add_json_record(log: _JsonLog, line: int, rec, bad: BadRows) -> None:
    """Append one job record (and its attempts) to ``log``. A record that is not an object, or
    malformed attempts, are reported to ``bad``; their fields count as missing."""
    k = len(log.line)
    log.line.append(line)
    if not isinstance(rec, dict):
        bad.add([line], "<record>", "malformed job record", [type(rec).__name__])
        rec = {}
    log.jobid.append(_str_or_empty(rec.get("jobid")))
    log.status.append(_str_or_empty(rec.get("status")))
    log.vc.append(_str_or_empty(rec.get("vc")))
    log.user.append(_str_or_empty(rec.get("user")))
    log.submitted_time.append(_str_or_empty(rec.get("submitted_time")))
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
        log.attempt_job.append(k)
        log.attempt_index.append(i)
        log.attempt_line.append(line)
        log.start_time.append(_str_or_empty(att.get("start_time")))
        log.end_time.append(_str_or_empty(att.get("end_time")))
        if i == 0:
            gpus = _first_attempt_gpus(att, line, bad)
    log.gpus.append(gpus)
    log.attempts.append(len(attempts))


@dataclass
class _JsonTimes:
    """The parsed times of a ``cluster_job_log`` (seconds on the epoch clock; NaN: missing):
    ``submitted`` and canonical ``status`` per job, ``start``/``end`` per attempt."""

    submitted: np.ndarray
    status: np.ndarray
    start: np.ndarray
    end: np.ndarray


def _parse_json_times(log: _JsonLog, bad: BadRows) -> _JsonTimes:
    """Parse the submission times, statuses and attempt start/end times; bad values and an
    attempt ending before its start are reported to ``bad``."""
    lines = np.asarray(log.line, dtype=np.int64)
    sub = parse_time(pd.Series(log.submitted_time, dtype=object), lines, bad, "submitted_time")
    status = check_status(pd.Series(log.status, dtype=object), lines, bad, "status", PHILLY_JSON_STATUS)
    a_lines = np.asarray(log.attempt_line, dtype=np.int64)
    st = parse_time(pd.Series(log.start_time, dtype=object), a_lines, bad, "attempts.start_time", required=False)
    en = parse_time(pd.Series(log.end_time, dtype=object), a_lines, bad, "attempts.end_time", required=False)
    back = en < st
    if back.any():
        for ln, i, v in zip(a_lines[back], np.asarray(log.attempt_index)[back],
                            np.asarray(log.end_time, dtype=object)[back]):
            bad.add([ln], f"attempts[{i}].end_time", "end before start", [v])
    return _JsonTimes(submitted=sub, status=status, start=st, end=en)


@dataclass
class _JobAttempts:
    """Each job's attempts summed up: ``missing_start``/``missing_end`` (some attempt lacks a
    start / end time), ``duration_s`` (seconds holding GPUs: the sum of end - start over the
    attempts with both), ``first_start`` / ``last_end`` (the first attempt's start and the last
    attempt's end, as the file gives them; "" when there is no attempt)."""

    missing_start: np.ndarray
    missing_end: np.ndarray
    duration_s: np.ndarray
    first_start: np.ndarray
    last_end: np.ndarray


def _sum_attempts(log: _JsonLog, times: _JsonTimes) -> _JobAttempts:
    """Sum each job's attempts (see :class:`_JobAttempts`)."""
    nj = len(log.line)
    a_job = np.asarray(log.attempt_job, dtype=np.int64)
    st, en = times.start, times.end
    run = np.where(np.isnan(st) | np.isnan(en), 0.0, en - st)
    first_start = np.full(nj, "", dtype=object)
    last_end = np.full(nj, "", dtype=object)
    if a_job.size:
        firsts = np.asarray(log.attempt_index) == 0
        first_start[a_job[firsts]] = np.asarray(log.start_time, dtype=object)[firsts]
        last_pos = np.r_[a_job[1:] != a_job[:-1], True]
        last_end[a_job[last_pos]] = np.asarray(log.end_time, dtype=object)[last_pos]
    return _JobAttempts(
        missing_start=np.bincount(a_job, weights=np.isnan(st), minlength=nj) > 0,
        missing_end=np.bincount(a_job, weights=np.isnan(en), minlength=nj) > 0,
        duration_s=np.bincount(a_job, weights=run, minlength=nj).astype(np.float64),
        first_start=first_start, last_end=last_end)


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
    log = _JsonLog()
    for line, rec in iter_json_records(path, read_text(path)):
        _add_json_record(log, line, rec, bad)
    times = _parse_json_times(log, bad)
    keep = ~np.isin(np.asarray(log.line, dtype=np.int64), bad.resolve())
    attempts = _sum_attempts(log, times)
    natt = np.asarray(log.attempts, dtype=np.int64)
    gpus = np.asarray(log.gpus, dtype=np.float64)

    def kept(a):
        return np.asarray(a, dtype=object)[keep]

    drop = {
        "never_started": (natt == 0)[keep],
        "missing_start_time": attempts.missing_start[keep],
        "missing_end_time": attempts.missing_end[keep],
        "no_gpus": (gpus == 0)[keep],
        "zero_duration": (attempts.duration_s == 0)[keep],
    }
    return build_jobs(
        "philly-json", str(path), bad, rows_read=len(log.line), arrival=times.submitted[keep],
        num_gpus=gpus[keep], duration_s=attempts.duration_s[keep], status=times.status[keep], vc=kept(log.vc),
        extras={"philly_jobid": kept(log.jobid), "philly_user": kept(log.user),
                "philly_status": kept(log.status), "philly_submitted_time": kept(log.submitted_time),
                "philly_attempts": kept([str(x) for x in log.attempts]),
                "philly_first_start": attempts.first_start[keep], "philly_last_end": attempts.last_end[keep]},
        drop=drop, clock="epoch", default_gpu_type=PHILLY_GPU_TYPE, has_status=True, has_vc=True)
