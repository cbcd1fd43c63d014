"""The cluster simulator: jobs arrive, queue, run, are preempted and complete, round by round.

Plain Python/numpy; it knows nothing of Gymnasium. Each round it applies one :class:`Decision`
(validated first: an infeasible decision raises and leaves the state untouched), then advances
time to the end of the round, solving iteration times of co-located jobs together
(:mod:`jigsaw_env.engine`). Formulas: docs/simulator.md.

Round length: ``SimConfig.round_s`` seconds (default 300), or ``None`` for iteration granularity
(a round ends at the next iteration boundary of any running job). Both give the same job finish
times when decisions do not change (tests/sim/test_simulator.py::test_round_length_parity).
"""
from __future__ import annotations

import copy
import math
import operator
import re
import time as _time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np
import pandas as pd

from .cluster import ClusterSpec
from .cost_table import default_batch_size, get_table
from .engine import Component, ComponentSet, Member
from .free_running import DEFAULT_PACE, FreeRunner, check_pace, free_running
from .gc_tuning import fewer_collections
from .interference import DEFAULT_SHARING, SharingModel, check_sharing
from .placement import GpuLedger, InfeasibleDecision, connected_groups, validate_decision
from .spb import SPBConfig
from .state import ClusterState, CostModel, Decision, JobDecision, JobState, JobStatus, apply_job_bookkeeping


@dataclass(frozen=True)
class SimConfig:
    """Simulator settings.

    round_s: round length in seconds, or None for iteration granularity.
    restart_s: seconds a job holds its GPUs without progress when it resumes after a preemption or
        moves to other GPUs (checkpoint restore; assumed value, docs/simulator.md).
    max_workers_per_gpu: most workers (of different jobs) sharing one GPU, besides its memory.
    backlogged: submit every job at t = 0 (docs/design.md section 5, form a).
    max_time_s: truncate the episode after this much simulated time (None: no limit).
    idle_round_s: round length when nothing runs at iteration granularity.
    eta_override / eta_scale: statistical-efficiency sensitivity knobs (level > 0 only).
    lockstep_s: seconds every lockstep step of a co-location component of two or more jobs waits
        at the barrier that holds them together (eq. K3, docs/spb_model.md), under the lockstep
        pace. 0 (the default) is the ideal lockstep of eq. K2; ``jigsaw calibrate --executor``
        measures the live executor's value (``lockstep.json``), which the decision-log replay uses.
    sharing: how workers of different jobs on one GPU share it: ``"fitted"`` (the default: the
        interference model fitted to measured co-located pairs, docs/colocation.md) or
        ``"timeslice"`` (their work adds up, eq. K1 of docs/spb_model.md).
    pace: how co-located jobs step: ``"free"`` (the default: each at its own pace, eqs. F1-F4 of
        docs/colocation.md) or ``"lockstep"`` (one iteration each per step, held together by a
        barrier: eqs. K1-K3). The live executor runs the same pace (``LiveConfig.pace``).
    """

    round_s: float | None = 300.0
    restart_s: float = 30.0
    max_workers_per_gpu: int = 2
    backlogged: bool = False
    max_time_s: float | None = None
    idle_round_s: float = 60.0
    spb: SPBConfig = field(default_factory=SPBConfig)
    eta_override: float | None = None
    eta_scale: float = 1.0
    log_rounds: bool = True
    lockstep_s: float = 0.0
    sharing: str = DEFAULT_SHARING
    pace: str = DEFAULT_PACE

    def __post_init__(self) -> None:
        if self.round_s is not None and not (self.round_s > 0 and np.isfinite(self.round_s)):
            raise ValueError(f"round_s must be a positive number of seconds or None (iteration granularity), got {self.round_s!r}")
        if not self.restart_s >= 0:
            raise ValueError(f"restart_s must be >= 0 seconds, got {self.restart_s!r}")
        if not isinstance(self.max_workers_per_gpu, int) or self.max_workers_per_gpu < 1:
            raise ValueError(f"max_workers_per_gpu must be an integer >= 1, got {self.max_workers_per_gpu!r}")
        if self.max_time_s is not None and not self.max_time_s > 0:
            raise ValueError(f"max_time_s must be > 0 or None, got {self.max_time_s!r}")
        if not self.idle_round_s > 0:
            raise ValueError(f"idle_round_s must be > 0, got {self.idle_round_s!r}")
        check_lockstep_s(self.lockstep_s)
        check_sharing(self.sharing)
        check_pace(self.pace)


def check_lockstep_s(value) -> None:
    """ValueError (one line) unless ``value`` is a finite number of seconds >= 0: the lockstep
    barrier of :class:`SimConfig` and of the live executor's ``LiveConfig``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise ValueError(f"lockstep_s must be a finite number of seconds >= 0, got {value!r}")


@dataclass
class RoundResult:
    """What one round did. Times in seconds."""

    round: int
    start_s: float
    end_s: float
    job_seconds: float          # integral of jobs in system over the round
    finished: list[int]
    useful_gpu_s: float         # full-backprop-equivalent GPU-seconds of work done in the round
    busy_gpu_s: float           # GPU-seconds of compute
    allocated_gpu_s: float      # GPU-seconds held by jobs
    done: bool
    truncated: bool


JOB_COLUMNS = ["job_id", "arrival_s", "start_s", "finish_s", "jct_s", "queue_s", "num_gpus", "model",
               "batch_size", "iterations", "progress", "raw_iterations", "isolated_s", "attained_gpu_s",
               "run_s", "preemptions", "migrations", "level_changes", "status"]
ROUND_COLUMNS = ["round", "start_s", "end_s", "job_id", "gpus", "level", "pattern", "run_s", "steps",
                 "progress", "rate", "bytes"]
CLUSTER_COLUMNS = ["round", "start_s", "end_s", "active", "queued", "running", "allocated_gpus",
                   "shared_gpus", "busy_gpu_s", "allocated_gpu_s", "job_seconds", "useful_gpu_s",
                   "finished"] + [f"level{l}" for l in range(8)]


#: the job-table columns the simulator reads; they are validated with the trace loaders' rules
#: (traces.schema.validate_jobs). Other columns of a job table are ignored.
_SEQ = operator.attrgetter("seq")
_TABLE_COLUMNS = ("job_id", "arrival_s", "num_gpus", "duration_s", "iterations", "model", "batch_size", "gpu_type")
#: what an integer column must hold (checked before validate_jobs, which cannot see huge values)
_INTEGER_COLUMNS = {"job_id": "must be an integer", "num_gpus": "must be an integer >= 1",
                    "batch_size": "must be an integer >= 1 (or empty)"}
_EXPECTED = {"job_id": "an integer", "arrival_s": "a finite number >= 0", "num_gpus": "an integer >= 1"}


def _table_error(message: str) -> ValueError:
    """validate_jobs' message with a missing value's expected content named."""
    m = re.search(r": column '([^']+)': .*: missing value, got ", message)
    if m and m.group(1) in _EXPECTED:
        message += f"; expected {_EXPECTED[m.group(1)]}"
    return ValueError(message)


def check_job_table(df: pd.DataFrame, origin: str = "job table") -> pd.DataFrame:
    """Validate a job table with the trace loaders' rules (:func:`traces.schema.validate_jobs`)
    and return the columns the simulator reads (:data:`_TABLE_COLUMNS`), normalized as the
    loaders normalize them (numeric dtypes, "" for a missing model, <NA> for a missing batch
    size), rows in the table's own order. ValueError naming ``origin``, the column, the job and
    what was expected; the table itself is not changed."""
    if not isinstance(df, pd.DataFrame):
        raise ValueError(f"{origin}: expected a pandas DataFrame, got {type(df).__name__}")
    if len(df) == 0:
        raise ValueError(f"{origin}: the trace has no jobs (empty job table)")
    for col in ("job_id", "arrival_s", "num_gpus"):
        if col not in df.columns:
            raise ValueError(f"{origin} is missing column {col!r} (it needs job_id, arrival_s, num_gpus, model and "
                             f"iterations or duration_s; it has {[str(c) for c in df.columns]})")
    cols = [c for c in _TABLE_COLUMNS if c in df.columns]
    twice = sorted({str(c) for c in df.columns[df.columns.duplicated()] if c in cols})
    if twice:
        raise ValueError(f"{origin}: column(s) {twice} appear more than once")
    sub = df[cols]
    for c, what in _INTEGER_COLUMNS.items():
        # an integer dtype holds only integers; floats and text may hold inf or values past int64
        if c in sub.columns and not pd.api.types.is_integer_dtype(sub[c].dtype):
            v = pd.to_numeric(sub[c], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
            bad = np.abs(v) >= 2.0 ** 53  # NaN compares False: validate_jobs names it
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                jid = sub["job_id"].iloc[i] if c != "job_id" else f"at row {i}"
                val = sub[c].iloc[i]
                if isinstance(val, np.generic):  # 1e+300, not np.float64(1e+300) (as validate_jobs says it)
                    val = val.item()
                raise ValueError(f"{origin}: column '{c}': job_id {jid}: {what}, got {val!r}")
    from traces.schema import validate_jobs  # traces imports the simulator's package lazily; keep it so

    try:
        out = validate_jobs(sub, origin=origin, sort=False)  # rows in the table's order
    except ValueError as e:
        raise _table_error(str(e)) from None
    return out[list(_TABLE_COLUMNS)]


def jobs_from_table(df: pd.DataFrame, cluster: ClusterSpec, backlogged: bool = False,
                    origin: str = "job table", checked: bool = False) -> list[JobState]:
    """Job states from a canonical job table (traces/), validated first (:func:`check_job_table`;
    errors name ``origin``, the row, the job and the field; ``checked=True``: ``df`` is
    check_job_table's own output). Jobs without ``iterations`` get ``duration_s`` x the isolated
    full-backprop throughput on the cluster's main GPU type."""
    if df is None or len(df) == 0:
        raise ValueError("the trace has no jobs (empty job table)")
    t = df if checked else check_job_table(df, origin)
    jobs = []
    gtype = cluster.main_gpu_type
    tmp_costs = CostModel(cluster, SPBConfig())
    checked: set[tuple[str, int]] = set()
    bss = t["batch_size"].to_numpy(dtype=np.float64, na_value=np.nan).tolist()
    rows = zip(t["job_id"].tolist(), t["arrival_s"].tolist(), t["num_gpus"].tolist(), t["iterations"].tolist(),
               t["duration_s"].tolist(), t["model"].tolist(), bss)
    for i, (jid, arr, ng, it, d, m, bs) in enumerate(rows):
        where = f"{origin} row {i} (job_id {jid})"
        if ng > cluster.num_gpus:
            raise ValueError(f"{where}: needs {ng} GPUs but the cluster has {cluster.num_gpus}; cap GPUs per job (--max-gpus-per-job) or use a larger cluster")
        if not m:
            raise ValueError(f"{where}: field 'model' is empty; map jobs to zoo models (traces map_models) first")
        try:
            bs = int(bs) if bs == bs else default_batch_size(m)
            if (m, bs) not in checked:
                get_table(m, bs, gtype, nearest=True)  # ValueError naming allowed models / sizes
                checked.add((m, bs))
        except ValueError as e:
            raise ValueError(f"{where}: field 'model' / 'batch_size': {e}") from None
        job = JobState(job_id=jid, arrival_s=0.0 if backlogged else arr, num_gpus=ng, model=m,
                       batch_size=bs, iterations=float("nan"), duration_s=d)
        if it == it:  # validated: NaN or > 0
            job.iterations = it
        elif d == d:
            job.iterations = max(1.0, d / tmp_costs.isolated_iteration_s(job))
        else:
            raise ValueError(f"{where}: needs iterations > 0 or duration_s > 0")
        jobs.append(job)
    return jobs


@dataclass
class _Round:
    """What one round of :meth:`Simulator.step` gathers as it goes (times in seconds): its start,
    the counts at its start, the JobDecisions in force (for the round log) and those of the jobs
    that finish in it, the finished jobs, the job-seconds in the system, and the sums of busy,
    useful and allocated GPU-seconds with the per-job round-log sums (``acc``)."""

    t0: float
    active_at_start: int
    n_dec: int
    levels: list
    n_alloc_gpus: int
    n_shared_gpus: int
    dec_of: dict
    left: dict = field(default_factory=dict)
    finished: list = field(default_factory=list)
    job_seconds: float = 0.0
    acc: dict = field(default_factory=lambda: {"busy": 0.0, "useful": 0.0, "alloc": 0.0, "jobs": {}})


def _add_to_round_log(per_job: dict, job_id: int, run_s: float, steps: int, gain: float, nbytes: float) -> None:
    """Add one advance to a job's round-log sums [run seconds, steps, progress gained, bytes]."""
    r = per_job.get(job_id)
    if r is None:
        per_job[job_id] = [run_s, steps, gain, nbytes]
    else:
        r[0] += run_s
        r[1] += steps
        r[2] += gain
        r[3] += nbytes


class PolicyStalled(ValueError):
    """A policy left every job waiting for too many rounds in a row (Simulator.run). A ValueError,
    so the command line prints its one line instead of a traceback."""


def _same_decision(d, in_force: Decision) -> bool:
    if not isinstance(d, dict) or len(d) != len(in_force):
        return False
    for jid, jd in d.items():
        if in_force.get(jid) != jd:
            return False
    return True


class RunningJobs:
    """The running jobs' progress counters in arrays, one row per job in a live component, so a
    round credits every job at once (the per-job formulas of ``Simulator._advance_components``,
    element by element). While a job has a row, the row is the truth once the simulator has made
    the arrays current; :meth:`write_back` copies it to the :class:`JobState` (the simulator does
    it at the end of every round and when the job's component dissolves). Units: iterations,
    seconds, GPU-seconds.

    Rows are filled lazily: :meth:`add` only reserves the row, and the row's values are copied
    from the job (and its member) by :meth:`materialize`, which every method reading the arrays
    calls first (the simulator calls it before a vectorised advance). Until then the job object
    is the truth, so a row that comes and goes while the simulator advances the objects (few
    components: the scalar path) costs no array writes."""

    _FIELDS = ("progress", "iterations", "eta", "iso", "ngpus", "run_s", "attained", "comp")

    def __init__(self, capacity: int = 64):
        self._cap = 0
        self._free: list[int] = []
        self.jobs: dict[int, JobState] = {}  # row -> job
        self._pending: dict[int, tuple] = {}  # row -> (job, member, component slot), not filled yet
        self._grow(capacity)

    def _grow(self, cap: int) -> None:
        old = self._cap
        for name in self._FIELDS + ("iteration",):
            new = np.zeros(cap, dtype=np.int64 if name in ("iteration", "comp") else np.float64)
            if old:
                new[:old] = getattr(self, name)
            setattr(self, name, new)
        self._free.extend(range(cap - 1, old - 1, -1))
        self._cap = cap

    def add(self, job: JobState, m: Member, comp_slot: int) -> int:
        """A row for ``job`` (member ``m`` of the component in ``comp_slot``), filled from the job
        when the arrays are next read (:meth:`materialize`)."""
        if not self._free:
            self._grow(2 * self._cap)
        row = self._free.pop()
        self.jobs[row] = job
        self._pending[row] = (job, m, comp_slot)
        m.slot = row
        return row

    def materialize(self) -> None:
        """Fill the rows added since the last call from their jobs (the jobs are their truth)."""
        if not self._pending:
            return
        rows = np.array(list(self._pending), dtype=np.intp)  # (converted once for the nine writes)
        vals = list(self._pending.values())
        self.progress[rows] = [j.progress for j, _, _ in vals]
        self.iterations[rows] = [j.iterations for j, _, _ in vals]
        self.eta[rows] = [m.profile.eta for _, m, _ in vals]
        self.iso[rows] = [m.iso_s for _, m, _ in vals]
        self.ngpus[rows] = [j.num_gpus for j, _, _ in vals]
        self.run_s[rows] = [j.run_s for j, _, _ in vals]
        self.attained[rows] = [j.attained_gpu_s for j, _, _ in vals]
        self.iteration[rows] = [j.iteration for j, _, _ in vals]
        self.comp[rows] = [c for _, _, c in vals]
        self._pending.clear()

    def write_back(self, rows=None) -> None:
        """Copy rows (default: all) to their jobs' progress, iteration, run_s, attained_gpu_s
        (rows not filled yet are skipped: their jobs are current)."""
        if rows is None:
            rows = list(self.jobs)
        pend = self._pending
        if pend:
            rows = [r for r in rows if r not in pend]
        elif not isinstance(rows, list):
            rows = list(rows)
        if not rows:
            return
        idx = np.array(rows, dtype=np.intp)  # (converted once for the four gathers)
        for j, p, it, r, a in zip(map(self.jobs.__getitem__, rows), self.progress[idx].tolist(),
                                  self.iteration[idx].tolist(), self.run_s[idx].tolist(), self.attained[idx].tolist()):
            j.progress, j.iteration, j.run_s, j.attained_gpu_s = p, it, r, a

    def load(self, rows=None) -> None:
        """Refresh rows (default: all) from their jobs (after the scalar path credited them)."""
        self.materialize()
        rows = list(self.jobs) if rows is None else list(rows)
        for row in rows:
            j = self.jobs[row]
            self.progress[row], self.iteration[row] = j.progress, j.iteration
            self.run_s[row], self.attained[row] = j.run_s, j.attained_gpu_s

    def remove(self, row: int, write_back: bool = True) -> None:
        """Free a row, first writing it back to its job (unless the job is the more recent, or
        the row was never filled)."""
        if self._pending.pop(row, None) is None and write_back:
            j = self.jobs[row]
            j.progress, j.iteration = float(self.progress[row]), int(self.iteration[row])
            j.run_s, j.attained_gpu_s = float(self.run_s[row]), float(self.attained[row])
        del self.jobs[row]
        self._free.append(row)


class Simulator:
    """Round-based cluster simulator. See module docstring.

    >>> sim = Simulator(cluster, jobs, SimConfig())
    >>> while not sim.done:
    ...     sim.step(policy(sim.state))
    """

    # True: the reference path of every step (tests/sim/test_sim_step_parity.py), with none of the
    # incremental shortcuts: the whole decision validated and applied (every running job
    # visited), per-round counts recomputed from the ledger, component tables computed afresh
    # (no shared cache), component and job arrays filled when formed, no deferred round ends
    # in run(), the next completion found with the vectorised scan. Same results, slower.
    _reference = False

    def __init__(self, cluster: ClusterSpec, jobs: Iterable[JobState] | pd.DataFrame, config: SimConfig = SimConfig(),
                 costs: CostModel | None = None):
        """``costs``: a CostModel to reuse (its cached profiles and step tables), made by an earlier
        Simulator of the same ``cluster`` and the same SPB and eta settings (an env that plays many
        episodes passes its last one); ValueError when it was made for other settings."""
        if isinstance(jobs, pd.DataFrame):
            jobs = jobs_from_table(jobs, cluster, config.backlogged)
        self.cluster = cluster
        self.config = config
        self._initial_jobs = [copy.copy(j) for j in jobs]
        if not self._initial_jobs:
            raise ValueError("the simulator needs at least one job")
        for j in self._initial_jobs:
            if j.num_gpus > cluster.num_gpus:
                raise ValueError(f"job {j.job_id} needs {j.num_gpus} GPUs but the cluster has {cluster.num_gpus}")
            if config.backlogged:
                j.arrival_s = 0.0
        if costs is None:
            costs = CostModel(cluster, config.spb, config.eta_override, config.eta_scale)
        else:
            why = costs.mismatch(cluster, config.spb, config.eta_override, config.eta_scale)
            if why is not None:
                raise ValueError(f"costs: a CostModel made for another {why}")
        self.costs = costs
        self._check_jobs()
        # how co-located jobs share GPUs (eq. K1 or K1') and links (eq. L1)
        self._sharing = SharingModel(config.sharing, [cluster.gpu_type(g) for g in range(cluster.num_gpus)],
                                     gpus_per_node=cluster.gpus_per_node)
        self.reset()

    def _check_jobs(self) -> None:
        """Raise ValueError for jobs that could never run: duplicate ids, no work, an unknown model
        (get_table names the allowed ones), or too few GPUs with memory for a full-depth worker
        (slot 0 is in every level and pattern, so some worker always peaks at full depth)."""
        ids = [j.job_id for j in self._initial_jobs]
        if len(set(ids)) != len(ids):
            raise ValueError("jobs: job_id values must be unique")
        cl = self.cluster
        types = sorted(set(cl.gpu_types))
        gpu_type_arr = np.array([cl.gpu_type(g) for g in range(cl.num_gpus)])
        memory = cl.memory_array()
        fit_cache: dict[tuple, tuple[int, dict]] = {}
        for j in self._initial_jobs:
            if not (isinstance(j.num_gpus, (int, np.integer)) and j.num_gpus >= 1):
                raise ValueError(f"job {j.job_id}: num_gpus must be an integer >= 1, got {j.num_gpus!r}")
            if not (np.isfinite(j.iterations) and j.iterations > 0):
                raise ValueError(f"job {j.job_id}: iterations must be a finite number > 0, got {j.iterations!r}")
            if not (isinstance(j.arrival_s, (int, float, np.integer, np.floating)) and math.isfinite(j.arrival_s)
                    and j.arrival_s >= 0):
                raise ValueError(f"job {j.job_id}: arrival_s must be a finite number >= 0, got {j.arrival_s!r}")
            key = (j.model, j.batch_size)
            hit = fit_cache.get(key)
            if hit is None:
                peak, err = {}, None
                for t in types:
                    try:
                        peak[t] = self.costs.table(j.model, j.batch_size, t).process_peak_bytes(0)
                    except ValueError as e:  # no table for this GPU type: the job cannot use those GPUs
                        err = err or e
                if not peak:
                    raise err
                fit = int(sum(np.count_nonzero((gpu_type_arr == t) & (peak[t] <= memory)) for t in peak))
                fit_cache[key] = hit = (fit, peak)
            fit, peak = hit
            if fit < j.num_gpus:
                need = max(peak.values()) / 2**30
                raise ValueError(f"job {j.job_id} ({j.model}, batch {j.batch_size}) needs {need:.2f} GiB per worker "
                                 f"but only {fit} GPUs have that much memory (cluster gpu_memory_bytes); "
                                 f"it needs {j.num_gpus}")

    # ------------------------------------------------------------------ lifecycle
    def reset(self) -> ClusterState:
        jobs = [copy.copy(j) for j in self._initial_jobs]
        jobs.sort(key=lambda j: (j.arrival_s, j.job_id))
        # the scheduler's view: the tables' eta estimate, never a sweep's true eta (CostModel.estimate)
        self.state = ClusterState(cluster=self.cluster, costs=self.costs.estimate(), time_s=0.0, round=0,
                                  jobs={j.job_id: j for j in jobs}, active_ids=[],
                                  max_workers_per_gpu=self.config.max_workers_per_gpu, sharing=self._sharing)
        self._pending = [j.job_id for j in jobs]  # arrival order
        self.state.arrival_pos = {jid: i for i, jid in enumerate(self._pending)}
        self._pending_pos = 0
        self._components: dict[tuple, Component] = {}
        self._comp_of: dict[int, Component] = {}   # job -> the live component it is in
        self._gpu_comp: dict[int, Component] = {}  # GPU -> the live component using it
        # the live components of two or more jobs (key -> their job ids): the jobs that share GPUs,
        # grouped as the sharing connects them (ClusterState.shared_ref)
        self._shared: dict[tuple, tuple[int, ...]] = {}
        self._n_live_gpus = 0                      # GPUs held by the live components
        self._cset = ComponentSet()             # the live components' step state, vectorised
        self._rjobs = RunningJobs()             # the running jobs' counters, vectorised
        self._order = None                      # index arrays over the live components (cached)
        self._comps_list = None                 # the live components in their order (cached)
        self._gathered = None                   # the component set's constants in that order (cached)
        # which copy of the step counters and job counters is current: "both" (at a round's end),
        # "arrays" (after a vectorised advance) or "objects" (after a scalar one)
        self._current = "both"
        self._need_finish: list[Component] = []  # built, next completion not computed yet
        self._formed = 0  # components formed so far: each one's ``seq`` (the components' dict order)
        # run() sets it for rounds that keep the allocation without asking the policy: the
        # objects are then brought up to date only before someone reads them (_end_round)
        self._defer_round_end = False
        # shared step tables of components (engine.Component), kept by the cost model whose
        # profiles they are computed from: they stay valid for as long as it lives
        self._tables: dict = self.costs.step_tables
        self._round_token = object()  # marks the ledgers in_force_ledger hands out this round
        self._round_rows: list[tuple] = []
        self._cluster_rows: list[tuple] = []
        self.num_finished = 0
        self.quiet_rounds = 0  # rounds run() kept the allocation without asking the policy
        self.truncated = False
        self.first_arrival_s = jobs[0].arrival_s
        self.window_end_s = jobs[-1].arrival_s
        self.useful_at_window_end: float | None = None
        self._useful_total = 0.0
        self._busy_total = 0.0
        self._alloc_total = 0.0
        self._busy_flushed = [0.0] * self.cluster.num_gpus  # of components already dissolved (Python floats)
        self._levels = [0] * 8  # jobs of the allocation in force at each SPB level (7: 7 and above)
        self._gpu_str: dict[tuple, str] = {}  # GPUs -> their round-log text
        # the allocation in force, validated when applied: decisions are validated against it
        # incrementally (only jobs whose configuration changes are re-checked)
        self._in_force = GpuLedger(self.state)
        self.state.running_ref = self._in_force.decision  # its keys are the running jobs (ClusterState.running)
        self.state.shared_ref = self._shared
        self.state.time_s = self.first_arrival_s
        self._admit(self.state.time_s)
        self._wall0 = _time.perf_counter()
        return self.state

    @property
    def _busy_per_gpu(self) -> np.ndarray:
        """(G,) compute seconds per GPU so far."""
        out = np.array(self._busy_flushed, dtype=np.float64)
        for comp in self._components.values():
            out[comp.gpu_list] += comp.busy_vector()
        return out

    def in_force_ledger(self) -> GpuLedger:
        """A copy of the ledger of the allocation in force (what ``step(None)`` would keep). Marked
        with this round, so that :meth:`step` may take it back as the next decision's ledger."""
        led = self._in_force.copy()
        led._origin = self._round_token
        return led

    @property
    def done(self) -> bool:
        return self.num_finished == len(self.state.jobs) or self.truncated

    def copy(self) -> "Simulator":
        """A deep copy (for mask checks and look-ahead)."""
        return copy.deepcopy(self)

    # ------------------------------------------------------------------ arrivals
    def _admit(self, t: float) -> None:
        ids = self._pending
        st = self.state
        while self._pending_pos < len(ids) and st.jobs[ids[self._pending_pos]].arrival_s <= t + 1e-9:
            j = st.jobs[ids[self._pending_pos]]
            j.status = JobStatus.QUEUED
            st.active_ids.append(j.job_id)
            self._pending_pos += 1

    def next_arrival_s(self) -> float | None:
        if self._pending_pos < len(self._pending):
            return self.state.jobs[self._pending[self._pending_pos]].arrival_s
        return None

    # ------------------------------------------------------------------ decisions
    def validate(self, decision: Decision) -> GpuLedger:
        """Raise InfeasibleDecision (a ValueError) if ``decision`` breaks a constraint."""
        return validate_decision(self.state, decision)

    def _validate_incremental(self, decision: Decision) -> GpuLedger:
        """The ledger of ``decision``, or InfeasibleDecision. Starts from the allocation in force
        (valid), takes out the jobs that leave or change, then adds the changed and new ones with
        checks. Adds only raise sums, so checking each add against the running sums is the same
        as checking the final sums: the result equals :func:`validate_decision`'s. When nothing
        changes it is the ledger in force itself (not a copy)."""
        return self._validate_diff(decision)[0]

    def _validate_full(self, decision: Decision) -> GpuLedger:
        """The reference for :meth:`_validate_diff`: every job of the decision compared with
        the allocation in force, on a copy of the ledger (the validation before the diff)."""
        cur = self._in_force
        led = cur.copy()
        for jid, jd in cur.decision.items():
            if decision.get(jid) != jd:
                led.remove(jid)
        for jid, jd in decision.items():
            if not isinstance(jd, JobDecision):
                raise InfeasibleDecision(f"decision for job {jid} must be a JobDecision, got {type(jd).__name__}")
            if jid not in led.decision:
                led.add(jid, jd)
        return led

    def _leaving(self, decision: Decision) -> list[int]:
        """The jobs in force (in the order in force) that ``decision`` leaves out or changes."""
        removed = []
        for jid, jd in self._in_force.decision.items():
            x = decision.get(jid)
            if x is not jd and x != jd:
                removed.append(jid)
        return removed

    def _validate_diff(self, decision: Decision) -> tuple[GpuLedger, list[int], list[int]]:
        """:meth:`_validate_incremental`, and what changed: the ids of the jobs in force that
        leave or change (in the order of the allocation in force) and of the jobs to add (in
        the decision's order). Jobs whose JobDecision equals the one in force (the same object,
        usually) cost a lookup: no ledger update, no check."""
        cur = self._in_force
        cd = cur.decision
        removed = self._leaving(decision)
        added = []
        led = None
        rem = set(removed)
        for jid, jd in decision.items():
            if not isinstance(jd, JobDecision):
                raise InfeasibleDecision(f"decision for job {jid} must be a JobDecision, got {type(jd).__name__}")
            if jid not in cd or jid in rem:
                if led is None:
                    led = cur.copy()
                    for x in removed:
                        led.remove(x)
                led.add(jid, jd)
                added.append(jid)
        if led is None:
            if not removed:
                return cur, removed, added
            led = cur.copy()
            for x in removed:
                led.remove(x)
        return led, removed, added

    def _adopt(self, ledger: GpuLedger) -> tuple[GpuLedger, list[int], list[int]] | None:
        """What :meth:`_validate_diff` returns for ``ledger.decision``, with ``ledger`` itself as
        the new ledger, when its job order is the one validation would give; None otherwise."""
        cd = self._in_force.decision
        dec = ledger.decision
        removed = self._leaving(dec)
        rem = set(removed)
        kept = [jid for jid in cd if jid not in rem and jid in dec]
        added = []
        for i, (jid, jd) in enumerate(dec.items()):
            if type(jd) is not JobDecision:
                return None
            if i < len(kept):
                if jid != kept[i]:
                    return None
            else:
                added.append(jid)
        if any(jid in cd and jid not in rem for jid in added):
            return None  # a job re-added with its JobDecision unchanged: validation keeps its place
        # the tally of GPUs by worker count grows a slot the first time a GPU reaches a new count;
        # the builder may have passed through a count validation never reaches (a job added before
        # another left its GPU): drop those empty slots, as validation's tally would not have them
        wc, n0 = ledger._wc, len(self._in_force._wc)
        while len(wc) > n0 and wc[-1] == 0:
            wc.pop()
        return ledger, removed, added

    def _flush(self, comp: Component) -> None:
        """Add a dissolving component's per-GPU busy seconds to the dissolved total (Python
        floats: the same additions as ``flushed[comp.gpus] += comp.busy_vector()``)."""
        bf = self._busy_flushed
        for g, v in zip(comp.gpu_list, comp.busy_list()):
            bf[g] += v

    def _apply(self, decision: Decision) -> None:
        self._rebuild(apply_job_bookkeeping(self.state, decision, self.config.restart_s,
                                            running_ids=list(self._in_force.decision)))

    def _dissolve(self, comp: Component) -> Component:
        """Take a live component out: its step state and its jobs' counters go back to the
        objects, and its per-GPU busy seconds are added to the dissolved total."""
        del self._components[comp.key]
        if len(comp.members) > 1:
            del self._shared[comp.key]
        elif comp.group is not None:
            self._shared.pop(comp.group_key, None)
        from_arrays = self._current != "objects"
        self._cset.remove(comp, write_back=from_arrays)
        gpus = comp.gpu_list
        self._flush(comp)
        rj = self._rjobs
        for m in comp.members:
            rj.remove(m.slot, write_back=from_arrays)
            m.slot = -1
        gc = self._gpu_comp
        for g in gpus:
            if gc.get(g) is comp:
                del gc[g]
                self._n_live_gpus -= 1
        self._order = self._gathered = self._comps_list = None
        return comp

    def _dissolve_group(self, comp: Component) -> tuple:
        """Dissolve ``comp`` and, under the free pace, the components of the jobs it shares GPUs
        with (formed together: their times depend on each other); returns them."""
        group = (comp,) if comp.group is None else comp.group
        for c in group:
            if c.slot >= 0:
                self._dissolve(c)
        return group

    def _form(self, key: tuple, comp: Component) -> None:
        """Put a new component in: a slot in the component set, a row per job, its GPUs."""
        comp.key = key
        comp.seq = self._formed  # (a dict appends: increasing seq is the components' order)
        self._formed += 1
        self._components[key] = comp
        if len(comp.members) > 1:
            self._shared[key] = tuple([m.job_id for m in comp.members])
        slot = self._cset.add(comp)
        jobs = self.state.jobs
        rj = self._rjobs
        comp_of = self._comp_of
        for m in comp.members:
            rj.add(jobs[m.job_id], m, slot)
            comp_of[m.job_id] = comp
        comp.rows = [m.slot for m in comp.members]
        gc = self._gpu_comp
        for g in comp.gpu_list:
            if g not in gc:
                self._n_live_gpus += 1
            gc[g] = comp
        self._need_finish.append(comp)
        self._order = self._gathered = self._comps_list = None
        if self._reference:
            self._cset.materialize()
            self._rjobs.materialize()

    def _rebuild(self, changed: set[int], at_s: float | None = None) -> None:
        """Recompute the co-location components touched by ``changed`` jobs, formed at ``at_s``
        (s; default the state's time, the round's start). (A live component holds a slot in the
        component set: ``comp.slot >= 0``.)"""
        if not changed:
            return
        st = self.state
        jobs = st.jobs
        comp_of = self._comp_of
        RUNNING = JobStatus.RUNNING
        # components that lose or gain members are dissolved; their surviving jobs are regrouped
        dirty = set(changed)
        for jid in changed:
            comp = comp_of.get(jid)
            if comp is not None and comp.slot >= 0:
                for c in self._dissolve_group(comp):
                    dirty.update(m.job_id for m in c.members)
        # GPUs of dirty running jobs may touch clean components: dissolve those too
        gpu_owner = self._gpu_comp
        frontier = [j for j in dirty if jobs[j].status is RUNNING]
        while frontier:
            jid = frontier.pop()
            for g in jobs[jid].placement:
                comp = gpu_owner.get(g)
                if comp is not None and comp.slot >= 0:
                    for c in self._dissolve_group(comp):
                        for m in c.members:
                            if m.job_id not in dirty:
                                dirty.add(m.job_id)
                                frontier.append(m.job_id)
        for jid in dirty:
            comp_of.pop(jid, None)
        running = [j for j in dirty if jobs[j].status is RUNNING]
        if not running:
            return
        groups = [running] if len(running) == 1 else connected_groups({jid: jobs[jid].placement for jid in running})
        costs = self.costs
        formed_s = st.time_s if at_s is None else at_s
        free = self.config.pace == "free"
        for jids in groups:
            members = []
            key = []
            ready = st.time_s
            for jid in jids:
                j = jobs[jid]
                pl = j.placement
                members.append(Member(jid, costs.profile(j, j.level, j.pattern, pl), pl, j.iteration,
                                      costs.isolated_iteration_s(j)))
                key.append((jid, pl, j.level, j.pattern.value))
                if j.restart_until_s > ready:
                    ready = j.restart_until_s
            if free and len(members) > 1:
                self._form_free_group(tuple(key), members, formed_s)
            else:
                self._form(tuple(key), Component(members, ready, None if self._reference else self._tables,
                                                 self.config.lockstep_s, formed_s, self._sharing))

    def _form_free_group(self, key: tuple, members: list[Member], formed_s: float) -> None:
        """Under the free pace, a component per job of a group that shares GPUs, each stepping
        with the times it takes beside the others (eqs. F1-F4, :mod:`jigsaw_env.free_running`)."""
        fr = self._free_running(members)
        per_gpu: dict[int, int] = {}
        for m in members:
            for g in set(m.gpus):
                per_gpu[g] = per_gpu.get(g, 0) + 1
        jobs = self.state.jobs
        cache = None if self._reference else self._tables
        comps = []
        for m, prof, rate, entry in zip(members, fr.profiles, fr.busy_rate, key):
            ready = max(self.state.time_s, jobs[m.job_id].restart_until_s)
            comp = Component([Member(m.job_id, prof, m.gpus, m.iteration0, m.iso_s)], ready, cache, 0.0, formed_s, None)
            comp.alloc_gpus = sum(1.0 / per_gpu[g] for g in comp.gpu_list)
            comp.set_busy_rate(rate)
            comps.append((entry, comp))
        group = tuple(c for _, c in comps)
        for entry, comp in comps:
            comp.group, comp.group_key = group, key
            self._form((entry,), comp)
        self._shared[key] = tuple([m.job_id for m in members])

    def _free_running(self, members: list[Member]):
        """:func:`free_running` of ``members``, kept with the step tables: the result depends on
        the members' profiles and on which of the group's GPUs (their types and nodes) each uses,
        not on where the group sits or on the jobs' phases."""
        sharing = self._sharing
        gpus = sorted({g for m in members for g in m.gpus})
        col = {g: i for i, g in enumerate(gpus)}
        key = (sharing.mode, tuple((id(m.profile), tuple(col[g] for g in m.gpus)) for m in members),
               tuple(sharing.gpu_type_of(g) for g in gpus), sharing.node_signature(gpus))
        cache = None if self._reference else self.costs.free_running
        hit = None if cache is None else cache.get(key)
        if hit is not None and all(p is m.profile for p, m in zip(hit[0], members)):
            return hit[1]
        fr = free_running([FreeRunner(m.profile, m.gpus) for m in members], sharing)
        if cache is not None:
            if len(cache) > 50_000:
                cache.clear()
            cache[key] = (tuple(m.profile for m in members), fr)
        return fr

    # ------------------------------------------------------------------ time
    def _finish_time(self, comp: Component, now: float) -> tuple[float, list[int]]:
        """Earliest absolute time a member finishes, and who finishes then. Cached on the
        component: advancing it does not move that time, and any change rebuilds the component."""
        if comp.finish is not None:
            return comp.finish
        st = self.state
        best, who = float("inf"), []
        for i, m in enumerate(comp.members):
            j = st.jobs[m.job_id]
            # steps already taken in this component have been credited to j.progress
            steps = math.ceil(j.remaining / m.profile.eta - 1e-9)  # as int(np.ceil(...))
            # steps == 0: an earlier advance already completed the last step (Component.steps_within
            # counts a step that ends within its relative tolerance after the round end): finish now
            t = now + comp.time_to_steps(steps, now) if steps > 0 else now
            if t < best - 1e-9:
                best, who = t, [m.job_id]
            elif abs(t - best) <= 1e-9:
                who.append(m.job_id)
        comp.finish = (best, who)
        return best, who

    def _member_row(self, jid: int) -> int:
        """The running-job row of job ``jid`` (a member of a live component)."""
        for m in self._comp_of[jid].members:
            if m.job_id == jid:
                return m.slot
        raise KeyError(jid)

    def _next_completion(self, now: float, t_end: float) -> tuple[float, list[int]]:
        """The next completion before ``t_end`` (or ``t_end``) and the jobs finishing then: the
        earliest cached finish time across components, ties within 1e-9 s. Only components whose
        finish is near or before ``t_end`` can matter; they are scanned in the components' order,
        exactly as a scan over all of them would go."""
        cset = self._cset
        for comp in self._need_finish:
            if comp.slot >= 0:
                cset.fin[comp.slot] = self._finish_time(comp, now)[0]
        self._need_finish.clear()
        t_next, who_all = t_end, []
        comps = self._live_comps()
        if not comps:
            return t_next, who_all
        if len(comps) < self.VECTOR_MIN_FINISH and not self._reference:
            lim = t_end + 2e-9
            for comp in comps:  # the same scan one by one (fewer numpy calls)
                t_fin, who = comp.finish
                if t_fin <= lim:
                    if t_fin < t_next - 1e-9:
                        t_next, who_all = t_fin, list(who)
                    elif abs(t_fin - t_next) <= 1e-9:
                        who_all.extend(who)
            return t_next, who_all
        # every slot's cached finish (a free slot's is +inf): the few components near or before
        # t_end, put back in the components' order
        near = np.flatnonzero(cset.fin <= t_end + 2e-9).tolist()
        near = list(map(cset.comps.__getitem__, near))
        if len(near) > 1:
            near.sort(key=_SEQ)
        for comp in near:
            t_fin, who = comp.finish
            if t_fin < t_next - 1e-9:
                t_next, who_all = t_fin, list(who)
            elif abs(t_fin - t_next) <= 1e-9:
                who_all.extend(who)
        return t_next, who_all

    def _live_order(self) -> tuple:
        """Index arrays over the live components in their dict order (cached until one forms or
        dissolves): component slots, the components, job rows, each row's position among the
        components, the GPUs each component is charged for (``Component.alloc_gpus``) and its
        formation time (s)."""
        if self._order is None:
            comps = self._live_comps()
            slots = np.array([c.slot for c in comps], dtype=np.int64)
            rows: list[int] = []
            ext = rows.extend
            for c in comps:
                ext(c.rows)
            pos = np.repeat(np.arange(len(comps)), [len(c.rows) for c in comps])
            self._order = (slots, comps, np.array(rows, dtype=np.int64), pos,
                           np.array([c.alloc_gpus for c in comps], dtype=np.float64),
                           np.array([c.formed_s for c in comps], dtype=np.float64))
        return self._order

    def _live_comps(self) -> list:
        """The live components in their dict order (cached until one forms or dissolves)."""
        if self._comps_list is None:
            self._comps_list = list(self._components.values())
        return self._comps_list

    # below this many live components the scalar path is faster than numpy's per-call overhead
    VECTOR_MIN_COMPONENTS = 12
    VECTOR_MIN_FINISH = 48  # the same for the scan for the next completion

    def _use_arrays(self) -> None:
        """Make the arrays current (load what the scalar path advanced since)."""
        cset, rj = self._cset, self._rjobs
        cset.materialize()
        rj.materialize()
        if self._current == "objects":
            for comp in self._components.values():
                cset.load(comp)
            rj.load()
        self._current = "arrays"

    def _use_objects(self) -> None:
        """Make the objects current (write back what the vectorised path advanced since)."""
        if self._current == "arrays":
            self._rjobs.write_back()
            self._cset.sync()
        self._current = "objects"

    def _end_round(self) -> None:
        """At the round's end the objects are current, for whoever reads the state next."""
        if self._current == "arrays":
            self._rjobs.write_back()
            self._cset.sync()
            self._current = "both"

    def _advance_components(self, t: float, base_s: float, acc: dict, some: list | None = None) -> None:
        """Advance live components to time ``t`` (s) and credit their jobs: every live one, or
        only those of ``some``. Each component is advanced from its own clock: its formation
        time, or ``base_s`` (when every live component was last advanced together: the round's
        start, or the end of the measured window) if that is later. Components are independent
        between a round's decisions (a completion changes only its own component, rebuilt then),
        so the round advances only the finishing ones at a completion and all of them at its end.

        Each job gains ``steps x eta`` full-backprop-equivalent iterations capped at what it still
        needs, ``steps`` raw iterations, the component's run seconds, and ``dt x GPUs``
        GPU-seconds held. Sums go into ``acc`` (busy, useful and allocated GPU-seconds) in the
        components' order, one by one, as a scalar loop would add them."""
        comps = self._live_comps()
        if not comps:
            return
        if len(comps) < self.VECTOR_MIN_COMPONENTS:
            self._use_objects()
            self._advance_scalar(comps if some is None else some, t, base_s, acc)
            return
        self._use_arrays()
        if some is not None:
            self._advance_from_arrays(some, t, base_s, acc)
            return
        slots, comps, rows, pos, ngpu, formed = self._live_order()
        if self._gathered is None:
            self._gathered = self._cset.gather(slots)
        now = np.maximum(formed, base_s)
        dt = t - now
        steps, run, busy = self._cset.advance(self._gathered, now, dt)
        rj = self._rjobs
        msteps = steps[pos]
        gain = msteps * rj.eta[rows]
        progress = rj.progress[rows]
        rem = rj.iterations[rows] - progress
        gain = np.where(gain > rem, np.where(rem > 0.0, rem, 0.0), gain)
        rj.progress[rows] = progress + gain
        rj.iteration[rows] += msteps
        mrun = run[pos]
        rj.run_s[rows] += mrun
        ng = rj.ngpus[rows]
        rj.attained[rows] += dt[pos] * ng
        useful_sum = sum((gain * rj.iso[rows] * ng).tolist())
        if self.config.log_rounds:
            self._log_jobs(acc["jobs"], comps, steps, mrun, msteps, gain)
        acc["busy"] += sum(busy.tolist())
        acc["useful"] += useful_sum
        acc["alloc"] += sum((dt * ngpu).tolist())

    def _advance_from_arrays(self, comps: list, t: float, base_s: float, acc: dict) -> None:
        """:meth:`_advance_scalar` for a few components while the arrays are current (a
        completion's components): their slots and job rows are copied to the objects, advanced
        there, and copied back; a few scalar reads and writes instead of the vectorised path's
        per-call cost, with the same arithmetic (tests/sim/test_perf.py holds the two paths equal)."""
        cset, rj = self._cset, self._rjobs
        rows = [r for c in comps for r in c.rows]
        rj.write_back(rows)
        for c in comps:
            c.k, c.partial = int(cset.k[c.slot]), float(cset.partial[c.slot])
        self._advance_scalar(comps, t, base_s, acc)
        for c in comps:
            cset.load(c)
        rj.load(rows)

    def _advance_scalar(self, comps: list, t: float, base_s: float, acc: dict) -> None:
        """:meth:`_advance_components` one component and one job at a time, on the objects (the
        same formulas and summation order; faster for a few components)."""
        jobs = self.state.jobs
        log = self.config.log_rounds
        per_job = acc["jobs"]
        busy_sum = useful_sum = alloc_sum = 0.0
        for comp in comps:
            now = comp.formed_s if comp.formed_s > base_s else base_s
            dt = t - now
            steps, run_s, busy, bytes_ = comp.advance_totals(now, dt)
            busy_sum += busy
            alloc_sum += dt * comp.alloc_gpus
            for m, by in zip(comp.members, bytes_):
                j = jobs[m.job_id]
                rem = j.iterations - j.progress
                gain = steps * m.profile.eta
                if gain > rem:
                    gain = rem if rem > 0.0 else 0.0
                j.progress += gain
                j.iteration += steps
                j.run_s += run_s
                j.attained_gpu_s += dt * j.num_gpus
                useful_sum += gain * m.iso_s * j.num_gpus
                if log:
                    _add_to_round_log(per_job, m.job_id, run_s, steps, gain, by)
        acc["busy"] += busy_sum
        acc["useful"] += useful_sum
        acc["alloc"] += alloc_sum

    def _log_jobs(self, per_job: dict, comps: list, steps: np.ndarray, mrun: np.ndarray, msteps: np.ndarray,
                  gain: np.ndarray) -> None:
        """Add this advance to the round log's per-job sums: run seconds, steps, progress gained,
        bytes on the wire (the component's per-member cumulative bytes over the steps taken)."""
        i = 0
        ks = self._cset.k
        for comp, dk in zip(comps, steps.tolist()):
            k1 = int(ks[comp.slot])
            k0 = k1 - dk
            H = comp.H
            q0, r0 = divmod(k0, H)
            q1, r1 = divmod(k1, H)
            for m, cb in zip(comp.members, comp._cum_bytes_l):
                by = (q1 - q0) * cb[-1] + cb[r1] - cb[r0]
                _add_to_round_log(per_job, m.job_id, float(mrun[i]), int(msteps[i]), float(gain[i]), by)
                i += 1

    def _snap_window(self, t: float) -> None:
        if self.useful_at_window_end is None and t >= self.window_end_s - 1e-9:
            self.useful_at_window_end = self._useful_total

    def step(self, decision: Decision | None, ledger: GpuLedger | None = None) -> RoundResult:
        """Apply ``decision`` (None: keep the current allocation) and advance one round.

        ``ledger``: the ledger that holds ``decision`` (``ledger.decision is decision``), if the
        caller built it from this round's :meth:`in_force_ledger` by the ledger's own checked adds
        and removes (the env's RoundBuilder does). It is then taken as the allocation in force
        instead of re-validating the decision job by job: every add was checked against a ledger
        holding at least the jobs the validation's would (each job leaves before it comes back),
        and memory is whole bytes (exact sums, in any order), so the validation would pass and
        build an equal ledger. It is used only when its job order is also the one validation
        would give (jobs kept, in the order in force, then jobs added); otherwise, or with any
        other ledger, the decision is validated as usual.

        The round's phases: take the decision (validated, or adopted with its ledger; nothing
        changes when it is refused), apply what changed, find the round's end, advance to it with
        the completions inside it, then close the round (arrivals, clock, logs)."""
        if self.done:
            raise RuntimeError("the episode is over; call reset()")
        self._check_round_advances_time()
        decision, ledger, removed, added = self._take_decision(decision, ledger)
        st = self.state
        self._snap_window(st.time_s)
        self._apply_changes(decision, removed, added)
        self._in_force = ledger
        st.running_ref = ledger.decision
        n_alloc, n_shared = self._gpu_counts(ledger)
        rnd = _Round(t0=st.time_s, active_at_start=len(st.active_ids), n_dec=len(ledger.decision),
                     levels=list(self._levels), n_alloc_gpus=n_alloc, n_shared_gpus=n_shared,
                     dec_of=ledger.decision if decision is None else decision)
        t_end = self._advance_round(rnd, ledger, self._round_end_s(rnd.t0))
        self._close_round(rnd, t_end)
        acc = rnd.acc
        return RoundResult(round=st.round - 1, start_s=rnd.t0, end_s=t_end, job_seconds=rnd.job_seconds,
                           finished=rnd.finished, useful_gpu_s=acc["useful"], busy_gpu_s=acc["busy"],
                           allocated_gpu_s=acc["alloc"], done=self.num_finished == len(st.jobs),
                           truncated=self.truncated)

    # ----- the phases of a round (step)
    def _check_round_advances_time(self) -> None:
        """ValueError, before anything changes, when one round would not move the clock."""
        t = self.state.time_s
        rs = self.config.round_s if self.config.round_s is not None else self.config.idle_round_s
        if t + rs == t:
            raise ValueError(f"simulated time {t:.6g} s is too large for rounds of {rs:g} s: adding one round "
                             f"does not change it in double precision (arrival or duration values far too large?)")

    def _take_decision(self, decision, ledger) -> tuple:
        """(decision, its ledger, jobs removed, jobs added): the decision validated against the
        allocation in force (or its ledger adopted, or the allocation in force kept for None).
        The job lists are None where nothing is applied job by job. Raises InfeasibleDecision
        before anything changes."""
        ref = self._reference
        adopted = None
        if (ledger is not None and not ref and decision is not None and ledger.decision is decision
                and ledger._origin is self._round_token):
            adopted = self._adopt(ledger)
        self._round_token = object()  # ledgers handed out before this step are of an earlier round
        if adopted is not None:
            ledger, removed, added = adopted
            return decision, ledger, removed, added
        if decision is None and not ref:
            # the allocation in force: nothing to validate or apply. The ledger itself stands for
            # the decision (jobs finishing in the round leave it; the round log keeps their entries)
            return None, self._in_force, None, None
        if decision is None:
            decision = Decision(self._in_force.decision)
            return decision, self._validate_full(decision), None, None
        if not isinstance(decision, dict):
            raise InfeasibleDecision(f"a decision must be a dict job_id -> JobDecision, got {type(decision).__name__}")
        try:
            decision = Decision({int(k): v for k, v in decision.items()})
        except (TypeError, ValueError):
            raise InfeasibleDecision(f"decision keys must be integer job ids, got {list(decision)[:5]}") from None
        if ref:
            return decision, self._validate_full(decision), None, None
        ledger, removed, added = self._validate_diff(decision)  # raises before anything changes
        return decision, ledger, removed, added

    def _apply_changes(self, decision, removed, added) -> None:
        """The jobs' bookkeeping (starts, stops, moves, level changes), the components they touch
        and the count of jobs per SPB level."""
        st = self.state
        if self._reference:
            self._rebuild(apply_job_bookkeeping(st, decision, self.config.restart_s,
                                                running_ids=list(self._in_force.decision)))
            self._levels = [0] * 8
            for jd in decision.values():
                self._levels[min(jd.level, 7)] += 1
        elif decision is not None and (removed or added):
            # only the jobs that leave or change are visited: apply_job_bookkeeping does nothing
            # to a running job whose JobDecision equals the one in force
            old = self._in_force.decision
            levels = self._levels
            for jid in removed:
                levels[min(old[jid].level, 7)] -= 1
            for jid in added:
                levels[min(decision[jid].level, 7)] += 1
            sub = Decision({jid: decision[jid] for jid in added})
            self._rebuild(apply_job_bookkeeping(st, sub, self.config.restart_s, running_ids=removed))

    def _gpu_counts(self, ledger: GpuLedger) -> tuple[int, int]:
        """(GPUs allocated, GPUs shared by two or more workers) in ``ledger``."""
        G = ledger.num_gpus
        n_free = ledger.num_with_workers(0)
        if self._reference:
            return G - ledger._wl.count(0), int(np.count_nonzero(ledger.workers > 1))
        return G - n_free, G - n_free - ledger.num_with_workers(1)

    def _round_end_s(self, t0: float) -> float:
        """When a round starting at ``t0`` ends (s): after ``round_s``, at the next step boundary
        (iteration granularity), at the next arrival on an idle cluster, capped at ``max_time_s``."""
        cfg = self.config
        if self._components:
            if cfg.round_s is not None:
                t_end = t0 + cfg.round_s
            else:
                self._end_round()  # the step counters of the objects are read
                t_end = t0 + min(c.time_to_next_step(t0) for c in self._components.values())
        else:
            nxt = self.next_arrival_s()
            if not self.state.active_ids and nxt is not None:
                t_end = nxt  # idle cluster: jump to the next arrival
            else:
                t_end = t0 + (cfg.round_s if cfg.round_s is not None else cfg.idle_round_s)
        if cfg.max_time_s is not None:
            t_end = min(t_end, self.first_arrival_s + cfg.max_time_s)
        return t_end

    def _advance_round(self, rnd: "_Round", ledger: GpuLedger, t_end: float) -> float:
        """Advance from the round's start to ``t_end`` with the completions inside it; returns the
        round's end (the last completion when the episode ends before ``t_end``)."""
        st = self.state
        acc = rnd.acc
        now = rnd.t0
        n_active = rnd.active_at_start
        base_s = now  # every live component has been advanced to max(base_s, its formation time)
        advances = now < t_end - 1e-12  # a round of (nearly) no time advances nothing
        while now < t_end - 1e-12:
            t_next, who_all = self._next_completion(now, t_end)
            if self.useful_at_window_end is None and now < self.window_end_s < t_next:
                t_next, who_all = self.window_end_s, []
            rnd.job_seconds += n_active * max(0.0, t_next - now)
            now = t_next
            if self.useful_at_window_end is None and now >= self.window_end_s - 1e-9:
                # the measured window ends: its useful work counts every component up to now
                self._advance_components(now, base_s, acc)
                base_s = now
            elif who_all:
                # only the components of the finishing jobs: the others are untouched until the
                # round ends (or the window does)
                self._advance_components(now, base_s, acc, self._components_of(who_all))
            if who_all:
                self._complete(who_all, now, ledger, rnd)
                n_active -= len(who_all)
            self._snap_window_acc(now, acc)
            if self.num_finished == len(st.jobs):
                t_end = now  # episode over: the last round ends at the last completion
                break
        if advances:  # the rest of the round, up to its last event (its end, or within 1e-12 s of it)
            self._advance_components(now, base_s, acc)
        return t_end

    def _components_of(self, job_ids: list[int]) -> list:
        """The live components of ``job_ids``, with the free pace's siblings (formed together)."""
        comp_of = self._comp_of
        some = []
        for jid in job_ids:
            comp = comp_of[jid]
            for c in ((comp,) if comp.group is None else comp.group):
                if c not in some:
                    some.append(c)
        return some

    def _complete(self, job_ids: list[int], now: float, ledger: GpuLedger, rnd: "_Round") -> None:
        """Jobs ``job_ids`` finish at ``now``: done, out of the ledger (their entries kept for the
        round log), their components re-formed without them."""
        st = self.state
        rj = self._rjobs
        for jid in job_ids:
            j = st.jobs[jid]
            rj.progress[self._member_row(jid)] = j.iterations  # written back when it dissolves
            j.progress = j.iterations
            j.status = JobStatus.DONE
            j.finish_s = now
            j.placement = ()
            jd = ledger.decision.get(jid)
            if jd is not None:
                rnd.left[jid] = jd
                self._levels[min(jd.level, 7)] -= 1
                ledger.remove(jid)
            rnd.finished.append(jid)
            self.num_finished += 1
        self._rebuild(set(job_ids), now)

    def _close_round(self, rnd: "_Round", t_end: float) -> None:
        """The round ends at ``t_end``: finished jobs leave the active list, arrivals during the
        round count from their arrival, the clock moves, new arrivals are admitted, the totals
        and logs are written and the round counter moves on."""
        st = self.state
        if not self._defer_round_end:
            self._end_round()
        if rnd.finished:  # once per round, not per completion
            # the jobs that finished are exactly the ones to drop (only _complete marks a job DONE);
            # list.remove scans in C, where a filter over the (possibly thousands of) active jobs
            # would read every job's status in Python. The order of the rest is kept.
            remove = st.active_ids.remove
            for jid in rnd.finished:
                remove(jid)
        # arrivals during the round count as in the system from their arrival time
        nxt_pos = self._pending_pos
        while nxt_pos < len(self._pending):
            j = st.jobs[self._pending[nxt_pos]]
            if j.arrival_s > t_end + 1e-9:
                break
            rnd.job_seconds += t_end - j.arrival_s
            nxt_pos += 1
        st.time_s = t_end
        self._admit(t_end)
        acc = rnd.acc
        self._useful_total += acc["useful"]
        self._busy_total += acc["busy"]
        self._alloc_total += acc["alloc"]
        if self.config.log_rounds:
            self._log_jobs_of_round(rnd, t_end)
        self._cluster_rows.append((st.round, rnd.t0, t_end, rnd.active_at_start, rnd.active_at_start - rnd.n_dec,
                                   rnd.n_dec, rnd.n_alloc_gpus, rnd.n_shared_gpus, acc["busy"], acc["alloc"],
                                   rnd.job_seconds, acc["useful"], len(rnd.finished), *rnd.levels))
        st.round += 1
        cfg = self.config
        if cfg.max_time_s is not None and not self.done and st.time_s >= self.first_arrival_s + cfg.max_time_s - 1e-9:
            self.truncated = True
        self._snap_window(st.time_s)

    def _log_jobs_of_round(self, rnd: "_Round", t_end: float) -> None:
        """One round-log row per job that ran in the round (its JobDecision, or the one it had
        when it finished)."""
        st = self.state
        rows = self._round_rows
        gstr = self._gpu_str
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

    def _snap_window_acc(self, now: float, acc: dict) -> None:
        if self.useful_at_window_end is None and now >= self.window_end_s - 1e-9:
            self.useful_at_window_end = self._useful_total + acc["useful"]

    # ------------------------------------------------------------------ whole episodes
    def run(self, policy: Callable[[ClusterState], Decision], progress: bool = False,
            skip_quiet: bool = True, max_stalled_rounds: int | None = 1000) -> dict:
        """Run to the end with ``policy(state) -> Decision`` each round; return the metrics.

        Quiet rounds: when the policy (a scheduler, or its bound ``schedule``) has a
        ``quiet_until(state)`` method and has just returned the allocation in force, later rounds
        keep that allocation without asking it again, until a job arrives or finishes or its
        ``quiet_until`` time comes. Results are identical (tests/sim/test_perf.py checks it against
        ``skip_quiet=False``); only the calls are saved.

        A policy that runs nothing for ``max_stalled_rounds`` rounds in a row while jobs wait (an
        undertrained learned policy can choose "advance" forever; no heuristic does, since any
        waiting job fits the idle cluster) raises :class:`PolicyStalled` instead of looping
        forever. None turns the check off.
        """
        owner = getattr(policy, "__self__", policy)
        quiet_fn = getattr(owner, "quiet_until", None) if skip_quiet else None
        bar = None
        if progress:
            from tqdm.auto import tqdm
            bar = tqdm(total=len(self.state.jobs), unit="job", desc="simulating")
        quiet_until = -float("inf")
        st = self.state
        stalled = 0
        # young collections in larger batches while the loop runs (jigsaw_env.gc_tuning)
        with fewer_collections():
            try:
                while not self.done:
                    waiting_at_start = len(st.active_ids)
                    if st.time_s < quiet_until - 1e-9:
                        self.quiet_rounds += 1
                        pos = self._pending_pos
                        # nobody reads the job objects before the next policy call: they are brought
                        # up to date then (the arrays stay the truth in between; the same numbers)
                        self._defer_round_end = not self._reference
                        try:
                            r = self.step(None)
                        finally:
                            self._defer_round_end = False
                    else:
                        self._end_round()  # the policy reads the job objects
                        st.in_force = self._in_force  # for the policy's call only (ClusterState.in_force)
                        try:
                            d = policy(st)
                        finally:
                            st.in_force = None
                        if quiet_fn is not None and _same_decision(d, self._in_force.decision):
                            quiet_until = quiet_fn(st)
                        else:
                            quiet_until = -float("inf")
                        pos = self._pending_pos
                        r = self.step(d)
                    if r.finished or self._pending_pos != pos:
                        quiet_until = -float("inf")  # an event: ask the policy next round
                    if max_stalled_rounds is not None:
                        stalled = stalled + 1 if (r.allocated_gpu_s == 0.0 and waiting_at_start) else 0
                        if stalled >= max_stalled_rounds:
                            raise PolicyStalled(
                                f"the policy ran nothing for {stalled} rounds in a row while {waiting_at_start} jobs "
                                f"waited (simulated time {st.time_s:,.0f} s); it never starts them (an undertrained "
                                f"policy?). Raise max_stalled_rounds or train longer")
                    if bar is not None and r.finished:
                        bar.update(len(r.finished))
            finally:
                self._end_round()
        if bar is not None:
            bar.close()
        return self.metrics()

    # ------------------------------------------------------------------ logs & metrics
    def jobs_frame(self) -> pd.DataFrame:
        rows = []
        for j in sorted(self.state.jobs.values(), key=lambda j: j.job_id):
            iso = j.iterations * self.costs.isolated_iteration_s(j)
            rows.append((j.job_id, j.arrival_s, j.first_start_s, j.finish_s, j.finish_s - j.arrival_s,
                         j.first_start_s - j.arrival_s, j.num_gpus, j.model, j.batch_size, j.iterations,
                         j.progress, j.iteration, iso, j.attained_gpu_s, j.run_s, j.preemptions, j.migrations,
                         j.level_changes, j.status.value))
        return pd.DataFrame(rows, columns=JOB_COLUMNS)

    def rounds_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self._round_rows, columns=ROUND_COLUMNS)

    def cluster_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self._cluster_rows, columns=CLUSTER_COLUMNS)

    def metrics(self) -> dict:
        from .metrics import compute_metrics
        return compute_metrics(self.jobs_frame(), self.cluster_frame(), self.cluster.num_gpus,
                               backlogged=self.config.backlogged, window=(self.first_arrival_s, self.window_end_s),
                               useful_at_window_end=self.useful_at_window_end,
                               wall_s=_time.perf_counter() - self._wall0)

    def write_logs(self, out_dir) -> None:
        from pathlib import Path
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        jf = self.jobs_frame()
        jf[["job_id", "arrival_s", "start_s", "finish_s", "jct_s", "num_gpus", "model", "batch_size", "iterations",
            "queue_s", "isolated_s", "preemptions", "migrations", "level_changes", "status"]].to_csv(out / "jobs.csv", index=False)
        self.rounds_frame().to_csv(out / "rounds.csv", index=False)
        self.cluster_frame().to_csv(out / "cluster.csv", index=False)
