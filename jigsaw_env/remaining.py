"""Two-dimensional shortest-remaining-service-first (2D-SRTF): an oracle priority.

A job's *remaining service* is the GPU-seconds it still needs alone: its remaining iterations x
its isolated iteration time (``CostModel.isolated_iteration_s``: dedicated consolidated GPUs,
full backprop) x its GPUs. Jobs are served from the least remaining service up, ties by arrival
and id. It is the clairvoyant counterpart of Tiresias's 2D-LAS (:mod:`jigsaw_env.las`), which
orders by attained GPU-seconds because durations are unknown; here they are read from the job
(``JobState.remaining``), as the ``srtf`` scheduler and the observation's oracle features do.
Shortest-remaining-first minimizes mean completion time on one machine (Schrage, "A proof of the
optimality of the shortest remaining processing time discipline", Operations Research 16, 1968);
weighting time by GPUs is Tiresias's "2D" argument (Gu et al., NSDI 2019, section 4.1).

:class:`RemainingOrder` has the interface the heuristics use for their priority (``observe``,
``order_active``, ``quiet_until``, ``state_dict``), so a scheduler takes either order;
:func:`remaining_rank` is the same order as the ranks the env's window takes (``window_order``).
"""
from __future__ import annotations

from .state import ClusterState, JobState

#: the name of this order where a scheduler or the env's window names its order
ORDER_NAME = "2d-srtf"


def remaining_isolated_s(state: ClusterState, job: JobState) -> float:
    """The seconds ``job`` still needs alone on dedicated consolidated GPUs: remaining iterations x
    isolated iteration time (s)."""
    return job.remaining * state.costs.isolated_iteration_s(job)


def remaining_gpu_s(state: ClusterState, job: JobState) -> float:
    """The GPU-seconds ``job`` still needs alone: :func:`remaining_isolated_s` x GPUs."""
    return remaining_isolated_s(state, job) * job.num_gpus


def remaining_order(state: ClusterState) -> list[JobState]:
    """Every active job from the least remaining GPU-seconds up (ties: arrival, then id)."""
    return sorted(state.active(), key=lambda j: (remaining_gpu_s(state, j), j.arrival_s, j.job_id))


def remaining_rank(state: ClusterState) -> dict[int, int]:
    """Job id -> position in :func:`remaining_order` (0: the highest priority)."""
    return {j.job_id: i for i, j in enumerate(remaining_order(state))}


class RemainingOrder:
    """2D-SRTF as a scheduler's priority (module docstring). It keeps no history: the order is a
    function of the state alone, so :meth:`observe` and the state dict are empty."""

    name = ORDER_NAME

    def reset(self) -> None:
        """Nothing to forget (no history)."""

    def observe(self, state: ClusterState) -> None:
        """Nothing to record (no history)."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, d: dict | None) -> None:
        if d:
            raise ValueError(f"a {ORDER_NAME} order keeps no state, got {sorted(d)!r}")

    def order_active(self, state: ClusterState) -> list[JobState]:
        """:func:`remaining_order`."""
        return remaining_order(state)

    def quiet_until(self, state: ClusterState) -> float:
        """``state.time_s``: no promise. Running jobs' remaining service falls at their own paces
        (a paired or partially backpropagating job slower), so two running jobs can swap places
        in any round, and a heuristic reads their ranks (which host takes a guest, who is
        displaced): it is asked every round."""
        return state.time_s
