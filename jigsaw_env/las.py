"""Tiresias's discretized two-dimensional least-attained-service (2D-LAS) priority.

A job's LAS priority is a function of its history alone (arrival, GPU-seconds held, when it ran
and waited), with no knowledge of durations. The ``tiresias`` and ``jigsaw`` schedulers order their
queue by it, and the observation encoder shows it to learned agents (features 19-21,
``jigsaw_env/encoder.py``), so that a policy sees the same queue those schedulers serve.
Source: Gu et al., "Tiresias: A GPU Cluster Manager for Distributed Deep Learning", NSDI 2019
(section 4: discretized 2D-LAS, FIFO inside a queue, starvation guard).
"""
from __future__ import annotations

import bisect
import operator
from typing import Iterable, Sequence

from .state import ClusterState, JobState, JobStatus

DEFAULT_THRESHOLDS: tuple[float, ...] = (3600.0,)  # GPU-seconds: two queues, as the paper found enough
DEFAULT_STARVE_FACTOR = 10.0


class LASQueues:
    """Tiresias's discretized two-dimensional least-attained-service priority.

    Attained service is GPU-seconds held (``JobState.attained_gpu_s``: GPUs x time, the "2D").
    A job is in queue ``k`` = number of thresholds its service has passed (queue 0 is the highest
    priority). Inside a queue jobs are served FIFO by arrival. No job durations are used.

    Starvation guard (Tiresias section 4.2, optional): a job that has run before and has now waited
    longer than ``starve_factor`` x the length of its last continuous run is promoted back to
    queue 0 (its service is counted afresh from that moment). ``starve_factor=None`` disables it.
    Waits and runs are observed at each :meth:`observe` call (one per round).
    """

    def __init__(self, thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
                 starve_factor: float | None = DEFAULT_STARVE_FACTOR):
        th = [float(t) for t in thresholds]
        if any(t <= 0 for t in th) or th != sorted(th):
            raise ValueError(f"LAS thresholds must be increasing GPU-seconds > 0, got {list(thresholds)!r}")
        if starve_factor is not None and not starve_factor > 0:
            raise ValueError(f"starve_factor must be > 0 or None, got {starve_factor!r}")
        self.thresholds = tuple(th)
        self.starve_factor = starve_factor
        self.reset()

    def reset(self) -> None:
        self._run_since: dict[int, float] = {}
        self._last_run: dict[int, float] = {}
        self._wait_since: dict[int, float] = {}
        self._base: dict[int, float] = {}  # attained service at the last promotion
        self.promotions = 0

    def observe(self, state: ClusterState) -> None:
        """Update run/wait bookkeeping from the state at the start of a round; promote starved jobs.

        Only running jobs and waiting jobs with a run or wait on record are touched; every other
        waiting job (never started, or already counted as waiting) has nothing to update."""
        now = state.time_s
        run_since, wait_since, last_run = self._run_since, self._wait_since, self._last_run
        sf = self.starve_factor
        RUNNING = JobStatus.RUNNING
        for j in state.active():
            jid = j.job_id
            if j.status is RUNNING:
                if jid not in run_since:
                    run_since[jid] = now
                if jid in wait_since:
                    del wait_since[jid]
                continue
            if jid not in run_since and jid not in wait_since:
                continue
            start = run_since.pop(jid, None)
            if start is not None:
                last_run[jid] = max(now - start, 1e-9)
                wait_since[jid] = now
            if sf is not None and jid in wait_since:
                if now - wait_since[jid] >= sf * last_run[jid]:
                    self._base[jid] = j.attained_gpu_s
                    wait_since[jid] = now
                    self.promotions += 1
        if len(self._last_run) > 4 * max(64, len(state.active_ids)):
            live = set(state.active_ids)
            for d in (self._run_since, self._last_run, self._wait_since, self._base):
                for k in [k for k in d if k not in live]:
                    del d[k]

    def quiet_until(self, state: ClusterState) -> float:
        """The earliest time the priority order can change without arrivals or completions: a
        running job's service reaching its next threshold (service grows GPUs x seconds), or a
        waiting job's starvation promotion."""
        now = state.time_s
        t = float("inf")
        th = self.thresholds
        nth = len(th)
        base, wait_since, last_run = self._base, self._wait_since, self._last_run
        sf = self.starve_factor
        RUNNING = JobStatus.RUNNING
        bisect_right = bisect.bisect_right
        for j in state.active():
            if j.status is RUNNING:
                s = j.attained_gpu_s - base.get(j.job_id, 0.0)
                k = bisect_right(th, s)
                if k < nth:
                    t = min(t, now + (th[k] - s) / j.num_gpus)
            elif sf is not None and j.job_id in wait_since:
                t = min(t, wait_since[j.job_id] + sf * last_run[j.job_id])
        return t

    def service(self, job: JobState) -> float:
        return job.attained_gpu_s - self._base.get(job.job_id, 0.0)

    def queue_of(self, job: JobState) -> int:
        return bisect.bisect_right(self.thresholds, self.service(job))

    def job_features(self, job: JobState, now: float) -> tuple[float, float, float]:
        """What the queue looks like to ``job`` as of the last :meth:`observe` (at ``now``, s):
        its queue divided by the number of thresholds (0 the highest priority, 1 the lowest), the
        service its queue is judged by (GPU-seconds since its last promotion), and its starvation
        progress: for a waiting job with a run on record, (now - waiting since) / (starve_factor x
        last run), at most 1 (it is promoted when this reaches 1); 0 for any other job."""
        jid = job.job_id
        s = job.attained_gpu_s - self._base.get(jid, 0.0)
        q = bisect.bisect_right(self.thresholds, s) / len(self.thresholds) if self.thresholds else 0.0
        starve = 0.0
        sf = self.starve_factor
        if sf is not None and job.status is not JobStatus.RUNNING:
            since = self._wait_since.get(jid)
            if since is not None:
                starve = min(1.0, (now - since) / (sf * self._last_run[jid]))
        return q, s, starve

    def order(self, jobs: Iterable[JobState]) -> list[JobState]:
        """Jobs from the highest priority down: (queue, arrival, id).

        Bucketed by queue, each bucket sorted by (arrival, id) -- the same list as one sort by
        (queue, arrival, id), without a Python key call per comparison (the jobs usually come in
        arrival order already, which the sort finds in one pass)."""
        th = self.thresholds
        base = self._base
        if not isinstance(jobs, list):
            jobs = list(jobs)
        if len(th) == 1:
            t0 = th[0]
            if base:
                bget = base.get
                q = [j.attained_gpu_s - bget(j.job_id, 0.0) < t0 for j in jobs]
            else:
                q = [j.attained_gpu_s < t0 for j in jobs]
            first = [j for j, f in zip(jobs, q) if f]
            second = [j for j, f in zip(jobs, q) if not f]
            first.sort(key=_ARRIVAL_KEY)
            second.sort(key=_ARRIVAL_KEY)
            first += second
            return first
        buckets: list[list[JobState]] = [[] for _ in range(len(th) + 1)]
        bget = base.get
        bisect_right = bisect.bisect_right
        for j in jobs:
            buckets[bisect_right(th, j.attained_gpu_s - bget(j.job_id, 0.0))].append(j)
        out: list[JobState] = []
        for b in buckets:
            b.sort(key=_ARRIVAL_KEY)
            out += b
        return out


_ARRIVAL_KEY = operator.attrgetter("arrival_s", "job_id")


def parse_thresholds(value) -> tuple[float, ...]:
    """``3600`` / ``"3600,36000"`` / a sequence -> tuple of GPU-second thresholds."""
    if isinstance(value, (int, float)):
        return (float(value),)
    if isinstance(value, str):
        return tuple(float(x) for x in value.split(",") if x.strip())
    return tuple(float(x) for x in value)
