"""The live executor's recovery: noticing a worker that died, raised or stalled, and recovering
its job (a full restart from the last checkpoint, or a CPR-style partial recovery that replaces
the dead workers), counting failures against ``max_restarts``, checkpoint fallbacks and losses,
and reconciling incarnations after a scheduler restart (docs/executor.md, "Fault tolerance").
"""
from __future__ import annotations

import json
import time
from typing import Callable

from jigsaw_env.state import JobStatus

from .control import Keys, read_json
from .live_types import CheckpointLost, JobFailed, steps_to_finish
from .peer_failure import is_peer_failure

__all__ = ["Recovery"]


class Recovery:
    """Failure handling of a :class:`~jigsaw_executor.live.LiveExecutor` ``ex``: :meth:`wait_for`
    (wait for reports, handling failures and stalls on the way), :meth:`check_failures`,
    :meth:`on_failure`, :meth:`give_up`, :meth:`checkpoint_iteration`, and the restore-time
    :meth:`restart_lost` and :meth:`reconcile_ended`. The job's state goes back to a checkpoint
    through the ledger (``ex.ledger.rollback``)."""

    def __init__(self, ex):
        self.ex = ex

    def give_up(self, jid: int, err: JobFailed) -> None:
        """The job cannot go on (:class:`CheckpointLost`): stop its workers, mark it ``failed`` and
        take it out of the cluster state, so that the scheduler never sees it again; the other
        jobs run on. One ``job_failed`` event (``final``) and one echoed line."""
        ex = self.ex
        inc = ex.inc.get(jid)
        key = (jid, inc)
        if inc is not None and key in ex.launched and not ex.launched[key].get("ended"):
            ex.workers.kill_incarnation(key)
            ex.launched[key]["failed"] = True
        j = ex.state.jobs[jid]
        j.status, j.placement = JobStatus.FAILED, ()
        if jid in ex.state.active_ids:
            ex.state.active_ids.remove(jid)
        ex.round_decision.pop(jid, None)
        line = str(err).splitlines()[0]
        ex.ledger.totals[jid]["error"] = line
        ex.event("job_failed", job=jid, inc=inc, message=line, final=True, failures=ex.ledger.totals[jid]["failures"])
        ex.echo(f"job {jid} ({j.model}) given up, the other jobs go on: {line}")

    def check_resume_checkpoint(self, jid: int) -> None:
        """Before a paused job resumes: the checkpoint its workers will load. A damaged newest one
        falls back to the one before it (the job's state goes back to that iteration, the lost ones
        counted); when none loads, the job is given up."""
        ex = self.ex
        j = ex.state.jobs[jid]
        try:
            c = self.checkpoint_iteration(jid)
        except CheckpointLost as e:
            self.give_up(jid, e)
            return
        if c < j.iteration:
            last = j.iteration
            lost, _ = ex.ledger.rollback(jid, c, last)
            ex.event("checkpoint_fallback", job=jid, iteration=last, resume_iteration=c, iterations_lost=lost)

    def check_failures(self, keys: list[tuple[int, int]] | None = None) -> None:
        """Handle (recover, or raise JobFailed) a worker of a running incarnation that died, raised
        or, in partial mode, whose peers asked for recovery."""
        import ray

        ex = self.ex
        keys = list(ex.refs) if keys is None else keys
        for key in keys:
            if ex.launched.get(key, {}).get("ended"):
                continue
            refs = ex.refs.get(key)
            if not refs:
                if key in ex.detached:
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
                gone = [r for r, ref in enumerate(refs) if ref not in ready and ex.workers.host_dead(key[0], key[1], r)]
                if gone:
                    failed = RuntimeError(f"the process of rank {gone[0]} is gone")
            if failed is None and ex.cfg.recovery == "partial" and \
                    ex.store.check([Keys.rcvn(key[0], key[1], ex.gens.get(key, 0) + 1)]):
                failed = RuntimeError("a peer's collective failed")
            if failed is not None:
                self.on_failure(key, failed)

    def _check_detached(self, key: tuple[int, int]) -> None:
        ex = self.ex
        jid, inc = key
        info = ex.launched.get(key, {})
        W = len(info.get("gpus", []))
        gen = ex.gens.get(key, 0) + 1
        if any(ex.store.check([Keys.err(jid, inc, r)]) for r in range(W)) or \
                ex.store.check([Keys.rcvn(jid, inc, gen)]):
            self.on_failure(key, None)

    def _failure_error(self, key: tuple[int, int], exc: BaseException | None,
                       reason: str | None = None) -> tuple[JobFailed, int | None, set[int]]:
        """The failure of incarnation ``key`` as a JobFailed naming the root-cause rank (the first
        error that is not a peer-failure symptom, or a rank whose process died without a Python
        error), as ``jigsaw_executor.launcher`` does for local jobs; also the highest iteration a
        rank reported reaching (or None) and the ranks that died."""
        import ray

        ex = self.ex
        jid, inc = key
        info = ex.launched.get(key, {})
        gpus = info.get("gpus", [])
        W = len(gpus)
        refs = ex.refs.get(key) or []
        died: dict[int, tuple[float, str]] = {}
        raised: set[int] = set()
        deadline = time.time() + 2.0  # let peers fail on their own and write their errors
        while True:
            for r, ref in enumerate(refs):
                if r in died or r in raised:
                    continue
                ready, _ = ray.wait([ref], timeout=0)
                if not ready and ex.workers.host_dead(jid, inc, r):  # SIGKILLed: before Ray notices
                    died[r] = (time.time(), "its host process is gone")
                    continue
                if ready:
                    try:
                        ray.get(ref)
                    except ray.exceptions.RayActorError as e:  # its process died
                        died[r] = (time.time(), f"{type(e).__name__}")
                    except Exception:  # noqa: BLE001 - it raised (its error record says what)
                        raised.add(r)
            errs = [r for r in range(W) if ex.store.check([Keys.err(jid, inc, r)])]
            if len(set(errs) | set(died) | raised) >= W or time.time() > deadline:
                break
            time.sleep(0.05)
        errors = {r: read_json(ex.store, Keys.err(jid, inc, r)) for r in range(W)}
        errors = {r: e for r, e in errors.items() if e is not None}
        silent = {r: v for r, v in died.items() if r not in errors}
        stalled = [r for r in range(W) if r not in errors and r not in silent]
        job = ex.state.jobs[jid]
        ts = [e.get("t") for e in errors.values() if e.get("t") is not None]
        t_fail = max(ts) if ts else None
        events = [(e["time"], not is_peer_failure(e), r) for r, e in errors.items()]
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
        return err, t_fail, set(died) | {r for r, e in errors.items() if not is_peer_failure(e)}

    def on_failure(self, key: tuple[int, int], exc: BaseException | None, reason: str | None = None) -> None:
        """A worker of incarnation ``key`` failed (died, raised, or stalled). Recover: in partial
        mode, replace the dead workers and let the survivors go on; otherwise (or when that is not
        possible) restart the job from its last checkpoint, in place when it runs in this round.
        Raise :class:`JobFailed` once the job has used up ``max_restarts``."""
        ex = self.ex
        jid, inc = key
        if ex.inc.get(jid) != inc or ex.launched.get(key, {}).get("ended"):
            return
        t_detect = ex.now()
        j = ex.state.jobs[jid]
        running = ex.phase == "round" and jid in ex.round_decision and j.status is JobStatus.RUNNING
        W = len(ex.launched[key]["gpus"])
        self._abort_component(jid)
        if ex.cfg.recovery == "partial" and running and W > 1 and ex.refs.get(key):
            if self._recover_partial(key, t_detect):
                return
        err, t_fail, dead = self._failure_error(key, exc, reason)
        fin = read_json(ex.store, Keys.fin(jid, inc))
        ex.workers.kill_incarnation(key)
        ex.launched[key]["failed"] = True
        if fin is not None and fin["status"] in ("done", "paused"):
            # it failed after writing its final checkpoint and end record: nothing is lost
            ex.event("warning", job=jid, inc=inc, message=f"a worker failed after the incarnation ended "
                     f"({fin['status']}): {str(err).splitlines()[0]}")
            return
        self._count_failure(jid, err)
        try:
            c = self.checkpoint_iteration(jid)
        except CheckpointLost as e:
            self.give_up(jid, e)
            return
        lost, exact = ex.ledger.rollback(jid, c, t_fail)
        times = [e["time"] for e in err.errors.values() if e and e.get("time")]
        rec = {"job": jid, "inc": inc, "round": ex.state.round, "mode": "full", "t_detect": t_detect,
               "t_fail": (min(times) - ex.epoch) if times else None, "fail_iteration": t_fail,
               "resume_iteration": c, "iterations_lost": lost, "lost_exact": exact, "dead_ranks": sorted(dead),
               "error": str(err).splitlines()[0], "relaunched": running}
        ex.ledger.totals[jid]["restarts"] += 1
        ex.ledger.totals[jid]["recoveries"].append(rec)
        ex.event("job_failed", job=jid, inc=inc, message=str(err).splitlines()[0], recovery="full",
                 resume_iteration=c, iterations_lost=lost, lost_exact=exact)
        if running:
            self._relaunch(jid, rec)

    def _count_failure(self, jid: int, err: JobFailed) -> None:
        ex = self.ex
        tot = ex.ledger.totals[jid]
        tot["failures"] += 1
        if tot["failures"] > ex.cfg.max_restarts:
            ex.event("job_failed", job=jid, inc=ex.inc.get(jid), message=str(err).splitlines()[0],
                     final=True, failures=tot["failures"])
            if ex.cfg.max_restarts == 0:
                raise err
            first, _, rest = str(err).partition("\n")
            raise JobFailed(f"job {jid} ({ex.state.jobs[jid].model}) failed {tot['failures']} times, more than "
                            f"max_restarts={ex.cfg.max_restarts}: giving up. Last failure: {first}"
                            + (f"\n{rest}" if rest else ""), jid, err.rank, err.errors)

    def _abort_component(self, jid: int) -> None:
        """A job of a co-location component failed: its lockstep partners hold until the next round
        instead of waiting at the barrier for it."""
        rec = self.ex.last_records.get(jid)
        if rec is not None and int(rec.get("comp_size", 1)) > 1 and rec.get("action") in ("run", "hold"):
            self.ex.store.set(Keys.lk_abort(f"{rec['round']}.{rec['comp']}"), "1")

    def checkpoint_iteration(self, jid: int) -> int:
        """The iteration of the job's newest checkpoint that loads (0: none saved), which its next
        incarnation loads. A truncated newest one is dropped for the one before it (a ``warning``
        event and one echoed line); when no kept checkpoint loads, :class:`CheckpointLost` (one line)."""
        from .spb_checkpoint import CheckpointUnreadable, select_checkpoint

        try:
            return select_checkpoint(self.ex.checkpoint_dir(jid), log=lambda line: self._checkpoint_warning(jid, line))
        except CheckpointUnreadable as e:
            model = self.ex.state.jobs[jid].model
            raise CheckpointLost(f"job {jid} ({model}) cannot go on: {e}", jid, None, {}) from None

    def _checkpoint_warning(self, jid: int, line: str) -> None:
        self.ex.event("warning", job=jid, message=line)
        self.ex.echo(f"job {jid}: {line}")

    def _relaunch(self, jid: int, rec: dict) -> None:
        """Start a new incarnation of a failed job on the slots of this round's decision (the dead
        hosts restart; a warm spare host of the slot is used when there is one), from its
        checkpoint, within the round."""
        import ray

        ex = self.ex
        j = ex.state.jobs[jid]
        jd = ex.round_decision[jid]
        inc = ex.inc[jid] + 1
        eta = ex.costs.profile(j, jd.level, jd.pattern, jd.gpus).eta
        old = ex.last_records[jid]
        new = dict(old, inc=inc, finish_at=int(j.iteration + steps_to_finish(j, eta)),
                   action="hold" if ex.holding else "run")
        if int(old.get("comp_size", 1)) > 1:  # the component holds for the rest of the round (aborted)
            new.update(comp=10 ** 6 + jid, comp_size=1)
        ex.last_records[jid] = new
        ray.get(ex.hub.publish.remote(ex.run_id, {jid: new}))
        t_pub = ex.now()
        ex.workers.launch(jid, jd, resumed=True, t_pub=t_pub)
        rec["t_relaunch"] = t_pub
        rec["new_inc"] = inc

    def _recover_partial(self, key: tuple[int, int], t_detect: float) -> bool:
        """CPR-style partial recovery of incarnation ``key`` (docs/executor.md, "Fault tolerance"):
        wait for the survivors' recovery requests, start a replacement for every dead (or stalled)
        rank on a host of its slot, and name the source rank; the job goes on without rolling
        back. False when it cannot (no survivor, the incarnation already ended), for a full
        restart instead."""
        import ray

        ex = self.ex
        jid, inc = key
        info = ex.launched[key]
        gpus = info["gpus"]
        W = len(gpus)
        refs = ex.refs[key]
        gen = ex.gens.get(key, 0) + 1
        # survivors that sit between rounds notice a dead peer only at their next collective: wake them
        ray.get(ex.hub.publish.remote(ex.run_id, {jid: dict(ex.last_records[jid])}))
        dead: set[int] = set()
        rcv: dict[int, dict] = {}
        deadline = time.time() + max(3.0, min(10.0, ex.cfg.timeout_s))
        first_rcv = None
        while True:
            for r, ref in enumerate(refs):
                if r not in dead and ray.wait([ref], timeout=0)[0]:
                    try:
                        ray.get(ref)
                        return False  # a rank ended normally: the incarnation is over
                    except Exception:  # noqa: BLE001
                        dead.add(r)
                elif r not in dead and ex.workers.host_dead(jid, inc, r):  # before Ray notices (~2 s)
                    dead.add(r)
            for r in range(W):
                if r not in rcv and ex.store.check([Keys.rcv(jid, inc, gen, r)]):
                    rcv[r] = read_json(ex.store, Keys.rcv(jid, inc, gen, r))
                    first_rcv = first_rcv or time.time()
            # survivors notice a dead peer within milliseconds (a closed connection); one that has
            # not asked a second after the first did is dead or stalled
            if len(dead | set(rcv)) >= W or time.time() > deadline or \
                    (first_rcv is not None and time.time() > first_rcv + 1.0):
                break
            time.sleep(0.005)
        survivors = {r: v for r, v in rcv.items() if r not in dead}
        if not survivors or ex.store.check([Keys.fin(jid, inc)]):
            if survivors:
                ex.store.set(Keys.rgo(jid, inc, gen), json.dumps({"abort": True, "why": "incarnation ended"}))
            return False
        stalled = [r for r in range(W) if r not in dead and r not in survivors]
        for r in stalled:
            h = ex.workers.host_of(jid, inc, r)
            if h is not None:
                ex.pool.kill(h)
        dead |= set(stalled)
        if not dead:  # every rank asked (a spurious timeout): all go on, nobody is replaced
            pass
        errors = {r: read_json(ex.store, Keys.err(jid, inc, r)) for r in sorted(dead)}
        first = next((e for e in errors.values() if e and not is_peer_failure(e)), None)
        why = (f"worker rank(s) {sorted(dead)} died" + (f" ({first['type']}: {first['message']})" if first else "")
               if dead else "a collective timed out on every rank")
        self._count_failure(jid, JobFailed(f"job {jid} ({ex.state.jobs[jid].model}) failed: {why}",
                                           jid, min(dead) if dead else None, {r: e for r, e in errors.items() if e}))
        src = max(survivors, key=lambda r: (int(survivors[r]["t_done"]), -r))
        t_go = ex.now()
        for r in sorted(dead):
            old = ex.workers.host_of(jid, inc, r)
            if old is not None:
                old.owner = None
                old.mark_dirty()
            h = ex.pool.free_host(gpus[r])
            h.owner = (jid, inc, r)
            ex.pool.refresh(timeout_s=120.0, hosts=[h])
            refs[r] = h.handle.run_worker.remote(ex.workers.spec(ex.live_job(jid), inc, r, gpus, recover_gen=gen))
            info["hosts"][r] = h.name
        t_hosts = ex.now()
        ex.store.set(Keys.rgo(jid, inc, gen), json.dumps({"src": src, "t": int(survivors[src]["t_done"]),
                                                          "dead": sorted(dead), "gen": gen}))
        ex.gens[key] = gen
        t_done = int(survivors[src]["t_done"])
        rec = {"job": jid, "inc": inc, "round": ex.state.round, "mode": "partial", "gen": gen, "t_detect": t_detect,
               "t_fail": min(float(v["wall"]) for v in survivors.values()) - ex.epoch,
               "t_survivors": t_go, "t_hosts": t_hosts, "dead_ranks": sorted(dead), "src": src,
               "resume_iteration": t_done,
               "fail_iteration": max(int(v["t_done"]) for v in survivors.values()), "iterations_lost": 0,
               "lost_exact": True, "error": why}
        tot = ex.ledger.totals[jid]
        tot["partial_recoveries"] += 1
        tot["recoveries"].append(rec)
        ex.event("recover", job=jid, inc=inc, mode="partial", gen=gen, dead=sorted(dead), src=src,
                 resume_iteration=t_done, message=why)
        return True

    def wait_for(self, jids: list[int], pred: Callable[[int], bool], timeout_s: float, what: str,
                 poll: float = 0.002) -> None:
        """Wait until ``pred(job)`` holds for every job in ``jids``, handling worker failures on
        the way; a job still not there after ``timeout_s`` is a stalled job: a failure too."""
        ex = self.ex
        deadline = time.time() + timeout_s
        last_check = 0.0
        expired: dict[int, int] = {}
        while not all(pred(j) for j in jids):
            now = time.time()
            if now - last_check > 0.05:
                self.check_failures(ex.workers.current_keys(jids))
                last_check = now
            if now > deadline:
                reason = f"{what}: no report within {timeout_s:.0f} s (a worker stalled)"
                for jid in [j for j in jids if not pred(j)]:
                    key = (jid, ex.inc[jid])
                    expired[jid] = expired.get(jid, 0) + 1
                    if ex.launched.get(key, {}).get("ended") or expired[jid] > ex.cfg.max_restarts + 1:
                        ex.workers.kill_incarnation(key)  # nothing left to recover: a stall is final
                        raise JobFailed(f"job {jid} ({ex.state.jobs[jid].model}) failed: {reason}; stopped",
                                        jid, None, {})
                    self.on_failure(key, None, reason=reason)
                deadline = time.time() + timeout_s
            time.sleep(poll)

    def restart_lost(self, key: tuple[int, int]) -> None:
        """Cold restore: the incarnation died with the previous Ray session; the job goes back to its
        last checkpoint and waits (paused) for the scheduler to place it again."""
        ex = self.ex
        jid, inc = key
        ex.launched[key]["ended"] = True
        j = ex.state.jobs[jid]
        if j.status is not JobStatus.RUNNING:
            return
        try:
            c = self.checkpoint_iteration(jid)
        except CheckpointLost as e:
            self.give_up(jid, e)
            return
        last = j.iteration
        lost, exact = ex.ledger.rollback(jid, c, None)
        j.status, j.placement = JobStatus.PAUSED, ()
        rec = {"job": jid, "inc": inc, "round": ex.state.round, "mode": "scheduler_restart",
               "t_detect": ex.now(), "resume_iteration": c, "last_reported_iteration": last,
               "iterations_lost": lost, "lost_exact": exact}
        ex.ledger.totals[jid]["recoveries"].append(rec)
        ex.event("job_restart", job=jid, inc=inc, reason="scheduler restarted without its Ray session",
                 resume_iteration=c, iterations_lost=lost)

    def reconcile_ended(self, key: tuple[int, int], fin: dict) -> None:
        """Warm restore: an incarnation ended (done, paused, stopped) while no scheduler was there
        to read its reports; account for it from its end record and its checkpoint."""
        ex = self.ex
        jid, inc = key
        j = ex.state.jobs[jid]
        tot = ex.ledger.totals[jid]
        try:
            t = int(fin["t"]) if fin["status"] in ("done", "paused") else self.checkpoint_iteration(jid)
        except CheckpointLost as e:
            ex.workers.end_incarnation(key)
            self.give_up(jid, e)
            return
        ex.ledger.rollback(jid, t, t)  # credits the unreported iterations up to t at the round's eta
        ex.workers.end_incarnation(key)
        if fin["status"] == "done":
            j.progress, j.status, j.placement = j.iterations, JobStatus.DONE, ()
            j.finish_s = fin["wall"] - ex.epoch
            tot.update(accuracy=fin.get("accuracy"), final_hash=fin.get("hash"), finish_wall=fin["wall"])
            if j.job_id in ex.state.active_ids:
                ex.state.active_ids.remove(j.job_id)
        else:
            j.status, j.placement = JobStatus.PAUSED, ()
        ex.event("reconcile", job=jid, inc=inc, status=fin["status"], iteration=t)
