"""The live executor's progress ledger: per job, the iterations, time, bytes and recoveries of a
run (the ``totals`` of ``summary.json``), which iterations were credited at which eta (so that a
rollback to a checkpoint takes back exactly what the simulator would not have credited), and the
reading of a round's worker reports into the cluster state (docs/executor.md).
"""
from __future__ import annotations

import numpy as np

from jigsaw_env.spb import Pattern
from jigsaw_env.state import Decision, JobStatus

from .control import Keys, read_json
from .live_types import none_if_nan

__all__ = ["ProgressLedger"]


class ProgressLedger:
    """Per-job accounting of a :class:`~jigsaw_executor.live.LiveExecutor` ``ex``: ``totals``
    (job id -> counters, :meth:`new_totals`), the eta segments of the iterations credited
    (:meth:`credit`, :meth:`rollback`), the round's reports into the state (:meth:`collect`) and the
    run's summary (:meth:`summary`)."""

    def __init__(self, ex, job_ids):
        self.ex = ex
        self.totals: dict[int, dict] = {jid: self.new_totals() for jid in job_ids}

    @staticmethod
    def new_totals() -> dict:
        return {"iterations": 0, "stepping_s": 0.0, "bytes": 0, "wire": 0, "losses": [], "accuracy": None,
                "incarnations": 0, "levels": {}, "peak_act": [], "startup_s": [], "final_hash": None,
                "start_groups": {}, "finish_wall": None, "checkpoint_s": 0.0, "failures": 0, "restarts": 0,
                "partial_recoveries": 0, "iterations_lost": 0, "recoveries": [], "eta_segments": [],
                "rank_hashes": None, "loopback_bytes": None}

    def credit(self, jid: int, t0: int, t1: int, eta: float) -> None:
        """Record that iterations ``t0`` .. ``t1 - 1`` of job ``jid`` were credited at ``eta``
        (progress per iteration, in full-backprop-equivalent iterations)."""
        if t1 <= t0:
            return
        segs = self.totals[jid]["eta_segments"]
        if segs and segs[-1][1] == t0 and segs[-1][2] == eta:
            segs[-1][1] = t1
        else:
            segs.append([int(t0), int(t1), float(eta)])

    def progress_at(self, jid: int, c: int) -> float:
        """The progress credited to job ``jid`` for its first ``c`` iterations."""
        j = self.ex.state.jobs[jid]
        p = sum((min(t1, c) - t0) * eta for t0, t1, eta in self.totals[jid]["eta_segments"] if t0 < c)
        return float(min(j.iterations, p))

    def rollback(self, jid: int, c: int, t_fail: int | None) -> tuple[int, bool]:
        """Put the job's state back to its checkpoint at iteration ``c``. Iterations the checkpoint
        holds beyond the last report (a checkpoint taken inside the failed round) are credited at
        the round's eta. Returns (iterations lost, whether that count is exact: it is a lower bound
        when no worker said how far it got)."""
        j = self.ex.state.jobs[jid]
        tot = self.totals[jid]
        last = j.iteration
        if c > last:
            eta = self.current_eta(jid)
            self.credit(jid, last, c, eta)
            tot["iterations"] += c - last
        reached = max(x for x in (t_fail, last, c) if x is not None)
        lost = int(reached - c)
        tot["iterations_lost"] += lost
        exact = t_fail is not None
        tot["eta_segments"] = [[t0, min(t1, c), eta] for t0, t1, eta in tot["eta_segments"] if t0 < c]
        j.progress = self.progress_at(jid, c)
        j.iteration = int(c)
        if j.status is JobStatus.DONE:
            j.status = JobStatus.PAUSED
        return lost, exact

    def current_eta(self, jid: int) -> float:
        """The eta of the job's configuration in this round's decision (else its last credited one)."""
        ex = self.ex
        j = ex.state.jobs[jid]
        jd = ex.round_decision.get(jid)
        if jd is not None:
            return ex.costs.profile(j, jd.level, jd.pattern, jd.gpus).eta
        segs = self.totals[jid]["eta_segments"]
        return segs[-1][2] if segs else 1.0

    def collect(self, r: int, decision: Decision, t_start: float, t_end: float) -> dict:
        """Read round ``r``'s reports of the jobs in ``decision`` and advance the state as the
        simulator does (progress at each iteration's eta, iterations, run and attained time,
        completion); the round's outcome per job (the decision log's ``outcome``)."""
        st = self.ex.state
        outcome = {str(jid): self._collect_job(r, jid, jd, t_start, t_end) for jid, jd in decision.items()}
        st.active_ids = [x for x in st.active_ids if st.jobs[x].status is not JobStatus.DONE]
        return outcome

    def _collect_job(self, r: int, jid: int, jd, t_start: float, t_end: float) -> dict:
        """One job's reports of round ``r`` into the state and its totals; its outcome record."""
        ex = self.ex
        st = ex.state
        j = st.jobs[jid]
        inc = ex.inc[jid]
        W = len(jd.gpus)
        # a rank that failed after its incarnation's end record may have left no report
        reps = [read_json(ex.store, Keys.rep(jid, inc, r, w)) or {"rank": w, "slot": jd.gpus[w], "iterations": []}
                for w in range(W)]
        its = [rep["iterations"] for rep in reps]
        # a replacement rank (partial recovery) lacks the iterations before it joined: the
        # rank with the most reports stands for the job
        ref = max(its, key=len)
        by_t = [{it["t"]: it for it in rk} for rk in its]
        n = len(ref)
        fin = read_json(ex.store, Keys.fin(jid, inc))
        finished = fin is not None and fin["status"] == "done"
        info = ex.launched[(jid, inc)]
        ready = read_json(ex.store, Keys.ready(jid, inc))
        started_now = info["round"] == r
        startup = None
        if started_now and n:
            startup = ref[0]["wall"] - ex.epoch - info["t_launch"]
        # progress exactly as the simulator credits it: eta of each iteration's configuration
        gain = 0.0
        for it in ref:
            eta = ex.costs.profile(j, int(it["lvl"]), Pattern.parse(it["pat"]), jd.gpus).eta
            gain += eta
            self.credit(jid, int(it["t"]), int(it["t"]) + 1, eta)
        gain = min(j.remaining, gain)
        j.progress += gain
        j.iteration += n
        if n and ref[-1]["t"] + 1 != j.iteration:
            ex.event("warning", job=jid,
                     message=f"iteration counter {j.iteration} != worker's {ref[-1]['t'] + 1}")
            j.iteration = ref[-1]["t"] + 1
        stepping = float(sum(it["iter_s"] or 0.0 for it in ref))
        j.run_s += stepping
        end = (fin["wall"] - ex.epoch) if finished else t_end
        j.attained_gpu_s += max(0.0, end - t_start) * j.num_gpus
        bytes_ = int(sum(it["bytes"] for rk in its for it in rk))
        wire = int(sum(it["wire"] for it in ref))
        loss = [float(np.mean([bt[it["t"]]["loss"] for bt in by_t if it["t"] in bt])) for it in ref]
        ckpt_s = float(sum(it.get("ckpt_s", 0.0) for it in ref))
        # the kernel's loopback count around the syncs of the rank that stands for the job (every
        # process of the machine in those windows); None unless every iteration has one
        lo = [it.get("lo") for it in ref]
        lo_bytes = int(sum(lo)) if lo and all(x is not None for x in lo) else None
        tot = self.totals[jid]
        peaks = self._add_to_totals(tot, jd, its, n, stepping=stepping, ckpt_s=ckpt_s, bytes_=bytes_, wire=wire,
                                    loss=loss)
        if startup is not None:
            tot["startup_s"].append(startup)
        if lo_bytes is not None:
            tot["loopback_bytes"] = (tot.get("loopback_bytes") or 0) + lo_bytes
        if started_now:
            ex.event("ready", job=jid, inc=inc, loaded_hash=ready and ready.get("loaded_hash"),
                     resumed_at=ready and ready.get("t"), setup_s=ready and ready.get("setup_s"),
                     startup_s=startup)
        self._note_recoveries(jid)
        ex.folder.log_iterations(jid, inc, r, reps, ref, by_t)
        if finished:
            j.progress = j.iterations
            j.status = JobStatus.DONE
            j.finish_s = fin["wall"] - ex.epoch
            j.placement = ()
            tot["accuracy"] = fin.get("accuracy")
            tot["final_hash"] = fin.get("hash")
            tot["finish_wall"] = fin["wall"]
            results = ex.workers.end_incarnation((jid, inc))
            if results:
                tot["rank_hashes"] = [x.get("hash_full") or x.get("hash") for x in results]
            ex.event("done", job=jid, inc=inc, iteration=fin["t"], jct_s=j.finish_s - j.arrival_s,
                     accuracy=fin.get("accuracy"), hash=fin.get("hash"))
        return {
            "job_id": jid, "inc": inc, "gpus": list(jd.gpus), "level": jd.level, "pattern": jd.pattern.value,
            "iterations": n, "first_iteration": ref[0]["t"] if n else None, "stepping_s": stepping,
            "mean_iter_s": stepping / n if n else None,
            "median_iter_s": float(np.median([it["iter_s"] or 0.0 for it in ref])) if n else None,
            "bytes": bytes_, "bytes_per_iter": bytes_ / n if n else None, "wire_per_iter": wire / n if n else None,
            "loopback_bytes": lo_bytes,
            "loss_last": loss[-1] if loss else None, "progress_gain": gain, "finished": finished,
            "finish_s": j.finish_s if finished else None, "startup_s": startup,
            "setup_s": ready["setup_s"] if (ready and started_now) else None,
            "resumed": bool(info["resumed"]) and started_now, "started": started_now,
            "peak_activation_bytes": peaks,
            "start_groups": [sorted({it["sg"] for it in rk}) for rk in its],
            "recoveries": sum(1 for x in self.totals[jid]["recoveries"] if x.get("round") == r),
        }

    @staticmethod
    def _add_to_totals(tot: dict, jd, its: list[list[dict]], n: int, *, stepping: float, ckpt_s: float, bytes_: int,
                       wire: int, loss: list[float]) -> list[int]:
        """Add a round's reports (``its``: every rank's iteration records, ``n`` iterations) to a
        job's totals; the ranks' peak activation bytes in the round."""
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
        tot["peak_act"] = [max(a, b) for a, b in zip(tot["peak_act"] or [0] * len(its), peaks)]
        return peaks

    def _note_recoveries(self, jid: int) -> None:
        """Complete the job's recovery records: when the restored workers were ready (full: the new
        incarnation loaded its checkpoint; partial: the new process-group generation has the
        source's state) and how long the job was held up."""
        ex = self.ex
        for rec in self.totals[jid]["recoveries"]:
            if rec.get("t_ready") is not None:
                continue
            if rec["mode"] == "partial":
                ok = read_json(ex.store, Keys.rok(jid, rec["inc"], rec["gen"]))
                if ok is not None:
                    rec.update(t_ready=ok["wall"] - ex.epoch, state_bytes=ok["state_bytes"], join_s=ok["join_s"])
            elif rec.get("new_inc") is not None:
                ready = read_json(ex.store, Keys.ready(jid, rec["new_inc"]))
                if ready is not None:
                    rec.update(t_ready=ready["wall"] - ex.epoch, loaded_iteration=ready["t"],
                               setup_s=ready["setup_s"])
            if rec.get("t_ready") is not None:
                rec["recovery_s"] = rec["t_ready"] - rec["t_detect"]

    def summary(self) -> dict:
        """The run's summary (``summary.json``): per job and in all."""
        ex = self.ex
        st = ex.state
        jobs = {}
        for j in sorted(st.jobs.values(), key=lambda j: j.job_id):
            tot = self.totals[j.job_id]
            n = tot["iterations"]
            jobs[j.job_id] = {
                "job_id": j.job_id, "model": j.model, "num_gpus": j.num_gpus, "batch_size": j.batch_size,
                "arrival_s": j.arrival_s, "start_s": none_if_nan(j.first_start_s), "finish_s": none_if_nan(j.finish_s),
                "jct_s": none_if_nan(j.finish_s - j.arrival_s), "status": j.status.value,
                "iterations": n, "work_iterations": j.iterations, "progress": j.progress,
                "mean_iter_s": tot["stepping_s"] / n if n else None,
                "bytes_sent": tot["bytes"], "bytes_per_iter": tot["bytes"] / n if n else None,
                "loopback_bytes": tot.get("loopback_bytes"),
                "final_loss": float(np.mean(tot["losses"][-10:])) if tot["losses"] else None,
                "heldout_accuracy": tot["accuracy"], "preemptions": j.preemptions, "migrations": j.migrations,
                "level_changes": j.level_changes, "incarnations": tot["incarnations"], "levels_used": tot["levels"],
                "start_groups": tot["start_groups"], "peak_activation_bytes": tot["peak_act"],
                "startup_s": tot["startup_s"], "final_hash": tot["final_hash"],
                "rank_hashes": tot.get("rank_hashes"), "checkpoint_s": tot.get("checkpoint_s", 0.0),
                "failures": tot.get("failures", 0), "restarts": tot.get("restarts", 0),
                "partial_recoveries": tot.get("partial_recoveries", 0),
                "iterations_lost": tot.get("iterations_lost", 0), "final_iteration": j.iteration,
                "recoveries": tot.get("recoveries", []), "error": tot.get("error"),
            }
        failed = ex.failed_jobs()
        fin = [v["finish_s"] for v in jobs.values() if v["finish_s"] is not None]
        # the makespan of the jobs that ended (a job given up has none)
        return {"run_id": ex.run_id, "rounds": st.round, "slots": ex.cfg.slots,
                "scheduler": ex.scheduler_spec,
                "makespan_s": max(fin) if fin and len(fin) + len(failed) == len(jobs) else None,
                "failed_jobs": failed,
                "preemptions": sum(v["preemptions"] for v in jobs.values()),
                "level_changes": sum(v["level_changes"] for v in jobs.values()), "jobs": jobs}
