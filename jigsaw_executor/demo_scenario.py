"""The demo's scenario hook for ``jigsaw deploy --demo`` (:mod:`jigsaw_executor.deploy`, docs/deploy.md).

:class:`DemoScenario` guarantees the two events the demo must show whatever the policy does: a
preemption by round ``preempt_by_round`` and an SPB level change by round ``level_by_round``. The
live executor applies it to every round's decision, and the decision log's replay
(:mod:`jigsaw_executor.decision_log`) and a resumed run (:mod:`jigsaw_executor.live_persistence`)
rebuild it from its dictionary.
"""
from __future__ import annotations

from dataclasses import dataclass

from jigsaw_env.placement import GpuLedger
from jigsaw_env.spb import Pattern
from jigsaw_env.state import ClusterState, Decision, JobDecision, JobStatus

from .policies import start_where_they_fit

__all__ = ["DemoScenario"]


@dataclass(frozen=True)
class DemoScenario:
    """Forces a preemption and an SPB level change if the policy has not made them by the given
    rounds (:mod:`jigsaw_executor.deploy`'s docstring). A pure function of the state, so the replay re-applies it."""

    preempt_by_round: int = 5
    level_by_round: int = 7
    level_to: int = 2

    def to_dict(self) -> dict:
        return {"preempt_by_round": self.preempt_by_round, "level_by_round": self.level_by_round,
                "level_to": self.level_to}

    state_dict = to_dict

    @classmethod
    def from_dict(cls, d: dict) -> "DemoScenario":
        return cls(**d)

    from_state_dict = from_dict

    def __call__(self, state: ClusterState, decision: Decision) -> tuple[Decision, list[dict]]:
        dec = Decision(decision)
        forced: list[dict] = []
        jobs = state.jobs.values()
        if state.round >= self.preempt_by_round and sum(j.preemptions for j in jobs) == 0:
            running = sorted((j for j in state.running() if j.job_id in dec),
                             key=lambda j: (-j.attained_gpu_s, j.job_id))
            waiting = [j for j in state.active() if j.status is not JobStatus.RUNNING and j.job_id not in dec]
            # the victim: the running job with the most attained service (the one LAS would
            # demote first); waiting jobs that now fit take its slots (level 0, consolidated)
            for victim in running[:1]:
                led = GpuLedger(state, Decision({k: v for k, v in dec.items() if k != victim.job_id}))
                started = start_where_they_fit(led, waiting)
                dec = led.decision
                forced.append({"kind": "preempt", "job": victim.job_id, "started": started})
        if state.round >= self.level_by_round and sum(j.level_changes for j in jobs) == 0 \
                and not any(f["kind"] == "preempt" for f in forced):
            owners: dict[int, int] = {}
            for jid, jd in dec.items():
                for g in jd.gpus:
                    owners[g] = owners.get(g, 0) + 1
            for j in sorted(state.running(), key=lambda j: j.job_id):
                jd = dec.get(j.job_id)
                if jd is None or jd.gpus != j.placement or (jd.level, jd.pattern) != (j.level, j.pattern):
                    continue
                if any(owners[g] > 1 for g in jd.gpus):
                    continue
                to = self.level_to if j.level == 0 else 0
                new = JobDecision(jd.gpus, to, Pattern.ROTATING)
                led = GpuLedger(state, Decision({k: v for k, v in dec.items() if k != j.job_id}))
                if led.fits(j.job_id, new):
                    dec[j.job_id] = new
                    forced.append({"kind": "level", "job": j.job_id, "from": j.level, "to": to})
                    break
        return dec, forced
