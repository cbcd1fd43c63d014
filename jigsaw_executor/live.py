"""The live executor: real SPB jobs on Ray slots, driven round by round by a scheduler that reads
the simulator's own state type (docs/design.md section 3; docs/deploy.md).

:class:`LiveExecutor` keeps the cluster in a :class:`~jigsaw_env.state.ClusterState` (slots are
the cluster's "GPUs": ``ClusterSpec.from_gpus(slots, gpus_per_node=slots, gpu_type="cpu")``,
jobs are ``JobState``s with the CPU cost tables' batch sizes), so any heuristic
(``agents.make_scheduler``) or learned policy (the env's encoder and action codec, through
``agents.rl.LearnedScheduler``) schedules it unchanged. Each round:

1. admit arrived jobs; call the scheduler on the state; validate the decision
   (``jigsaw_env.placement.validate_decision``: the simulator's own check);
2. update the state's bookkeeping exactly as the simulator does (``state.apply_job_bookkeeping``:
   status, preemptions, migrations, level changes, first start, restart);
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

The executor runs the round loop; its parts, each in a module of its own, do one job each:
:class:`~jigsaw_executor.live_recovery.Recovery` (worker failures, restarts, checkpoint loss),
:class:`~jigsaw_executor.live_progress.ProgressLedger` (per-job iterations, progress and totals),
:class:`~jigsaw_executor.live_persistence.RunFolder` (logs, persisted state, summary) and
:class:`~jigsaw_executor.live_workers.Incarnations` (starting and stopping workers on hosts).
The data types (:class:`LiveJob`, :class:`LiveConfig`, the failures) are in
:mod:`jigsaw_executor.live_types`.
"""
from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Callable

from agents.rl import EvalSpaces
from jigsaw_env.placement import validate_decision
from jigsaw_env.state import ClusterState, CostModel, Decision, JobStatus, apply_job_bookkeeping

from .cluster_ray import RaySession, SlotPool, get_or_create_hub, kill_actor
from .control import Keys, connect_store, read_json
from .decision_log import decision_to_dict, encode_array, encode_mask, state_to_dict
from .live_persistence import (PICKLED_SCHEDULER_FIELD, SNAPSHOT_FORMAT, RunFolder, check_snapshot_format,
                               restore_executor, restore_scheduler)
from .live_progress import ProgressLedger
from .live_recovery import Recovery
from .live_types import (RECOVERY_MODES, CheckpointLost, JobFailed, LiveConfig, LiveJob, check_jobs, components_of,
                         job_state, live_cluster, segments_of, steps_to_finish)
from .live_workers import Incarnations
from .policies import idle_guard
from .store_seal import new_token

__all__ = ["LiveJob", "LiveConfig", "LiveExecutor", "JobFailed", "CheckpointLost", "components_of", "segments_of",
           "live_cluster", "check_snapshot_format", "restore_scheduler", "SNAPSHOT_FORMAT", "PICKLED_SCHEDULER_FIELD",
           "RECOVERY_MODES"]


class LiveExecutor:
    """Run live jobs under a scheduler (module docstring).

    jobs: :class:`LiveJob` list; scheduler: any ``agents.base.Scheduler`` (or callable
    ``state -> Decision``); scheduler_spec: how to rebuild it (``{"kind": "heuristic", "name",
    "kwargs"}`` or ``{"kind": "policy", "path", ...}``), written to the logs; pool / hub / session:
    reuse Ray pieces (tests share one per module), otherwise created here; scenario: an optional
    hook ``(state, decision) -> (decision, forced)`` applied after the scheduler (the demo's,
    :class:`jigsaw_executor.demo_scenario.DemoScenario`); fail_at: ``{job_id: (rank, iteration, mode)}``
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
        self.jobs = check_jobs(jobs, config, self.cluster)
        self.state = self._initial_state()
        self._check_scheduler()
        self.session, self.pool, self.hub = session, pool, hub
        self._own_session = self._own_pool = self._own_hub = False
        self.store = None
        self.store_addr: tuple[str, int] | None = None
        self.store_token = ""  # the run's secret for decision records (ControlHub.open_run)
        self.epoch: float | None = None
        self.inc: dict[int, int] = {}  # job -> current incarnation number (-1: none yet)
        self.refs: dict[tuple[int, int], list] = {}  # (job, inc) -> ray refs of its ranks
        self.launched: dict[tuple[int, int], dict] = {}  # (job, inc) -> gpus, launch time, resumed
        self.detached: set[tuple[int, int]] = set()  # running incarnations without refs (after a restore)
        self.version = 0
        self.rounds_done = 0
        self.pending = sorted(self.state.jobs, key=lambda j: (self.state.jobs[j].arrival_s, j))
        self.pending_pos = 0
        self.finished = False
        self._started = False
        self.last_records: dict[int, dict] = {}  # job -> its newest published decision record
        self.gens: dict[tuple[int, int], int] = {}  # (job, inc) -> process-group generation (partial recoveries)
        self.round_decision: Decision = Decision()  # the decision of the round in progress
        self.phase: str | None = None  # "round" while a round runs, "pause" while pausing
        self.holding = False  # the round's hold has been published
        # the parts, one job each (their modules' docstrings)
        self.ledger = ProgressLedger(self, [j.job_id for j in self.jobs])
        self.folder = RunFolder(self)
        self.workers = Incarnations(self)
        self.recovery = Recovery(self)

    # ------------------------------------------------------------------ setup
    def _initial_state(self) -> ClusterState:
        jobs = {j.job_id: job_state(j) for j in self.jobs}
        return ClusterState(cluster=self.cluster, costs=self.costs, time_s=0.0, round=0, jobs=jobs, active_ids=[],
                            max_workers_per_gpu=self.cfg.max_workers_per_gpu)

    def _check_scheduler(self) -> None:
        """A learned policy must fit this layout (observation size, action count): checked here,
        before any job starts."""
        agent = getattr(self.scheduler, "agent", None)
        if agent is not None and hasattr(agent, "check_compatible"):
            agent.check_compatible(EvalSpaces(None, self.cfg.spb.max_level, self.cfg.spb.num_slots))

    def now(self) -> float:
        """Seconds since the run's epoch (its first round)."""
        return time.time() - self.epoch

    def own(self, *, session: bool, pool: bool, hub: bool) -> None:
        """Which Ray pieces this executor stops on :meth:`close` (those it created)."""
        self._own_session, self._own_pool, self._own_hub = session, pool, hub

    @property
    def totals(self) -> dict[int, dict]:
        """Per-job counters of the run (:class:`~jigsaw_executor.live_progress.ProgressLedger`)."""
        return self.ledger.totals

    def event(self, kind: str, **kw) -> None:
        """Append one event to the run log (``run_log.jsonl``)."""
        self.folder.event(kind, **kw)

    def summary(self) -> dict:
        """The run's summary (``summary.json``): per job and in all."""
        return self.ledger.summary()

    def abort(self) -> None:
        """Stop every running incarnation (no checkpoint): publish ``stop``, then kill stragglers."""
        if not self._started:
            return
        self.workers.abort()

    def start(self) -> None:
        """Start (or reuse) Ray, the worker hosts and the hub; open the logs. Nothing runs yet."""
        if self._started:
            return
        import ray

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
        self.store_token = ray.get(self.hub.open_run.remote(self.run_id, new_token()))
        self.store = connect_store(*self.store_addr, self.run_id, self.cfg.timeout_s)
        self._started = True

    # ------------------------------------------------------------------ the run
    def run(self, max_rounds: int | None = None) -> dict | None:
        """Run rounds until every job is done (then return the summary) or ``max_rounds`` rounds
        have run in this call (then return None; the jobs wait, held, for the next decision)."""
        self.start()
        if self.epoch is None:
            self.folder.open_logs()
            self.epoch = time.time()
            self.folder.decision_log.write(self.folder.header())
            self.event("start", run_id=self.run_id, slots=self.cfg.slots, jobs=[j.to_dict() for j in self.jobs],
                       scheduler=self.scheduler_spec, hosts={h.name: {"slot": h.slot, "pid": h.pid, "core": h.core, "node_id": h.node_id}
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
        return self.folder.finish()

    def _all_done(self) -> bool:
        return all(j.status in (JobStatus.DONE, JobStatus.FAILED) for j in self.state.jobs.values())

    def failed_jobs(self) -> list[int]:
        """The jobs given up (no checkpoint of theirs loads): status ``failed``."""
        return sorted(jid for jid, j in self.state.jobs.items() if j.status is JobStatus.FAILED)

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
        self.round_decision = Decision(decision)
        for jid in plan["start"]:  # a resumed job's checkpoint: a damaged newest one falls back, none: given up
            if self.inc.get(jid, -1) >= 0 and st.jobs[jid].status is not JobStatus.FAILED:
                self.recovery.check_resume_checkpoint(jid)
        run_dec = Decision({jid: jd for jid, jd in decision.items() if st.jobs[jid].status is not JobStatus.FAILED})
        self.round_decision = run_dec
        records = self._records(run_dec, r, set(plan["start"]))
        self.last_records = records
        self.version = int(__import__("ray").get(self.hub.publish.remote(self.run_id, records)))
        t_pub = self.now()
        for jid in plan["start"]:
            if jid in run_dec:
                self.workers.launch(jid, run_dec[jid], resumed=st.jobs[jid].preemptions > 0 or self.inc.get(jid, -1) >= 0,
                                    t_pub=t_pub)
        # 4. the round runs (a worker that fails is recovered within it)
        running = list(run_dec)
        self.phase = "round"
        try:
            self._wait_round(r, running, t_pub)
        finally:
            self.phase = None
        t_end = self.now()
        outcome = self.ledger.collect(r, Decision({jid: jd for jid, jd in run_dec.items()
                                                   if st.jobs[jid].status is not JobStatus.FAILED}), t_start, t_end)
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
                             "finish_at": int(j.iteration + steps_to_finish(j, eta))}
        return recs

    def live_job(self, jid: int) -> LiveJob:
        """The :class:`LiveJob` of job ``jid``."""
        return next(j for j in self.jobs if j.job_id == jid)

    def checkpoint_dir(self, jid: int) -> Path:
        """The folder of job ``jid``'s checkpoints."""
        return Path(self.cfg.checkpoint_root or (self.out / "checkpoints")) / f"job{jid}"

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

        self.phase = "pause"
        try:
            self.recovery.wait_for(jids, paused, self.cfg.timeout_s, f"pausing jobs {jids}")
        finally:
            self.phase = None
        for key in keys.values():
            if self.launched[key].get("failed"):
                continue  # rolled back to its checkpoint by the failure handler
            self.workers.end_incarnation(key)
            fin = read_json(self.store, Keys.fin(*key))
            self.event("pause", job=key[0], inc=key[1], iteration=fin["t"], hash=fin["hash"])

    def _wait_round(self, r: int, running: list[int], t_pub: float) -> None:
        W = {jid: len(self.state.jobs[jid].placement) for jid in running}

        def reported(jid: int) -> bool:
            if self.state.jobs[jid].status is JobStatus.FAILED:  # given up within the round
                return True
            inc = self.inc[jid]
            if all(self.store.check([Keys.rep(jid, inc, r, w)]) for w in range(W[jid])):
                return True
            # a worker died after the incarnation's end record: what it did not report is not needed
            return bool(self.launched[(jid, inc)].get("failed")) and self.store.check([Keys.fin(jid, inc)])

        def done(jid: int) -> bool:
            return self.state.jobs[jid].status is JobStatus.FAILED or self.store.check([Keys.fin(jid, self.inc[jid])])

        self.holding = False
        if self.cfg.steps_per_round is not None and running:
            self.recovery.wait_for(running, reported, self.cfg.round_timeout_s, f"round {r}")
            return
        if not running:  # nothing runs (the policy chose so): the round still lasts, as in the simulator
            time.sleep(self.cfg.round_s if self.cfg.steps_per_round is None else 0.1)
            return
        end = t_pub + self.cfg.round_s
        while self.now() < end:
            if all(done(j) for j in running):
                break
            self.recovery.check_failures(self.workers.current_keys(running))
            time.sleep(min(0.02, max(0.0, end - self.now())))
        still = [j for j in running if not done(j)]
        self.holding = True
        if still:
            import ray

            recs = {}
            for jid in still:
                if self.state.jobs[jid].status is JobStatus.FAILED:
                    continue
                self.last_records[jid] = recs[jid] = dict(self.last_records[jid], action="hold")
            ray.get(self.hub.publish.remote(self.run_id, recs))
        self.recovery.wait_for(running, reported, self.cfg.timeout_s, f"holding round {r}")

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
        pos = self.folder.decision_log.write(rec)
        self.rounds_done += 1
        self.event("round_end", round=r, t_start=t_start, t_end=t_end,
                   jobs={k: {"iterations": v["iterations"], "mean_iter_s": v["mean_iter_s"], "finished": v["finished"]}
                         for k, v in outcome.items()})
        self.folder.persist(pos)

    # ------------------------------------------------------------------ restore and close
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
        return restore_executor(cls, out_dir, scheduler=scheduler, recorder=recorder, pool=pool, hub=hub,
                                session=session, from_hub=from_hub, echo=echo, address=address)

    def close(self, keep: bool = False) -> None:
        """Close the logs; unless ``keep``, stop running jobs and release what this executor
        created (hosts, hub, Ray)."""
        if not keep:
            self.abort()
        self.folder.close()
        if keep:
            return
        import ray

        if self._own_pool and self.pool is not None:
            self.pool.close()
        if self._own_hub and self.hub is not None:
            kill_actor(self.hub)
        elif self.hub is not None and ray.is_initialized():
            try:
                ray.get(self.hub.forget.remote(self.run_id), timeout=10)
            except Exception:  # noqa: BLE001
                pass
        if self._own_session and self.session is not None:
            self.session.stop()
