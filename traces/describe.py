"""What ``jigsaw traces describe`` reports about a loaded trace."""
from __future__ import annotations

from typing import Any

import numpy as np

from jigsaw_env.cost_table import available_tables

from .api import Trace, offered_load
from .models import ThroughputFn, estimated_durations

QUANTILES = (10, 50, 90, 99)


def batch_scaled_jobs(jobs) -> dict[str, int]:
    """``{"<model>-bs<B>-<gpu type>": jobs}`` for the jobs whose (model, batch size) has no cost table
    on their GPU type, so the simulator gives them the nearest batch size's table scaled by eq. B1
    (docs/cost_tables.md section 9); jobs without a model or batch size are not counted."""
    has = (jobs["model"] != "").to_numpy() & jobs["batch_size"].notna().to_numpy()
    if not has.any():
        return {}
    known = set(available_tables())
    typed = {(m, d) for m, _, d in known}
    sub = jobs.loc[has, ["model", "batch_size", "gpu_type"]]
    out: dict[str, int] = {}
    for (m, b, g), n in sub.value_counts(sort=False).items():
        # a model without any table on the type is an error for the simulator, not a scaled table
        if (str(m), str(g)) in typed and (str(m), int(b), str(g)) not in known:
            out[f"{m}-bs{int(b)}-{g}"] = int(n)
    return dict(sorted(out.items()))


def describe_trace(trace: Trace, cluster_gpus: int, throughput_fn: ThroughputFn | None = None) -> dict[str, Any]:
    """Job count, GPU histogram, duration quantiles, arrival span, offered load, filter summary,
    and the jobs whose batch size has no cost table (batch-scaled)."""
    jobs = trace.jobs
    n = len(jobs)
    hist = {int(k): int(v) for k, v in jobs["num_gpus"].value_counts().sort_index().items()}
    d_trace = jobs["duration_s"].to_numpy(dtype=np.float64)
    known = d_trace[~np.isnan(d_trace)]
    dq = None
    if known.size:
        dq = {f"p{q}": float(np.percentile(known, q)) for q in QUANTILES}
        dq |= {"min": float(known.min()), "max": float(known.max()), "mean": float(known.mean())}
    estimate_error = None
    try:
        d_est = estimated_durations(jobs, throughput_fn)
    except ValueError as e:  # no throughput for some job: report the load as unknown
        d_est, estimate_error = d_trace.copy(), str(e)
    n_est = int(np.sum(np.isnan(d_trace) & ~np.isnan(d_est)))
    a = jobs["arrival_s"].to_numpy()
    span = float(a.max() - a.min()) if n else 0.0
    load = offered_load(jobs, cluster_gpus, d_est) if n else float("nan")
    it = jobs["iterations"].to_numpy(dtype=np.float64)
    scaled = batch_scaled_jobs(jobs) if n else {}
    out: dict[str, Any] = {
        "source": trace.source,
        "digest": trace.digest(),
        "jobs": n,
        "gpu_histogram": hist,
        "gpu_seconds": float(np.nansum(jobs["num_gpus"].to_numpy() * d_est)) if n else 0.0,
        "duration_s": dq,
        "jobs_without_duration": int(np.isnan(d_trace).sum()),
        "durations_estimated_from_iterations": n_est,
        "duration_estimate_error": estimate_error,
        "iterations_known": int((~np.isnan(it)).sum()),
        "arrival_span_s": span,
        "first_arrival_s": float(a.min()) if n else None,
        "last_arrival_s": float(a.max()) if n else None,
        "cluster_gpus": int(cluster_gpus),
        "offered_load": None if not np.isfinite(load) else float(load),
        "models": {str(k): int(v) for k, v in jobs["model"].value_counts().items()},
        "jobs_batch_scaled": int(sum(scaled.values())),
        "batch_scaled": scaled,
        "status": {str(k): int(v) for k, v in jobs["status"].value_counts().items()},
        "gpu_types": {str(k): int(v) for k, v in jobs["gpu_type"].value_counts().items()},
        "vcs": int(jobs["vc"].replace("", np.nan).nunique()),
        "summary": {k: v for k, v in trace.summary.items() if k not in ("source",)},
    }
    return out


def _fmt_s(x: float) -> str:
    if x is None or not np.isfinite(x):
        return "n/a"
    if x < 120:
        return f"{x:,.0f} s"
    if x < 2 * 3600:
        return f"{x:,.0f} s ({x / 60:.1f} min)"
    if x < 2 * 86400:
        return f"{x:,.0f} s ({x / 3600:.1f} h)"
    return f"{x:,.0f} s ({x / 86400:.1f} d)"


def render_description(d: dict[str, Any]) -> str:
    s = d["summary"]
    lines = [f"trace     {d['source']}   (digest {d['digest']})"]
    if s.get("path"):
        lines.append(f"file      {s['path']}  (trace start {s.get('trace_start')})")
    lines.append(f"jobs      {d['jobs']:,}   (rows read {s['rows_read']:,}; jobs read {s['jobs_read']:,}; "
                 f"kept {s['kept']:,})")
    lines.append("GPUs per job:")
    total = max(d["jobs"], 1)
    for g, c in d["gpu_histogram"].items():
        lines.append(f"  {g:>5}  {c:>9,}  {100.0 * c / total:6.2f}%")
    dq = d["duration_s"]
    if dq:
        qs = "  ".join(f"{k} {_fmt_s(v)}" for k, v in dq.items() if k.startswith("p"))
        lines.append(f"duration  {qs}")
        lines.append(f"          min {_fmt_s(dq['min'])}  mean {_fmt_s(dq['mean'])}  max {_fmt_s(dq['max'])}")
    if d["jobs_without_duration"]:
        lines.append(f"          {d['jobs_without_duration']:,} jobs give iterations only "
                     f"({d['durations_estimated_from_iterations']:,} durations estimated from throughput)")
    if d.get("duration_estimate_error"):
        lines.append(f"          (no estimate: {d['duration_estimate_error']})")
    lines.append(f"arrivals  span {_fmt_s(d['arrival_span_s'])}")
    load = d["offered_load"]
    lines.append(f"load      offered load vs {d['cluster_gpus']} GPUs: "
                 f"{'n/a' if load is None else f'{load:.3f}'}   "
                 "(= sum(num_gpus*duration_s) / (GPUs * arrival span))")
    if s.get("load") and abs(s["load"]["arrival_scale"] - 1.0) > 1e-9:
        li = s["load"]
        lines.append(f"          arrivals scaled by {li['arrival_scale']:.4g} to load {li['target']} "
                     f"vs {li['cluster_gpus']} GPUs (was {li['before_scaling']:.4g})")
    if d["models"] and any(k for k in d["models"]):
        lines.append("models    " + ", ".join(f"{k or '(none)'} {v:,}" for k, v in d["models"].items()))
    if d.get("jobs_batch_scaled"):
        lines.append(f"batch     {d['jobs_batch_scaled']:,} jobs at a batch size without a cost table (nearest batch "
                     "size's table scaled, docs/cost_tables.md eq. B1): "
                     + ", ".join(f"{k} {v:,}" for k, v in d["batch_scaled"].items()))
    if s.get("gavel_stand_ins"):
        lines.append("stand-ins " + ", ".join(f"{k} {v:,}" for k, v in s["gavel_stand_ins"].items())
                     + " (Gavel job types without a zoo model, docs/traces.md eq. G2)")
    if d["status"] and any(k for k in d["status"]):
        lines.append("status    " + ", ".join(f"{k} {v:,}" for k, v in d["status"].items()))
    lines.append("gpu type  " + ", ".join(f"{k} {v:,}" for k, v in d["gpu_types"].items()))
    filt = s.get("filtered") or {}
    lines.append("filtered  " + (", ".join(f"{k} {v:,}" for k, v in filt.items()) if filt else "none"))
    badr = s.get("bad_rows_skipped") or {}
    lines.append("bad rows  " + (", ".join(f"{k} {v:,}" for k, v in badr.items()) + " (skipped)" if badr else "none"))
    for e in s.get("bad_row_examples") or []:
        lines.append(f"          e.g. {e}")
    if s.get("capped_gpus"):
        lines.append(f"capped    {s['capped_gpus']:,} jobs to {s['gpu_cap']} GPUs")
    notes = {k: v for k, v in (s.get("notes") or {}).items() if k not in ("synthetic", "fitted_to")}
    if notes:
        lines.append("notes     " + ", ".join(f"{k} {v}" for k, v in notes.items()))
    return "\n".join(lines)
