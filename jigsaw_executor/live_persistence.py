"""The live executor's run folder: the decision log, the event and iteration logs, the persisted
scheduler state (``scheduler_state.json`` and the hub's copy) and ``summary.json``; and the restore
of an executor from that state (docs/executor.md, docs/deploy.md).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from jigsaw_env.cost_table import get_table as gt
from jigsaw_env.jsonfile import read_json_file
from jigsaw_env.spb import SPBConfig

from .cluster_ray import NAMESPACE, RaySession, SlotPool
from .control import Keys, read_json
from .decision_log import FORMAT, DecisionLogWriter, cluster_to_dict, spb_to_dict, state_from_dict, state_to_dict
from .demo_scenario import DemoScenario
from .live_progress import ProgressLedger
from .live_types import LiveConfig, LiveJob, jsonable
from .policies import build_scheduler

__all__ = ["SNAPSHOT_FORMAT", "PICKLED_SCHEDULER_FIELD", "RunFolder", "check_snapshot_format", "restore_scheduler",
           "read_snapshot", "restore_executor"]

SNAPSHOT_FORMAT = "jigsaw-live-state/2"
#: the field that held a pickled scheduler in run folders written by an earlier version (refused)
PICKLED_SCHEDULER_FIELD = "scheduler_pickle"


class RunFolder:
    """What a :class:`~jigsaw_executor.live.LiveExecutor` ``ex`` writes to its folder ``ex.out``:
    ``decision_log.jsonl`` (:class:`~jigsaw_executor.decision_log.DecisionLogWriter`),
    ``run_log.jsonl`` (events), ``iterations.jsonl``, ``scheduler_state.json`` and ``summary.json``."""

    def __init__(self, ex):
        self.ex = ex
        self.decision_log: DecisionLogWriter | None = None
        self.run_log = None
        self.iter_log = None

    def open_logs(self, truncate_to: int | None = None) -> None:
        """Open the run's logs for appending (the decision log cut back to ``truncate_to`` bytes: a
        restored run drops the rounds after its snapshot)."""
        ex = self.ex
        self.decision_log = DecisionLogWriter(ex.out / "decision_log.jsonl", truncate_to)
        self.run_log = open(ex.out / "run_log.jsonl", "a")
        self.iter_log = open(ex.out / "iterations.jsonl", "a")

    def header(self) -> dict:
        """The decision log's first record: the cluster, settings, jobs, scheduler and cost tables."""
        ex = self.ex
        tables = {f"{j.model}-bs{j.batch_size}-cpu": gt(j.model, j.batch_size, "cpu").digest() for j in ex.jobs}
        return {"kind": "header", "format": FORMAT, "run_id": ex.run_id, "created": time.time(),
                "cluster": cluster_to_dict(ex.cluster), "spb": spb_to_dict(ex.cfg.spb),
                "sim": {"max_workers_per_gpu": ex.cfg.max_workers_per_gpu, "round_s": ex.cfg.round_s,
                        "steps_per_round": ex.cfg.steps_per_round, "restart_s": ex.cfg.restart_s,
                        "lockstep_s": ex.cfg.lockstep_s, "pace": ex.cfg.pace},
                "config": ex.cfg.to_dict(), "jobs": [j.to_dict() for j in ex.jobs],
                "scheduler": ex.scheduler_spec, "tables": tables,
                "scenario": ex.scenario.to_dict() if hasattr(ex.scenario, "to_dict") else None,
                "idle_guard_s": ex.idle_guard_s}

    def event(self, kind: str, **kw) -> None:
        """Append one event to ``run_log.jsonl`` (``t``: seconds since the run's epoch)."""
        rec = {"t": round(self.ex.now(), 6) if self.ex.epoch else 0.0, "event": kind, **kw}
        self.run_log.write(json.dumps(rec, default=jsonable) + "\n")
        self.run_log.flush()

    def log_iterations(self, jid: int, inc: int, r: int, reps: list[dict], ref: list[dict] | None = None,
                       by_t: list[dict] | None = None) -> None:
        """One line per iteration of round ``r`` in ``iterations.jsonl`` (every rank's report)."""
        its = [rep["iterations"] for rep in reps]
        ref = ref if ref is not None else its[0]
        by_t = by_t if by_t is not None else [{it["t"]: it for it in rk} for rk in its]
        for a in ref:
            t = a["t"]
            self.iter_log.write(json.dumps({
                "job": jid, "inc": inc, "round": r, "t": t, "level": a["lvl"], "pattern": a["pat"],
                "iter_s": a["iter_s"], "wall": a["wall"] - self.ex.epoch, "ckpt_s": a.get("ckpt_s"),
                "ranks": [{"rank": w, "slot": reps[w]["slot"], "start_group": by_t[w][t]["sg"],
                           "loss": by_t[w][t]["loss"], "step_s": by_t[w][t]["step_s"], "sync_s": by_t[w][t]["sync_s"],
                           "bytes_sent": by_t[w][t]["bytes"], "bytes_by_collective": by_t[w][t]["by"],
                           "peak_activation_bytes": by_t[w][t]["act"]}
                          for w in range(len(its)) if t in by_t[w]]}) + "\n")
        self.iter_log.flush()

    def snapshot(self, log_pos: int) -> dict:
        """The executor's state as plain data (:data:`SNAPSHOT_FORMAT`; ``log_pos``: the decision
        log's size in bytes at this snapshot)."""
        ex = self.ex
        return {"format": SNAPSHOT_FORMAT, "run_id": ex.run_id, "epoch": ex.epoch, "saved": time.time(),
                "round": ex.state.round, "state": state_to_dict(ex.state), "config": ex.cfg.to_dict(),
                "jobs": [j.to_dict() for j in ex.jobs], "scheduler_spec": ex.scheduler_spec,
                "scheduler_state": self.scheduler_state(), "inc": {str(k): v for k, v in ex.inc.items()},
                "launched": {f"{k[0]}/{k[1]}": v for k, v in ex.launched.items()},
                "hosts": ex.pool.occupancy(), "pool_prefix": ex.pool.prefix, "hub": ex.run_id + "-hub",
                "store": list(ex.store_addr), "decision_log_bytes": log_pos, "pending_pos": ex.pending_pos,
                "totals": ex.ledger.totals, "version": ex.version,
                "last_records": {str(k): v for k, v in ex.last_records.items()},
                "gens": {f"{k[0]}/{k[1]}": v for k, v in ex.gens.items()}, "address": ex.address,
                "scenario": ex.scenario.state_dict() if hasattr(ex.scenario, "state_dict") else None}

    def scheduler_state(self) -> dict | None:
        """The scheduler's plain-data state (``Scheduler.state_dict``), or None for a scheduler
        without one (a callable handed in by a caller: rebuilt fresh on restore)."""
        state_dict = getattr(self.ex.scheduler, "state_dict", None)
        return state_dict() if callable(state_dict) else None

    def persist(self, log_pos: int) -> None:
        """Write the snapshot to ``scheduler_state.json`` (atomically) and to the hub actor."""
        import ray

        ex = self.ex
        snap = self.snapshot(log_pos)
        p = ex.out / "scheduler_state.json"
        tmp = p.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(snap, default=jsonable))
        os.replace(tmp, p)
        ray.get(ex.hub.put_snapshot.remote(ex.run_id, json.loads(json.dumps(snap, default=jsonable))))

    def finish(self) -> dict:
        """The run's summary, written to the decision log's end record and ``summary.json``."""
        ex = self.ex
        summary = ex.ledger.summary()
        self.decision_log.write({"kind": "end", "t": ex.now(), "jobs": {str(k): v for k, v in summary["jobs"].items()}})
        self.event("end", makespan_s=summary["makespan_s"])
        (ex.out / "summary.json").write_text(json.dumps(summary, indent=1, default=jsonable) + "\n")
        ex.finished = True
        return summary


    def close(self) -> None:
        """Close the logs (what is written stays)."""
        for f in (self.run_log, self.iter_log):
            if f is not None and not f.closed:
                f.close()
        if self.decision_log is not None:
            self.decision_log.close()


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
    scheduler, recorder = build_scheduler(spec, spb)
    if state is not None:
        try:
            scheduler.load_state_dict(state)
        except ValueError as e:
            raise ValueError(f"{where}: field 'scheduler_state': {e}") from None
    return scheduler, recorder


def read_snapshot(out: Path, from_hub: str | None, hub=None) -> tuple[dict, object]:
    """(the persisted live state, the hub) of the run in ``out`` (``scheduler_state.json``) or, with
    ``from_hub=RUN_ID``, held by that run's detached hub actor; FileNotFoundError or ValueError (one
    line, naming the file or the hub) for a missing, damaged or foreign state."""
    import ray

    if from_hub is not None:
        hub = hub or ray.get_actor(from_hub + "-hub", namespace=NAMESPACE)
        snap = ray.get(hub.get_snapshot.remote(from_hub))
        if snap is None:
            raise ValueError(f"the hub of run {from_hub} holds no scheduler state")
    else:
        p = out / "scheduler_state.json"
        if not p.is_file():
            raise FileNotFoundError(f"no persisted scheduler state in {out} (scheduler_state.json)")
        snap = read_json_file(p, "scheduler state")  # "{p}: not valid JSON (...)" for a damaged file
        if not isinstance(snap, dict):
            raise ValueError(f"{p}: expected a JSON object (a jigsaw live state), got "
                             f"{'null' if snap is None else type(snap).__name__}")
    check_snapshot_format(snap, out / "scheduler_state.json" if from_hub is None else f"the hub of run {from_hub}")
    return snap, hub


def restore_executor(cls, out_dir: str | Path, *, scheduler=None, recorder=None, pool=None, hub=None, session=None,
                     from_hub: str | None = None, echo=None, address: str | None = None):
    """``LiveExecutor.restore`` (its docstring): an executor of class ``cls`` continuing the run
    persisted in ``out_dir`` (or in the hub of run ``from_hub``)."""
    import ray

    out = Path(out_dir)
    snap, hub = read_snapshot(out, from_hub, hub)
    cfg = LiveConfig.from_dict(snap["config"])
    jobs = [LiveJob(**j) for j in snap["jobs"]]
    spec = snap["scheduler_spec"]
    if scheduler is None:
        scheduler, recorder = restore_scheduler(spec, snap.get("scheduler_state"), cfg.spb,
                                                out / "scheduler_state.json")
    scenario = None
    if snap.get("scenario") is not None:
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
    ex.own(session=own_session, pool=not given_pool, hub=not given_hub)
    live = _load_snapshot(ex, snap)
    if not cold:
        pool.restore_occupancy(snap["hosts"])
        ex.detached = set(live)
    ex.start()
    ex.folder.open_logs(truncate_to=int(snap["decision_log_bytes"]))
    ex.event("restore", round=ex.state.round, run_id=ex.run_id, cold=cold, detached=sorted(ex.detached))
    if cold:
        for key in live:
            ex.recovery.restart_lost(key)
    else:
        for key in live:
            fin = read_json(ex.store, Keys.fin(*key))
            if fin is not None:
                ex.recovery.reconcile_ended(key, fin)
    return ex


def _load_snapshot(ex, snap: dict) -> list[tuple[int, int]]:
    """Set the executor's state, incarnations and totals from ``snap``; the incarnations that had
    not ended when it was taken."""
    def pair(k: str) -> tuple[int, int]:
        return int(k.split("/")[0]), int(k.split("/")[1])

    ex.state = state_from_dict(snap["state"], ex.cluster, ex.costs)
    ex.epoch = float(snap["epoch"])
    ex.inc = {int(k): int(v) for k, v in snap["inc"].items()}
    ex.launched = {pair(k): v for k, v in snap["launched"].items()}
    ex.ledger.totals = {int(k): {**ProgressLedger.new_totals(), **v} for k, v in snap["totals"].items()}
    ex.version = int(snap["version"])
    ex.pending_pos = int(snap["pending_pos"])
    ex.last_records = {int(k): v for k, v in snap.get("last_records", {}).items()}
    ex.gens = {pair(k): int(v) for k, v in snap.get("gens", {}).items()}
    return sorted(k for k, v in ex.launched.items() if not v.get("ended"))
