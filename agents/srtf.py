"""SRTF: shortest remaining time first, with oracle remaining times, preemptive."""
from __future__ import annotations

from jigsaw_env.remaining import remaining_gpu_s, remaining_isolated_s
from jigsaw_env.state import ClusterState, Decision

from .base import Scheduler, register_scheduler
from .common import exclusive_by_priority


@register_scheduler("srtf")
class SRTF(Scheduler):
    """Each round, order the arrived jobs by remaining isolated run time (oracle: it reads the
    job's remaining iterations) and run them top-down on exclusive consolidated GPUs until GPUs
    run out; a job that does not fit is skipped (backfilling). Running jobs that stay keep their
    GPUs; the others are preempted. Full backprop.

    Remaining time = ``job.remaining x costs.isolated_iteration_s(job)``: wall-clock seconds alone on
    dedicated consolidated GPUs. This is remaining *time*, not GPU-time: a wide short job goes ahead
    of a narrow long one (docs/schedulers.md explains the choice; ``gpu_time=True`` multiplies by the
    job's GPU count instead).
    """

    def __init__(self, gpu_time: bool = False):
        self.gpu_time = bool(gpu_time)

    def remaining_s(self, state: ClusterState, job) -> float:
        return remaining_gpu_s(state, job) if self.gpu_time else remaining_isolated_s(state, job)

    def quiet_until(self, state: ClusterState) -> float:
        # between arrivals and completions only running jobs' remaining times fall: they can only
        # move up past waiting jobs, which therefore still do not get GPUs; nothing else changes
        return float("inf")

    def schedule(self, state: ClusterState) -> Decision:
        order = sorted(state.active(), key=lambda j: (self.remaining_s(state, j), j.arrival_s, j.job_id))
        return exclusive_by_priority(state, order).decision
