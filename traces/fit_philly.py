"""Fit the synthetic generator to the Philly trace and write ``traces/_philly_fit.py``.

    python -m traces.fit_philly [PATH_TO_philly.csv]     # default: $JIGSAW_DATA/philly/philly.csv

The output holds only derived numbers (counts, quantiles, an hourly profile) with their source;
the trace itself is never copied into the project. docs/traces.md explains each number.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from . import data_dir
from .philly import load_philly_csv

#: duration buckets by GPU count: (name, lowest, highest); the generator draws a job's duration
#: from the quantile table of its bucket, so big jobs keep their (longer) durations.
BUCKETS = (("1", 1, 1), ("2-4", 2, 4), ("5-8", 5, 8), (">8", 9, 10**9))
#: quantile-table resolution per bucket (number of intervals): finer where there are more jobs.
RESOLUTION = {"1": 1000, "2-4": 200, "5-8": 100, ">8": 50}

OUT = Path(__file__).with_name("_philly_fit.py")


def fit(path: str | Path) -> dict:
    res = load_philly_csv(path)
    df = res.jobs
    g = df["num_gpus"].to_numpy()
    d = df["duration_s"].to_numpy()
    counts = {int(k): int(v) for k, v in zip(*np.unique(g, return_counts=True))}
    quant = {}
    for name, lo, hi in BUCKETS:
        sel = d[(g >= lo) & (g <= hi)]
        k = RESOLUTION[name]
        quant[name] = {"n": int(sel.size),
                       "values": [float(round(v, 3)) for v in np.quantile(sel, np.linspace(0, 1, k + 1))]}
    ts = df["philly_timestamp"].astype(str).str.slice(11, 13).astype(int).to_numpy()
    hourly = np.bincount(ts, minlength=24) / len(ts)
    arr = df["arrival_s"].to_numpy()
    return {
        "n_jobs": int(len(df)),
        "gpu_counts": counts,
        "duration_quantiles": quant,
        "duration_summary": {f"p{q}": float(np.percentile(d, q)) for q in (1, 10, 25, 50, 75, 90, 99)}
        | {"mean": float(d.mean()), "max": float(d.max())},
        "hourly_share": [float(round(x, 6)) for x in hourly],
        "arrival_span_s": float(arr.max() - arr.min()),
        "mean_interarrival_s": float((arr.max() - arr.min()) / (len(arr) - 1)),
        "mean_gpu_seconds": float((g * d).mean()),
        "trace_start": res.trace_start,
    }


def render(f: dict) -> str:
    lines = [
        '"""Numbers fitted to the Philly trace; written by ``python -m traces.fit_philly`` -- do not edit.',
        "",
        "Source: $JIGSAW_DATA/philly/philly.csv (Microsoft Philly trace as processed by the Pollux",
        "authors: petuum/adaptdl, branch osdi21-artifact, simulator/traces/philly.csv, Apache-2.0),",
        "columns num_gpus, duration (seconds) and timestamp. Only derived figures are stored here.",
        'See docs/traces.md, "Synthetic generator".',
        '"""',
        "",
        'SOURCE = "philly.csv (petuum/adaptdl osdi21-artifact simulator/traces/philly.csv): columns num_gpus, duration, timestamp"',
        f"N_JOBS = {f['n_jobs']}",
        f"TRACE_START = {f['trace_start']!r}",
        "#: jobs per GPU count (column num_gpus)",
        f"GPU_COUNTS = {f['gpu_counts']!r}",
        "#: duration buckets by GPU count: (name, lowest, highest)",
        f"DURATION_BUCKETS = {tuple(BUCKETS)!r}",
        "#: per bucket: number of jobs and the duration quantiles (seconds, column duration) at",
        "#: probabilities 0, 1/K, ..., 1 (K = len(values) - 1; numpy 'linear' quantiles)",
        "DURATION_QUANTILES = {",
    ]
    for name, q in f["duration_quantiles"].items():
        vals = q["values"]
        lines.append(f"    {name!r}: {{'n': {q['n']}, 'values': (")
        for i in range(0, len(vals), 8):
            lines.append("        " + ", ".join(repr(v) for v in vals[i:i + 8]) + ",")
        lines.append("    )},")
    lines += [
        "}",
        "#: quantiles of all durations (seconds), for reference and tests",
        f"DURATION_SUMMARY = {f['duration_summary']!r}",
        "#: share of submissions per hour of day 0..23 (hours as written in column timestamp)",
        f"HOURLY_SHARE = {tuple(f['hourly_share'])!r}",
        f"ARRIVAL_SPAN_S = {f['arrival_span_s']!r}",
        f"MEAN_INTERARRIVAL_S = {f['mean_interarrival_s']!r}",
        "#: mean of num_gpus * duration (GPU-seconds per job)",
        f"MEAN_GPU_SECONDS = {f['mean_gpu_seconds']!r}",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    path = Path(argv[0]) if argv else data_dir() / "philly" / "philly.csv"
    OUT.write_text(render(fit(path)))
    print(f"wrote {OUT} from {path}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
