"""A scheduler defined outside the ``agents`` package, for tests/agents/test_plugins.py (a plug-in as a
user would write one: no registration, used by its import path or an entry point)."""
from __future__ import annotations

from agents.base import Scheduler
from jigsaw_env.state import ClusterState, Decision, JobStatus


class SmallestFirst(Scheduler):
    """Start waiting jobs by GPU count (then arrival), consolidated, full backprop; never preempt."""

    def schedule(self, state: ClusterState) -> Decision:
        ledger = self.ledger(state)
        waiting = [j for j in state.active() if j.status is not JobStatus.RUNNING]
        for job in sorted(waiting, key=lambda j: (j.num_gpus, j.arrival_s, j.job_id)):
            ledger.place_and_add(job, "consolidated", level=0)
        return ledger.decision


class NotAScheduler:
    """Has a ``schedule`` method but is no Scheduler subclass."""

    def schedule(self, state):
        return Decision()
