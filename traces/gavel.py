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
#: Gavel job types -> zoo models. A3C and CycleGAN have no zoo model: their jobs get model ""
#: and are mapped like model-less jobs (their Gavel step counts are kept as iterations).
GAVEL_MODELS = {"ResNet-18": "resnet18", "ResNet-50": "resnet50", "Transformer": "transformer_small",
                "LM": "lstm_lm", "Recommendation": "recommendation"}
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
