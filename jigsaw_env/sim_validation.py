"""The simulator's checks: the job table it is given, and each round's decision against the
allocation in force.

A decision is validated incrementally: only the jobs whose JobDecision differs from the one in
force are taken out and re-added with checks, which builds the same ledger as validating the
whole decision (:func:`jigsaw_env.placement.validate_decision`; tests/sim/test_perf.py and
tests/sim/test_sim_step_parity.py hold them equal). A ledger the env built with checked adds and
removes can be taken over without re-validation (:func:`adopt_ledger`).
"""
from __future__ import annotations

import math

import numpy as np

from .cluster import ClusterSpec
from .placement import GpuLedger, InfeasibleDecision
from .state import CostModel, Decision, JobDecision, JobState


def check_jobs(jobs: list[JobState], cluster: ClusterSpec, costs: CostModel) -> None:
    """Raise ValueError for jobs that could never run: duplicate ids, no work, an unknown model
    (get_table names the allowed ones), or too few GPUs with memory for a full-depth worker
    (slot 0 is in every level and pattern, so some worker always peaks at full depth)."""
    ids = [j.job_id for j in jobs]
    if len(set(ids)) != len(ids):
        raise ValueError("jobs: job_id values must be unique")
    cl = cluster
    types = sorted(set(cl.gpu_types))
    gpu_type_arr = np.array([cl.gpu_type(g) for g in range(cl.num_gpus)])
    memory = cl.memory_array()
    fit_cache: dict[tuple, tuple[int, dict]] = {}
    for j in jobs:
        if not (isinstance(j.num_gpus, (int, np.integer)) and j.num_gpus >= 1):
            raise ValueError(f"job {j.job_id}: num_gpus must be an integer >= 1, got {j.num_gpus!r}")
        if not (np.isfinite(j.iterations) and j.iterations > 0):
            raise ValueError(f"job {j.job_id}: iterations must be a finite number > 0, got {j.iterations!r}")
        if not (isinstance(j.arrival_s, (int, float, np.integer, np.floating)) and math.isfinite(j.arrival_s)
                and j.arrival_s >= 0):
            raise ValueError(f"job {j.job_id}: arrival_s must be a finite number >= 0, got {j.arrival_s!r}")
        key = (j.model, j.batch_size)
        hit = fit_cache.get(key)
        if hit is None:
            peak, err = {}, None
            for t in types:
                try:
                    peak[t] = costs.table(j.model, j.batch_size, t).process_peak_bytes(0)
                except ValueError as e:  # no table for this GPU type: the job cannot use those GPUs
                    err = err or e
            if not peak:
                raise err
            fit = int(sum(np.count_nonzero((gpu_type_arr == t) & (peak[t] <= memory)) for t in peak))
            fit_cache[key] = hit = (fit, peak)
        fit, peak = hit
        if fit < j.num_gpus:
            need = max(peak.values()) / 2**30
            raise ValueError(f"job {j.job_id} ({j.model}, batch {j.batch_size}) needs {need:.2f} GiB per worker "
                             f"but only {fit} GPUs have that much memory (cluster gpu_memory_bytes); "
                             f"it needs {j.num_gpus}")


def as_decision(decision) -> Decision:
    """``decision`` as a :class:`Decision` with integer job ids; InfeasibleDecision naming what it
    got when it is not a dict or a key is not an integer."""
    if not isinstance(decision, dict):
        raise InfeasibleDecision(f"a decision must be a dict job_id -> JobDecision, got {type(decision).__name__}")
    try:
        return Decision({int(k): v for k, v in decision.items()})
    except (TypeError, ValueError):
        raise InfeasibleDecision(f"decision keys must be integer job ids, got {list(decision)[:5]}") from None


def leaving(in_force: GpuLedger, decision: Decision) -> list[int]:
    """The jobs in force (in the order in force) that ``decision`` leaves out or changes."""
    removed = []
    for jid, jd in in_force.decision.items():
        x = decision.get(jid)
        if x is not jd and x != jd:
            removed.append(jid)
    return removed


def validate_diff(in_force: GpuLedger, decision: Decision) -> tuple[GpuLedger, list[int], list[int]]:
    """The ledger of ``decision`` and what changed: the ids of the jobs in force (``in_force``,
    the ledger of the allocation in force) that leave or change, in the order in force, and of
    the jobs to add, in the decision's order. Raises InfeasibleDecision.

    Starts from the allocation in force (valid), takes out the jobs that leave or change, then
    adds the changed and new ones with checks. Adds only raise sums, so checking each add against
    the running sums is the same as checking the final sums: the ledger equals
    :func:`~jigsaw_env.placement.validate_decision`'s. Jobs whose JobDecision equals the one in
    force (the same object, usually) cost a lookup: no ledger update, no check. When nothing
    changes the ledger is ``in_force`` itself (not a copy)."""
    cur = in_force
    cd = cur.decision
    removed = leaving(in_force, decision)
    added = []
    led = None
    rem = set(removed)
    for jid, jd in decision.items():
        if not isinstance(jd, JobDecision):
            raise InfeasibleDecision(f"decision for job {jid} must be a JobDecision, got {type(jd).__name__}")
        if jid not in cd or jid in rem:
            if led is None:
                led = cur.copy()
                for x in removed:
                    led.remove(x)
            led.add(jid, jd)
            added.append(jid)
    if led is None:
        if not removed:
            return cur, removed, added
        led = cur.copy()
        for x in removed:
            led.remove(x)
    return led, removed, added


def adopt_ledger(in_force: GpuLedger, ledger: GpuLedger) -> tuple[GpuLedger, list[int], list[int]] | None:
    """What :func:`validate_diff` returns for ``ledger.decision``, with ``ledger`` itself as the
    new ledger, when its job order is the one validation would give; None otherwise. ``ledger``
    must have been built from a copy of ``in_force`` by its own checked adds and removes
    (:meth:`Simulator.step <jigsaw_env.simulator.Simulator.step>` says when it is taken)."""
    cd = in_force.decision
    dec = ledger.decision
    removed = leaving(in_force, dec)
    rem = set(removed)
    kept = [jid for jid in cd if jid not in rem and jid in dec]
    added = []
    for i, (jid, jd) in enumerate(dec.items()):
        if type(jd) is not JobDecision:
            return None
        if i < len(kept):
            if jid != kept[i]:
                return None
        else:
            added.append(jid)
    if any(jid in cd and jid not in rem for jid in added):
        return None  # a job re-added with its JobDecision unchanged: validation keeps its place
    # the tally of GPUs by worker count grows a slot the first time a GPU reaches a new count;
    # the builder may have passed through a count validation never reaches (a job added before
    # another left its GPU): drop those empty slots, as validation's tally would not have them
    wc, n0 = ledger.gpus_by_worker_count, len(in_force.gpus_by_worker_count)
    while len(wc) > n0 and wc[-1] == 0:
        wc.pop()
    return ledger, removed, added
