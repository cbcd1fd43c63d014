"""The live executor: real SPB jobs on Ray slots, driven round by round by a scheduler that reads
the simulator's own state type (docs/design.md section 3; docs/deploy.md).

:class:`LiveExecutor` keeps the cluster in a :class:`~jigsaw_env.state.ClusterState` (slots are
the cluster's "GPUs": ``ClusterSpec.from_gpus(slots, gpus_per_node=slots, gpu_type="cpu")``,
jobs are ``JobState``s with the CPU cost tables' batch sizes), so any heuristic
(``agents.make_scheduler``) or learned policy (the env's encoder and action codec, through
``agents.rl.LearnedScheduler``) schedules it unchanged. Each round:

1. admit arrived jobs; call the scheduler on the state; validate the decision
   (``jigsaw_env.placement.validate_decision``: the simulator's own check);
2. update the state's bookkeeping exactly as ``Simulator._apply`` does (status, preemptions,
   migrations, level changes, first start, restart);
3. pause the running jobs the decision leaves out or moves (checkpoint to disk), publish the
   round's versioned decision records (level, pattern, co-location component, the iteration at
   which the job's work is done), and start or resume incarnations on the named slots;
4. let the round run for ``round_s`` wall seconds (or ``steps_per_round`` lockstep steps, for
   deterministic tests), then hold every running job at its next iteration boundary and read the
   workers' reports;
5. advance the state from the reports as the simulator does (``progress += eta`` per iteration,
   ``iteration``, ``run_s``, ``attained_gpu_s``, completion), append a line to the decision log
   and persist the scheduler's state (to disk, and to the detached hub actor).

The state is persisted every round (``scheduler_state.json`` and the hub), so a scheduler that is
restarted (:meth:`LiveExecutor.restore`) continues with the same jobs: held workers wait in their
detached host actors for the next decision.
"""
from __future__ import annotations

import json
import math
import os
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from jigsaw_env.cluster import ClusterSpec
from jigsaw_env.cost_table import get_table
from jigsaw_env.free_running import DEFAULT_PACE, check_pace
from jigsaw_env.network import INTRA_NODE, Link
from jigsaw_env.placement import validate_decision
from jigsaw_env.spb import Pattern, SPBConfig
from jigsaw_env.state import ClusterState, CostModel, Decision, JobDecision, JobState, JobStatus, apply_job_bookkeeping

from .control import Keys, WorkerSpec, connect_store, read_json
from .store_seal import new_token
from .decision_log import (FORMAT, DecisionLogWriter, cluster_to_dict, decision_to_dict, encode_array, encode_mask,
                           spb_from_dict, spb_to_dict, state_from_dict, state_to_dict)

__all__ = ["LiveJob", "LiveConfig", "LiveExecutor", "JobFailed", "components_of", "segments_of"]

SNAPSHOT_FORMAT = "jigsaw-live-state/2"
#: the field that held a pickled scheduler in run folders written by an earlier version (refused)
PICKLED_SCHEDULER_FIELD = "scheduler_pickle"
RECOVERY_MODES = ("full", "partial")


class JobFailed(RuntimeError):
    """A live job failed: a worker raised, died, or stalled. ``job_id``, ``rank`` (root cause, or
    None), ``errors`` (every rank's error record)."""

    def __init__(self, message: str, job_id: int, rank: int | None, errors: dict[int, dict]):
        super().__init__(message)
        self.job_id = job_id
        self.rank = rank
        self.errors = errors


@dataclass(frozen=True)
class LiveJob:
    """One live training job. ``iterations``: full-backprop-equivalent iterations of work (as
    ``JobState.iterations``); ``batch_size``: per worker, default the CPU cost table's;
    ``arrival_s``: seconds after the run starts."""

    job_id: int
    model: str
    num_gpus: int
    iterations: float
    arrival_s: float = 0.0
    batch_size: int | None = None
    data: str = "digits"
    seed: int = 0
    lr: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class LiveConfig:
    """Settings of a live run.

    slots: CPU slots, each one "GPU" of the live cluster (one core by default).
    round_s: wall seconds per round; steps_per_round: instead, a fixed number of lockstep steps
        per round (deterministic; for tests).
    slot_memory_gib: memory budget per slot (default: ``jigsaw_env.cluster``'s cpu value).
    link: the alpha-beta link the scheduler's cost model assumes between slots (and that the
        workers use to choose ring vs reduce+broadcast, as the simulator does).
    restart_s: the bookkeeping restart delay recorded in the state on resume/migration (the
        simulator's meaning; the scheduler may read it). The replay uses measured start-ups.
    timeout_s: process-group and store timeout (a stalled worker fails its peers after it).
    round_timeout_s: bound on one round's wall time (steps mode), a stall watchdog.
    checkpoint_every: every running job checkpoints every this many iterations (0: only when it
        is paused or done). A failure loses at most this many iterations.
    max_restarts: recoveries allowed per job (full restarts and partial recoveries); one more
        failure fails the run with :class:`JobFailed` naming the job, the count and the last error.
    recovery: ``"full"`` (a failed job restarts every worker from its last checkpoint, losing the
        iterations since) or ``"partial"`` (CPR-style: the surviving workers go on; a replacement
        for each dead worker copies the current weights and optimizer state from a survivor; falls
        back to full when no worker survived, for one-worker jobs, and while a job is paused).
        docs/executor.md, "Fault tolerance".
    lockstep_s: the barrier the simulator charges every co-located lockstep step when it replays
        this run's decision log (``SimConfig.lockstep_s``, eq. K3; recorded in the log's header).
        ``jigsaw deploy --tables OUT`` takes it from ``OUT/lockstep.json``. It changes nothing live.
    pace: how jobs that share slots step: ``"free"`` (each at its own pace: no barrier between
        them) or ``"lockstep"`` (their rank 0s meet at a store barrier before every step). The
        decision log's header records it and the replay runs the simulator at the same pace
        (``SimConfig.pace``).
    """

    slots: int = 2
    round_s: float = 5.0
    steps_per_round: int | None = None
    max_workers_per_gpu: int = 2
    slot_memory_gib: float | None = None
    spb: SPBConfig = field(default_factory=SPBConfig)
    link: Link = INTRA_NODE
    restart_s: float = 0.0
    timeout_s: float = 60.0
    hold_timeout_s: float = 600.0
    round_timeout_s: float = 600.0
    measure_activations: bool = True
    pin: bool = True
    evaluate: bool = True
    checkpoint_root: str | None = None
    checkpoint_every: int = 500
    max_restarts: int = 3
    recovery: str = "full"
    lockstep_s: float = 0.0
    pace: str = DEFAULT_PACE

    def __post_init__(self) -> None:
        from jigsaw_env.simulator import check_lockstep_s

        check_lockstep_s(self.lockstep_s)
        check_pace(self.pace)
        if self.recovery not in RECOVERY_MODES:
            raise ValueError(f"recovery must be one of {list(RECOVERY_MODES)}, got {self.recovery!r}")
        for name in ("checkpoint_every", "max_restarts"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
        if self.steps_per_round is None and not (self.round_s > 0 and math.isfinite(self.round_s)):
            raise ValueError(f"round_s must be > 0 seconds, got {self.round_s!r}")
        if self.steps_per_round is not None and (not isinstance(self.steps_per_round, int) or self.steps_per_round < 1):
            raise ValueError(f"steps_per_round must be an integer >= 1 or None, got {self.steps_per_round!r}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["spb"] = spb_to_dict(self.spb)
        d["link"] = [self.link.alpha_s, self.link.bandwidth_Bps]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "LiveConfig":
        d = dict(d)
        d.setdefault("pace", "lockstep")  # a run folder without it was run in lockstep
        d["spb"] = spb_from_dict(d["spb"])
        d["link"] = Link(*d["link"])
        return cls(**d)


def live_cluster(cfg: LiveConfig) -> ClusterSpec:
    return ClusterSpec.from_gpus(cfg.slots, gpus_per_node=cfg.slots, gpu_type="cpu",
                                 gpu_memory_gib=cfg.slot_memory_gib, intra=cfg.link, cross=cfg.link)


def components_of(decision: dict) -> list[list[int]]:
    """Jobs connected through shared slots, each list sorted, ordered by smallest job id."""
    from jigsaw_env.placement import connected_groups

    return connected_groups({jid: jd.gpus for jid, jd in decision.items()})


def segments_of(decision: dict, pace: str) -> list[list[int]]:
    """The groups of jobs whose rank 0s meet at a barrier before every step: the components of
    ``decision`` under the lockstep pace, every job on its own under the free pace (the
    simulator's ``SimConfig.pace`` likewise forms one component per job)."""
    comps = components_of(decision)
    if check_pace(pace) == "free":
        return [[jid] for members in comps for jid in members]
    return comps


def _steps_to_finish(job: JobState, eta: float) -> int:
    """The simulator's count (Simulator._finish_time): iterations left at this eta."""
    return max(0, int(math.ceil(job.remaining / eta - 1e-9)))


def _is_peer_failure(rec: dict) -> bool:
    from .launcher import _is_peer_failure as f

    return f(rec)


class LiveExecutor:
    """Run live jobs under a scheduler (module docstring).

    jobs: :class:`LiveJob` list; scheduler: any ``agents.base.Scheduler`` (or callable
    ``state -> Decision``); scheduler_spec: how to rebuild it (``{"kind": "heuristic", "name",
    "kwargs"}`` or ``{"kind": "policy", "path", ...}``), written to the logs; pool / hub / session:
    reuse Ray pieces (tests share one per module), otherwise created here; scenario: an optional
    hook ``(state, decision) -> (decision, forced)`` applied after the scheduler (the demo's,
    :class:`jigsaw_executor.deploy.DemoScenario`); fail_at: ``{job_id: (rank, iteration, mode)}``
    fault injection for tests.
    """

    def __init__(self, jobs: list[LiveJob], scheduler, config: LiveConfig, out_dir: str | Path, *,
                 scheduler_spec: dict | None = None, pool=None, hub=None, session=None, address: str | None = None,
                 scenario=None, run_id: str | None = None, fail_at: dict | None = None, recorder=None,
                 allow_oversubscribe: bool = False, echo: Callable[[str], None] | None = None,
                 idle_guard_s: float | None = 30.0):
        self.cfg = config
        self.idle_guard_s = idle_guard_s  # see policies.idle_guard
        self.out = Path(out_dir)
        self.run_id = run_id or f"jigsaw-{uuid.uuid4().hex[:8]}"
        self.scheduler = scheduler
        self.scheduler_spec = scheduler_spec or {"kind": "heuristic", "name": getattr(scheduler, "name", "custom"),
                                                 "kwargs": {}}
        self.recorder = recorder
        self.scenario = scenario
        self.fail_at = {int(k): tuple(v) for k, v in (fail_at or {}).items()}
        self.address = address
        self.allow_oversubscribe = allow_oversubscribe
        self.echo = echo or (lambda s: None)
        self.cluster = live_cluster(config)
        self.costs = CostModel(self.cluster, config.spb)
        self.jobs = self._check_jobs(jobs)
        self.state = self._initial_state()
        self._check_scheduler()
        self.session, self.pool, self.hub = session, pool, hub
        self._own_session = self._own_pool = self._own_hub = False
        self.store = None
        self.store_addr: tuple[str, int] | None = None
        self._store_token = ""                   # the run's secret for decision records (ControlHub.open_run)
        self.epoch: float | None = None
        self.inc: dict[int, int] = {}            # job -> current incarnation number (-1: none yet)
        self.refs: dict[tuple[int, int], list] = {}  # (job, inc) -> ray refs of its ranks
        self.launched: dict[tuple[int, int], dict] = {}  # (job, inc) -> gpus, launch time, resumed
        self.detached: set[tuple[int, int]] = set()  # running incarnations without refs (after a restore)
        self.totals: dict[int, dict] = {j.job_id: self._new_totals() for j in self.jobs}
        self.decision_log: DecisionLogWriter | None = None
        self.run_log = None
        self.iter_log = None
        self.version = 0
        self.rounds_done = 0
        self.pending = sorted(self.state.jobs, key=lambda j: (self.state.jobs[j].arrival_s, j))
        self.pending_pos = 0
        self.finished = False
        self._started = False
        self._last_records: dict[int, dict] = {}
        self.gens: dict[tuple[int, int], int] = {}  # (job, inc) -> process-group generation (partial recoveries)
        self._decision: Decision = Decision()      # the decision of the round in progress
        self._phase: str | None = None             # "round" while a round runs, "pause" while pausing
        self._holding = False                      # the round's hold has been published

    # ------------------------------------------------------------------ setup and checks
    def _check_jobs(self, jobs: list[LiveJob]) -> list[LiveJob]:
        from .models import executor_model_names

        if not jobs:
            raise ValueError("the live executor needs at least one job")
        ids = [j.job_id for j in jobs]
        if len(set(ids)) != len(ids):
            raise ValueError(f"job ids must be unique, got {ids}")
        out = []
        first = min(j.arrival_s for j in jobs)
        for j in jobs:
            if j.model not in executor_model_names():
                raise ValueError(f"job {j.job_id}: unknown model {j.model!r}; allowed: {executor_model_names()}")
            if j.num_gpus > self.cfg.slots:
                raise ValueError(f"job {j.job_id} ({j.model}) needs {j.num_gpus} slots but the live cluster has "
                                 f"{self.cfg.slots} (--slots): it can never run")
            if j.num_gpus < 1:
                raise ValueError(f"job {j.job_id}: num_gpus must be >= 1, got {j.num_gpus}")
            if not (j.iterations > 0 and math.isfinite(j.iterations)):
                raise ValueError(f"job {j.job_id}: iterations must be > 0, got {j.iterations!r}")
            bs = j.batch_size
            if bs is None:
                from jigsaw_env.cost_table import default_batch_size

                bs = default_batch_size(j.model)
            get_table(j.model, bs, "cpu")  # ValueError naming the allowed batch sizes
            if j.data == "digits":
                from .data import DigitsData

                DigitsData(seed=j.seed).iterations_per_epoch(j.num_gpus, bs)
            # arrivals relative to the first one (the run's clock starts when the first job arrives)
            out.append(replace(j, batch_size=bs, arrival_s=float(j.arrival_s - first)))
        # memory: the simulator's own feasibility check (a full-depth worker must fit a slot)
        from jigsaw_env.simulator import SimConfig, Simulator

        try:
            Simulator(self.cluster, [self._job_state(j) for j in out],
                      SimConfig(max_workers_per_gpu=self.cfg.max_workers_per_gpu, spb=self.cfg.spb))
        except ValueError as e:
            raise ValueError(str(e).replace("GPUs", "slots").replace("GPU ", "slot ")) from None
        return out

    @staticmethod
    def _job_state(j: LiveJob) -> JobState:
        return JobState(job_id=j.job_id, arrival_s=float(j.arrival_s), num_gpus=j.num_gpus, model=j.model,
                        batch_size=int(j.batch_size), iterations=float(j.iterations))

    def _initial_state(self) -> ClusterState:
        jobs = {j.job_id: self._job_state(j) for j in self.jobs}
        return ClusterState(cluster=self.cluster, costs=self.costs, time_s=0.0, round=0, jobs=jobs, active_ids=[],
                            max_workers_per_gpu=self.cfg.max_workers_per_gpu)

    def _check_scheduler(self) -> None:
        """A learned policy must fit this layout (observation size, action count): checked here,
        before any job starts."""
        agent = getattr(self.scheduler, "agent", None)
        if agent is not None and hasattr(agent, "check_compatible"):
            from agents.rl import EvalSpaces

            agent.check_compatible(EvalSpaces(None, self.cfg.spb.max_level, self.cfg.spb.num_slots))

    @staticmethod
    def _new_totals() -> dict:
        return {"iterations": 0, "stepping_s": 0.0, "bytes": 0, "wire": 0, "losses": [], "accuracy": None,
                "incarnations": 0, "levels": {}, "peak_act": [], "startup_s": [], "final_hash": None,
                "start_groups": {}, "finish_wall": None, "checkpoint_s": 0.0, "failures": 0, "restarts": 0,
                "partial_recoveries": 0, "iterations_lost": 0, "recoveries": [], "eta_segments": [],
                "rank_hashes": None}

    def now(self) -> float:
        return time.time() - self.epoch

    def start(self) -> None:
        """Start (or reuse) Ray, the worker hosts and the hub; open the logs. Nothing runs yet."""
        if self._started:
            return
        import ray

        from .cluster_ray import RaySession, SlotPool, get_or_create_hub

        self.out.mkdir(parents=True, exist_ok=True)
        if self.session is None and not ray.is_initialized():
            self.session = RaySession(self.cfg.slots, self.address, self.allow_oversubscribe).start()
            self._own_session = True
        elif self.session is None:
            RaySession(self.cfg.slots, self.address, True).check_resources()
        if self.pool is None:
            self.pool = SlotPool(self.cfg.slots, self.cfg.max_workers_per_gpu, prefix=self.run_id, pin=self.cfg.pin)
            self._own_pool = True
        if self.pool.slots < self.cfg.slots or self.pool.cap < self.cfg.max_workers_per_gpu:
            raise ValueError(f"the worker pool has {self.pool.slots} slots x {self.pool.cap} hosts; this run needs "
                             f"{self.cfg.slots} x {self.cfg.max_workers_per_gpu}")
        if self.hub is None:
            self.hub = get_or_create_hub(self.run_id + "-hub")
            self._own_hub = True
        self.store_addr = tuple(ray.get(self.hub.address.remote()))
        # the run's secret for decision records; a hub that already knows the run keeps its own
        self._store_token = ray.get(self.hub.open_run.remote(self.run_id, new_token()))
        self.store = connect_store(*self.store_addr, self.run_id, self.cfg.timeout_s)
        self._started = True

    def _open_logs(self, truncate_to: int | None = None) -> None:
        self.decision_log = DecisionLogWriter(self.out / "decision_log.jsonl", truncate_to)
        self.run_log = open(self.out / "run_log.jsonl", "a")
        self.iter_log = open(self.out / "iterations.jsonl", "a")

    def header(self) -> dict:
        from jigsaw_env.cost_table import get_table as gt

        tables = {f"{j.model}-bs{j.batch_size}-cpu": gt(j.model, j.batch_size, "cpu").digest() for j in self.jobs}
        return {"kind": "header", "format": FORMAT, "run_id": self.run_id, "created": time.time(),
                "cluster": cluster_to_dict(self.cluster), "spb": spb_to_dict(self.cfg.spb),
                "sim": {"max_workers_per_gpu": self.cfg.max_workers_per_gpu, "round_s": self.cfg.round_s,
                        "steps_per_round": self.cfg.steps_per_round, "restart_s": self.cfg.restart_s,
                        "lockstep_s": self.cfg.lockstep_s, "pace": self.cfg.pace},
                "config": self.cfg.to_dict(), "jobs": [j.to_dict() for j in self.jobs],
                "scheduler": self.scheduler_spec, "tables": tables,
                "scenario": self.scenario.to_dict() if self.scenario is not None and hasattr(self.scenario, "to_dict") else None,
                "idle_guard_s": self.idle_guard_s}

    def event(self, kind: str, **kw) -> None:
        rec = {"t": round(self.now(), 6) if self.epoch else 0.0, "event": kind, **kw}
        self.run_log.write(json.dumps(rec, default=_jsonable) + "\n")
        self.run_log.flush()

    # ------------------------------------------------------------------ the run
    def run(self, max_rounds: int | None = None) -> dict | None:
        """Run rounds until every job is done (then return the summary) or ``max_rounds`` rounds
        have run in this call (then return None; the jobs wait, held, for the next decision)."""
        self.start()
        if self.epoch is None:
            self._open_logs()
            self.epoch = time.time()
            self.decision_log.write(self.header())
            self.event("start", run_id=self.run_id, slots=self.cfg.slots, jobs=[j.to_dict() for j in self.jobs],
                       scheduler=self.scheduler_spec, hosts={h.name: {"slot": h.slot, "pid": h.pid, "core": h.core}
                                                             for h in self.pool.hosts.values()})
            if hasattr(self.scheduler, "reset"):
                self.scheduler.reset()
            self._admit(0.0)
        n = 0
        try:
            while not self._all_done():
                if max_rounds is not None and n >= max_rounds:
                    return None
                self._round()
                n += 1
        except BaseException:
            self.abort()
            raise
        return self._finish()

    def _all_done(self) -> bool:
        return all(j.status is JobStatus.DONE for j in self.state.jobs.values())

    def _admit(self, t: float) -> None:
        st = self.state
        while self.pending_pos < len(self.pending) and st.jobs[self.pending[self.pending_pos]].arrival_s <= t + 1e-9:
            j = st.jobs[self.pending[self.pending_pos]]
            j.status = JobStatus.QUEUED
            st.active_ids.append(j.job_id)
            self.pending_pos += 1
            self.event("arrive", job=j.job_id, model=j.model, num_gpus=j.num_gpus)

    def _next_arrival(self) -> float | None:
        if self.pending_pos < len(self.pending):
            return self.state.jobs[self.pending[self.pending_pos]].arrival_s
        return None

    def _round(self) -> None:
        st = self.state
        r = st.round
        t_start = st.time_s
        if not st.active_ids:  # idle: nothing arrived yet; wait for the next arrival
            nxt = self._next_arrival()
            time.sleep(max(0.0, nxt - self.now()))
            t_end = max(self.now(), nxt)
            self._end_round(r, t_start, t_end, state_dict=None, policy_decision=Decision(), decision=Decision(),
                            forced=[], steps=None, outcome={}, sched_s=0.0, idle=True)
            return
        state_dict = state_to_dict(st)
        t0 = time.perf_counter()
        decision = Decision(self.scheduler(st))
        sched_s = time.perf_counter() - t0
        steps = self.recorder.take() if self.recorder is not None else None
        policy_decision = Decision(decision)
        forced = []
        if self.scenario is not None:
            decision, forced = self.scenario(st, decision)
            decision = Decision(decision)
        from .policies import idle_guard
        decision, guarded = idle_guard(st, decision, self.idle_guard_s)
        forced = forced + guarded
        validate_decision(st, decision)  # InfeasibleDecision (ValueError) before anything changes
        plan = self._plan(decision)
        self._apply(decision)
        self.event("decision", round=r, decision=decision_to_dict(decision), forced=forced,
                   scheduler_s=round(sched_s, 6))
        # 1. pause what leaves or moves (checkpoint), 2. publish the round, 3. start incarnations
        if plan["stop"]:
            self._pause(plan["stop"])
        self._decision = decision
        records = self._records(decision, r, set(plan["start"]))
        self._last_records = records
        self.version = int(__import__("ray").get(self.hub.publish.remote(self.run_id, records)))
        t_pub = self.now()
        for jid in plan["start"]:
            self._launch(jid, decision[jid], resumed=st.jobs[jid].preemptions > 0 or self.inc.get(jid, -1) >= 0,
                         t_pub=t_pub)
        # 4. the round runs (a worker that fails is recovered within it)
        running = list(decision)
        self._phase = "round"
        try:
            self._wait_round(r, running, t_pub)
        finally:
            self._phase = None
        t_end = self.now()
        outcome = self._collect(r, decision, t_start, t_end)
        self._end_round(r, t_start, t_end, state_dict, policy_decision, decision, forced, steps, outcome, sched_s)

    def _plan(self, decision: Decision) -> dict:
        """Which incarnations stop (left out, or moving) and which start (new, resumed, moved)."""
        st = self.state
        stop, start = [], []
        for j in st.active():
            jd = decision.get(j.job_id)
            running = j.status is JobStatus.RUNNING
            if running and (jd is None or jd.gpus != j.placement):
                stop.append(j.job_id)
            if jd is not None and (not running or jd.gpus != j.placement):
                start.append(j.job_id)
        return {"stop": stop, "start": start}

    def _apply(self, decision: Decision) -> None:
        """The state's bookkeeping, shared with the simulator (``apply_job_bookkeeping``)."""
        apply_job_bookkeeping(self.state, decision, self.cfg.restart_s)

    def _records(self, decision: Decision, r: int, starting: set[int]) -> dict:
        comps = segments_of(decision, self.cfg.pace)
        recs = {}
        for c, members in enumerate(comps):
            for jid in members:
                jd = decision[jid]
                j = self.state.jobs[jid]
                inc = self.inc.get(jid, -1) + (1 if jid in starting else 0)
                eta = self.costs.profile(j, jd.level, jd.pattern, jd.gpus).eta
                recs[jid] = {"round": r, "inc": inc, "action": "run", "gpus": list(jd.gpus), "level": jd.level,
                             "pattern": jd.pattern.value, "comp": c, "comp_size": len(members),
                             "steps": self.cfg.steps_per_round if self.cfg.steps_per_round else -1,
                             "finish_at": int(j.iteration + _steps_to_finish(j, eta))}
        return recs

    def _launch(self, jid: int, jd: JobDecision, resumed: bool, t_pub: float) -> None:
        job = self._job(jid)
        inc = self.inc.get(jid, -1) + 1
        self.inc[jid] = inc
        chosen = []
        for w, g in enumerate(jd.gpus):
            h = self.pool.free_host(g)
            h.owner = (jid, inc, w)
            chosen.append(h)
        self.pool.refresh(timeout_s=120.0, hosts=chosen)  # a host whose process died restarts first
        refs = [h.handle.run_worker.remote(self._spec(job, inc, w, jd.gpus)) for w, h in enumerate(chosen)]
        self.refs[(jid, inc)] = refs
        self.launched[(jid, inc)] = {"gpus": list(jd.gpus), "t_launch": t_pub, "resumed": bool(resumed),
                                     "hosts": [h.name for h in chosen], "ended": False, "round": self.state.round}
        self.totals[jid]["incarnations"] += 1
        self.event("launch", job=jid, inc=inc, gpus=list(jd.gpus), resumed=bool(resumed),
                   hosts=[h.name for h in chosen], level=jd.level, pattern=jd.pattern.value)

    def _job(self, jid: int) -> LiveJob:
        return next(j for j in self.jobs if j.job_id == jid)

    def checkpoint_dir(self, jid: int) -> Path:
        return Path(self.cfg.checkpoint_root or (self.out / "checkpoints")) / f"job{jid}"

    def _spec(self, job: LiveJob, inc: int, w: int, gpus, recover_gen: int = 0) -> WorkerSpec:
        return WorkerSpec(run_id=self.run_id, job_id=job.job_id, incarnation=inc, rank=w, world=len(gpus),
                          slot=int(gpus[w]), model=job.model, batch_size=int(job.batch_size),
                          store_host=self.store_addr[0], store_port=int(self.store_addr[1]),
                          store_token=self._store_token,
                          checkpoint_dir=str(self.checkpoint_dir(job.job_id)), data=job.data, seed=job.seed,
                          lr=job.lr, spb=self.cfg.spb, link=self.cfg.link, timeout_s=self.cfg.timeout_s,
                          hold_timeout_s=self.cfg.hold_timeout_s, measure_activations=self.cfg.measure_activations,
                          evaluate=self.cfg.evaluate, fail_at=self.fail_at.get(job.job_id),
                          checkpoint_every=self.cfg.checkpoint_every, recovery=self.cfg.recovery,
                          recover_gen=recover_gen)

    # ------------------------------------------------------------------ waiting and failures
    def _current_keys(self, jids) -> list[tuple[int, int]]:
        return [(jid, self.inc[jid]) for jid in jids if jid in self.inc]

    def _check_failures(self, keys: list[tuple[int, int]] | None = None) -> None:
        """Handle (recover, or raise JobFailed) a worker of a running incarnation that died, raised
        or, in partial mode, whose peers asked for recovery."""
        import ray

        keys = list(self.refs) if keys is None else keys
        for key in keys:
            if self.launched.get(key, {}).get("ended"):
                continue
            refs = self.refs.get(key)
            if not refs:
                if key in self.detached:
                    self._check_detached(key)
                continue
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            failed = None
            for ref in ready:
                try:
                    ray.get(ref)
                except Exception as e:  # noqa: BLE001 - a worker's process died or raised
                    failed = e
                    break
            if failed is None:  # a killed host process is seen at once here, by Ray a second or two later
                gone = [r for r, ref in enumerate(refs) if ref not in ready and self._host_dead(key[0], key[1], r)]
                if gone:
                    failed = RuntimeError(f"the process of rank {gone[0]} is gone")
            if failed is None and self.cfg.recovery == "partial" and \
                    self.store.check([Keys.rcvn(key[0], key[1], self.gens.get(key, 0) + 1)]):
                failed = RuntimeError("a peer's collective failed")
            if failed is not None:
                self._on_failure(key, failed)

    def _check_detached(self, key: tuple[int, int]) -> None:
        jid, inc = key
        info = self.launched.get(key, {})
        W = len(info.get("gpus", []))
        gen = self.gens.get(key, 0) + 1
        if any(self.store.check([Keys.err(jid, inc, r)]) for r in range(W)) or \
                self.store.check([Keys.rcvn(jid, inc, gen)]):
            self._on_failure(key, None)

    def _failure_error(self, key: tuple[int, int], exc: BaseException | None,
                       reason: str | None = None) -> tuple[JobFailed, int | None, set[int]]:
        """The failure of incarnation ``key`` as a JobFailed naming the root-cause rank (the first
        error that is not a peer-failure symptom, or a rank whose process died without a Python
        error), as ``jigsaw_executor.launcher`` does for local jobs; also the highest iteration a
        rank reported reaching (or None) and the ranks that died."""
        import ray

        jid, inc = key
        info = self.launched.get(key, {})
        gpus = info.get("gpus", [])
        W = len(gpus)
        refs = self.refs.get(key) or []
        died: dict[int, tuple[float, str]] = {}
        raised: set[int] = set()
        deadline = time.time() + 2.0  # let peers fail on their own and write their errors
        while True:
            for r, ref in enumerate(refs):
                if r in died or r in raised:
                    continue
                ready, _ = ray.wait([ref], timeout=0)
                if not ready and self._host_dead(jid, inc, r):  # SIGKILLed: before Ray notices
                    died[r] = (time.time(), "its host process is gone")
                    continue
                if ready:
                    try:
                        ray.get(ref)
                    except ray.exceptions.RayActorError as e:  # its process died
                        died[r] = (time.time(), f"{type(e).__name__}")
                    except Exception:  # noqa: BLE001 - it raised (its error record says what)
                        raised.add(r)
            errs = [r for r in range(W) if self.store.check([Keys.err(jid, inc, r)])]
            if len(set(errs) | set(died) | raised) >= W or time.time() > deadline:
                break
            time.sleep(0.05)
        errors = {r: read_json(self.store, Keys.err(jid, inc, r)) for r in range(W)}
        errors = {r: e for r, e in errors.items() if e is not None}
        silent = {r: v for r, v in died.items() if r not in errors}
        stalled = [r for r in range(W) if r not in errors and r not in silent]
        job = self.state.jobs[jid]
        ts = [e.get("t") for e in errors.values() if e.get("t") is not None]
        t_fail = max(ts) if ts else None
        events = [(e["time"], not _is_peer_failure(e), r) for r, e in errors.items()]
        events += [(t, True, r) for r, (t, _) in silent.items()]
        if not events:
            why = reason or (f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}" if exc
                             else "no report")
            err = JobFailed(f"job {jid} ({job.model}) failed: a worker process died without a Python error ({why})"
                            if reason is None else f"job {jid} ({job.model}) failed: {reason}", jid, None, {})
        else:
            primary = [e for e in events if e[1]]
            r = min(primary or events)[2]
            others = "; ".join(f"rank {o}: {e['type']}: {(e['message'] or '').splitlines()[0] if e['message'] else ''}"
                               for o, e in sorted(errors.items()) if o != r)
            tail = (f"\n(then: {others})" if others else "") + \
                (f"\n(ranks {stalled} were still running when the job failed: stalled?)" if stalled else "")
            slot = gpus[r] if r < W else "?"
            if r in errors:
                rec = errors[r]
                msg = (f"job {jid} ({job.model}) failed: worker rank {r} on slot {slot} raised {rec['type']}: "
                       f"{rec['message']}{tail}\n--- rank {r} traceback ---\n{rec['traceback']}")
            else:
                msg = (f"job {jid} ({job.model}) failed: worker rank {r} on slot {slot} died without a Python "
                       f"error (its process exited: {silent[r][1]}){tail}")
            err = JobFailed(msg, jid, r, errors)
        return err, t_fail, set(died) | {r for r, e in errors.items() if not _is_peer_failure(e)}

    def _on_failure(self, key: tuple[int, int], exc: BaseException | None, reason: str | None = None) -> None:
        """A worker of incarnation ``key`` failed (died, raised, or stalled). Recover: in partial
        mode, replace the dead workers and let the survivors go on; otherwise (or when that is not
        possible) restart the job from its last checkpoint, in place when it runs in this round.
        Raise :class:`JobFailed` once the job has used up ``max_restarts``."""
        jid, inc = key
        if self.inc.get(jid) != inc or self.launched.get(key, {}).get("ended"):
            return
        t_detect = self.now()
        j = self.state.jobs[jid]
        running = self._phase == "round" and jid in self._decision and j.status is JobStatus.RUNNING
        W = len(self.launched[key]["gpus"])
        self._abort_component(jid)
        if self.cfg.recovery == "partial" and running and W > 1 and self.refs.get(key):
            if self._recover_partial(key, t_detect):
                return
        err, t_fail, dead = self._failure_error(key, exc, reason)
        fin = read_json(self.store, Keys.fin(jid, inc))
        self._kill_incarnation(key)
        self.launched[key]["failed"] = True
        if fin is not None and fin["status"] in ("done", "paused"):
            # it failed after writing its final checkpoint and end record: nothing is lost
            self.event("warning", job=jid, inc=inc, message=f"a worker failed after the incarnation ended "
                                                           f"({fin['status']}): {str(err).splitlines()[0]}")
            return
        self._count_failure(jid, err)
        c = self._checkpoint_iteration(jid)
        lost, exact = self._rollback(jid, c, t_fail)
        times = [e["time"] for e in err.errors.values() if e and e.get("time")]
        rec = {"job": jid, "inc": inc, "round": self.state.round, "mode": "full", "t_detect": t_detect,
               "t_fail": (min(times) - self.epoch) if times else None, "fail_iteration": t_fail,
               "resume_iteration": c, "iterations_lost": lost, "lost_exact": exact, "dead_ranks": sorted(dead),
               "error": str(err).splitlines()[0], "relaunched": running}
        self.totals[jid]["restarts"] += 1
        self.totals[jid]["recoveries"].append(rec)
        self.event("job_failed", job=jid, inc=inc, message=str(err).splitlines()[0], recovery="full",
                   resume_iteration=c, iterations_lost=lost, lost_exact=exact)
        if running:
            self._relaunch(jid, rec)

    def _count_failure(self, jid: int, err: JobFailed) -> None:
        tot = self.totals[jid]
        tot["failures"] += 1
        if tot["failures"] > self.cfg.max_restarts:
            self.event("job_failed", job=jid, inc=self.inc.get(jid), message=str(err).splitlines()[0],
                       final=True, failures=tot["failures"])
            if self.cfg.max_restarts == 0:
                raise err
            first, _, rest = str(err).partition("\n")
            raise JobFailed(f"job {jid} ({self.state.jobs[jid].model}) failed {tot['failures']} times, more than "
                            f"max_restarts={self.cfg.max_restarts}: giving up. Last failure: {first}"
                            + (f"\n{rest}" if rest else ""), jid, err.rank, err.errors)

    def _abort_component(self, jid: int) -> None:
        """A job of a co-location component failed: its lockstep partners hold until the next round
        instead of waiting at the barrier for it."""
        rec = self._last_records.get(jid)
        if rec is not None and int(rec.get("comp_size", 1)) > 1 and rec.get("action") in ("run", "hold"):
            self.store.set(Keys.lk_abort(f"{rec['round']}.{rec['comp']}"), "1")

    def _checkpoint_iteration(self, jid: int) -> int:
        """The iteration of the job's newest checkpoint that loads (0: none saved), which its next
        incarnation loads. A truncated newest one is dropped for the one before it (a ``warning``
        event and one echoed line); when no kept checkpoint loads, :class:`JobFailed` (one line)."""
        from .spb_worker import CheckpointUnreadable, select_checkpoint

        try:
            return select_checkpoint(self.checkpoint_dir(jid), log=lambda line: self._checkpoint_warning(jid, line))
        except CheckpointUnreadable as e:
            raise JobFailed(f"job {jid} ({self.state.jobs[jid].model}) cannot go on: {e}", jid, None, {}) from None

    def _checkpoint_warning(self, jid: int, line: str) -> None:
        self.event("warning", job=jid, message=line)
        self.echo(f"job {jid}: {line}")

    # ----- progress ledger: which iterations were credited at which eta (for rollbacks)
    def _credit(self, jid: int, t0: int, t1: int, eta: float) -> None:
        if t1 <= t0:
            return
        segs = self.totals[jid]["eta_segments"]
        if segs and segs[-1][1] == t0 and segs[-1][2] == eta:
            segs[-1][1] = t1
        else:
            segs.append([int(t0), int(t1), float(eta)])

    def _progress_at(self, jid: int, c: int) -> float:
        j = self.state.jobs[jid]
        p = sum((min(t1, c) - t0) * eta for t0, t1, eta in self.totals[jid]["eta_segments"] if t0 < c)
        return float(min(j.iterations, p))

    def _rollback(self, jid: int, c: int, t_fail: int | None) -> tuple[int, bool]:
        """Put the job's state back to its checkpoint at iteration ``c``. Iterations the checkpoint
        holds beyond the last report (a checkpoint taken inside the failed round) are credited at
        the round's eta. Returns (iterations lost, whether that count is exact: it is a lower bound
        when no worker said how far it got)."""
        j = self.state.jobs[jid]
        tot = self.totals[jid]
        last = j.iteration
        if c > last:
            eta = self._current_eta(jid)
            self._credit(jid, last, c, eta)
            tot["iterations"] += c - last
        reached = max(x for x in (t_fail, last, c) if x is not None)
        lost = int(reached - c)
        tot["iterations_lost"] += lost
        exact = t_fail is not None
        tot["eta_segments"] = [[t0, min(t1, c), eta] for t0, t1, eta in tot["eta_segments"] if t0 < c]
        j.progress = self._progress_at(jid, c)
        j.iteration = int(c)
        if j.status is JobStatus.DONE:
            j.status = JobStatus.PAUSED
        return lost, exact

    def _current_eta(self, jid: int) -> float:
        j = self.state.jobs[jid]
        jd = self._decision.get(jid)
        if jd is not None:
            return self.costs.profile(j, jd.level, jd.pattern, jd.gpus).eta
        segs = self.totals[jid]["eta_segments"]
        return segs[-1][2] if segs else 1.0

    def _relaunch(self, jid: int, rec: dict) -> None:
        """Start a new incarnation of a failed job on the slots of this round's decision (the dead
        hosts restart; a warm spare host of the slot is used when there is one), from its
        checkpoint, within the round."""
        import ray

        j = self.state.jobs[jid]
        jd = self._decision[jid]
        inc = self.inc[jid] + 1
        eta = self.costs.profile(j, jd.level, jd.pattern, jd.gpus).eta
        old = self._last_records[jid]
        new = dict(old, inc=inc, finish_at=int(j.iteration + _steps_to_finish(j, eta)),
                   action="hold" if self._holding else "run")
        if int(old.get("comp_size", 1)) > 1:  # the component holds for the rest of the round (aborted)
            new.update(comp=10 ** 6 + jid, comp_size=1)
        self._last_records[jid] = new
        ray.get(self.hub.publish.remote(self.run_id, {jid: new}))
        t_pub = self.now()
        self._launch(jid, jd, resumed=True, t_pub=t_pub)
        rec["t_relaunch"] = t_pub
        rec["new_inc"] = inc

    def _recover_partial(self, key: tuple[int, int], t_detect: float) -> bool:
        """CPR-style partial recovery of incarnation ``key`` (docs/executor.md, "Fault tolerance"):
        wait for the survivors' recovery requests, start a replacement for every dead (or stalled)
        rank on a host of its slot, and name the source rank; the job goes on without rolling
        back. False when it cannot (no survivor, the incarnation already ended), for a full
        restart instead."""
        import ray

        jid, inc = key
        info = self.launched[key]
        gpus = info["gpus"]
        W = len(gpus)
        refs = self.refs[key]
        gen = self.gens.get(key, 0) + 1
        # survivors that sit between rounds notice a dead peer only at their next collective: wake them
        ray.get(self.hub.publish.remote(self.run_id, {jid: dict(self._last_records[jid])}))
        dead: set[int] = set()
        rcv: dict[int, dict] = {}
        deadline = time.time() + max(3.0, min(10.0, self.cfg.timeout_s))
        first_rcv = None
        while True:
            for r, ref in enumerate(refs):
                if r not in dead and ray.wait([ref], timeout=0)[0]:
                    try:
                        ray.get(ref)
                        return False  # a rank ended normally: the incarnation is over
                    except Exception:  # noqa: BLE001
                        dead.add(r)
                elif r not in dead and self._host_dead(jid, inc, r):  # before Ray notices (~2 s)
                    dead.add(r)
            for r in range(W):
                if r not in rcv and self.store.check([Keys.rcv(jid, inc, gen, r)]):
                    rcv[r] = read_json(self.store, Keys.rcv(jid, inc, gen, r))
                    first_rcv = first_rcv or time.time()
            # survivors notice a dead peer within milliseconds (a closed connection); one that has
            # not asked a second after the first did is dead or stalled
            if len(dead | set(rcv)) >= W or time.time() > deadline or \
                    (first_rcv is not None and time.time() > first_rcv + 1.0):
                break
            time.sleep(0.005)
        survivors = {r: v for r, v in rcv.items() if r not in dead}
        if not survivors or self.store.check([Keys.fin(jid, inc)]):
            if survivors:
                self.store.set(Keys.rgo(jid, inc, gen), json.dumps({"abort": True, "why": "incarnation ended"}))
            return False
        stalled = [r for r in range(W) if r not in dead and r not in survivors]
        for r in stalled:
            h = self._host_of(jid, inc, r)
            if h is not None:
                self.pool.kill(h)
        dead |= set(stalled)
        if not dead:  # every rank asked (a spurious timeout): all go on, nobody is replaced
            pass
        errors = {r: read_json(self.store, Keys.err(jid, inc, r)) for r in sorted(dead)}
        first = next((e for e in errors.values() if e and not _is_peer_failure(e)), None)
        why = (f"worker rank(s) {sorted(dead)} died" + (f" ({first['type']}: {first['message']})" if first else "")
               if dead else "a collective timed out on every rank")
        self._count_failure(jid, JobFailed(f"job {jid} ({self.state.jobs[jid].model}) failed: {why}",
                                           jid, min(dead) if dead else None, {r: e for r, e in errors.items() if e}))
        src = max(survivors, key=lambda r: (int(survivors[r]["t_done"]), -r))
        t_go = self.now()
        for r in sorted(dead):
            old = self._host_of(jid, inc, r)
            if old is not None:
                old.owner = None
                old.mark_dirty()
            h = self.pool.free_host(gpus[r])
            h.owner = (jid, inc, r)
            self.pool.refresh(timeout_s=120.0, hosts=[h])
            refs[r] = h.handle.run_worker.remote(self._spec(self._job(jid), inc, r, gpus, recover_gen=gen))
            info["hosts"][r] = h.name
        t_hosts = self.now()
        self.store.set(Keys.rgo(jid, inc, gen), json.dumps({"src": src, "t": int(survivors[src]["t_done"]),
                                                            "dead": sorted(dead), "gen": gen}))
        self.gens[key] = gen
        t_done = int(survivors[src]["t_done"])
        rec = {"job": jid, "inc": inc, "round": self.state.round, "mode": "partial", "gen": gen, "t_detect": t_detect,
               "t_fail": min(float(v["wall"]) for v in survivors.values()) - self.epoch,
               "t_survivors": t_go, "t_hosts": t_hosts, "dead_ranks": sorted(dead), "src": src,
               "resume_iteration": t_done,
               "fail_iteration": max(int(v["t_done"]) for v in survivors.values()), "iterations_lost": 0,
               "lost_exact": True, "error": why}
        tot = self.totals[jid]
        tot["partial_recoveries"] += 1
        tot["recoveries"].append(rec)
        self.event("recover", job=jid, inc=inc, mode="partial", gen=gen, dead=sorted(dead), src=src,
                   resume_iteration=t_done, message=why)
        return True

    def _host_dead(self, jid: int, inc: int, rank: int) -> bool:
        h = self._host_of(jid, inc, rank)
        return h is not None and self.pool.alive(h) is False

    def _host_of(self, jid: int, inc: int, rank: int):
        for h in self.pool.owned_by(jid, inc):
            if h.owner is not None and h.owner[2] == rank:
                return h
        return None

    def _kill_incarnation(self, key: tuple[int, int]) -> None:
        """Stop every worker of the incarnation: kill the hosts whose worker still runs (a host
        whose worker died is restarting already) and release them."""
        import ray

        jid, inc = key
        refs = self.refs.pop(key, None) or []
        # a rank that wrote an error record is on its way out (a peer failure: it returns, and its
        # host stays warm): give it a moment instead of killing its host
        leaving = [ref for r, ref in enumerate(refs) if self.store.check([Keys.err(jid, inc, r)])]
        if leaving:
            ray.wait(leaving, num_returns=len(leaving), timeout=2.0)
        for h in self.pool.owned_by(jid, inc):
            r = h.owner[2]
            ref = refs[r] if r < len(refs) else None
            if ref is None or not ray.wait([ref], timeout=0)[0]:
                self.pool.kill(h)
            else:
                h.owner = None
                try:
                    ray.get(ref, timeout=0)
                except ray.exceptions.RayActorError:  # its process died: restarting
                    h.mark_dirty()
                except Exception:  # noqa: BLE001 - the worker raised; its process is up
                    pass
        self.detached.discard(key)
        if key in self.launched:
            self.launched[key]["ended"] = True

    def _wait_for(self, jids: list[int], pred: Callable[[int], bool], timeout_s: float, what: str,
                  poll: float = 0.002) -> None:
        """Wait until ``pred(job)`` holds for every job in ``jids``, handling worker failures on
        the way; a job still not there after ``timeout_s`` is a stalled job: a failure too."""
        deadline = time.time() + timeout_s
        last_check = 0.0
        expired: dict[int, int] = {}
        while not all(pred(j) for j in jids):
            now = time.time()
            if now - last_check > 0.05:
                self._check_failures(self._current_keys(jids))
                last_check = now
            if now > deadline:
                reason = f"{what}: no report within {timeout_s:.0f} s (a worker stalled)"
                for jid in [j for j in jids if not pred(j)]:
                    key = (jid, self.inc[jid])
                    expired[jid] = expired.get(jid, 0) + 1
                    if self.launched.get(key, {}).get("ended") or expired[jid] > self.cfg.max_restarts + 1:
                        self._kill_incarnation(key)  # nothing left to recover: a stall is final
                        raise JobFailed(f"job {jid} ({self.state.jobs[jid].model}) failed: {reason}; stopped",
                                        jid, None, {})
                    self._on_failure(key, None, reason=reason)
                deadline = time.time() + timeout_s
            time.sleep(poll)

    def _pause(self, jids: list[int]) -> None:
        """Preempt (or move): the incarnations checkpoint to disk and exit."""
        import ray

        recs = {}
        for jid in jids:
            inc = self.inc[jid]
            recs[jid] = {"round": self.state.round, "inc": inc, "action": "pause", "gpus": [], "level": 0,
                         "pattern": "rotating", "comp": -1, "comp_size": 1, "steps": -1, "finish_at": 10 ** 12}
        ray.get(self.hub.publish.remote(self.run_id, recs))
        keys = {jid: (jid, self.inc[jid]) for jid in jids}

        def paused(jid: int) -> bool:
            k = keys[jid]
            return self.launched[k].get("failed", False) or self.store.check([Keys.fin(*k)])

        self._phase = "pause"
        try:
            self._wait_for(jids, paused, self.cfg.timeout_s, f"pausing jobs {jids}")
        finally:
            self._phase = None
        for key in keys.values():
            if self.launched[key].get("failed"):
                continue  # rolled back to its checkpoint by the failure handler
            self._end_incarnation(key)
            fin = read_json(self.store, Keys.fin(*key))
            self.event("pause", job=key[0], inc=key[1], iteration=fin["t"], hash=fin["hash"])

    def _end_incarnation(self, key: tuple[int, int], timeout_s: float | None = None) -> list | None:
        """Collect the ranks' results of an incarnation that ended (paused, done, stopped); a rank
        that died after its end record was written loses nothing (logged)."""
        import ray

        refs = self.refs.pop(key, None)
        results = None
        if refs:
            try:
                results = ray.get(refs, timeout=timeout_s or self.cfg.timeout_s)
            except Exception as e:  # noqa: BLE001
                fin = read_json(self.store, Keys.fin(*key))
                if fin is None or fin["status"] not in ("done", "paused"):
                    self.refs[key] = refs
                    self._on_failure(key, e)
                    return None
                self.event("warning", job=key[0], inc=key[1],
                           message=f"a worker failed after its end record ({fin['status']}): {type(e).__name__}")
                self._kill_incarnation(key)
        self.detached.discard(key)
        self.pool.release(*key)
        if key in self.launched:
            self.launched[key]["ended"] = True
        return results

    def _wait_round(self, r: int, running: list[int], t_pub: float) -> None:
        W = {jid: len(self.state.jobs[jid].placement) for jid in running}

        def reported(jid: int) -> bool:
            inc = self.inc[jid]
            if all(self.store.check([Keys.rep(jid, inc, r, w)]) for w in range(W[jid])):
                return True
            # a worker died after the incarnation's end record: what it did not report is not needed
            return bool(self.launched[(jid, inc)].get("failed")) and self.store.check([Keys.fin(jid, inc)])

        def done(jid: int) -> bool:
            return self.store.check([Keys.fin(jid, self.inc[jid])])

        self._holding = False
        if self.cfg.steps_per_round is not None and running:
            self._wait_for(running, reported, self.cfg.round_timeout_s, f"round {r}")
            return
        if not running:  # nothing runs (the policy chose so): the round still lasts, as in the simulator
            time.sleep(self.cfg.round_s if self.cfg.steps_per_round is None else 0.1)
            return
        end = t_pub + self.cfg.round_s
        while self.now() < end:
            if all(done(j) for j in running):
                break
            self._check_failures(self._current_keys(running))
            time.sleep(min(0.02, max(0.0, end - self.now())))
        still = [j for j in running if not done(j)]
        self._holding = True
        if still:
            import ray

            recs = {}
            for jid in still:
                self._last_records[jid] = recs[jid] = dict(self._last_records[jid], action="hold")
            ray.get(self.hub.publish.remote(self.run_id, recs))
        self._wait_for(running, reported, self.cfg.timeout_s, f"holding round {r}")

    # ------------------------------------------------------------------ reports -> state
    def _collect(self, r: int, decision: Decision, t_start: float, t_end: float) -> dict:
        st = self.state
        outcome = {}
        for jid, jd in decision.items():
            j = st.jobs[jid]
            inc = self.inc[jid]
            W = len(jd.gpus)
            # a rank that failed after its incarnation's end record may have left no report
            reps = [read_json(self.store, Keys.rep(jid, inc, r, w)) or {"rank": w, "slot": jd.gpus[w], "iterations": []}
                    for w in range(W)]
            its = [rep["iterations"] for rep in reps]
            # a replacement rank (partial recovery) lacks the iterations before it joined: the
            # rank with the most reports stands for the job
            ref = max(its, key=len)
            by_t = [{it["t"]: it for it in rk} for rk in its]
            n = len(ref)
            fin = read_json(self.store, Keys.fin(jid, inc))
            finished = fin is not None and fin["status"] == "done"
            info = self.launched[(jid, inc)]
            ready = read_json(self.store, Keys.ready(jid, inc))
            started_now = info["round"] == r
            startup = None
            if started_now and n:
                startup = ref[0]["wall"] - self.epoch - info["t_launch"]
            # progress exactly as the simulator credits it: eta of each iteration's configuration
            gain = 0.0
            for it in ref:
                eta = self.costs.profile(j, int(it["lvl"]), Pattern.parse(it["pat"]), jd.gpus).eta
                gain += eta
                self._credit(jid, int(it["t"]), int(it["t"]) + 1, eta)
            gain = min(j.remaining, gain)
            j.progress += gain
            j.iteration += n
            if n and ref[-1]["t"] + 1 != j.iteration:
                self.event("warning", job=jid,
                           message=f"iteration counter {j.iteration} != worker's {ref[-1]['t'] + 1}")
                j.iteration = ref[-1]["t"] + 1
            stepping = float(sum(it["iter_s"] or 0.0 for it in ref))
            j.run_s += stepping
            end = (fin["wall"] - self.epoch) if finished else t_end
            j.attained_gpu_s += max(0.0, end - t_start) * j.num_gpus
            bytes_ = int(sum(it["bytes"] for rk in its for it in rk))
            wire = int(sum(it["wire"] for it in ref))
            loss = [float(np.mean([bt[it["t"]]["loss"] for bt in by_t if it["t"] in bt])) for it in ref]
            ckpt_s = float(sum(it.get("ckpt_s", 0.0) for it in ref))
            tot = self.totals[jid]
            tot["iterations"] += n
            tot["stepping_s"] += stepping
            tot["checkpoint_s"] += ckpt_s
            tot["bytes"] += bytes_
            tot["wire"] += wire
            tot["losses"] = (tot["losses"] + loss)[-50:]
            key = f"{jd.level}/{jd.pattern.value}"
            tot["levels"][key] = tot["levels"].get(key, 0) + n
            for rk in its:
                for it in rk:
                    tot["start_groups"][str(it["sg"])] = tot["start_groups"].get(str(it["sg"]), 0) + 1
            peaks = [max([it["act"] for it in rk] or [0]) for rk in its]
            tot["peak_act"] = [max(a, b) for a, b in zip(tot["peak_act"] or [0] * W, peaks)]
            if startup is not None:
                tot["startup_s"].append(startup)
            if started_now:
                self.event("ready", job=jid, inc=inc, loaded_hash=ready and ready.get("loaded_hash"),
                           resumed_at=ready and ready.get("t"), setup_s=ready and ready.get("setup_s"),
                           startup_s=startup)
            self._note_recoveries(jid)
            self._log_iterations(jid, inc, r, reps, ref, by_t)
            if finished:
                j.progress = j.iterations
                j.status = JobStatus.DONE
                j.finish_s = fin["wall"] - self.epoch
                j.placement = ()
                tot["accuracy"] = fin.get("accuracy")
                tot["final_hash"] = fin.get("hash")
                tot["finish_wall"] = fin["wall"]
                results = self._end_incarnation((jid, inc))
                if results:
                    tot["rank_hashes"] = [x.get("hash_full") or x.get("hash") for x in results]
                self.event("done", job=jid, inc=inc, iteration=fin["t"], jct_s=j.finish_s - j.arrival_s,
                           accuracy=fin.get("accuracy"), hash=fin.get("hash"))
            outcome[str(jid)] = {
                "job_id": jid, "inc": inc, "gpus": list(jd.gpus), "level": jd.level, "pattern": jd.pattern.value,
                "iterations": n, "first_iteration": ref[0]["t"] if n else None, "stepping_s": stepping,
                "mean_iter_s": stepping / n if n else None,
                "median_iter_s": float(np.median([it["iter_s"] or 0.0 for it in ref])) if n else None,
                "bytes": bytes_, "bytes_per_iter": bytes_ / n if n else None, "wire_per_iter": wire / n if n else None,
                "loss_last": loss[-1] if loss else None, "progress_gain": gain, "finished": finished,
                "finish_s": j.finish_s if finished else None, "startup_s": startup,
                "setup_s": ready["setup_s"] if (ready and started_now) else None,
                "resumed": bool(info["resumed"]) and started_now, "started": started_now,
                "peak_activation_bytes": peaks,
                "start_groups": [sorted({it["sg"] for it in rk}) for rk in its],
                "recoveries": sum(1 for x in self.totals[jid]["recoveries"] if x.get("round") == r),
            }
        st.active_ids = [x for x in st.active_ids if st.jobs[x].status is not JobStatus.DONE]
        return outcome

    def _note_recoveries(self, jid: int) -> None:
        """Complete the job's recovery records: when the restored workers were ready (full: the new
        incarnation loaded its checkpoint; partial: the new process-group generation has the
        source's state) and how long the job was held up."""
        for rec in self.totals[jid]["recoveries"]:
            if rec.get("t_ready") is not None:
                continue
            if rec["mode"] == "partial":
                ok = read_json(self.store, Keys.rok(jid, rec["inc"], rec["gen"]))
                if ok is not None:
                    rec.update(t_ready=ok["wall"] - self.epoch, state_bytes=ok["state_bytes"], join_s=ok["join_s"])
            elif rec.get("new_inc") is not None:
                ready = read_json(self.store, Keys.ready(jid, rec["new_inc"]))
                if ready is not None:
                    rec.update(t_ready=ready["wall"] - self.epoch, loaded_iteration=ready["t"],
                               setup_s=ready["setup_s"])
            if rec.get("t_ready") is not None:
                rec["recovery_s"] = rec["t_ready"] - rec["t_detect"]

    def _log_iterations(self, jid: int, inc: int, r: int, reps: list[dict], ref: list[dict] | None = None,
                        by_t: list[dict] | None = None) -> None:
        its = [rep["iterations"] for rep in reps]
        ref = ref if ref is not None else its[0]
        by_t = by_t if by_t is not None else [{it["t"]: it for it in rk} for rk in its]
        for a in ref:
            t = a["t"]
            self.iter_log.write(json.dumps({
                "job": jid, "inc": inc, "round": r, "t": t, "level": a["lvl"], "pattern": a["pat"],
                "iter_s": a["iter_s"], "wall": a["wall"] - self.epoch, "ckpt_s": a.get("ckpt_s"),
                "ranks": [{"rank": w, "slot": reps[w]["slot"], "start_group": by_t[w][t]["sg"],
                           "loss": by_t[w][t]["loss"], "step_s": by_t[w][t]["step_s"], "sync_s": by_t[w][t]["sync_s"],
                           "bytes_sent": by_t[w][t]["bytes"], "bytes_by_collective": by_t[w][t]["by"],
                           "peak_activation_bytes": by_t[w][t]["act"]}
                          for w in range(len(its)) if t in by_t[w]]}) + "\n")
        self.iter_log.flush()

    def _end_round(self, r, t_start, t_end, state_dict, policy_decision, decision, forced, steps, outcome, sched_s,
                   idle: bool = False) -> None:
        st = self.state
        st.time_s = t_end
        st.round = r + 1
        self._admit(t_end)
        rec = {"kind": "round", "round": r, "t_start": t_start, "t_end": t_end, "idle": idle, "state": state_dict,
               "policy_decision": decision_to_dict(policy_decision), "decision": decision_to_dict(decision),
               "forced": forced, "scheduler_s": sched_s, "version": self.version, "outcome": outcome}
        if steps is not None:
            rec["steps"] = [{"obs": encode_array(o), "mask": encode_mask(m), "n_actions": int(len(m)), "action": int(a)}
                            for o, m, a in steps]
        pos = self.decision_log.write(rec)
        self.rounds_done += 1
        self.event("round_end", round=r, t_start=t_start, t_end=t_end,
                   jobs={k: {"iterations": v["iterations"], "mean_iter_s": v["mean_iter_s"], "finished": v["finished"]}
                         for k, v in outcome.items()})
        self.persist(pos)

    # ------------------------------------------------------------------ persistence
    def snapshot(self, log_pos: int) -> dict:
        return {"format": SNAPSHOT_FORMAT, "run_id": self.run_id, "epoch": self.epoch, "saved": time.time(),
                "round": self.state.round, "state": state_to_dict(self.state), "config": self.cfg.to_dict(),
                "jobs": [j.to_dict() for j in self.jobs], "scheduler_spec": self.scheduler_spec,
                "scheduler_state": self.scheduler_state(), "inc": {str(k): v for k, v in self.inc.items()},
                "launched": {f"{k[0]}/{k[1]}": v for k, v in self.launched.items()},
                "hosts": self.pool.occupancy(), "pool_prefix": self.pool.prefix, "hub": self.run_id + "-hub",
                "store": list(self.store_addr), "decision_log_bytes": log_pos, "pending_pos": self.pending_pos,
                "totals": self.totals, "version": self.version,
                "last_records": {str(k): v for k, v in self._last_records.items()},
                "gens": {f"{k[0]}/{k[1]}": v for k, v in self.gens.items()}, "address": self.address,
                "scenario": self.scenario.state_dict() if hasattr(self.scenario, "state_dict") else None}

    def scheduler_state(self) -> dict | None:
        """The scheduler's plain-data state (``Scheduler.state_dict``), or None for a scheduler
        without one (a callable handed in by a caller: rebuilt fresh on restore)."""
        state_dict = getattr(self.scheduler, "state_dict", None)
        return state_dict() if callable(state_dict) else None

    def persist(self, log_pos: int) -> None:
        import ray

        snap = self.snapshot(log_pos)
        p = self.out / "scheduler_state.json"
        tmp = p.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(snap, default=_jsonable))
        os.replace(tmp, p)
        ray.get(self.hub.put_snapshot.remote(self.run_id, json.loads(json.dumps(snap, default=_jsonable))))

    @classmethod
    def restore(cls, out_dir: str | Path, *, scheduler=None, recorder=None, pool=None, hub=None, session=None,
                from_hub: str | None = None, echo=None, address: str | None = None) -> "LiveExecutor":
        """A new executor (a restarted scheduler) that continues the run persisted in ``out_dir``
        (or, with ``from_hub=RUN_ID``, in the detached hub actor): the same jobs, the scheduler
        rebuilt from its spec (name and arguments, or policy file) and its plain-data state
        (``Scheduler.load_state_dict``). Nothing in the state file is unpickled: a state written
        by an earlier version with a pickled scheduler is refused (ValueError, one line).

        *Warm* (the Ray cluster and its detached hub and hosts are still up, e.g. ``--address``):
        held workers continue in their incarnations; one that ended or failed meanwhile is
        reconciled (done, paused, or restarted from its checkpoint). *Cold* (Ray went down with
        the previous scheduler process, the embedded default): a new Ray session, hosts and hub, and
        every job that was running goes back to its last checkpoint (its state rolled back to the
        checkpoint's iteration) and waits for the scheduler to place it again."""
        import ray

        from .cluster_ray import NAMESPACE, RaySession, SlotPool

        out = Path(out_dir)
        if from_hub is not None:
            hub = hub or ray.get_actor(from_hub + "-hub", namespace=NAMESPACE)
            snap = ray.get(hub.get_snapshot.remote(from_hub))
            if snap is None:
                raise ValueError(f"the hub of run {from_hub} holds no scheduler state")
        else:
            from jigsaw_env.jsonfile import read_json_file

            p = out / "scheduler_state.json"
            if not p.is_file():
                raise FileNotFoundError(f"no persisted scheduler state in {out} (scheduler_state.json)")
            snap = read_json_file(p, "scheduler state")  # "{p}: not valid JSON (...)" for a damaged file
            if not isinstance(snap, dict):
                raise ValueError(f"{p}: expected a JSON object (a jigsaw live state), got "
                                 f"{'null' if snap is None else type(snap).__name__}")
        check_snapshot_format(snap, out / "scheduler_state.json" if from_hub is None else f"the hub of run {from_hub}")
        cfg = LiveConfig.from_dict(snap["config"])
        jobs = [LiveJob(**j) for j in snap["jobs"]]
        spec = snap["scheduler_spec"]
        if scheduler is None:
            scheduler, recorder = restore_scheduler(spec, snap.get("scheduler_state"), cfg.spb,
                                                    out / "scheduler_state.json")
        scenario = None
        if snap.get("scenario") is not None:
            from .deploy import DemoScenario

            scenario = DemoScenario.from_state_dict(snap["scenario"])
        address = address or snap.get("address")
        own_session = False
        if session is None and not ray.is_initialized():
            session = RaySession(cfg.slots, address, allow_oversubscribe=True).start()
            own_session = True
        given_hub, given_pool = hub is not None, pool is not None
        if hub is None:
            try:
                hub = ray.get_actor(snap["hub"], namespace=NAMESPACE)
            except ValueError:  # Ray went down with the previous scheduler: a cold restore
                hub = None
        cold = hub is None
        if pool is None:
            pool = SlotPool(cfg.slots, cfg.max_workers_per_gpu, prefix=snap["pool_prefix"], pin=cfg.pin,
                            attach=not cold)
            if cold and not own_session:  # Ray outlived the hub: its hosts may still run old workers
                for h in pool.hosts.values():
                    pool.kill(h)
                pool.refresh(timeout_s=300.0)
        ex = cls(jobs, scheduler, cfg, out, scheduler_spec=spec, pool=pool, hub=hub, session=session,
                 address=address, scenario=scenario, run_id=snap["run_id"], recorder=recorder, echo=echo,
                 allow_oversubscribe=True)
        ex._own_session = own_session
        ex._own_pool = not given_pool
        ex._own_hub = not given_hub
        ex.state = state_from_dict(snap["state"], ex.cluster, ex.costs)
        ex.epoch = float(snap["epoch"])
        ex.inc = {int(k): int(v) for k, v in snap["inc"].items()}
        ex.launched = {(int(k.split("/")[0]), int(k.split("/")[1])): v for k, v in snap["launched"].items()}
        ex.totals = {int(k): {**cls._new_totals(), **v} for k, v in snap["totals"].items()}
        ex.version = int(snap["version"])
        ex.pending_pos = int(snap["pending_pos"])
        ex._last_records = {int(k): v for k, v in snap.get("last_records", {}).items()}
        ex.gens = {(int(k.split("/")[0]), int(k.split("/")[1])): int(v) for k, v in snap.get("gens", {}).items()}
        live = sorted(k for k, v in ex.launched.items() if not v.get("ended"))
        if not cold:
            pool.restore_occupancy(snap["hosts"])
            ex.detached = set(live)
        ex.start()
        ex._open_logs(truncate_to=int(snap["decision_log_bytes"]))
        ex.event("restore", round=ex.state.round, run_id=ex.run_id, cold=cold, detached=sorted(ex.detached))
        if cold:
            for key in live:
                ex._restart_lost(key)
        else:
            for key in live:
                fin = read_json(ex.store, Keys.fin(*key))
                if fin is not None:
                    ex._reconcile_ended(key, fin)
        return ex

    def _restart_lost(self, key: tuple[int, int]) -> None:
        """Cold restore: the incarnation died with the previous Ray session; the job goes back to its
        last checkpoint and waits (paused) for the scheduler to place it again."""
        jid, inc = key
        self.launched[key]["ended"] = True
        j = self.state.jobs[jid]
        if j.status is not JobStatus.RUNNING:
            return
        c = self._checkpoint_iteration(jid)
        last = j.iteration
        lost, exact = self._rollback(jid, c, None)
        j.status, j.placement = JobStatus.PAUSED, ()
        rec = {"job": jid, "inc": inc, "round": self.state.round, "mode": "scheduler_restart",
               "t_detect": self.now(), "resume_iteration": c, "last_reported_iteration": last,
               "iterations_lost": lost, "lost_exact": exact}
        self.totals[jid]["recoveries"].append(rec)
        self.event("job_restart", job=jid, inc=inc, reason="scheduler restarted without its Ray session",
                   resume_iteration=c, iterations_lost=lost)

    def _reconcile_ended(self, key: tuple[int, int], fin: dict) -> None:
        """Warm restore: an incarnation ended (done, paused, stopped) while no scheduler was there
        to read its reports; account for it from its end record and its checkpoint."""
        jid, inc = key
        j = self.state.jobs[jid]
        tot = self.totals[jid]
        t = int(fin["t"]) if fin["status"] in ("done", "paused") else self._checkpoint_iteration(jid)
        self._rollback(jid, t, t)  # credits the unreported iterations up to t at the round's eta
        self._end_incarnation(key)
        if fin["status"] == "done":
            j.progress, j.status, j.placement = j.iterations, JobStatus.DONE, ()
            j.finish_s = fin["wall"] - self.epoch
            tot.update(accuracy=fin.get("accuracy"), final_hash=fin.get("hash"), finish_wall=fin["wall"])
            if j.job_id in self.state.active_ids:
                self.state.active_ids.remove(j.job_id)
        else:
            j.status, j.placement = JobStatus.PAUSED, ()
        self.event("reconcile", job=jid, inc=inc, status=fin["status"], iteration=t)

    # ------------------------------------------------------------------ the end
    def _finish(self) -> dict:
        summary = self.summary()
        self.decision_log.write({"kind": "end", "t": self.now(), "jobs": {str(k): v for k, v in summary["jobs"].items()}})
        self.event("end", makespan_s=summary["makespan_s"])
        (self.out / "summary.json").write_text(json.dumps(summary, indent=1, default=_jsonable) + "\n")
        self.finished = True
        return summary

    def summary(self) -> dict:
        st = self.state
        jobs = {}
        for j in sorted(st.jobs.values(), key=lambda j: j.job_id):
            tot = self.totals[j.job_id]
            n = tot["iterations"]
            jobs[j.job_id] = {
                "job_id": j.job_id, "model": j.model, "num_gpus": j.num_gpus, "batch_size": j.batch_size,
                "arrival_s": j.arrival_s, "start_s": _none(j.first_start_s), "finish_s": _none(j.finish_s),
                "jct_s": _none(j.finish_s - j.arrival_s), "status": j.status.value,
                "iterations": n, "work_iterations": j.iterations, "progress": j.progress,
                "mean_iter_s": tot["stepping_s"] / n if n else None,
                "bytes_sent": tot["bytes"], "bytes_per_iter": tot["bytes"] / n if n else None,
                "final_loss": float(np.mean(tot["losses"][-10:])) if tot["losses"] else None,
                "heldout_accuracy": tot["accuracy"], "preemptions": j.preemptions, "migrations": j.migrations,
                "level_changes": j.level_changes, "incarnations": tot["incarnations"], "levels_used": tot["levels"],
                "start_groups": tot["start_groups"], "peak_activation_bytes": tot["peak_act"],
                "startup_s": tot["startup_s"], "final_hash": tot["final_hash"],
                "rank_hashes": tot.get("rank_hashes"), "checkpoint_s": tot.get("checkpoint_s", 0.0),
                "failures": tot.get("failures", 0), "restarts": tot.get("restarts", 0),
                "partial_recoveries": tot.get("partial_recoveries", 0),
                "iterations_lost": tot.get("iterations_lost", 0), "final_iteration": j.iteration,
                "recoveries": tot.get("recoveries", []),
            }
        fin = [v["finish_s"] for v in jobs.values() if v["finish_s"] is not None]
        return {"run_id": self.run_id, "rounds": st.round, "slots": self.cfg.slots,
                "scheduler": self.scheduler_spec, "makespan_s": max(fin) if len(fin) == len(jobs) else None,
                "preemptions": sum(v["preemptions"] for v in jobs.values()),
                "level_changes": sum(v["level_changes"] for v in jobs.values()), "jobs": jobs}

    def abort(self) -> None:
        """Stop every running incarnation (no checkpoint): publish ``stop``, then kill stragglers."""
        import ray

        if not self._started:
            return
        live = [k for k, v in self.launched.items() if not v.get("ended")]
        if live:
            try:
                recs = {jid: {"round": self.state.round, "inc": inc, "action": "stop", "gpus": [], "level": 0,
                              "pattern": "rotating", "comp": -1, "comp_size": 1, "steps": -1, "finish_at": 10 ** 12}
                        for jid, inc in live}
                ray.get(self.hub.publish.remote(self.run_id, recs), timeout=10)
            except Exception:  # noqa: BLE001
                pass
            deadline = time.time() + 3.0
            for key in live:
                refs = self.refs.get(key) or []
                try:
                    ray.get(refs, timeout=max(0.1, deadline - time.time()))
                except Exception:  # noqa: BLE001
                    pass
                self._kill_if_busy(key)

    def _kill_if_busy(self, key) -> None:
        import ray

        refs = self.refs.pop(key, None) or []
        ready, not_ready = ray.wait(refs, num_returns=len(refs), timeout=0) if refs else ([], [])
        if not_ready or (key in self.detached):
            for h in self.pool.owned_by(*key):
                self.pool.kill(h)
        self.pool.release(*key)
        if key in self.launched:
            self.launched[key]["ended"] = True

    def close(self, keep: bool = False) -> None:
        """Close the logs; unless ``keep``, stop running jobs and release what this executor
        created (hosts, hub, Ray)."""
        if not keep:
            self.abort()
        for f in (self.run_log, self.iter_log):
            if f is not None and not f.closed:
                f.close()
        if self.decision_log is not None:
            self.decision_log.close()
        if keep:
            return
        import ray

        if self._own_pool and self.pool is not None:
            self.pool.close()
        if self._own_hub and self.hub is not None:
            from .cluster_ray import kill_actor

            kill_actor(self.hub)
        elif self.hub is not None and ray.is_initialized():
            try:
                ray.get(self.hub.forget.remote(self.run_id), timeout=10)
            except Exception:  # noqa: BLE001
                pass
        if self._own_session and self.session is not None:
            self.session.stop()


def check_snapshot_format(snap: dict, where) -> None:
    """ValueError (one line) unless ``snap`` is a live state of :data:`SNAPSHOT_FORMAT`; a state
    written by an earlier version (a pickled scheduler) is refused without reading that field."""
    if PICKLED_SCHEDULER_FIELD in snap:
        raise ValueError(f"{where}: written by an earlier version of jigsaw (field {PICKLED_SCHEDULER_FIELD!r}: a "
                         f"pickled scheduler, never loaded since unpickling can run code); start the run afresh "
                         f"with jigsaw deploy --out ANOTHER_FOLDER")
    if snap.get("format") != SNAPSHOT_FORMAT:
        raise ValueError(f"{where}: not a jigsaw live state (field 'format': expected {SNAPSHOT_FORMAT!r}, "
                         f"got {snap.get('format')!r})")


def restore_scheduler(spec: dict, state: dict | None, spb: SPBConfig, where):
    """(scheduler, recorder or None) rebuilt from ``spec`` (``policies.scheduler_spec``) with the
    plain-data ``state`` of ``Scheduler.state_dict`` loaded (None: a fresh scheduler); a state that
    does not fit raises ValueError naming ``where``."""
    from .policies import build_scheduler

    scheduler, recorder = build_scheduler(spec, spb)
    if state is not None:
        try:
            scheduler.load_state_dict(state)
        except ValueError as e:
            raise ValueError(f"{where}: field 'scheduler_state': {e}") from None
    return scheduler, recorder


def _none(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def _jsonable(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Pattern):
        return o.value
    if isinstance(o, tuple):
        return list(o)
    raise TypeError(f"not JSON-serialisable: {type(o).__name__}")
