"""Spilling waiting jobs onto shared GPUs: no job waits beside GPUs that could hold it.

A data-parallel job runs on all its GPUs or not at all, so a priority scheduler leaves a wide job
waiting while fewer GPUs than it needs stand free, and those GPUs idle until enough of the
cluster drains. Spilling runs such a job anyway, on GPUs other jobs already use: co-located
workers run at the fitted co-location rates (docs/colocation.md), and two processes on one GPU
usually do more work together than either alone, so the waiting job makes progress and the
GPUs do more work, at some cost in speed to the jobs it joins.

The rule (:func:`spill_waiting`), applied to a decision after the scheduler has made it:

1. Go through the jobs the decision leaves waiting, from the highest priority down.
2. Skip a job that the free GPUs (GPUs with no worker) could hold: leaving it waiting is the
   scheduler's choice.
3. Otherwise give it every free GPU and, for the rest, GPUs that hold exactly one worker, taking
   those of the lowest-priority job first (ties: the lower GPU index). Its workers go in (node,
   GPU) order, at full backprop (SPB level 0).
4. Add it if the placement passes the ledger's checks (memory at every process's peak, the
   workers-per-GPU cap); otherwise it keeps waiting.

With a cap of one worker per GPU there is nothing to share and the rule places nothing. The
heuristics take it as an option (``jigsaw-srtf-spill``) and the environment applies it when the
agent ends a round (``EnvConfig.spill``), with the same function, so a heuristic and its
translation into actions make the same decisions. Chosen and measured in docs/schedulers.md.
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
    if state.max_workers_per_gpu < 2:
        return []
    decision = ledger.decision
    gpn = state.cluster.gpus_per_node
    added: list[int] = []
    lowest_first = len(rank)
    for job in order:
        jid = job.job_id
        if jid in decision:
            continue
        workers = ledger.worker_counts()
        free = [g for g, w in enumerate(workers) if w == 0]
        need = job.num_gpus - len(free)
        if need <= 0:
            continue  # rule 2: the free GPUs could hold it
        owners = ledger.owners
        shared = sorted((g for g, w in enumerate(workers) if w == 1),
                        key=lambda g: (lowest_first - rank.get(owners[g][0], lowest_first), g))
        if len(shared) < need:
            continue
        gpus = tuple(sorted(free + shared[:need], key=lambda g: (g // gpn, g)))
        jd = JobDecision(gpus, 0, Pattern.ROTATING)
        if ledger.fits(jid, jd):
            ledger.add(jid, jd, checked=True)
            added.append(jid)
    return added
