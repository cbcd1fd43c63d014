"""The live executor: real SPB jobs on Ray slots, driven round by round by a scheduler that reads
the simulator's own state type (DESIGN.md section 3; docs/deploy.md).

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

import base64
import json
import math
import os
import pickle
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from jigsaw_env.cluster import ClusterSpec
from jigsaw_env.cost_table import get_table
from jigsaw_env.network import INTRA_NODE, Link
from jigsaw_env.placement import validate_decision
from jigsaw_env.spb import Pattern, SPBConfig
from jigsaw_env.state import ClusterState, CostModel, Decision, JobDecision, JobState, JobStatus, apply_job_bookkeeping

from .control import Keys, WorkerSpec, connect_store, read_json
from .decision_log import (FORMAT, DecisionLogWriter, cluster_to_dict, decision_to_dict, encode_array, encode_mask,
                           spb_from_dict, spb_to_dict, state_from_dict, state_to_dict)

__all__ = ["LiveJob", "LiveConfig", "LiveExecutor", "JobFailed", "components_of"]

SNAPSHOT_FORMAT = "jigsaw-live-state/1"


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

    def __post_init__(self) -> None:
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
        d["spb"] = spb_from_dict(d["spb"])
        d["link"] = Link(*d["link"])
        return cls(**d)


def live_cluster(cfg: LiveConfig) -> ClusterSpec:
    return ClusterSpec.from_gpus(cfg.slots, gpus_per_node=cfg.slots, gpu_type="cpu",
                                 gpu_memory_gib=cfg.slot_memory_gib, intra=cfg.link, cross=cfg.link)


def components_of(decision: dict) -> list[list[int]]:
    """Jobs connected through shared slots, each list sorted, ordered by smallest job id."""
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    owner: dict[int, int] = {}
    for jid, jd in decision.items():
        find(jid)
        for g in jd.gpus:
            if g in owner:
                a, b = find(owner[g]), find(jid)
                if a != b:
                    parent[a] = b
            else:
                owner[g] = jid
    groups: dict[int, list[int]] = {}
    for jid in decision:
        groups.setdefault(find(jid), []).append(jid)
    return sorted((sorted(g) for g in groups.values()), key=lambda g: g[0])


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
                 allow_oversubscribe: bool = False, echo: Callable[[str], None] | None = None):
        self.cfg = config
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
                "start_groups": {}, "finish_wall": None}

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
                        "steps_per_round": self.cfg.steps_per_round, "restart_s": self.cfg.restart_s},
                "config": self.cfg.to_dict(), "jobs": [j.to_dict() for j in self.jobs],
                "scheduler": self.scheduler_spec, "tables": tables,
                "scenario": self.scenario.to_dict() if self.scenario is not None and hasattr(self.scenario, "to_dict") else None}

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
        validate_decision(st, decision)  # InfeasibleDecision (ValueError) before anything changes
        plan = self._plan(decision)
        self._apply(decision)
        self.event("decision", round=r, decision=decision_to_dict(decision), forced=forced,
                   scheduler_s=round(sched_s, 6))
        # 1. pause what leaves or moves (checkpoint), 2. publish the round, 3. start incarnations
        if plan["stop"]:
            self._pause(plan["stop"])
        records = self._records(decision, r, set(plan["start"]))
        self._last_records = records
        self.version = int(__import__("ray").get(self.hub.publish.remote(self.run_id, records)))
        t_pub = self.now()
        for jid in plan["start"]:
            self._launch(jid, decision[jid], resumed=st.jobs[jid].preemptions > 0 or self.inc.get(jid, -1) >= 0,
                         t_pub=t_pub)
        # 4. the round runs
        running = list(decision)
        self._wait_round(r, running, t_pub)
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
        comps = components_of(decision)
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
        import ray

        job = next(j for j in self.jobs if j.job_id == jid)
        inc = self.inc.get(jid, -1) + 1
        self.inc[jid] = inc
        ckpt = Path(self.cfg.checkpoint_root or (self.out / "checkpoints")) / f"job{jid}"
        refs = []
        hosts = []
        chosen = []
        for w, g in enumerate(jd.gpus):
            h = self.pool.free_host(g)
            h.owner = (jid, inc, w)
            chosen.append(h)
        self.pool.refresh(timeout_s=120.0, hosts=chosen)  # a host whose process died restarts first
        for w, (g, h) in enumerate(zip(jd.gpus, chosen)):
            hosts.append(h.name)
            spec = WorkerSpec(run_id=self.run_id, job_id=jid, incarnation=inc, rank=w, world=len(jd.gpus), slot=g,
                              model=job.model, batch_size=int(job.batch_size), store_host=self.store_addr[0],
                              store_port=int(self.store_addr[1]), checkpoint_dir=str(ckpt), data=job.data,
                              seed=job.seed, lr=job.lr, spb=self.cfg.spb, link=self.cfg.link,
                              timeout_s=self.cfg.timeout_s, hold_timeout_s=self.cfg.hold_timeout_s,
                              measure_activations=self.cfg.measure_activations, evaluate=self.cfg.evaluate,
                              fail_at=self.fail_at.get(jid))
            refs.append(h.handle.run_worker.remote(spec))
        self.refs[(jid, inc)] = refs
        self.launched[(jid, inc)] = {"gpus": list(jd.gpus), "t_launch": t_pub, "resumed": bool(resumed),
                                     "hosts": hosts, "ended": False, "round": self.state.round}
        self.totals[jid]["incarnations"] += 1
        self.event("launch", job=jid, inc=inc, gpus=list(jd.gpus), resumed=bool(resumed), hosts=hosts,
                   level=jd.level, pattern=jd.pattern.value)

    # ------------------------------------------------------------------ waiting and failures
    def _check_failures(self, keys: list[tuple[int, int]] | None = None) -> None:
        """Raise JobFailed if a worker of a running incarnation died or reported an error."""
        import ray

        keys = list(self.refs) if keys is None else keys
        for key in keys:
            refs = self.refs.get(key)
            if not refs:
                if key in self.detached:
                    self._check_detached(key)
                continue
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            for ref in ready:
                try:
                    ray.get(ref)
                except Exception as e:  # noqa: BLE001 - a worker's process died or raised
                    self._fail(key, e)

    def _check_detached(self, key: tuple[int, int]) -> None:
        jid, inc = key
        info = self.launched.get(key, {})
        W = len(info.get("gpus", []))
        if any(self.store.check([Keys.err(jid, inc, r)]) for r in range(W)):
            self._fail(key, None)

    def _fail(self, key: tuple[int, int], exc: BaseException | None) -> None:
        """Raise JobFailed for incarnation ``key``, naming the root-cause rank: the first error that
        is not a peer-failure symptom (a connection closed, a timeout), or a rank whose process died
        without a Python error; as ``jigsaw_executor.launcher`` does for local jobs."""
        import ray

        jid, inc = key
        info = self.launched.get(key, {})
        gpus = info.get("gpus", [])
        W = len(gpus)
        refs = self.refs.get(key) or []
        died: dict[int, tuple[float, str]] = {}
        deadline = time.time() + 2.0  # let peers fail on their own and write their errors
        while True:
            for r, ref in enumerate(refs):
                if r in died:
                    continue
                ready, _ = ray.wait([ref], timeout=0)
                if ready:
                    try:
                        ray.get(ref)
                    except Exception as e:  # noqa: BLE001
                        died[r] = (time.time(), f"{type(e).__name__}")
            errs = [r for r in range(W) if self.store.check([Keys.err(jid, inc, r)])]
            if len(set(errs) | set(died)) >= W or time.time() > deadline:
                break
            time.sleep(0.05)
        errors = {r: read_json(self.store, Keys.err(jid, inc, r)) for r in range(W)}
        errors = {r: e for r, e in errors.items() if e is not None}
        silent = {r: v for r, v in died.items() if r not in errors}
        stalled = [r for r in range(W) if r not in errors and r not in silent]
        job = self.state.jobs[jid]
        self._kill_incarnation(key)
        events = [(e["time"], not _is_peer_failure(e), r) for r, e in errors.items()]
        events += [(t, True, r) for r, (t, _) in silent.items()]
        if not events:
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}" if exc else "no report"
            err = JobFailed(f"job {jid} ({job.model}) failed: a worker process died without a Python error ({why})",
                            jid, None, {})
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
        self.event("job_failed", job=jid, inc=inc, message=str(err).splitlines()[0])
        raise err

    def _kill_incarnation(self, key: tuple[int, int]) -> None:
        jid, inc = key
        for h in self.pool.owned_by(jid, inc):
            self.pool.kill(h)
        self.refs.pop(key, None)
        if key in self.launched:
            self.launched[key]["ended"] = True

    def _wait_for(self, pred: Callable[[], bool], timeout_s: float, what: str, keys=None, poll: float = 0.002) -> None:
        deadline = time.time() + timeout_s
        last_check = 0.0
        while not pred():
            now = time.time()
            if now - last_check > 0.05:
                self._check_failures(keys)
                last_check = now
            if now > deadline:
                stuck = keys or list(self.refs)
                for key in stuck:
                    self._kill_incarnation(key)
                jid = stuck[0][0] if stuck else -1
                raise JobFailed(f"{what}: no report within {timeout_s:.0f} s (a worker stalled); job(s) "
                                f"{sorted({k[0] for k in stuck})} stopped", jid, None, {})
            time.sleep(poll)

    def _pause(self, jids: list[int]) -> None:
        """Preempt (or move): the incarnations checkpoint to disk and exit."""
        import ray

        recs = {}
        for jid in jids:
            j = self.state.jobs[jid]
            inc = self.inc[jid]
            recs[jid] = {"round": self.state.round, "inc": inc, "action": "pause", "gpus": [], "level": 0,
                         "pattern": "rotating", "comp": -1, "comp_size": 1, "steps": -1, "finish_at": 10 ** 12}
        ray.get(self.hub.publish.remote(self.run_id, recs))
        keys = [(jid, self.inc[jid]) for jid in jids]
        self._wait_for(lambda: all(self.store.check([Keys.fin(*k)]) for k in keys), self.cfg.timeout_s,
                       f"pausing jobs {jids}", keys)
        for key in keys:
            self._end_incarnation(key)
            fin = read_json(self.store, Keys.fin(*key))
            self.event("pause", job=key[0], inc=key[1], iteration=fin["t"], hash=fin["hash"])

    def _end_incarnation(self, key: tuple[int, int], timeout_s: float | None = None) -> None:
        import ray

        refs = self.refs.pop(key, None)
        if refs:
            try:
                ray.get(refs, timeout=timeout_s or self.cfg.timeout_s)
            except Exception as e:  # noqa: BLE001
                self.refs[key] = refs
                self._fail(key, e)
        self.detached.discard(key)
        self.pool.release(*key)
        if key in self.launched:
            self.launched[key]["ended"] = True

    def _wait_round(self, r: int, running: list[int], t_pub: float) -> None:
        keys = [(jid, self.inc[jid]) for jid in running]
        W = {jid: len(self.state.jobs[jid].placement) for jid in running}

        def reported(jid: int) -> bool:
            inc = self.inc[jid]
            return all(self.store.check([Keys.rep(jid, inc, r, w)]) for w in range(W[jid]))

        def done(jid: int) -> bool:
            return self.store.check([Keys.fin(jid, self.inc[jid])])

        if self.cfg.steps_per_round is not None and running:
            self._wait_for(lambda: all(reported(j) for j in running), self.cfg.round_timeout_s, f"round {r}", keys)
            return
        if not running:  # nothing runs (the policy chose so): the round still lasts, as in the simulator
            time.sleep(self.cfg.round_s if self.cfg.steps_per_round is None else 0.1)
            return
        end = t_pub + self.cfg.round_s
        while self.now() < end:
            if all(done(j) for j in running):
                break
            self._check_failures(keys)
            time.sleep(min(0.02, max(0.0, end - self.now())))
        still = [j for j in running if not done(j)]
        if still:
            import ray

            recs = {jid: dict(self._last_records[jid], action="hold") for jid in still}
            ray.get(self.hub.publish.remote(self.run_id, recs))
        self._wait_for(lambda: all(reported(j) for j in running), self.cfg.timeout_s, f"holding round {r}", keys)

    # ------------------------------------------------------------------ reports -> state
    def _collect(self, r: int, decision: Decision, t_start: float, t_end: float) -> dict:
        st = self.state
        outcome = {}
        for jid, jd in decision.items():
            j = st.jobs[jid]
            inc = self.inc[jid]
            W = len(jd.gpus)
            reps = [read_json(self.store, Keys.rep(jid, inc, r, w)) for w in range(W)]
            its = [rep["iterations"] for rep in reps]
            n = len(its[0])
            fin = read_json(self.store, Keys.fin(jid, inc))
            finished = fin is not None and fin["status"] == "done"
            info = self.launched[(jid, inc)]
            ready = read_json(self.store, Keys.ready(jid, inc))
            started_now = info["round"] == r
            startup = None
            if started_now and n:
                startup = its[0][0]["wall"] - self.epoch - info["t_launch"]
            # progress exactly as the simulator credits it: eta of each iteration's configuration
            gain = 0.0
            for it in its[0]:
                gain += self.costs.profile(j, int(it["lvl"]), Pattern.parse(it["pat"]), jd.gpus).eta
            gain = min(j.remaining, gain)
            j.progress += gain
            j.iteration += n
            if n and its[0][-1]["t"] + 1 != j.iteration:
                self.event("warning", job=jid, message=f"iteration counter {j.iteration} != worker's {its[0][-1]['t'] + 1}")
                j.iteration = its[0][-1]["t"] + 1
            stepping = float(sum(it["iter_s"] or 0.0 for it in its[0]))
            j.run_s += stepping
            end = (fin["wall"] - self.epoch) if finished else t_end
            j.attained_gpu_s += max(0.0, end - t_start) * j.num_gpus
            bytes_ = int(sum(it["bytes"] for rk in its for it in rk))
            wire = int(sum(it["wire"] for it in its[0]))
            loss = [float(np.mean([its[w][i]["loss"] for w in range(W)])) for i in range(n)]
            tot = self.totals[jid]
            tot["iterations"] += n
            tot["stepping_s"] += stepping
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
            self._log_iterations(jid, inc, r, reps)
            if finished:
                j.progress = j.iterations
                j.status = JobStatus.DONE
                j.finish_s = fin["wall"] - self.epoch
                j.placement = ()
                tot["accuracy"] = fin.get("accuracy")
                tot["final_hash"] = fin.get("hash")
                tot["finish_wall"] = fin["wall"]
                self._end_incarnation((jid, inc))
                self.event("done", job=jid, inc=inc, iteration=fin["t"], jct_s=j.finish_s - j.arrival_s,
                           accuracy=fin.get("accuracy"), hash=fin.get("hash"))
            outcome[str(jid)] = {
                "job_id": jid, "inc": inc, "gpus": list(jd.gpus), "level": jd.level, "pattern": jd.pattern.value,
                "iterations": n, "first_iteration": its[0][0]["t"] if n else None, "stepping_s": stepping,
                "mean_iter_s": stepping / n if n else None,
                "median_iter_s": float(np.median([it["iter_s"] for it in its[0]])) if n else None,
                "bytes": bytes_, "bytes_per_iter": bytes_ / n if n else None, "wire_per_iter": wire / n if n else None,
                "loss_last": loss[-1] if loss else None, "progress_gain": gain, "finished": finished,
                "finish_s": j.finish_s if finished else None, "startup_s": startup,
                "setup_s": ready["setup_s"] if (ready and started_now) else None,
                "resumed": bool(info["resumed"]) and started_now, "started": started_now,
                "peak_activation_bytes": [max([it["act"] for it in rk] or [0]) for rk in its],
                "start_groups": [sorted({it["sg"] for it in rk}) for rk in its],
            }
        st.active_ids = [x for x in st.active_ids if st.jobs[x].status is not JobStatus.DONE]
        return outcome

    def _log_iterations(self, jid: int, inc: int, r: int, reps: list[dict]) -> None:
        its = [rep["iterations"] for rep in reps]
        for i in range(len(its[0])):
            a = its[0][i]
            self.iter_log.write(json.dumps({
                "job": jid, "inc": inc, "round": r, "t": a["t"], "level": a["lvl"], "pattern": a["pat"],
                "iter_s": a["iter_s"], "wall": a["wall"] - self.epoch,
                "ranks": [{"rank": w, "slot": reps[w]["slot"], "start_group": its[w][i]["sg"], "loss": its[w][i]["loss"],
                           "step_s": its[w][i]["step_s"], "sync_s": its[w][i]["sync_s"], "bytes_sent": its[w][i]["bytes"],
                           "bytes_by_collective": its[w][i]["by"], "peak_activation_bytes": its[w][i]["act"]}
                          for w in range(len(its))]}) + "\n")
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
        try:
            sched_blob = base64.b64encode(pickle.dumps(self.scheduler)).decode("ascii") \
                if self.scheduler_spec.get("kind") == "heuristic" else None
        except Exception:  # noqa: BLE001 - an unpicklable custom scheduler: rebuilt fresh on restore
            sched_blob = None
        return {"format": SNAPSHOT_FORMAT, "run_id": self.run_id, "epoch": self.epoch, "saved": time.time(),
                "round": self.state.round, "state": state_to_dict(self.state), "config": self.cfg.to_dict(),
                "jobs": [j.to_dict() for j in self.jobs], "scheduler_spec": self.scheduler_spec,
                "scheduler_pickle": sched_blob, "inc": {str(k): v for k, v in self.inc.items()},
                "launched": {f"{k[0]}/{k[1]}": v for k, v in self.launched.items()},
                "hosts": self.pool.occupancy(), "pool_prefix": self.pool.prefix, "hub": self.run_id + "-hub",
                "store": list(self.store_addr), "decision_log_bytes": log_pos, "pending_pos": self.pending_pos,
                "totals": self.totals, "version": self.version,
                "last_records": {str(k): v for k, v in self._last_records.items()},
                "scenario": self.scenario.state_dict() if hasattr(self.scenario, "state_dict") else None}

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
                from_hub: str | None = None, echo=None) -> "LiveExecutor":
        """A new executor (a restarted scheduler) that continues the run persisted in ``out_dir``
        (or, with ``from_hub=RUN_ID``, in the detached hub actor): the same jobs, incarnations and
        held workers; the scheduler rebuilt from its spec and its pickled memory."""
        import ray

        from .cluster_ray import NAMESPACE, SlotPool

        out = Path(out_dir)
        if from_hub is not None:
            hub = hub or ray.get_actor(from_hub + "-hub", namespace=NAMESPACE)
            snap = ray.get(hub.get_snapshot.remote(from_hub))
            if snap is None:
                raise ValueError(f"the hub of run {from_hub} holds no scheduler state")
        else:
            p = out / "scheduler_state.json"
            if not p.is_file():
                raise FileNotFoundError(f"no persisted scheduler state in {out} (scheduler_state.json)")
            snap = json.loads(p.read_text())
        if snap.get("format") != SNAPSHOT_FORMAT:
            raise ValueError(f"{out}: not a jigsaw live state (format {snap.get('format')!r})")
        cfg = LiveConfig.from_dict(snap["config"])
        jobs = [LiveJob(**j) for j in snap["jobs"]]
        spec = snap["scheduler_spec"]
        if scheduler is None:
            if spec["kind"] == "heuristic" and snap.get("scheduler_pickle"):
                scheduler = pickle.loads(base64.b64decode(snap["scheduler_pickle"]))
            else:
                from .policies import build_scheduler

                scheduler, recorder = build_scheduler(spec, cfg.spb)
        scenario = None
        if snap.get("scenario") is not None:
            from .deploy import DemoScenario

            scenario = DemoScenario.from_state_dict(snap["scenario"])
        if hub is None:
            hub = ray.get_actor(snap["hub"], namespace=NAMESPACE)
        if pool is None:
            pool = SlotPool(cfg.slots, cfg.max_workers_per_gpu, prefix=snap["pool_prefix"], pin=cfg.pin, attach=True)
        ex = cls(jobs, scheduler, cfg, out, scheduler_spec=spec, pool=pool, hub=hub, session=session,
                 scenario=scenario, run_id=snap["run_id"], recorder=recorder, echo=echo)
        ex.state = state_from_dict(snap["state"], ex.cluster, ex.costs)
        ex.epoch = float(snap["epoch"])
        ex.inc = {int(k): int(v) for k, v in snap["inc"].items()}
        ex.launched = {(int(k.split("/")[0]), int(k.split("/")[1])): v for k, v in snap["launched"].items()}
        ex.totals = {int(k): v for k, v in snap["totals"].items()}
        ex.version = int(snap["version"])
        ex.pending_pos = int(snap["pending_pos"])
        ex._last_records = {int(k): v for k, v in snap.get("last_records", {}).items()}
        pool.restore_occupancy(snap["hosts"])
        ex.detached = {k for k, v in ex.launched.items() if not v.get("ended")}
        ex.start()
        ex._open_logs(truncate_to=int(snap["decision_log_bytes"]))
        ex.event("restore", round=ex.state.round, run_id=ex.run_id, detached=sorted(ex.detached))
        return ex

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
