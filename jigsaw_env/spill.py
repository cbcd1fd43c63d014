"""Spilling waiting jobs onto shared GPUs: no job waits beside GPUs that could hold it.

A data-parallel job runs on all its GPUs or not at all, so a priority scheduler leaves a wide job
waiting while fewer GPUs than it needs stand free, and those GPUs idle until enough of the
cluster drains. Spilling runs such a job anyway, on GPUs other jobs already use: co-located
workers run at the fitted co-location rates (docs/colocation.md), and two processes on one GPU
usually do more work together than either alone, so the waiting job makes progress and the
GPUs do more work, at some cost in speed to the jobs it joins.

The rule (:func:`spill_waiting`), applied to a decision after the scheduler has made it:

1. Go through the jobs the decision leaves waiting, from the highest priority down.
2. A job that the free GPUs (GPUs with no worker) can hold runs on them, on the fewest nodes
   (``GpuLedger``'s ``consolidated`` option).
3. Otherwise it takes every free GPU and, for the rest, GPUs where it can share: GPUs below the
   workers-per-GPU cap with memory left for its process's peak, those of the lowest-priority job
   first (ties: the lower GPU index). Its workers go in (node, GPU) order.
4. Either way at full backprop (SPB level 0), and only if the placement passes the ledger's checks
   (memory at every process's peak, the cap); otherwise it keeps waiting.

With a cap of one worker per GPU only rule 2 places jobs. The heuristics take the rule as an
option (``jigsaw-spill``, ``jigsaw-srtf-spill``) and the environment applies it when the agent
ends a round (``JigsawClusterEnv(spill=True)``): one function, so an agent that plays a
heuristic's decision in the env gets the heuristic-with-spill's round. Chosen and measured in
docs/schedulers.md, "Spilling".
"""
from __future__ import annotations

from typing import Mapping, Sequence

from .placement import GpuLedger
from .spb import Pattern
from .state import ClusterState, JobDecision, JobState


def spill_waiting(state: ClusterState, ledger: GpuLedger, order: Sequence[JobState],
                  rank: Mapping[int, int]) -> list[int]:
    """Add to ``ledger`` (and so to ``ledger.decision``) every waiting job the rule (module
    docstring) places; returns their ids, in the order they were added.

    ``order``: the active jobs from the highest priority down; ``rank``: each active job's
    position in it (0: the highest priority), which decides whose GPUs are shared first."""
    decision = ledger.decision
    added: list[int] = []
    for job in order:
        if job.job_id in decision:
            continue
        free = [g for g, w in enumerate(ledger.worker_counts()) if w == 0]
        if len(free) >= job.num_gpus:  # rule 2
            jd = ledger.place(job, "consolidated", 0, Pattern.ROTATING)
        else:  # rule 3
            jd = _shared_placement(state, ledger, job, free, rank)
        if jd is not None and ledger.fits(job.job_id, jd):
            ledger.add(job.job_id, jd, checked=True)
            added.append(job.job_id)
    return added


def spill_left_waiting(state: ClusterState, ledger: GpuLedger, rank: Mapping[int, int]) -> list[int]:
    """:func:`spill_waiting` over every active job ``ledger``'s decision leaves out, in the order of
    ``rank`` (each active job's rank, 0: the highest priority)."""
    dec, jobs = ledger.decision, state.jobs
    left = sorted((x for x in state.active_ids if x not in dec), key=rank.__getitem__)
    return spill_waiting(state, ledger, [jobs[x] for x in left], rank)


def _shared_placement(state: ClusterState, ledger: GpuLedger, job: JobState, free: list[int],
                      rank: Mapping[int, int]) -> JobDecision | None:
    """Rule 3's placement of ``job`` (``free``: the GPUs with no worker, fewer than it needs), or
    None when too few GPUs can take a worker of it."""
    cap = state.max_workers_per_gpu
    need = job.num_gpus - len(free)
    # a full-backprop worker's peak is the same on every GPU of one type; the largest, to be safe
    peak = max(ledger.peak_list(job, JobDecision(tuple(range(job.num_gpus)), 0, Pattern.ROTATING)))
    workers, mem, capacity, owners = ledger.worker_counts(), ledger.mem, ledger.capacity, ledger.owners
    lowest = len(rank)
    room = [g for g, w in enumerate(workers) if 0 < w < cap and mem[g] + peak <= capacity[g]]
    if len(room) < need:
        return None
    room.sort(key=lambda g: (lowest - max(rank.get(o, lowest) for o in owners[g]), g))
    gpn = state.cluster.gpus_per_node
    return JobDecision(tuple(sorted(free + room[:need], key=lambda g: (g // gpn, g))), 0, Pattern.ROTATING)
