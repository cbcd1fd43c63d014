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
import heapq
import operator
from dataclasses import dataclass
from typing import Iterable, Sequence

from .declared import seal_declared_classes
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
        self._promoted: set[int] = set()  # promoted since order_active last looked
        self._kept = None  # order_active's queues (see there)
        self._changes = None  # _observe_changes's running set and starvation heap (see there)

    #: what a copy or a pickle keeps (every attribute but the caches; tests/sim/test_accel.py checks
    #: that a LASQueues has no other): listed, since the compiled build keeps them out of __dict__
    _STATE = ("thresholds", "starve_factor", "_run_since", "_last_run", "_wait_since", "_base", "promotions",
              "_promoted")

    def __getstate__(self) -> dict:
        # order_active's queues are a cache of one state: a copy or a pickle (the live
        # executor's snapshot of its scheduler) leaves them out and builds them anew
        d = {name: getattr(self, name) for name in self._STATE}
        d["_kept"] = d["_changes"] = None
        return d

    def __setstate__(self, d: dict) -> None:
        for name, value in d.items():
            setattr(self, name, value)

    def state_dict(self) -> dict:
        """What the queues carry from round to round, as plain data (JSON): each job's run and
        wait bookkeeping and the starvation guard's service bases, as ``[job id, value]`` pairs in
        insertion order. The thresholds and starve factor are configuration (the scheduler's
        arguments), and ``_kept``/``_changes`` are caches of one state object, rebuilt on demand."""
        return {"run_since": _pairs(self._run_since), "last_run": _pairs(self._last_run),
                "wait_since": _pairs(self._wait_since), "base": _pairs(self._base),
                "promotions": int(self.promotions), "promoted": sorted(int(x) for x in self._promoted)}

    def load_state_dict(self, d: dict) -> None:
        """Take the bookkeeping of :meth:`state_dict`'s ``d`` (checked: ValueError naming the field
        that is not what :meth:`state_dict` writes); the caches start afresh."""
        if not isinstance(d, dict):
            raise ValueError(f"LAS state: expected a JSON object, got {type(d).__name__}")
        self.reset()
        self._run_since = _from_pairs(d, "run_since")
        self._last_run = _from_pairs(d, "last_run")
        self._wait_since = _from_pairs(d, "wait_since")
        self._base = _from_pairs(d, "base")
        promotions, promoted = d.get("promotions", 0), d.get("promoted", [])
        if isinstance(promotions, bool) or not isinstance(promotions, int) or not isinstance(promoted, list) \
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in promoted):
            raise ValueError("LAS state: fields 'promotions' and 'promoted': expected an integer and a list of job ids")
        self.promotions = promotions
        self._promoted = set(promoted)

    def observe(self, state: ClusterState) -> None:
        """Update run/wait bookkeeping from the state at the start of a round; promote starved jobs.

        Only running jobs and waiting jobs with a run or wait on record are touched; every other
        waiting job (never started, or already counted as waiting) has nothing to update."""
        if getattr(state, "running_ref", None) is not None:  # under a simulator
            self._observe_changes(state)
        else:
            self._changes = None
            self._observe_all(state)
        if len(self._last_run) > 4 * max(64, len(state.active_ids)):
            live = set(state.active_ids)
            for d in (self._run_since, self._last_run, self._wait_since, self._base):
                for k in [k for k in d if k not in live]:
                    del d[k]

    def _observe_all(self, state: ClusterState) -> None:
        """:meth:`observe`'s updates, visiting every active job."""
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
                    self._promote(j, now)

    def _promote(self, job: JobState, now: float) -> None:
        """The starvation guard's promotion of a waiting job at ``now``: its service counts afresh
        (and so does its wait)."""
        jid = job.job_id
        self._base[jid] = job.attained_gpu_s
        self._wait_since[jid] = now
        self.promotions += 1
        self._promoted.add(jid)

    def _observe_changes(self, state: ClusterState) -> None:
        """:meth:`observe` under a simulator (``state.running_ref`` holds the running jobs): the same
        updates, visiting only the jobs that started or stopped running since the last call and
        the waiting jobs whose starvation time has come, instead of every active job.

        The jobs running at the last call are kept (``_changes``), and each waiting job with a
        wait on record sits in a heap by ``wait since + starve_factor x last run``: its test
        cannot pass before then (a relative margin of 1e-9 covers the rounding of that sum; the
        test itself is the one :meth:`observe` applies, with its own arithmetic). A job's entry is
        stale once its wait changes (it ran, or was promoted) or the job finished, and is dropped
        when met. Kept for one state object; another state or a clock that went back starts afresh
        from the dicts."""
        now = state.time_s
        run_since, wait_since, last_run = self._run_since, self._wait_since, self._last_run
        sf = self.starve_factor
        ch = self._changes
        if ch is None or ch.state is not state or ch.time_s > now:
            live = set(state.active_ids)
            prev = {x for x in run_since if x in live}
            heap = ([(ws + sf * last_run[x], x, ws) for x, ws in wait_since.items() if x in live]
                    if sf is not None else [])
            heapq.heapify(heap)
            ch = self._changes = _Changes(state, now, prev, heap)
        prev, heap = ch.running, ch.heap
        ch.time_s = now
        cur = set(state.running_ref)  # running now
        for jid in cur - prev:  # started (or resumed) since the last call
            if jid not in run_since:
                run_since[jid] = now
            if jid in wait_since:
                del wait_since[jid]
        jobs = state.jobs
        for jid in prev - cur:  # stopped: preempted (still active) or finished (never visited again)
            j = jobs[jid]
            if not j.active:
                continue
            start = run_since.pop(jid, None)
            if start is not None:
                last_run[jid] = max(now - start, 1e-9)
                wait_since[jid] = now
                if sf is not None:
                    heapq.heappush(heap, (now + sf * last_run[jid], jid, now))
        ch.running = cur
        if sf is None:
            return
        limit = now + 1e-9 * (1.0 + abs(now))
        back = []
        while heap and heap[0][0] <= limit:
            entry = heapq.heappop(heap)
            _, jid, ws = entry
            if wait_since.get(jid) != ws:
                continue  # stale: the job ran or was promoted since
            j = jobs[jid]
            if not j.active:
                continue  # it finished (resumed and done within a round): never visited again
            if now - ws >= sf * last_run[jid]:
                self._promote(j, now)
                back.append((now + sf * last_run[jid], jid, now))
            else:
                back.append(entry)  # within the margin, not yet due
        for entry in back:
            heapq.heappush(heap, entry)

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


    def order_active(self, state: ClusterState) -> list[JobState]:
        """``order(state.active())``: every active job from the highest priority down.

        Under a simulator (``state.running_ref`` and ``state.arrival_pos`` set) the queues are kept
        from call to call instead of sorted anew: each queue is a list of job ids in arrival order
        (``arrival_pos`` follows (arrival, id), the sort key of :meth:`order`), and only the jobs
        whose queue can have changed are looked at again: those that arrived or left, those
        running now (the only ones whose service grew since the last call: a job's status changes
        only when a decision is applied, after a call), and those promoted by :meth:`observe`
        (their service counts afresh). Kept for one state object; another state (a copy), a
        clock that went back or :meth:`reset` starts the queues afresh. Elsewhere (a state built
        by hand, the live executor) it is :meth:`order` itself."""
        pos = getattr(state, "arrival_pos", None)
        running = getattr(state, "running_ref", None)  # the decision in force: its keys run
        if pos is None or running is None:
            return self.order(state.active())
        jobs = state.jobs
        th = self.thresholds
        bget = self._base.get
        bisect_right = bisect.bisect_right
        kept = self._kept
        if kept is None or kept.state is not state or kept.time_s > state.time_s:
            queues: list[list[int]] = [[] for _ in range(len(th) + 1)]
            qof: dict[int, int] = {}
            for jid in state.active_ids:  # in arrival order: each queue comes out sorted
                q = self.queue_of(jobs[jid])
                queues[q].append(jid)
                qof[jid] = q
            self._kept = _Queues(state, state.time_s, queues, qof, set(state.active_ids))
            self._promoted = set()
        else:
            queues, qof, known = kept.queues, kept.queue_of, kept.known
            kept.time_s = state.time_s
            cur = set(state.active_ids)
            key = pos.__getitem__

            def drop(jid: int, q: int) -> None:
                lst = queues[q]
                del lst[bisect.bisect_left(lst, pos[jid], key=key)]

            for jid in known - cur:  # finished
                drop(jid, qof.pop(jid))
            look = cur - known  # arrived
            # running: their service grew, so they move only to a later queue (a running job in
            # the last queue stays there until it is promoted)
            last = len(th)
            qget = qof.get
            look.update([x for x in running if qget(x) != last])
            if self._promoted:
                look.update(x for x in self._promoted if x in cur)
                self._promoted = set()
            for jid in look:
                q = bisect_right(th, jobs[jid].attained_gpu_s - bget(jid, 0.0))  # queue_of, inlined
                old = qget(jid)
                if old != q:
                    if old is not None:
                        drop(jid, old)
                    bisect.insort(queues[q], jid, key=key)
                    qof[jid] = q
            kept.known = cur
        out: list[JobState] = []
        get = jobs.__getitem__
        for lst in queues:
            out += map(get, lst)
        return out


_ARRIVAL_KEY = operator.attrgetter("arrival_s", "job_id")


@dataclass(slots=True)
class _Queues:
    """:meth:`LASQueues.order_active`'s queues, kept for one state object: the job ids of each
    queue in arrival order, each job's queue, and the active jobs they were built from, as of
    ``time_s`` (seconds)."""

    state: ClusterState
    time_s: float
    queues: list[list[int]]
    queue_of: dict[int, int]
    known: set[int]


@dataclass(slots=True)
class _Changes:
    """:meth:`LASQueues._observe_changes`'s memory of one state object: the jobs running at the
    last call (at ``time_s``, seconds) and the heap of waiting jobs by the earliest time their
    starvation test can pass, ``(wait since + starve_factor x last run, job id, wait since)``."""

    state: ClusterState
    time_s: float
    running: set[int]
    heap: list[tuple[float, int, float]]


def _pairs(d: dict) -> list[list]:
    return [[int(k), float(v)] for k, v in d.items()]


def _from_pairs(d: dict, field: str) -> dict[int, float]:
    """``d[field]``, a list of ``[job id, seconds]`` pairs, as a dict; ValueError naming the field."""
    rows = d.get(field, [])
    ok = isinstance(rows, list) and all(
        isinstance(r, list) and len(r) == 2 and isinstance(r[0], int) and not isinstance(r[0], bool)
        and isinstance(r[1], (int, float)) and not isinstance(r[1], bool) for r in rows)
    if not ok:
        raise ValueError(f"LAS state: field {field!r}: expected a list of [job id, seconds] pairs")
    return {int(k): float(v) for k, v in rows}


def parse_thresholds(value) -> tuple[float, ...]:
    """``3600`` / ``"3600,36000"`` / a sequence -> tuple of GPU-second thresholds."""
    if isinstance(value, (int, float)):
        return (float(value),)
    if isinstance(value, str):
        return tuple(float(x) for x in value.split(",") if x.strip())
    return tuple(float(x) for x in value)


seal_declared_classes(globals())  # the classes las.pxd declares behave as compiled (jigsaw_env/declared.py)
