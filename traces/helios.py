"""SenseTime Helios ``cluster_log.csv`` (``helios:``). Mapping rules: docs/traces.md."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ._io import check_status, parse_number, parse_time, read_delimited
from ._loader import LoaderResult, build_jobs
from .schema import BadRows

#: Slurm end states in Helios (HeliosData README): TIMEOUT and NODE_FAIL are "regarded as
#: failed"; CANCELLED is a user kill; SUSPENDED happened once and is treated as killed.
HELIOS_STATUS = {"COMPLETED": "completed", "CANCELLED": "killed", "FAILED": "failed",
                 "TIMEOUT": "failed", "NODE_FAIL": "failed", "SUSPENDED": "killed"}
HELIOS_REQUIRED = ("vc", "gpu_num", "state", "submit_time", "start_time", "end_time", "duration")
#: Default GPU type: an assumption (the public trace names no GPU model); override with --gpu-type.
HELIOS_GPU_TYPE = "v100"


def load_helios(path: str | Path, *, skip_bad_rows: bool = False) -> LoaderResult:
    """``helios:PATH`` -- a Helios ``cluster_log.csv`` (job_id, user, vc, [jobname,] gpu_num,
    cpu_num, node_num, state, submit_time, start_time, end_time, duration, queue).

    arrival = submit_time; duration_s = duration (seconds; end_time - start_time when empty);
    num_gpus = gpu_num (0 = CPU job, dropped as ``no_gpus``); vc = vc; state -> status.
    """
    bad = BadRows(str(path), skip_bad_rows)
    raw = read_delimited(path, bad, sep=",", header=True, required=HELIOS_REQUIRED)
    df, ln = raw.df, raw.lines
    sub = parse_time(df["submit_time"], ln, bad, "submit_time")
    st = parse_time(df["start_time"], ln, bad, "start_time", required=False)
    en = parse_time(df["end_time"], ln, bad, "end_time", required=False)
    dur = parse_number(df["duration"], ln, bad, "duration", required=False)
    gpus = parse_number(df["gpu_num"], ln, bad, "gpu_num", integer=True)
    status = check_status(df["state"], ln, bad, "state", HELIOS_STATUS)
    bad.add_mask(en < st, ln, "end_time", "end before start", df["end_time"])
    keep = ~np.isin(ln, bad.resolve())
    dur = np.where(np.isnan(dur), en - st, dur)[keep]
    st, en, g = st[keep], en[keep], gpus[keep]

    def col(c):
        return df[c].to_numpy(dtype=object)[keep] if c in df.columns else ""

    return build_jobs(
        "helios", str(path), bad, rows_read=raw.rows_read, arrival=sub[keep], num_gpus=g, duration_s=dur,
        status=status[keep], vc=col("vc"),
        extras={"helios_job_id": col("job_id"), "helios_user": col("user"), "helios_jobname": col("jobname"),
                "helios_state": col("state"), "helios_cpu_num": col("cpu_num"), "helios_node_num": col("node_num"),
                "helios_submit_time": col("submit_time"), "helios_queue": col("queue")},
        drop={"never_started": np.isnan(st), "missing_end_time": np.isnan(en) & np.isnan(dur),
              "no_gpus": g == 0, "zero_duration": dur == 0},
        clock="epoch", default_gpu_type=HELIOS_GPU_TYPE, has_status=True, has_vc=True)
