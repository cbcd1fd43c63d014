"""The cluster simulator: jobs arrive, queue, run, are preempted and complete, round by round.

Plain Python/numpy; it knows nothing of Gymnasium. Each round it applies one :class:`Decision`
(validated first: an infeasible decision raises and leaves the state untouched), then advances
time to the end of the round, solving iteration times of co-located jobs together
(:mod:`jigsaw_env.engine`). Formulas: docs/simulator.md.

The parts of a round live in modules with one job each:
:mod:`jigsaw_env.sim_validation` (the job table's and each decision's checks),
:mod:`jigsaw_env.sim_components` (forming and dissolving co-location components),
:mod:`jigsaw_env.sim_advance` (the next completion; advancing components and crediting their jobs)
and :mod:`jigsaw_env.sim_logs` (round logs, frames, metrics).

Round length: ``SimConfig.round_s`` seconds (default 300), or ``None`` for iteration granularity
(a round ends at the next iteration boundary of any running job). Both give the same job finish
times when decisions do not change (tests/sim/test_simulator.py::test_round_length_parity).
"""
from __future__ import annotations

import copy
import re
import time as _time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np
import pandas as pd
from tqdm.auto import tqdm
from traces.schema import validate_jobs

from .cluster import ClusterSpec
from .cost_table import default_batch_size, get_table
from . import sim_logs
from .declared import seal_declared_classes
from .free_running import DEFAULT_PACE, check_pace
from .gc_tuning import fewer_collections
from .interference import DEFAULT_SHARING, SharingModel, check_sharing
from .placement import GpuLedger, validate_decision
from .sim_advance import advance_components, end_round, next_completion
from .sim_components import LiveComponents
from .sim_logs import SimLog
from .sim_validation import adopt_ledger, as_decision, check_jobs, validate_diff
from .spb import SPBConfig
from .state import ClusterState, CostModel, Decision, JobState, JobStatus, apply_job_bookkeeping


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


#: the job-table columns the simulator reads; they are validated with the trace loaders' rules
#: (traces.schema.validate_jobs). Other columns of a job table are ignored.
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


class Simulator:
    """Round-based cluster simulator. See module docstring.

    >>> sim = Simulator(cluster, jobs, SimConfig())
    >>> while not sim.done:
    ...     sim.step(policy(sim.state))
    """

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
        check_jobs(self._initial_jobs, cluster, costs)
        # how co-located jobs share GPUs (eq. K1 or K1') and links (eq. L1)
        self._sharing = SharingModel(config.sharing, [cluster.gpu_type(g) for g in range(cluster.num_gpus)],
                                     gpus_per_node=cluster.gpus_per_node, pace=config.pace)
        self.reset()

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
        #: the live co-location components and the running jobs' counters (sim_components.LiveComponents)
        self.live = LiveComponents(self.state, self.costs, self._sharing, free_pace=self.config.pace == "free",
                                   lockstep_s=self.config.lockstep_s, log_rounds=self.config.log_rounds)
        # run() sets it for rounds that keep the allocation without asking the policy: the
        # objects are then brought up to date only before someone reads them (sim_advance.end_round)
        self._defer_round_end = False
        self._round_token = object()  # marks the ledgers in_force_ledger hands out this round
        #: the round and cluster logs (sim_logs.SimLog)
        self.log = SimLog()
        self.num_finished = 0
        self.quiet_rounds = 0  # rounds run() kept the allocation without asking the policy
        self.truncated = False
        self.first_arrival_s = jobs[0].arrival_s
        self.window_end_s = jobs[-1].arrival_s
        self.useful_at_window_end: float | None = None
        self._useful_total = 0.0
        self._busy_total = 0.0
        self._alloc_total = 0.0
        self._levels = [0] * 8  # jobs of the allocation in force at each SPB level (7: 7 and above)
        # the allocation in force, validated when applied: decisions are validated against it
        # incrementally (only jobs whose configuration changes are re-checked)
        self._in_force = GpuLedger(self.state)
        self.state.running_ref = self._in_force.decision  # its keys are the running jobs (ClusterState.running)
        self.state.shared_ref = self.live.shared
        self.state.time_s = self.first_arrival_s
        self._admit(self.state.time_s)
        #: wall-clock time (time.perf_counter, s) when the run started: metrics' wall_s counts from it
        self.started_at = _time.perf_counter()
        return self.state

    def busy_per_gpu(self) -> np.ndarray:
        """(G,) compute seconds per GPU so far."""
        return self.live.busy_per_gpu()

    def in_force_ledger(self) -> GpuLedger:
        """A copy of the ledger of the allocation in force (what ``step(None)`` would keep). Marked
        with this round, so that :meth:`step` may take it back as the next decision's ledger."""
        led = self._in_force.copy()
        led.origin = self._round_token
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

    def _adopt(self, ledger: GpuLedger) -> tuple[GpuLedger, list[int], list[int]] | None:
        """:func:`~jigsaw_env.sim_validation.adopt_ledger` against the allocation in force."""
        return adopt_ledger(self._in_force, ledger)

    # ------------------------------------------------------------------ time
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
        adopted = None
        if (ledger is not None and decision is not None and ledger.decision is decision
                and ledger.origin is self._round_token):
            adopted = self._adopt(ledger)
        self._round_token = object()  # ledgers handed out before this step are of an earlier round
        if adopted is not None:
            ledger, removed, added = adopted
            return decision, ledger, removed, added
        if decision is None:
            # the allocation in force: nothing to validate or apply. The ledger itself stands for
            # the decision (jobs finishing in the round leave it; the round log keeps their entries)
            return None, self._in_force, None, None
        decision = as_decision(decision)
        ledger, removed, added = validate_diff(self._in_force, decision)  # raises before anything changes
        return decision, ledger, removed, added

    def _apply_changes(self, decision, removed, added) -> None:
        """The jobs' bookkeeping (starts, stops, moves, level changes), the components they touch
        and the count of jobs per SPB level."""
        if decision is not None and (removed or added):
            # only the jobs that leave or change are visited: apply_job_bookkeeping does nothing
            # to a running job whose JobDecision equals the one in force
            old = self._in_force.decision
            levels = self._levels
            for jid in removed:
                levels[min(old[jid].level, 7)] -= 1
            for jid in added:
                levels[min(decision[jid].level, 7)] += 1
            sub = Decision({jid: decision[jid] for jid in added})
            self.live.rebuild(apply_job_bookkeeping(self.state, sub, self.config.restart_s, running_ids=removed))

    def _gpu_counts(self, ledger: GpuLedger) -> tuple[int, int]:
        """(GPUs allocated, GPUs shared by two or more workers) in ``ledger``."""
        G = ledger.num_gpus
        n_free = ledger.num_with_workers(0)
        return G - n_free, G - n_free - ledger.num_with_workers(1)

    def _round_end_s(self, t0: float) -> float:
        """When a round starting at ``t0`` ends (s): after ``round_s``, at the next step boundary
        (iteration granularity), at the next arrival on an idle cluster, capped at ``max_time_s``."""
        cfg = self.config
        live = self.live
        if live.components:
            if cfg.round_s is not None:
                t_end = t0 + cfg.round_s
            else:
                end_round(live)  # the step counters of the objects are read
                t_end = t0 + min(c.time_to_next_step(t0) for c in live.components.values())
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
        live = self.live
        acc = rnd.acc
        now = rnd.t0
        n_active = rnd.active_at_start
        base_s = now  # every live component has been advanced to max(base_s, its formation time)
        advances = now < t_end - 1e-12  # a round of (nearly) no time advances nothing
        while now < t_end - 1e-12:
            t_next, who_all = next_completion(live, now, t_end)
            if self.useful_at_window_end is None and now < self.window_end_s < t_next:
                t_next, who_all = self.window_end_s, []
            rnd.job_seconds += n_active * max(0.0, t_next - now)
            now = t_next
            if self.useful_at_window_end is None and now >= self.window_end_s - 1e-9:
                # the measured window ends: its useful work counts every component up to now
                advance_components(live, now, base_s, acc)
                base_s = now
            elif who_all:
                # only the components of the finishing jobs: the others are untouched until the
                # round ends (or the window does)
                advance_components(live, now, base_s, acc, live.components_of(who_all))
            if who_all:
                self._complete(who_all, now, ledger, rnd)
                n_active -= len(who_all)
            self._snap_window_acc(now, acc)
            if self.num_finished == len(st.jobs):
                t_end = now  # episode over: the last round ends at the last completion
                break
        if advances:  # the rest of the round, up to its last event (its end, or within 1e-12 s of it)
            advance_components(live, now, base_s, acc)
        return t_end

    def _complete(self, job_ids: list[int], now: float, ledger: GpuLedger, rnd: "_Round") -> None:
        """Jobs ``job_ids`` finish at ``now``: done, out of the ledger (their entries kept for the
        round log), their components re-formed without them."""
        st = self.state
        live = self.live
        rj = live.rjobs
        for jid in job_ids:
            j = st.jobs[jid]
            rj.progress[live.member_row(jid)] = j.iterations  # written back when it dissolves
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
        live.rebuild(set(job_ids), now)

    def _close_round(self, rnd: "_Round", t_end: float) -> None:
        """The round ends at ``t_end``: finished jobs leave the active list, arrivals during the
        round count from their arrival, the clock moves, new arrivals are admitted, the totals
        and logs are written and the round counter moves on."""
        st = self.state
        if not self._defer_round_end:
            end_round(self.live)
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
            self.log.add_jobs_of_round(st, rnd, t_end)
        self.log.cluster_rows.append((st.round, rnd.t0, t_end, rnd.active_at_start, rnd.active_at_start - rnd.n_dec,
                                   rnd.n_dec, rnd.n_alloc_gpus, rnd.n_shared_gpus, acc["busy"], acc["alloc"],
                                   rnd.job_seconds, acc["useful"], len(rnd.finished), *rnd.levels))
        st.round += 1
        cfg = self.config
        if cfg.max_time_s is not None and not self.done and st.time_s >= self.first_arrival_s + cfg.max_time_s - 1e-9:
            self.truncated = True
        self._snap_window(st.time_s)

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
                        self._defer_round_end = True
                        try:
                            r = self.step(None)
                        finally:
                            self._defer_round_end = False
                    else:
                        end_round(self.live)  # the policy reads the job objects
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
                end_round(self.live)
        if bar is not None:
            bar.close()
        return self.metrics()

    # ------------------------------------------------------------------ logs & metrics
    def jobs_frame(self) -> pd.DataFrame:
        """One row per job (``sim_logs.JOB_COLUMNS``), by job id; times in seconds."""
        return sim_logs.jobs_frame(self)

    def rounds_frame(self) -> pd.DataFrame:
        """The round log: one row per job that ran in a round (``sim_logs.ROUND_COLUMNS``)."""
        return self.log.rounds_frame()

    def cluster_frame(self) -> pd.DataFrame:
        """One row per round (``sim_logs.CLUSTER_COLUMNS``)."""
        return self.log.cluster_frame()

    def metrics(self) -> dict:
        """The episode's metrics (:func:`jigsaw_env.metrics.compute_metrics`)."""
        return sim_logs.metrics(self)

    def write_logs(self, out_dir) -> None:
        """jobs.csv, rounds.csv and cluster.csv of the episode so far in ``out_dir``."""
        sim_logs.write_logs(self, out_dir)


seal_declared_classes(globals())  # the classes simulator.pxd declares behave as compiled (jigsaw_env/declared.py)
