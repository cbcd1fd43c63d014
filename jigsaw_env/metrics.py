"""Metrics of docs/design.md section 5 (docs/metrics.md), computed from the job log and the per-round cluster log.

Inputs are the simulator's frames (``Simulator.jobs_frame()``, ``Simulator.cluster_frame()``) or
the same columns read back from ``jobs.csv`` / ``cluster.csv``. Definitions (docs/metrics.md):

- JCT = finish - arrival; mean, p50, p95, p99, and mean by job size (GPUs).
- makespan = last finish - first arrival; queueing delay = first start - arrival.
- allocated GPU utilization = GPU-seconds held / (GPUs x (end - first arrival)).
- compute utilization = GPU-seconds computing / (GPUs x (end - first arrival)).
- cluster efficiency = useful work / capacity. Useful work: full-backprop-equivalent iterations
  x isolated iteration time x GPUs (GPU-seconds on dedicated consolidated GPUs).
  backlogged form: window = makespan; trace-window form: window = first..last arrival, with the
  work done by the window's end. Saturated form: useful work / (GPUs x time) over the rounds that
  start with at least one job waiting (``queued > 0`` in the cluster log), the headline form: it
  measures what a scheduler does with a full cluster, whatever the load outside those rounds.
- finish-time fairness rho = JCT / T_fair, T_fair = isolated time x max(1, demand / (GPUs / n)),
  n = average number of active jobs over the job's lifetime (Themis, as Gavel computes it).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd


def _q(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q)) if len(x) else float("nan")


def fairness(jobs: pd.DataFrame, cluster_rounds: pd.DataFrame, num_gpus: int) -> np.ndarray:
    """rho per completed job (array aligned with ``jobs[jobs.status == 'done']``)."""
    done = jobs[jobs["status"] == "done"]
    if len(done) == 0 or len(cluster_rounds) == 0:
        return np.array([])
    starts = cluster_rounds["start_s"].to_numpy(float)
    ends = cluster_rounds["end_s"].to_numpy(float)
    js = cluster_rounds["job_seconds"].to_numpy(float)
    # F(t) = integral of active jobs from the first round's start; linear inside each round. Rounds
    # follow each other without gaps (an idle cluster's round runs to the next arrival), so the
    # first start and every end are the knots
    knots_t = np.concatenate([[starts[0]], ends])
    knots_F = np.concatenate([[0.0], np.cumsum(js)])
    arr = done["arrival_s"].to_numpy(float)
    fin = done["finish_s"].to_numpy(float)
    life = np.maximum(fin - arr, 1e-12)
    n_avg = (np.interp(fin, knots_t, knots_F) - np.interp(arr, knots_t, knots_F)) / life
    n_avg = np.maximum(n_avg, 1.0)
    demand = done["num_gpus"].to_numpy(float)
    t_fair = done["isolated_s"].to_numpy(float) * np.maximum(1.0, demand / (num_gpus / n_avg))
    return (fin - arr) / t_fair


def saturated_work(cluster_rounds: pd.DataFrame) -> tuple[float, float]:
    """(useful GPU-seconds, seconds) summed over the rounds that start with a job waiting."""
    if len(cluster_rounds) == 0 or "queued" not in cluster_rounds.columns:
        return 0.0, 0.0  # (a cluster log without the waiting count: the form is undefined)
    waiting = cluster_rounds["queued"].to_numpy() > 0
    seconds = (cluster_rounds["end_s"].to_numpy(float) - cluster_rounds["start_s"].to_numpy(float))[waiting]
    return float(cluster_rounds["useful_gpu_s"].to_numpy(float)[waiting].sum()), float(seconds.sum())


def compute_metrics(jobs: pd.DataFrame, cluster_rounds: pd.DataFrame, num_gpus: int, *, backlogged: bool,
                    window: tuple[float, float], useful_at_window_end: float | None,
                    wall_s: float = float("nan")) -> dict:
    """Every metric as a flat dict of floats/ints (JSON-ready). See module docstring."""
    done = jobs[jobs["status"] == "done"]
    jct = done["jct_s"].to_numpy(float)
    started = jobs[jobs["start_s"].notna()]
    first_arrival = float(jobs["arrival_s"].min())
    end = float(cluster_rounds["end_s"].max()) if len(cluster_rounds) else first_arrival
    last_finish = float(done["finish_s"].max()) if len(done) else float("nan")
    makespan = last_finish - first_arrival if len(done) == len(jobs) else float("nan")
    span = max(end - first_arrival, 1e-12)
    busy = float(cluster_rounds["busy_gpu_s"].sum()) if len(cluster_rounds) else 0.0
    alloc = float(cluster_rounds["allocated_gpu_s"].sum()) if len(cluster_rounds) else 0.0
    useful = float(cluster_rounds["useful_gpu_s"].sum()) if len(cluster_rounds) else 0.0
    if backlogged:
        eff = useful / (num_gpus * makespan) if makespan and makespan > 0 else float("nan")
        form = "backlogged"
    else:
        w = window[1] - window[0]
        eff = (useful_at_window_end / (num_gpus * w)) if (useful_at_window_end is not None and w > 0) else float("nan")
        form = "trace-window"
    sat_useful, sat_s = saturated_work(cluster_rounds)
    rho = fairness(jobs, cluster_rounds, num_gpus)
    by_size = {str(int(k)): float(v) for k, v in done.groupby("num_gpus")["jct_s"].mean().items()}
    out = {
        "jobs_total": int(len(jobs)),
        "jobs_completed": int(len(done)),
        "avg_jct_s": float(jct.mean()) if len(jct) else float("nan"),
        "p50_jct_s": _q(jct, 50),
        "p95_jct_s": _q(jct, 95),
        "p99_jct_s": _q(jct, 99),
        "jct_by_gpus_s": by_size,
        "makespan_s": makespan,
        "avg_queue_s": float(started["queue_s"].mean()) if len(started) else float("nan"),
        "gpu_utilization": alloc / (num_gpus * span),
        "compute_utilization": busy / (num_gpus * span),
        "cluster_efficiency": eff,
        "efficiency_form": form,
        "saturated_efficiency": sat_useful / (num_gpus * sat_s) if sat_s > 0 else float("nan"),
        "saturated_s": sat_s,
        "useful_gpu_s": useful,
        "ftf_mean": float(rho.mean()) if len(rho) else float("nan"),
        "ftf_max": float(rho.max()) if len(rho) else float("nan"),
        "preemptions": int(jobs["preemptions"].sum()),
        "migrations": int(jobs["migrations"].sum()),
        "level_changes": int(jobs["level_changes"].sum()),
        "simulated_s": span,
        "wall_s": wall_s,
    }
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in out.items()}
