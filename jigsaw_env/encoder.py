"""The one observation encoder, used by the Gymnasium env and by the live executor.

The observation is a float32 vector of ``K * JOB_FEATURES + CLUSTER_FEATURES`` values, whatever
the cluster's size: per-job features for the K jobs of the round's window (zeros for empty
slots), then cluster features that are fractions or log-scaled counts. A policy trained on 64
simulated GPUs therefore reads a 4-slot live cluster unchanged.

Per-job features (index: meaning):
 0 slot holds a job           1 running now                 2 placed in the decision being built
 3 already decided this round 4 log2(1+GPUs)/8              5 GPUs / cluster GPUs (capped at 1)
 6 log1p(age s)/16            7 log1p(attained GPU-s)/20    8 log1p(remaining isolated s)/16 *
 9 progress fraction *        10 current level / L          11 static pattern
12 log1p(isolated iteration ms)/10                          13 SPB compute gain at the half level - 1
14 eta at the half level      15 worker peak memory / GPU memory
(* zero unless ``observe_remaining``: an oracle, as SRTF has.)

Cluster features: exclusive-free GPU fraction, GPUs under the worker cap fraction, shared GPU
fraction, mean memory use of occupied GPUs, log1p(waiting jobs)/8, log1p(running jobs)/8,
waiting GPU demand / cluster GPUs (capped at 4)/4, jobs decided this round / K, round progress
(steps this round / (2K+2)), fraction of the window filled.
"""
from __future__ import annotations

import math

import numpy as np

from .spb import Pattern, spb_compute_bound
from .state import ClusterState, JobStatus

JOB_FEATURES = 16
CLUSTER_FEATURES = 10


def observation_size(window_k: int) -> int:
    return window_k * JOB_FEATURES + CLUSTER_FEATURES


class ObservationEncoder:
    """Encodes (state, decision under construction) into the fixed-size observation."""

    def __init__(self, window_k: int = 16, observe_remaining: bool = True):
        if window_k < 1:
            raise ValueError(f"window_k must be >= 1, got {window_k}")
        self.window_k = window_k
        self.observe_remaining = observe_remaining
        self._static_cache: dict = {}

    @property
    def size(self) -> int:
        return observation_size(self.window_k)

    def _job_static(self, state: ClusterState, job) -> tuple[float, float, float, float]:
        """Features that depend only on the job's model/size: iteration time, gain, eta, memory."""
        key = (job.model, job.batch_size, job.num_gpus)
        v = self._static_cache.get(key)
        if v is None:
            costs = state.costs
            iso = costs.isolated_iteration_s(job)
            half = min(2, state.spb.max_level)
            table = costs.table(job.model, job.batch_size, state.cluster.main_gpu_type)
            gain = spb_compute_bound(table, half, Pattern.ROTATING, job.num_gpus, state.spb) if half > 0 else 1.0
            gpus = tuple(range(job.num_gpus))
            eta = costs.profile(job, half, Pattern.ROTATING, gpus).eta
            peak = float(costs.worker_peaks(job, 0, Pattern.ROTATING).max())
            mem = peak / state.cluster.memory_of(0)
            v = (math.log1p(iso * 1000) / 10, gain - 1.0, eta, min(mem, 2.0))
            self._static_cache[key] = v
        return v

    def encode(self, state: ClusterState, window: list[int], ledger, acted: set[int], steps_in_round: int = 0) -> np.ndarray:
        k = self.window_k
        obs = np.zeros(self.size, dtype=np.float32)
        G = state.cluster.num_gpus
        now = state.time_s
        L = max(1, state.spb.max_level)
        for slot, jid in enumerate(window[:k]):
            j = state.jobs[jid]
            f = obs[slot * JOB_FEATURES:(slot + 1) * JOB_FEATURES]
            f[0] = 1.0
            f[1] = j.status is JobStatus.RUNNING
            f[2] = jid in ledger.decision
            f[3] = jid in acted
            f[4] = math.log2(1 + j.num_gpus) / 8
            f[5] = min(1.0, j.num_gpus / G)
            f[6] = math.log1p(max(0.0, now - j.arrival_s)) / 16
            f[7] = math.log1p(j.attained_gpu_s) / 20
            if self.observe_remaining:
                f[8] = math.log1p(j.remaining * state.costs.isolated_iteration_s(j)) / 16
                f[9] = j.progress / j.iterations if j.iterations > 0 else 0.0
            f[10] = j.level / L
            f[11] = j.pattern is Pattern.STATIC
            f[12:16] = self._job_static(state, j)
        c = obs[k * JOB_FEATURES:]
        workers = ledger.workers
        c[0] = float((workers == 0).sum()) / G
        c[1] = float((workers < state.max_workers_per_gpu).sum()) / G
        c[2] = float((workers > 1).sum()) / G
        occ = workers > 0
        c[3] = float((ledger.mem[occ] / ledger.capacity[occ]).mean()) if occ.any() else 0.0
        waiting = [state.jobs[j] for j in state.active_ids if state.jobs[j].status is not JobStatus.RUNNING]
        c[4] = math.log1p(len(waiting)) / 8
        c[5] = math.log1p(len(state.active_ids) - len(waiting)) / 8
        c[6] = min(4.0, sum(j.num_gpus for j in waiting) / G) / 4
        c[7] = len(acted) / k
        c[8] = min(1.0, steps_in_round / (2 * k + 2))
        c[9] = min(len(window), k) / k
        return obs
