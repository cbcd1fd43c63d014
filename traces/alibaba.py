"""Alibaba GPU traces: PAI 2020 (``alibaba2020:``, job + task tables) and the 2023 GPU-sharing
pod lists (``alibaba2023:``). Mapping rules: docs/traces.md."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ._io import check_status, parse_number, read_delimited
from ._loader import LoaderResult, build_jobs
from .schema import BadRows

ALI20_JOB_COLUMNS = ("job_name", "inst_id", "user", "status", "start_time", "end_time")
ALI20_TASK_COLUMNS = ("job_name", "task_name", "inst_num", "status", "start_time", "end_time",
                      "plan_cpu", "plan_mem", "plan_gpu", "gpu_type")
ALI20_STATUS = {"Terminated": "completed", "Failed": "failed", "Running": "running", "Waiting": "pending"}
ALI23_STATUS = {"Succeeded": "completed", "Failed": "failed", "Running": "running", "Pending": "pending"}
#: Alibaba GPU names -> cost-table GPU types. MISC = "older generations, e.g. K40m, K80, M60"
#: (trace README) -> k80. T4 has no table of its own; its training speed is closest to a P100.
#: Anything else (G1/G2/G3 undisclosed codes, A10, ...) stays unknown and takes the default.
ALI_GPU_TYPES = {"MISC": "k80", "K40": "k80", "K40M": "k80", "K80": "k80", "M60": "k80",
                 "P100": "p100", "T4": "p100", "V100": "v100", "V100M16": "v100", "V100M32": "v100"}
ALI_DEFAULT_GPU_TYPE = "v100"


def _gpu_type(raw: pd.Series) -> np.ndarray:
    first = raw.fillna("").astype(str).str.split("|").str[0].str.strip().str.upper()
    return first.map(ALI_GPU_TYPES).fillna("").to_numpy(dtype=object)


def _ali20_paths(path: str | Path) -> tuple[Path, Path]:
    p = Path(path)
    if p.is_dir():
        job, task = p / "pai_job_table.csv", p / "pai_task_table.csv"
    else:
        job = p
        task = p.parent / "pai_task_table.csv"
    if not job.exists():
        raise FileNotFoundError(f"alibaba2020: job table not found: {job}")
    if not task.exists():
        raise FileNotFoundError(f"alibaba2020: task table not found beside the job table: {task}")
    return job, task


def load_alibaba2020(path: str | Path, *, skip_bad_rows: bool = False) -> LoaderResult:
    """``alibaba2020:PATH`` -- PATH is the directory holding ``pai_job_table.csv`` and
    ``pai_task_table.csv`` (headerless), or the job table itself (the task table beside it).

    arrival = job start_time (submission; 0 or empty = unknown); num_gpus = ceil(sum over the
    job's tasks of inst_num * plan_gpu / 100), so fractional requests round up; duration_s = last
    task end_time - first task start_time; status Terminated/Failed/Running/Waiting ->
    completed/failed/running/pending; gpu_type from the task asking for the most GPU.
    """
    job_path, task_path = _ali20_paths(path)
    jbad = BadRows(str(job_path), skip_bad_rows)
    jraw = read_delimited(job_path, jbad, sep=",", columns=ALI20_JOB_COLUMNS, header=False)
    jdf, jl = jraw.df, jraw.lines
    j_sub = parse_number(jdf["start_time"], jl, jbad, "start_time", required=False)
    j_end = parse_number(jdf["end_time"], jl, jbad, "end_time", required=False)
    j_status = check_status(jdf["status"], jl, jbad, "status", ALI20_STATUS)
    jbad.add_mask((j_sub > 0) & (j_end > 0) & (j_end < j_sub), jl, "end_time", "end before start", jdf["end_time"])
    jbad.add_mask(jdf["job_name"].str.strip().eq("").to_numpy(), jl, "job_name", "missing job_name")
    jbad.add_mask(jdf["job_name"].duplicated().to_numpy(), jl, "job_name", "duplicate job_name", jdf["job_name"])
    jkeep = ~np.isin(jl, jbad.resolve())

    tbad = BadRows(str(task_path), skip_bad_rows)
    traw = read_delimited(task_path, tbad, sep=",", columns=ALI20_TASK_COLUMNS, header=False)
    tdf, tl = traw.df, traw.lines
    t_inst = parse_number(tdf["inst_num"], tl, tbad, "inst_num")
    t_st = parse_number(tdf["start_time"], tl, tbad, "start_time", required=False)
    t_en = parse_number(tdf["end_time"], tl, tbad, "end_time", required=False)
    t_gpu = parse_number(tdf["plan_gpu"], tl, tbad, "plan_gpu", required=False)
    check_status(tdf["status"], tl, tbad, "status", ALI20_STATUS)
    tbad.add_mask((t_st > 0) & (t_en > 0) & (t_en < t_st), tl, "end_time", "end before start", tdf["end_time"])
    tbad_lines = tbad.resolve()
    t_ok = ~np.isin(tl, tbad_lines)

    started = t_st > 0
    tasks = pd.DataFrame({
        "job_name": tdf["job_name"].to_numpy(dtype=object),
        "ok": t_ok,
        "gpu": np.nan_to_num(t_inst) * np.nan_to_num(t_gpu) / 100.0,
        "inst": np.nan_to_num(t_inst),
        "start": np.where(started, t_st, np.nan),
        "end": np.where(t_en > 0, t_en, np.nan),
        "started": started,
        "open": started & ~(t_en > 0),
        "gpu_type": tdf["gpu_type"].to_numpy(dtype=object),
    })
    agg = tasks.groupby("job_name", sort=False).agg(
        n_tasks=("ok", "size"), all_ok=("ok", "all"), gpu=("gpu", "sum"), inst=("inst", "sum"),
        start=("start", "min"), end=("end", "max"), any_started=("started", "any"), any_open=("open", "any"))
    if len(tasks):
        top = tasks.loc[tasks.groupby("job_name", sort=False)["gpu"].idxmax(), ["job_name", "gpu_type"]]
        agg = agg.join(top.set_index("job_name"))
    else:
        agg["gpu_type"] = pd.Series(dtype=object)
    names = jdf["job_name"].to_numpy(dtype=object)[jkeep]
    orphan = int((~tasks["job_name"].isin(set(names))).sum())
    a = agg.reindex(names)
    has_tasks = a["n_tasks"].notna().to_numpy()
    gpu_total = a["gpu"].fillna(0.0).to_numpy(dtype=np.float64)
    num_gpus = np.ceil(np.round(gpu_total, 6))
    dur = (a["end"] - a["start"]).to_numpy(dtype=np.float64)
    sub = j_sub[jkeep]
    drop = {
        "missing_submit_time": ~(sub > 0),
        "no_tasks": ~has_tasks,
        "bad_task_row": ~a["all_ok"].fillna(True).astype(bool).to_numpy(),
        "never_started": ~a["any_started"].fillna(False).astype(bool).to_numpy(),
        "missing_end_time": a["any_open"].fillna(False).astype(bool).to_numpy() | np.isnan(dur),
        "no_gpus": num_gpus == 0,
        "zero_duration": dur == 0,
    }
    bad = BadRows(str(job_path), skip_bad_rows)
    bad.counts = dict(jbad.counts)
    for r, c in tbad.counts.items():
        bad.counts[f"task table: {r}"] = c
    bad.examples = list(jbad.examples) + [f"{task_path.name} {e}" for e in tbad.examples]

    def k(col):
        return jdf[col].to_numpy(dtype=object)[jkeep]

    raw_type = a["gpu_type"].fillna("").astype(str)
    return build_jobs(
        "alibaba2020", str(job_path), bad, rows_read=jraw.rows_read, arrival=np.where(sub > 0, sub, np.nan),
        num_gpus=num_gpus, duration_s=dur, status=j_status[jkeep], gpu_type=_gpu_type(raw_type),
        extras={"ali20_job_name": names, "ali20_inst_id": k("inst_id"), "ali20_user": k("user"),
                "ali20_status": k("status"), "ali20_gpu_type": raw_type.to_numpy(dtype=object),
                "ali20_gpu_request": np.array([f"{x:g}" for x in gpu_total], dtype=object),
                "ali20_tasks": a["n_tasks"].fillna(0).astype(int).astype(str).to_numpy(dtype=object),
                "ali20_instances": np.array([f"{x:g}" for x in a["inst"].fillna(0.0)], dtype=object)},
        drop=drop, clock="trace", default_gpu_type=ALI_DEFAULT_GPU_TYPE, has_status=True, has_vc=False,
        notes={"task_rows_read": traw.rows_read, "orphan_task_rows": orphan,
               "task_bad_rows_skipped": int(tbad_lines.size)})


ALI23_REQUIRED = ("name", "num_gpu", "pod_phase", "creation_time", "deletion_time", "scheduled_time")


def load_alibaba2023(path: str | Path, *, skip_bad_rows: bool = False) -> LoaderResult:
    """``alibaba2023:PATH`` -- one ``openb_pod_list_*.csv`` (with header).

    arrival = creation_time; duration_s = deletion_time - scheduled_time; num_gpus = num_gpu (a
    GPU-sharing pod, num_gpu 1 with gpu_milli < 1000, counts as 1 GPU; gpu_milli is kept);
    pod_phase Succeeded/Failed/Running/Pending -> completed/failed/running/pending; gpu_type from
    the first type in gpu_spec. Pods never scheduled are ``never_started``; CPU-only pods
    (num_gpu 0) are ``no_gpus``.
    """
    bad = BadRows(str(path), skip_bad_rows)
    raw = read_delimited(path, bad, sep=",", header=True, required=ALI23_REQUIRED)
    df, ln = raw.df, raw.lines
    cre = parse_number(df["creation_time"], ln, bad, "creation_time")
    sch = parse_number(df["scheduled_time"], ln, bad, "scheduled_time", required=False)
    dele = parse_number(df["deletion_time"], ln, bad, "deletion_time", required=False)
    gpus = parse_number(df["num_gpu"], ln, bad, "num_gpu", integer=True)
    if "gpu_milli" in df.columns:
        parse_number(df["gpu_milli"], ln, bad, "gpu_milli", required=False)
    status = check_status(df["pod_phase"], ln, bad, "pod_phase", ALI23_STATUS)
    bad.add_mask(dele < sch, ln, "deletion_time", "end before start", df["deletion_time"])
    keep = ~np.isin(ln, bad.resolve())
    dur = (dele - sch)[keep]
    g = gpus[keep]

    def col(c):
        return df[c].to_numpy(dtype=object)[keep] if c in df.columns else ""

    spec = df["gpu_spec"][keep] if "gpu_spec" in df.columns else pd.Series([""] * int(keep.sum()), dtype=object)
    return build_jobs(
        "alibaba2023", str(path), bad, rows_read=raw.rows_read, arrival=cre[keep], num_gpus=g,
        duration_s=dur, status=status[keep], gpu_type=_gpu_type(spec),
        extras={"ali23_name": col("name"), "ali23_qos": col("qos"), "ali23_gpu_milli": col("gpu_milli"),
                "ali23_gpu_spec": col("gpu_spec"), "ali23_pod_phase": col("pod_phase"),
                "ali23_cpu_milli": col("cpu_milli"), "ali23_memory_mib": col("memory_mib")},
        drop={"never_started": np.isnan(sch[keep]), "missing_end_time": np.isnan(dele[keep]),
              "no_gpus": g == 0, "zero_duration": dur == 0},
        clock="trace", default_gpu_type=ALI_DEFAULT_GPU_TYPE, has_status=True, has_vc=False)
