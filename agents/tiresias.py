"""Tiresias: discretized 2D-LAS with no knowledge of job durations (Gu et al., NSDI 2019)."""
from __future__ import annotations

from typing import Sequence

from jigsaw_env.state import ClusterState, Decision

from .base import Scheduler, register_scheduler
from .common import LASQueues, exclusive_by_priority, parse_thresholds


@register_scheduler("tiresias")
class Tiresias(Scheduler):
    """Priority = attained service in GPU-seconds, discretized into queues by ``thresholds``
    (default one threshold at 3600 GPU-s: two queues, which the paper found enough); FIFO by
    arrival inside a queue; preemptive. Each round the desired set is taken top-down by priority
    until GPUs run out (jobs that do not fit are skipped), running jobs that stay keep their GPUs,
    new ones get consolidated exclusive GPUs, the rest are preempted. Starvation guard: a job
    waiting longer than ``starve_factor`` x its last run is promoted to queue 0 (None: off).
    """

    def __init__(self, thresholds: Sequence[float] | str | float = (3600.0,), starve_factor: float | None = 10.0):
        self.las = LASQueues(parse_thresholds(thresholds), starve_factor)

    def reset(self) -> None:
        self.las.reset()

    def _state(self) -> dict:
        return {"las": self.las.state_dict()}  # the LAS bookkeeping; its queues are a cache

    def _load_state(self, d: dict) -> None:
        self.las.load_state_dict(d.get("las"))

    def quiet_until(self, state: ClusterState) -> float:
        return self.las.quiet_until(state)

    def schedule(self, state: ClusterState) -> Decision:
        self.las.observe(state)
        return exclusive_by_priority(state, self.las.order_active(state)).decision
