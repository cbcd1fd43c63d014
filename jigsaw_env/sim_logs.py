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


class SimLog:
    """The rows a simulator logs as it goes: the round log (``round_rows``, one row per job that ran
    in a round, :data:`ROUND_COLUMNS`; kept only with ``SimConfig.log_rounds``) and the cluster log
    (``cluster_rows``, one row per round, :data:`CLUSTER_COLUMNS`). Times in seconds."""

    def __init__(self) -> None:
        self.round_rows: list[tuple] = []
        self.cluster_rows: list[tuple] = []
        self._gpu_text: dict[tuple, str] = {}  # GPUs -> their round-log text

    def add_jobs_of_round(self, state, rnd, t_end: float) -> None:
        """One round-log row per job that ran in round ``rnd`` (a ``simulator._Round`` of
        ``state``, ending at ``t_end`` s): its JobDecision, or the one it had when it finished."""
        rows = self.round_rows
        gstr = self._gpu_text
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
                rows.append((state.round, rnd.t0, t_end, jid, gs, jd.level, jd.pattern.value,
                             run_s, steps, gain, gain / run_s if run_s > 0 else 0.0, by))
            else:
                rows.append((state.round, rnd.t0, t_end, jid, "", 0, "",
                             run_s, steps, gain, gain / run_s if run_s > 0 else 0.0, by))

    def rounds_frame(self) -> pd.DataFrame:
        """The round log as a frame (:data:`ROUND_COLUMNS`)."""
        return pd.DataFrame(self.round_rows, columns=ROUND_COLUMNS)

    def cluster_frame(self) -> pd.DataFrame:
        """The cluster log as a frame (:data:`CLUSTER_COLUMNS`)."""
        return pd.DataFrame(self.cluster_rows, columns=CLUSTER_COLUMNS)


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


def metrics(sim) -> dict:
    """The episode's metrics (:func:`jigsaw_env.metrics.compute_metrics`)."""
    return compute_metrics(jobs_frame(sim), sim.log.cluster_frame(), sim.cluster.num_gpus,
                           backlogged=sim.config.backlogged, window=(sim.first_arrival_s, sim.window_end_s),
                           useful_at_window_end=sim.useful_at_window_end,
                           wall_s=_time.perf_counter() - sim.started_at)


def write_logs(sim, out_dir) -> None:
    """jobs.csv, rounds.csv and cluster.csv of the episode so far in ``out_dir`` (made if missing)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    jf = jobs_frame(sim)
    jf[["job_id", "arrival_s", "start_s", "finish_s", "jct_s", "num_gpus", "model", "batch_size", "iterations",
        "queue_s", "isolated_s", "preemptions", "migrations", "level_changes", "status"]].to_csv(out / "jobs.csv", index=False)
    sim.log.rounds_frame().to_csv(out / "rounds.csv", index=False)
    sim.log.cluster_frame().to_csv(out / "cluster.csv", index=False)
