"""Gavel job traces (``gavel:``): tab-separated, one job a line, no header.

Layouts (stanford-futuredata/gavel), picked by the field count of the first line:

* 10 fields (``scheduler/utils.py`` ``parse_trace``, current): job_type, command,
  working_directory, num_steps_arg, needs_data_dir, total_steps, scale_factor, priority_weight,
  SLO, arrival_time
* 9 fields (the same without working_directory)
* 7 fields (``traces/msr/seed=*/*.trace``): job_type, command, num_steps_arg, needs_data_dir,
  total_steps, arrival_time, scale_factor
* 6 fields (early ``traces/generated/msr/*.trace``): job_type, command, num_steps_arg,
  total_steps, arrival_time, scale_factor
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from ._io import parse_number, read_delimited
from ._loader import LoaderResult, build_jobs
from .schema import BadRows

GAVEL_LAYOUTS = {
    10: ("job_type", "command", "working_directory", "num_steps_arg", "needs_data_dir", "total_steps",
         "scale_factor", "priority_weight", "SLO", "arrival_time"),
    9: ("job_type", "command", "num_steps_arg", "needs_data_dir", "total_steps", "scale_factor",
        "priority_weight", "SLO", "arrival_time"),
    7: ("job_type", "command", "num_steps_arg", "needs_data_dir", "total_steps", "arrival_time", "scale_factor"),
    6: ("job_type", "command", "num_steps_arg", "total_steps", "arrival_time", "scale_factor"),
}
#: Gavel job types -> zoo models. A3C and CycleGAN have no zoo model: the loader gives their jobs
#: model "" and :func:`map_stand_ins` (model mapping on) gives them a stand-in (GAVEL_STAND_INS).
GAVEL_MODELS = {"ResNet-18": "resnet18", "ResNet-50": "resnet50", "Transformer": "transformer_small",
                "LM": "lstm_lm", "Recommendation": "recommendation"}
#: Gavel job types without a zoo model -> (zoo model, batch size, Gavel job type of that model):
#: the zoo model nearest in kind, at a batch size Gavel measured it at (docs/traces.md section
#: "Gavel's A3C and CycleGAN jobs"). A3C (a small convolutional + LSTM actor-critic) -> lstm_lm at
#: 20; CycleGAN (deep convolutional generators on 256x256 images) -> resnet50 at 16.
GAVEL_STAND_INS = {"A3C": ("lstm_lm", 20, "LM (batch size 20)"),
                   "CycleGAN": ("resnet50", 16, "ResNet-50 (batch size 16)")}
GAVEL_THROUGHPUTS = "gavel/simulation_throughputs.json"
#: Gavel simulates V100/P100/K80 clusters; a single-type replay defaults to V100.
GAVEL_GPU_TYPE = "v100"
_JOB_TYPE = re.compile(r"^(?P<name>.*?)\s*(?:\(batch size (?P<bs>\d+)\))?\s*$")


def parse_job_type(job_type: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """"ResNet-50 (batch size 64)" -> ("resnet50", 64); unknown names -> ("", batch size or NaN)."""
    m = job_type.str.strip().str.extract(_JOB_TYPE)
    model = m["name"].map(GAVEL_MODELS).fillna("").to_numpy(dtype=object)
    bs = pd.to_numeric(m["bs"], errors="coerce").to_numpy(dtype=np.float64)
    return model, bs


def load_gavel(path: str | Path, *, skip_bad_rows: bool = False) -> LoaderResult:
    """``gavel:PATH`` -- arrival = arrival_time (s); num_gpus = scale_factor; iterations =
    total_steps; no duration (Gavel gives work in steps); model and batch size from job_type."""
    bad = BadRows(str(path), skip_bad_rows)
    raw = read_delimited(path, bad, sep="\t", header=False, quoting=False, layouts=GAVEL_LAYOUTS)
    df, ln = raw.df, raw.lines
    arr = parse_number(df["arrival_time"], ln, bad, "arrival_time")
    steps = parse_number(df["total_steps"], ln, bad, "total_steps", integer=True)
    sf = parse_number(df["scale_factor"], ln, bad, "scale_factor", integer=True)
    bad.add_mask(sf == 0, ln, "scale_factor", "scale_factor must be >= 1", df["scale_factor"])
    bad.add_mask(df["job_type"].str.strip().eq("").to_numpy(), ln, "job_type", "missing job_type")
    for c in ("priority_weight", "SLO"):
        if c in df.columns:
            parse_number(df[c], ln, bad, c, required=False, allow_negative=True)
    keep = ~np.isin(ln, bad.resolve())
    model, bs = parse_job_type(df["job_type"])
    extras = {f"gavel_{c.lower()}": df[c].to_numpy(dtype=object)[keep]
              for c in df.columns if c not in ("arrival_time", "total_steps", "scale_factor")}
    return build_jobs(
        "gavel", str(path), bad, rows_read=raw.rows_read, arrival=arr[keep], num_gpus=sf[keep],
        iterations=steps[keep], model=model[keep], batch_size=bs[keep], extras=extras,
        drop={"zero_duration": steps[keep] == 0}, clock="trace", default_gpu_type=GAVEL_GPU_TYPE,
        has_status=False, has_vc=False, notes={"layout_fields": len(df.columns)})


def map_stand_ins(jobs: pd.DataFrame, data: Path, origin: str) -> tuple[pd.DataFrame, dict[str, int]]:
    """Give every A3C and CycleGAN job of a loaded Gavel trace its stand-in (GAVEL_STAND_INS) and
    the iterations that keep its time alone on one GPU of its type (Gavel's, else V100) what Gavel
    measured (eq. G2, docs/traces.md):

        iterations = max(1, round(total_steps * theta(stand-in, g) / theta(J, g)))

    with ``theta(., g)`` Gavel's alone throughput (iterations/s, scale factor 1) from
    ``data/gavel/simulation_throughputs.json``. Returns (jobs, {job type: jobs mapped}); raises
    ValueError naming ``origin`` and the file when a throughput is missing."""
    if "gavel_job_type" not in jobs.columns:
        return jobs, {}
    jt = jobs["gavel_job_type"].astype(str).str.strip()
    rows = jt.isin(list(GAVEL_STAND_INS)).to_numpy() & (jobs["model"] == "").to_numpy()
    if not rows.any():
        return jobs, {}
    path = Path(data) / GAVEL_THROUGHPUTS
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{origin}: A3C and CycleGAN jobs are mapped with Gavel's measured throughputs, which could "
                         f"not be read from {path} ({type(e).__name__}); set JIGSAW_DATA to the folder holding "
                         f"{GAVEL_THROUGHPUTS}") from None
    jobs = jobs.copy()
    it = jobs["iterations"].to_numpy(dtype=np.float64).copy()
    counts: dict[str, int] = {}
    for i in np.flatnonzero(rows):
        name = jt.iloc[i]
        model, bs, key = GAVEL_STAND_INS[name]
        g = str(jobs["gpu_type"].iloc[i]) if str(jobs["gpu_type"].iloc[i]) in ("k80", "p100", "v100") else GAVEL_GPU_TYPE
        thetas = []
        for k in (str((key, 1)), str((name, 1))):
            entry = table.get(g, {}).get(k) if isinstance(table, dict) and isinstance(table.get(g), dict) else None
            v = entry.get("null") if isinstance(entry, dict) else None
            if not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"{origin}: {path} has no alone throughput [{g!r}][{k!r}]['null'] to map {name} jobs")
            thetas.append(float(v))
        if it[i] == it[i]:
            it[i] = max(1.0, round(it[i] * thetas[0] / thetas[1]))
        jobs.iloc[i, jobs.columns.get_loc("model")] = model
        jobs.iloc[i, jobs.columns.get_loc("batch_size")] = bs
        counts[name] = counts.get(name, 0) + 1
    jobs["iterations"] = it
    return jobs, dict(sorted(counts.items()))
