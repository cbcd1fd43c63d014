"""The simulator's state type and its one decision type.

``ClusterState`` is what heuristics read and what the live executor keeps its cluster in, so both
drive the same schedulers. ``Decision`` maps each job that should run in the next round to a
``JobDecision`` (placement, SPB level, pattern); a job left out does not run (it queues, or is
preempted if it was running). Heuristics must treat the state as read-only.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, Iterable

import numpy as np

from .cluster import ClusterSpec
from .cost_table import CostTable, get_table
from .declared import seal_declared_classes
from .spb import JobProfile, Pattern, SPBConfig, job_profile


class JobStatus(str, Enum):
    PENDING = "pending"   # not yet arrived
    QUEUED = "queued"     # arrived, never started
    RUNNING = "running"
    PAUSED = "paused"     # started, then preempted
    DONE = "done"
    FAILED = "failed"     # the live executor gave the job up (no checkpoint of it loads); never in the simulator


_ACTIVE_STATUSES = (JobStatus.RUNNING, JobStatus.QUEUED, JobStatus.PAUSED)  # JobState.active


@dataclass(frozen=True)
class JobDecision:
    """Run one job in the next round.

    gpus: global GPU index of each worker, in worker order (worker ``w`` runs on ``gpus[w]``; the
        order sets which SPB slot lands on which GPU). Must hold ``num_gpus`` distinct GPUs.
    level: SPB level 0..L (0 = full backprop).
    pattern: rotating or static (ignored at level 0).
    """

    gpus: tuple[int, ...]
    level: int = 0
    pattern: Pattern = Pattern.ROTATING

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpus", tuple(int(g) for g in self.gpus))
        object.__setattr__(self, "pattern", Pattern.parse(self.pattern))
        if not isinstance(self.level, (int, np.integer)) or isinstance(self.level, bool):
            raise ValueError(f"JobDecision.level must be an integer, got {self.level!r}")
        object.__setattr__(self, "level", int(self.level))
        if self.level == 0 and self.pattern is not Pattern.ROTATING:
            # level 0 has a single slot: both patterns are the same schedule; normalise
            object.__setattr__(self, "pattern", Pattern.ROTATING)


class Decision(dict):
    """``{job_id: JobDecision}`` for the jobs that run in the next round."""

    def running(self) -> Iterable[int]:
        return self.keys()


def trusted_decision(gpus: tuple[int, ...], level: int, pattern: Pattern) -> JobDecision:
    """``JobDecision(gpus, level, pattern)`` without its conversions, for callers whose ``gpus``
    is already a tuple of Python ints, ``level`` an ``int`` and ``pattern`` a :class:`Pattern`
    (placements the ledger computed): the same fields, equal and hashing alike, for about a
    seventh of the cost. Any other level or pattern goes through JobDecision's checks."""
    if level.__class__ is not int or pattern.__class__ is not Pattern:
        return JobDecision(gpus, level, pattern)
    jd = object.__new__(JobDecision)
    d = jd.__dict__  # a frozen dataclass bars only __setattr__; its fields live in the instance dict
    d["gpus"] = gpus
    d["level"] = level
    d["pattern"] = pattern if level else Pattern.ROTATING  # level 0's one schedule, normalised
    return jd


_JD_MEMO: dict[tuple, JobDecision] = {}


def job_decision(gpus: tuple[int, ...], level: int, pattern: Pattern) -> JobDecision:
    """``JobDecision(gpus, level, pattern)``; the same (immutable) object for the same arguments,
    so a running job that keeps its configuration costs a lookup, not a new validated object."""
    if level.__class__ is not int:  # JobDecision checks and converts it (1.0 must not find level 1)
        return JobDecision(gpus, level, pattern)
    key = (gpus, level, pattern)
    jd = _JD_MEMO.get(key)
    if jd is None:
        if len(_JD_MEMO) > 100_000:
            _JD_MEMO.clear()
        jd = _JD_MEMO[key] = JobDecision(gpus, level, pattern)
    return jd


@dataclass
class JobState:
    """One job as the scheduler sees it. Times in seconds since the trace start.

    iterations: full-backprop-equivalent iterations the job needs.
    progress: full-backprop-equivalent iterations done (an SPB iteration adds eta).
    iteration: raw iterations executed (sets the SPB phase).
    attained_gpu_s: GPU-seconds held so far (Tiresias's attained service).
    status_since_s: when the job last started, resumed or was preempted (NaN before its first
        start: it has waited since ``arrival_s``).
    last_run_s: seconds of its last continuous run that ended in a preemption (0 if none yet).
    """

    job_id: int
    arrival_s: float
    num_gpus: int
    model: str
    batch_size: int
    iterations: float
    duration_s: float = float("nan")
    status: JobStatus = JobStatus.PENDING
    progress: float = 0.0
    iteration: int = 0
    attained_gpu_s: float = 0.0
    run_s: float = 0.0
    first_start_s: float = float("nan")
    finish_s: float = float("nan")
    placement: tuple[int, ...] = ()
    level: int = 0
    pattern: Pattern = Pattern.ROTATING
    restart_until_s: float = 0.0
    preemptions: int = 0
    migrations: int = 0
    level_changes: int = 0
    last_round_run: int = -1
    status_since_s: float = float("nan")
    last_run_s: float = 0.0

    # The dataclass's comparison, written out (the same: a tuple of the fields, so a field equals
    # itself, NaN included): the compiled build's generated one would compare NaN fields unequal.
    def __eq__(self, other):
        if other.__class__ is self.__class__:
            return _JOB_FIELDS(self) == _JOB_FIELDS(other)
        return NotImplemented

    __hash__ = None  # (as the dataclass's: mutable, compared by value)

    @property
    def status_start_s(self) -> float:
        """When the job's current status began (s): ``status_since_s``; for a state built without
        it (by hand, or from a decision log written before the field existed), the first start of
        a running job, the arrival of a job that never started, else NaN."""
        t = self.status_since_s
        if t != t:
            t = self.first_start_s if self.status is JobStatus.RUNNING else (
                self.arrival_s if self.first_start_s != self.first_start_s else t)
        return t

    @property
    def remaining(self) -> float:
        """Full-backprop-equivalent iterations still to do."""
        return max(0.0, self.iterations - self.progress)

    @property
    def active(self) -> bool:
        """Arrived and not finished (queued, running or paused)."""
        return self.status in _ACTIVE_STATUSES


_JOB_FIELDS = operator.attrgetter(*(f.name for f in fields(JobState)))  # (JobState.__eq__)


class CostModel:
    """Cost tables per GPU type and cached SPB profiles for the cluster's jobs."""

    def __init__(self, cluster: ClusterSpec, spb: SPBConfig, eta_override: float | None = None,
                 eta_scale: float = 1.0):
        self.cluster = cluster
        self.spb = spb
        if eta_override is not None and not 0 < eta_override <= 1:
            raise ValueError(f"eta_override must be in (0, 1], got {eta_override!r}")
        if not eta_scale > 0:
            raise ValueError(f"eta_scale must be > 0, got {eta_scale!r}")
        self.eta_override = eta_override
        self.eta_scale = eta_scale
        self._profiles: dict = {}
        self._iso: dict = {}
        self._peaks: dict = {}
        self._peak_lists: dict = {}
        self._peak_fast: dict = {}
        self._largest_peaks: dict = {}
        # engine.Component's shared step tables (the simulator's cache), keyed by profile identity:
        # kept here so that they live exactly as long as the profiles they are computed from
        self.step_tables: dict = {}
        # the free pace's times of groups of co-located jobs (LiveComponents.free_running_of), keyed the same way
        self.free_running: dict = {}
        self.homogeneous = len(set(cluster.gpu_types)) == 1

    def mismatch(self, cluster: ClusterSpec, spb: SPBConfig, eta_override: float | None, eta_scale: float) -> str | None:
        """The first of these settings that this model was not made for, as ``"name (have, expected
        want)"``; None when it was made for all of them (its caches then hold for them)."""
        for name, have, want in (("cluster", self.cluster, cluster), ("spb", self.spb, spb),
                                 ("eta_override", self.eta_override, eta_override), ("eta_scale", self.eta_scale, eta_scale)):
            if have is not want and have != want:
                return f"{name} ({have!r}, expected {want!r})"
        return None

    def table(self, model: str, batch_size: int, gpu_type: str) -> CostTable:
        """The job's cost table; a batch size without one gets the nearest one's scaled by eq. B1
        (docs/cost_tables.md section 9)."""
        return get_table(model, batch_size, gpu_type, nearest=True)

    def estimate(self) -> "CostModel":
        """The cost model a scheduler and the env's observation see: the same cluster, SPB settings
        and tables, with each table's own eta (eq. E1), not ``eta_override`` / ``eta_scale``. Those
        two set the simulated *true* eta of a sensitivity sweep, which no scheduler can know
        (docs/simulator.md section 1). ``self`` when neither is set; otherwise one CostModel made
        on first use and kept (its caches live as long as this one)."""
        if self.eta_override is None and self.eta_scale == 1.0:
            return self
        est = getattr(self, "_estimate", None)
        if est is None:
            est = self._estimate = CostModel(self.cluster, self.spb)
        return est

    def _eta(self, eta: float, level: int) -> float:
        if level == 0:
            return 1.0
        if self.eta_override is not None:
            return float(self.eta_override)
        return float(min(1.0, eta * self.eta_scale))

    def _key(self, job: JobState, level: int, pattern: Pattern, gpus: tuple[int, ...]) -> tuple:
        gpn = self.cluster.gpus_per_node
        cross = max(gpus) // gpn != min(gpus) // gpn
        if self.homogeneous:
            return (job.model, job.batch_size, level, pattern, len(gpus), cross)
        types = tuple(self.cluster.gpu_type(g) for g in gpus)
        return (job.model, job.batch_size, types if len(set(types)) > 1 else types[0], level, pattern, len(gpus), cross)

    def peak_list(self, job: JobState, level: int, pattern: Pattern, gpus: tuple[int, ...]) -> list[float]:
        """``profile(...).peak_bytes`` as a list of Python floats (cached; same values). Looked up
        first by the exact GPUs (the ledger's hot path: no node arithmetic), then by profile key."""
        fast = (job.model, job.batch_size, level, pattern, gpus)
        v = self._peak_fast.get(fast)
        if v is None:
            key = self._key(job, level, pattern, gpus)
            v = self._peak_lists.get(key)
            if v is None:
                v = self._peak_lists[key] = self.profile(job, level, pattern, gpus).peak_bytes.tolist()
            if len(self._peak_fast) > 200_000:
                self._peak_fast.clear()
            self._peak_fast[fast] = v
        return v

    def largest_peak(self, job: JobState, level: int, pattern: Pattern) -> float:
        """The job's largest worker peak (bytes) at this level and pattern on any ``num_gpus`` GPUs
        of the cluster's main type (:meth:`reference_gpus`; conservative per GPU: any worker may
        land on any GPU). Cached by model, batch size, width, level and pattern."""
        key = (job.model, job.batch_size, job.num_gpus, level, pattern)
        v = self._largest_peaks.get(key)
        if v is None:
            gpus = self.reference_gpus(job.num_gpus, self.cluster.main_gpu_type)
            v = self._largest_peaks[key] = max(self.peak_list(job, level, pattern, gpus))
        return v

    def profile(self, job: JobState, level: int, pattern: Pattern, gpus: tuple[int, ...]) -> JobProfile:
        """The job's per-phase costs at this level/pattern on these GPUs (cached)."""
        cl = self.cluster
        key = self._key(job, level, pattern, gpus)
        prof = self._profiles.get(key)
        if prof is None:
            gpn = cl.gpus_per_node
            cross = max(gpus) // gpn != min(gpus) // gpn
            types = None if self.homogeneous else tuple(cl.gpu_type(g) for g in gpus)
            if types is None:
                types = (cl.gpu_types[0],) * len(gpus)
            link = cl.cross if cross else cl.intra
            by_type = {t: job_profile(self.table(job.model, job.batch_size, t), level, pattern, len(gpus), link, self.spb)
                       for t in set(types)}
            base = by_type[types[0]]
            if len(by_type) > 1:
                compute = np.stack([by_type[t].compute_s[:, w] for w, t in enumerate(types)], axis=1)
                peak = np.array([by_type[t].peak_bytes[w] for w, t in enumerate(types)])
                base = JobProfile(level=base.level, pattern=base.pattern, slots=base.slots, period=base.period,
                                  compute_s=compute, comm_s=base.comm_s, bytes=base.bytes, peak_bytes=peak, eta=base.eta,
                                  batch_size=base.batch_size)
            eta = self._eta(base.eta, level)
            if eta != base.eta:
                base = JobProfile(level=base.level, pattern=base.pattern, slots=base.slots, period=base.period,
                                  compute_s=base.compute_s, comm_s=base.comm_s, bytes=base.bytes,
                                  peak_bytes=base.peak_bytes, eta=eta, batch_size=base.batch_size)
            self._profiles[key] = prof = base
        return prof

    def worker_peaks(self, job: JobState, level: int, pattern: Pattern, gpu_type: str | None = None) -> np.ndarray:
        """(W,) peak process memory (bytes) of the job's workers at this level/pattern."""
        t = gpu_type or self.cluster.main_gpu_type
        gpus = self.reference_gpus(job.num_gpus, t)
        return self.profile(job, level, pattern, gpus).peak_bytes

    def peak_matrix(self, job: JobState, combos) -> np.ndarray:
        """(len(combos), W) worker peak bytes for each (level, pattern) combo, on the main GPU type."""
        key = (job.model, job.batch_size, job.num_gpus, len(combos))
        m = self._peaks.get(key)
        if m is None:
            m = np.stack([self.worker_peaks(job, lv, pt) for lv, pt in combos])
            m.setflags(write=False)
            self._peaks[key] = m
        return m

    def peak_rows(self, job: JobState, combos) -> list[list[float]]:
        """``peak_matrix(job, combos)`` as nested Python lists (cached)."""
        key = ("rows", job.model, job.batch_size, job.num_gpus, len(combos))
        v = self._peaks.get(key)
        if v is None:
            v = self._peaks[key] = self.peak_matrix(job, combos).tolist()
        return v

    def need_vector(self, job: JobState, combos) -> np.ndarray:
        """(len(combos),) the largest worker peak (bytes) at each combo: ``peak_matrix(...).max(1)``."""
        key = ("need", job.model, job.batch_size, job.num_gpus, len(combos))
        v = self._peaks.get(key)
        if v is None:
            v = self.peak_matrix(job, combos).max(axis=1)
            v.setflags(write=False)
            self._peaks[key] = v
        return v

    def reference_gpus(self, n: int, gpu_type: str) -> tuple[int, ...]:
        """``n`` GPU ids that stand for any ``n`` GPUs of ``gpu_type`` when peaks are computed:
        consecutive ids from the first node of that type on."""
        cl = self.cluster
        node = cl.gpu_types.index(gpu_type)
        start = node * cl.gpus_per_node
        # n consecutive GPUs from that node on (only their type and node count matter to peaks)
        return tuple(range(start, start + n)) if start + n <= cl.num_gpus else tuple(range(n))

    def isolated_iteration_s(self, job: JobState) -> float:
        """Full-backprop iteration time of the job alone on consolidated GPUs of the cluster's main
        type (eq. T1 at level 0): the reference for useful work and fairness."""
        key = (job.model, job.batch_size, job.num_gpus)
        v = self._iso.get(key)
        if v is None:
            gpus = self._consolidated_reference(job.num_gpus)
            prof = self.profile(job, 0, Pattern.ROTATING, gpus)
            self._iso[key] = v = float(prof.dedicated_iteration_s()[0])
        return v

    def _consolidated_reference(self, n: int) -> tuple[int, ...]:
        # GPUs 0..n-1 fill nodes in order: the most consolidated placement
        return tuple(range(n))


@dataclass
class ClusterState:
    """Everything a scheduler may look at. Read-only for schedulers.

    time_s: current simulated time (s).
    round: index of the next round.
    jobs: every job of the episode by id (any status).
    active_ids: ids of arrived, unfinished jobs, in arrival order.
    running_ref, arrival_pos, in_force, shared_ref: kept by a simulator for speed (see below);
        None on a state built by hand, where every method reads the jobs' statuses instead.
    """

    cluster: ClusterSpec
    costs: CostModel
    time_s: float = 0.0
    round: int = 0
    jobs: dict[int, JobState] = field(default_factory=dict)
    active_ids: list[int] = field(default_factory=list)
    max_workers_per_gpu: int = 2
    # Kept by a simulator (None elsewhere; read-only for everyone else): the decision in force,
    # whose keys are exactly the running jobs, and every job's position in the arrival order (the
    # order of active_ids). With them running() sorts the running ids instead of reading every
    # waiting job's status (FIFO's queue on the Philly trace holds thousands of jobs), and 2D-LAS
    # follows changes (jigsaw_env/las.py).
    running_ref: dict | None = field(default=None, repr=False, compare=False)
    arrival_pos: dict | None = field(default=None, repr=False, compare=False)
    # The simulator's GpuLedger of that decision, only while Simulator.run asks its policy (a
    # scheduler's ledger starts as a copy: Scheduler.ledger); None otherwise, so that the state
    # and the ledger, which refers to the state, do not keep each other alive.
    in_force: Any = field(default=None, repr=False, compare=False)
    # The simulator's co-location groups of two or more running jobs (any key -> their job ids):
    # the connected components of "shares a GPU with" among the running jobs, kept as they form and
    # dissolve (agents.common.current_pairs reads them instead of every running job's GPUs).
    shared_ref: dict | None = field(default=None, repr=False, compare=False)
    # How co-located jobs share GPUs and links (jigsaw_env.interference.SharingModel: eqs. K1 or
    # K1', and L1). Set by a simulator; the pairing search of agents.common scores candidates with
    # it. None on a state built by hand: time-sliced GPUs, syncs that overlap freely.
    sharing: Any = field(default=None, repr=False, compare=False)

    def __eq__(self, other):  # the dataclass's comparison, written out (see JobState.__eq__)
        if other.__class__ is self.__class__:
            return _STATE_FIELDS(self) == _STATE_FIELDS(other)
        return NotImplemented

    __hash__ = None

    @property
    def spb(self) -> SPBConfig:
        return self.costs.spb

    # (one pass over active_ids each, no intermediate list: with thousands of jobs waiting, as
    # FIFO's queue on the Philly trace, these run every round)
    def active(self) -> list[JobState]:
        return list(map(self.jobs.__getitem__, self.active_ids))

    def queued(self) -> list[JobState]:
        """Arrived jobs not running (never started or preempted), in arrival order."""
        RUNNING = JobStatus.RUNNING
        return [j for j in map(self.jobs.__getitem__, self.active_ids) if j.status is not RUNNING]

    def running(self) -> list[JobState]:
        """Running jobs, in arrival order (the order of ``active_ids``)."""
        ref = self.running_ref
        # sorting the running ids costs about 5x reading one status per id (measured on Philly
        # replays): worth it when the waiting jobs outnumber the running ones that much
        if ref is not None and 5 * len(ref) < len(self.active_ids):
            return list(map(self.jobs.__getitem__, self.running_ids_by_arrival()))
        RUNNING = JobStatus.RUNNING
        return [j for j in map(self.jobs.__getitem__, self.active_ids) if j.status is RUNNING]

    def running_ids_by_arrival(self) -> list[int]:
        """The running jobs' ids in arrival order, from the simulator's decision (``running_ref``)."""
        return sorted(self.running_ref, key=self.arrival_pos.__getitem__)

    def current_decision(self) -> Decision:
        """The allocation in force: every running job keeps its placement, level and pattern
        (:func:`job_decision` objects: the same one while a job keeps its configuration)."""
        return Decision({j.job_id: job_decision(j.placement, j.level, j.pattern) for j in self.running()})


_STATE_FIELDS = operator.attrgetter(*(f.name for f in fields(ClusterState) if f.compare))  # (ClusterState.__eq__)


def apply_job_bookkeeping(state: ClusterState, decision: Decision, restart_s: float,
                          running_ids: Iterable[int] | None = None) -> set[int]:
    """Update every active job's status, placement, level, pattern and counters for a validated
    ``decision`` taking effect at ``state.time_s``; return the ids of jobs whose running
    configuration changed. Shared by the simulator and the live executor, so both count
    preemptions, migrations, level changes and restart delays the same way.

    Left out while running: preempted (PAUSED). Started: first start has no delay; a resume or a
    move to other GPUs holds the GPUs for ``restart_s`` seconds without progress. A level or
    pattern change on the same GPUs costs nothing.

    ``running_ids``: the ids of the running jobs, if the caller keeps them (the simulator does);
    then only they and the decision's jobs are visited, not every waiting job.
    """
    now = state.time_s
    changed: set[int] = set()
    if running_ids is None:
        visit = state.active()
    else:
        jobs = state.jobs
        visit = [jobs[x] for x in running_ids if x not in decision] + [jobs[x] for x in decision]
    for j in visit:
        if not j.active:
            continue
        jd = decision.get(j.job_id)
        was_running = j.status is JobStatus.RUNNING
        if jd is None:
            if was_running:
                since = j.status_start_s  # while it is still running
                j.status = JobStatus.PAUSED
                j.preemptions += 1
                j.last_run_s = now - since if since == since else 0.0
                j.status_since_s = now
                j.placement = ()
                changed.add(j.job_id)
            continue
        if not was_running:
            if j.status is JobStatus.PAUSED:
                j.restart_until_s = now + restart_s
            else:
                j.first_start_s = now
                j.restart_until_s = now
            j.status = JobStatus.RUNNING
            j.status_since_s = now
            changed.add(j.job_id)
        elif jd.gpus != j.placement:
            j.migrations += 1
            j.restart_until_s = now + restart_s
            changed.add(j.job_id)
        elif jd.level != j.level or jd.pattern != j.pattern:
            changed.add(j.job_id)
        if was_running and (jd.level != j.level or jd.pattern != j.pattern):
            j.level_changes += 1
        j.placement, j.level, j.pattern = jd.gpus, jd.level, jd.pattern
    return changed


seal_declared_classes(globals())  # the classes state.pxd declares behave as compiled (jigsaw_env/declared.py)
