"""The live executor's incarnations: starting a job's workers on the hosts of its slots, and
stopping, collecting or killing them (docs/executor.md). The executor keeps the bookkeeping
(``inc``, ``refs``, ``launched``, ``detached``); this part acts on it.
"""
from __future__ import annotations

import time

from jigsaw_env.state import JobDecision

from .control import Keys, WorkerSpec, read_json
from .live_types import LiveJob

__all__ = ["Incarnations"]


class Incarnations:
    """Start and stop the workers of a :class:`~jigsaw_executor.live.LiveExecutor` ``ex``'s
    incarnations on its slot pool (``ex.pool``)."""

    def __init__(self, ex):
        self.ex = ex

    def launch(self, jid: int, jd: JobDecision, resumed: bool, t_pub: float) -> None:
        """Start the job's next incarnation: one worker per slot of ``jd`` on a free host of that
        slot (``t_pub``: when its decision record was published, seconds since the epoch)."""
        ex = self.ex
        job = ex.live_job(jid)
        inc = ex.inc.get(jid, -1) + 1
        ex.inc[jid] = inc
        chosen = []
        for w, g in enumerate(jd.gpus):
            h = ex.pool.free_host(g)
            h.owner = (jid, inc, w)
            chosen.append(h)
        ex.pool.refresh(timeout_s=120.0, hosts=chosen)  # a host whose process died restarts first
        refs = [h.handle.run_worker.remote(self.spec(job, inc, w, jd.gpus)) for w, h in enumerate(chosen)]
        ex.refs[(jid, inc)] = refs
        ex.launched[(jid, inc)] = {"gpus": list(jd.gpus), "t_launch": t_pub, "resumed": bool(resumed),
                                   "hosts": [h.name for h in chosen], "ended": False, "round": ex.state.round}
        ex.ledger.totals[jid]["incarnations"] += 1
        ex.event("launch", job=jid, inc=inc, gpus=list(jd.gpus), resumed=bool(resumed),
                 hosts=[h.name for h in chosen], level=jd.level, pattern=jd.pattern.value)

    def spec(self, job: LiveJob, inc: int, w: int, gpus, recover_gen: int = 0) -> WorkerSpec:
        """What rank ``w`` of incarnation ``inc`` of ``job`` on slots ``gpus`` runs."""
        ex = self.ex
        return WorkerSpec(run_id=ex.run_id, job_id=job.job_id, incarnation=inc, rank=w, world=len(gpus),
                          slot=int(gpus[w]), model=job.model, batch_size=int(job.batch_size),
                          store_host=ex.store_addr[0], store_port=int(ex.store_addr[1]),
                          store_token=ex.store_token,
                          checkpoint_dir=str(ex.checkpoint_dir(job.job_id)), data=job.data, seed=job.seed,
                          lr=job.lr, spb=ex.cfg.spb, link=ex.cfg.link, timeout_s=ex.cfg.timeout_s,
                          hold_timeout_s=ex.cfg.hold_timeout_s, measure_activations=ex.cfg.measure_activations,
                          evaluate=ex.cfg.evaluate, fail_at=ex.fail_at.get(job.job_id),
                          checkpoint_every=ex.cfg.checkpoint_every, recovery=ex.cfg.recovery,
                          recover_gen=recover_gen, count_loopback=ex.cfg.count_loopback)

    def current_keys(self, jids) -> list[tuple[int, int]]:
        """The (job, incarnation) of each job's current incarnation (jobs never launched left out)."""
        return [(jid, self.ex.inc[jid]) for jid in jids if jid in self.ex.inc]

    def host_dead(self, jid: int, inc: int, rank: int) -> bool:
        """Whether the host process of that rank is known to be gone."""
        h = self.host_of(jid, inc, rank)
        return h is not None and self.ex.pool.alive(h) is False

    def host_of(self, jid: int, inc: int, rank: int):
        """The host running that rank, or None."""
        for h in self.ex.pool.owned_by(jid, inc):
            if h.owner is not None and h.owner[2] == rank:
                return h
        return None

    def kill_incarnation(self, key: tuple[int, int]) -> None:
        """Stop every worker of the incarnation: kill the hosts whose worker still runs (a host
        whose worker died is restarting already) and release them."""
        import ray

        ex = self.ex
        jid, inc = key
        refs = ex.refs.pop(key, None) or []
        # a rank that wrote an error record is on its way out (a peer failure: it returns, and its
        # host stays warm): give it a moment instead of killing its host
        leaving = [ref for r, ref in enumerate(refs) if ex.store.check([Keys.err(jid, inc, r)])]
        if leaving:
            ray.wait(leaving, num_returns=len(leaving), timeout=2.0)
        for h in ex.pool.owned_by(jid, inc):
            r = h.owner[2]
            ref = refs[r] if r < len(refs) else None
            if ref is None or not ray.wait([ref], timeout=0)[0]:
                ex.pool.kill(h)
            else:
                h.owner = None
                try:
                    ray.get(ref, timeout=0)
                except ray.exceptions.RayActorError:  # its process died: restarting
                    h.mark_dirty()
                except Exception:  # noqa: BLE001 - the worker raised; its process is up
                    pass
        ex.detached.discard(key)
        if key in ex.launched:
            ex.launched[key]["ended"] = True

    def end_incarnation(self, key: tuple[int, int], timeout_s: float | None = None) -> list | None:
        """Collect the ranks' results of an incarnation that ended (paused, done, stopped); a rank
        that died after its end record was written loses nothing (logged)."""
        import ray

        ex = self.ex
        refs = ex.refs.pop(key, None)
        results = None
        if refs:
            try:
                results = ray.get(refs, timeout=timeout_s or ex.cfg.timeout_s)
            except Exception as e:  # noqa: BLE001
                fin = read_json(ex.store, Keys.fin(*key))
                if fin is None or fin["status"] not in ("done", "paused"):
                    ex.refs[key] = refs
                    ex.recovery.on_failure(key, e)
                    return None
                ex.event("warning", job=key[0], inc=key[1],
                         message=f"a worker failed after its end record ({fin['status']}): {type(e).__name__}")
                self.kill_incarnation(key)
        ex.detached.discard(key)
        ex.pool.release(*key)
        if key in ex.launched:
            ex.launched[key]["ended"] = True
        return results

    def abort(self) -> None:
        """Stop every running incarnation (no checkpoint): publish ``stop``, then kill stragglers."""
        import ray

        ex = self.ex
        live = [k for k, v in ex.launched.items() if not v.get("ended")]
        if live:
            try:
                recs = {jid: {"round": ex.state.round, "inc": inc, "action": "stop", "gpus": [], "level": 0,
                              "pattern": "rotating", "comp": -1, "comp_size": 1, "steps": -1, "finish_at": 10 ** 12}
                        for jid, inc in live}
                ray.get(ex.hub.publish.remote(ex.run_id, recs), timeout=10)
            except Exception:  # noqa: BLE001
                pass
            deadline = time.time() + 3.0
            for key in live:
                refs = ex.refs.get(key) or []
                try:
                    ray.get(refs, timeout=max(0.1, deadline - time.time()))
                except Exception:  # noqa: BLE001
                    pass
                self._kill_if_busy(key)

    def _kill_if_busy(self, key) -> None:
        """Kill the hosts of an incarnation whose workers still run; release them."""
        import ray

        ex = self.ex
        refs = ex.refs.pop(key, None) or []
        ready, not_ready = ray.wait(refs, num_returns=len(refs), timeout=0) if refs else ([], [])
        if not_ready or (key in ex.detached):
            for h in ex.pool.owned_by(*key):
                ex.pool.kill(h)
        ex.pool.release(*key)
        if key in ex.launched:
            ex.launched[key]["ended"] = True
