"""The simulator's logs and metrics: the per-round rows it keeps as it goes and the frames,
CSV files and metrics made from them. Columns: docs/simulator.md.
"""
from __future__ import annotations

import time as _time
from pathlib import Path

import pandas as pd

from .metrics import compute_metrics

JOB_COLUMNS = ["job_id", "arrival_s", "start_s", "finish_s", "jct_s", "queue_s", "num_gpus", "model",
               "batch_size", "iterations", "progress", "raw_iterations", "isolated_s", "attained_gpu_s",
               "run_s", "preemptions", "migrations", "level_changes", "status"]
ROUND_COLUMNS = ["round", "start_s", "end_s", "job_id", "gpus", "level", "pattern", "run_s", "steps",
                 "progress", "rate", "bytes"]
CLUSTER_COLUMNS = ["round", "start_s", "end_s", "active", "queued", "running", "allocated_gpus",
                   "shared_gpus", "busy_gpu_s", "allocated_gpu_s", "job_seconds", "useful_gpu_s",
                   "finished"] + [f"level{l}" for l in range(8)]


def log_jobs_of_round(sim, rnd, t_end: float) -> None:
    """One round-log row per job that ran in round ``rnd`` (a ``simulator._Round``, ending at
    ``t_end`` s): its JobDecision, or the one it had when it finished."""
    st = sim.state
    rows = sim._round_rows
    gstr = sim._gpu_str
    for jid, (run_s, steps, gain, by) in rnd.acc["jobs"].items():
        jd = rnd.dec_of.get(jid)
        if jd is None:
            jd = rnd.left.get(jid)
        if jd is not None:
            gpus = jd.gpus
            gs = gstr.get(gpus)
            if gs is None:
                if len(gstr) > 100_000:
                    gstr.clear()
                gs = gstr[gpus] = " ".join(map(str, gpus))
            rows.append((st.round, rnd.t0, t_end, jid, gs, jd.level, jd.pattern.value,
                         run_s, steps, gain, gain / run_s if run_s > 0 else 0.0, by))
        else:
            rows.append((st.round, rnd.t0, t_end, jid, "", 0, "",
                         run_s, steps, gain, gain / run_s if run_s > 0 else 0.0, by))


def jobs_frame(sim) -> pd.DataFrame:
    """One row per job (:data:`JOB_COLUMNS`), by job id; times in seconds."""
    rows = []
    for j in sorted(sim.state.jobs.values(), key=lambda j: j.job_id):
        iso = j.iterations * sim.costs.isolated_iteration_s(j)
        rows.append((j.job_id, j.arrival_s, j.first_start_s, j.finish_s, j.finish_s - j.arrival_s,
                     j.first_start_s - j.arrival_s, j.num_gpus, j.model, j.batch_size, j.iterations,
                     j.progress, j.iteration, iso, j.attained_gpu_s, j.run_s, j.preemptions, j.migrations,
                     j.level_changes, j.status.value))
    return pd.DataFrame(rows, columns=JOB_COLUMNS)


def rounds_frame(sim) -> pd.DataFrame:
    """The round log: one row per job that ran in a round (:data:`ROUND_COLUMNS`)."""
    return pd.DataFrame(sim._round_rows, columns=ROUND_COLUMNS)


def cluster_frame(sim) -> pd.DataFrame:
    """One row per round (:data:`CLUSTER_COLUMNS`)."""
    return pd.DataFrame(sim._cluster_rows, columns=CLUSTER_COLUMNS)


def metrics(sim) -> dict:
    """The episode's metrics (:func:`jigsaw_env.metrics.compute_metrics`)."""
    return compute_metrics(jobs_frame(sim), cluster_frame(sim), sim.cluster.num_gpus,
                           backlogged=sim.config.backlogged, window=(sim.first_arrival_s, sim.window_end_s),
                           useful_at_window_end=sim.useful_at_window_end,
                           wall_s=_time.perf_counter() - sim._wall0)


def write_logs(sim, out_dir) -> None:
    """jobs.csv, rounds.csv and cluster.csv of the episode so far in ``out_dir`` (made if missing)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    jf = jobs_frame(sim)
    jf[["job_id", "arrival_s", "start_s", "finish_s", "jct_s", "num_gpus", "model", "batch_size", "iterations",
        "queue_s", "isolated_s", "preemptions", "migrations", "level_changes", "status"]].to_csv(out / "jobs.csv", index=False)
    rounds_frame(sim).to_csv(out / "rounds.csv", index=False)
    cluster_frame(sim).to_csv(out / "cluster.csv", index=False)
