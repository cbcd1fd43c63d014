"""FIFO: first come, first served, full backprop, exclusive consolidated GPUs, no preemption."""
from __future__ import annotations

from jigsaw_env.state import ClusterState, Decision, JobStatus

from .base import Scheduler, register_scheduler


@register_scheduler("fifo")
class FIFO(Scheduler):
    """Running jobs keep their GPUs; waiting jobs start in arrival order on consolidated exclusive
    GPUs. Strict FIFO: the first waiting job that does not fit blocks the ones behind it
    (head-of-line blocking, as a plain FIFO queue does)."""

    def quiet_until(self, state: ClusterState) -> float:
        # the decision depends only on which jobs are running or waiting, and their order
        return float("inf")

    def schedule(self, state: ClusterState) -> Decision:
        ledger = self.ledger(state)
        jobs = state.jobs
        for jid in state.active_ids:  # stops at the first job that does not fit: no list of all
            job = jobs[jid]
            if job.status is JobStatus.RUNNING:
                continue
            jd = ledger.place(job, "consolidated", 0)
            if jd is None:
                break
            ledger.add(job.job_id, jd)
        return ledger.decision
