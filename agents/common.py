"""Pieces the heuristics share: priority queues, exclusive placement, and co-location arithmetic.

Everything here reads a :class:`~jigsaw_env.state.ClusterState` and never changes it.

* :class:`LASQueues` -- Tiresias's discretized 2D-LAS: attained GPU-seconds, K queues, FIFO by
  arrival inside a queue, and the starvation guard. Used by ``tiresias`` and ``jigsaw``; defined
  in :mod:`jigsaw_env.las`, because the observation encoder shows it to learned agents too.
* :func:`exclusive_by_priority` -- the preemptive "take jobs top-down until GPUs run out, running
  jobs that stay keep their GPUs, the others get consolidated GPUs" step of SRTF, Tiresias, Jigsaw.
* :func:`spb_configs`, :func:`solo_rate`, :func:`best_solo` -- SPB level/pattern choice of a job
  alone on its GPUs (Jigsaw's rule 2), evaluated with the simulator's own cost model.
* :func:`best_pairing` -- the best way to co-locate a guest job on a host job's GPUs: SPB
  configuration of both and the guest's worker order, scored by the simulator's pace (lockstep:
  the engine's exact step formula over the hyper-period, ``jigsaw_env.engine``, eq. K1/K2; free:
  a one-step estimate of eqs. F1-F3), memory checked at each process's peak (the search itself
  is :func:`jigsaw_env.pairing.search_pairing`, which the environment's pair-with-host options
  use too).

Normalised useful throughput of a job ``j`` (the unit every rule compares in) is
``x_j = eta_j * T_iso_j / step_j``: full-backprop-equivalent iterations per second relative to the
job alone at level 0 on dedicated consolidated GPUs (``CostModel.isolated_iteration_s``).
``n_j * x_j`` is the useful work it turns out, in dedicated-GPU equivalents -- the quantity
``cluster_efficiency`` sums (docs/design.md section 5).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from jigsaw_env.actions import level_pattern_combos
from jigsaw_env.las import LASQueues, parse_thresholds  # noqa: F401 (re-exported: the heuristics' priority)
# the pairing search and its per-CostModel caches live in the core (the env's pair-with-host
# options choose a guest's GPUs with it); re-exported here, where the heuristics read them
from jigsaw_env.pairing import (MAX_PREP_ENTRIES, Config, PairingHit, PairPlan,  # noqa: F401
                                caches_of, guest_orders, host_layout, named_cache, pair_step_lower_bound,
                                pair_value_bound, phase_difference, phase_mod, placement_sig, profile_summary,
                                search_pairing, search_pairing_at, search_pairing_phases, sharing_tag,
                                syncs_share_a_link, workers_signature)
from jigsaw_env.placement import GpuLedger
from jigsaw_env.spb import Pattern
from jigsaw_env.state import ClusterState, CostModel, JobState, JobStatus, job_decision

LEVEL0: Config = (0, Pattern.ROTATING)

# ------------------------------------------------------------------------------------------------
# priority: discretized 2D-LAS (Tiresias) lives in jigsaw_env.las (the observation encoder shows it too)
# ------------------------------------------------------------------------------------------------


# ------------------------------------------------------------------------------------------------
# exclusive placement in priority order
# ------------------------------------------------------------------------------------------------
def select_by_budget(order: Sequence[JobState], num_gpus: int) -> tuple[list[JobState], list[JobState]]:
    """Walk ``order`` (highest priority first), taking every job whose GPUs still fit the budget.

    A job that does not fit is skipped, not blocking the ones behind it (the backfilling of
    Tiresias's simulator). The first job always fits (every job fits the cluster), so the
    highest-priority job always runs: no job waits forever once arrivals stop.
    """
    budget = num_gpus
    chosen, rest = [], []
    jobs = iter(order)
    for j in jobs:
        n = j.num_gpus
        if n <= budget:
            chosen.append(j)
            budget -= n
            if budget <= 0 < n:  # no GPU left: every later job (each needs one or more) is rest
                rest.extend(jobs)
                break
        else:
            rest.append(j)
    return chosen, rest


def exclusive_by_priority(state: ClusterState, order: Sequence[JobState], keep_config: bool = True) -> GpuLedger:
    """The decision "run the top of ``order`` on exclusive GPUs".

    Jobs are chosen by :func:`select_by_budget`. Chosen running jobs keep their GPUs (and, with
    ``keep_config``, their SPB level/pattern): no migration. The other chosen jobs get consolidated
    exclusive GPUs at level 0, largest first (large jobs are the hardest to consolidate).
    Everything not chosen is left out (queued, or preempted if it was running).
    """
    chosen, _ = select_by_budget(order, state.cluster.num_gpus)
    return place_exclusive(state, chosen, keep_config)


def place_exclusive(state: ClusterState, chosen: Sequence[JobState], keep_config: bool = True,
                    ledger: GpuLedger | None = None) -> GpuLedger:
    """Add ``chosen`` to ``ledger`` on exclusive GPUs (see :func:`exclusive_by_priority`)."""
    led = ledger if ledger is not None else GpuLedger(state)
    new = []
    wl = led.workers_per_gpu  # the ledger's per-GPU worker counts (a list mirror of ``led.workers``)
    RUNNING = JobStatus.RUNNING
    for j in chosen:
        if j.status is RUNNING and j.placement and not any(wl[g] for g in j.placement):
            if keep_config:
                # its own configuration on GPUs that hold no worker in the ledger (so no memory:
                # a GPU's bytes go back to exactly 0 when its last worker leaves) always fits: the
                # simulator validated it in force with at least these workers on them, so the
                # ledger's check would return True (as Jigsaw's exclusive pass does)
                led.add(j.job_id, job_decision(j.placement, j.level, j.pattern), checked=True)
                continue
            jd = job_decision(j.placement, 0, Pattern.ROTATING)  # level 0 may need more memory: check
            if led.fits(j.job_id, jd):
                led.add(j.job_id, jd, checked=True)
                continue
        new.append(j)
    for j in sorted(new, key=lambda j: -j.num_gpus):
        led.place_and_add(j, "consolidated", 0)
    return led


def consolidated_gpus(free: np.ndarray, gpus_per_node: int, n: int) -> list[int] | None:
    """``n`` GPUs among ``free`` (bool per GPU) on the fewest nodes: the fullest node that still
    fits them (best fit), else nodes with the most free GPUs first -- the rule of the ledger's
    "consolidated" option, on any set of GPUs considered free."""
    per_node = np.asarray(free, dtype=bool).reshape(-1, gpus_per_node)
    counts = per_node.sum(axis=1)
    if counts.sum() < n:
        return None
    fits = np.flatnonzero(counts >= n)
    if len(fits):
        node = int(fits[np.argmin(counts[fits])])
        return [node * gpus_per_node + int(i) for i in np.flatnonzero(per_node[node])[:n]]
    out: list[int] = []
    for node in np.argsort(-counts, kind="stable"):
        for i in np.flatnonzero(per_node[node]):
            out.append(int(node) * gpus_per_node + int(i))
            if len(out) == n:
                return out
    return None


# ------------------------------------------------------------------------------------------------
# SPB configuration of a job alone (rule 2)
# ------------------------------------------------------------------------------------------------
def spb_configs(state: ClusterState, job: JobState) -> list[Config]:
    """The distinct (level, pattern) choices of a job: level 0, then each level's rotating and
    static pattern, dropping choices whose start slots repeat an earlier one (a shallow model at a
    low level) and the static pattern of a one-worker job (its only worker is always full depth)."""
    key = (job.model, job.batch_size, job.num_gpus)
    cache = named_cache(state.costs, "configs")
    out = cache.get(key)
    if out is None:
        out, seen = [], set()
        gpus = tuple(range(job.num_gpus))
        for lv, pt in level_pattern_combos(state.spb):
            if lv > 0 and pt is Pattern.STATIC and job.num_gpus == 1:
                continue
            prof = state.costs.profile(job, lv, pt, gpus)
            sig = (prof.slots, prof.pattern if len(prof.slots) > 1 else Pattern.ROTATING)
            if sig in seen:
                continue
            seen.add(sig)
            out.append((lv, pt if lv > 0 else Pattern.ROTATING))
        cache[key] = out
    return out


def solo_rate(state: ClusterState, job: JobState, cfg: Config, gpus: Sequence[int]) -> float:
    """Normalised useful throughput x = eta * T_iso / mean dedicated step of ``job`` alone on
    ``gpus`` at ``cfg`` (mean over the SPB cycle: the job's own phases, eq. T1)."""
    prof = state.costs.profile(job, cfg[0], cfg[1], tuple(gpus))
    return prof.eta * state.costs.isolated_iteration_s(job) / float(prof.dedicated_iteration_s().mean())


def best_solo(state: ClusterState, job: JobState, gpus: Sequence[int], current: Config | None = None,
              hysteresis: float = 0.01, allow_spb: bool = True) -> tuple[Config, float]:
    """Rule 2 for a job alone on ``gpus``: the (level, pattern) maximising :func:`solo_rate`.

    ``current`` is kept unless the best beats it by more than ``hysteresis`` (relative), so a
    running job's configuration does not flip on rounding noise.
    """
    key = (job.model, job.batch_size, placement_sig(state, gpus), allow_spb)
    cache = named_cache(state.costs, "solo")
    hit = cache.get(key)
    if hit is None:
        cfgs = spb_configs(state, job) if allow_spb else [LEVEL0]
        rates = {c: solo_rate(state, job, c, gpus) for c in cfgs}
        hit = cache[key] = (rates, max(rates, key=lambda c: (rates[c], -c[0])))
    rates, best = hit
    if current is not None:
        cur = (current[0], current[1] if current[0] > 0 else Pattern.ROTATING)
        if cur in rates and rates[best] <= rates[cur] * (1.0 + hysteresis):
            return cur, rates[cur]
    return best, rates[best]


# ------------------------------------------------------------------------------------------------
# co-location of a guest on a host's GPUs (rules 3 and 4; Gandiva's packing test)
# ------------------------------------------------------------------------------------------------


def best_pairing(state: ClusterState, host: JobState, host_gpus: Sequence[int], guest: JobState,
                 host_cfgs: Sequence[Config] | None = None, guest_cfgs: Sequence[Config] | None = None,
                 orders: Sequence[tuple[int, ...]] | None = None, capacity: np.ndarray | None = None) -> PairPlan | None:
    """The best co-location of ``guest`` on ``host``'s GPUs, or None when none fits in memory.

    Searches every host configuration in ``host_cfgs`` x guest configuration in ``guest_cfgs``
    (default: all of :func:`spb_configs`) x guest worker order in ``orders`` (host worker indices,
    default :func:`guest_orders`), each scored by the simulator's pace
    (:func:`jigsaw_env.pairing.search_pairing`: under the lockstep pace the two jobs form one
    lockstep component whose step ``k`` is ``max_g (load of the host on g + load of the guest on
    g) + max(comm_host, comm_guest)`` (engine eq. K1/K2), with the phases the jobs' iteration
    counters give now, averaged over the hyper-period; under the free pace each job's iteration
    time is a one-step estimate of eqs. F1-F3). Infeasible candidates (a GPU's summed process
    peaks above its memory) are dropped. Returns the candidate with the largest ``value``.

    Results are cached by what they depend on (models, sizes, node layout, under the lockstep
    pace the phases mod the hyper-period, candidate sets), so repeated rounds cost a dictionary
    lookup.
    """
    wa, wb = len(host_gpus), guest.num_gpus
    if type(host_gpus) is not tuple or not all(type(g) is int for g in host_gpus):
        host_gpus = tuple(int(g) for g in host_gpus)
    default = host_cfgs is None and guest_cfgs is None and orders is None and capacity is None
    if default:
        hit = default_pairing(state, host, host_gpus, guest)
        return None if hit is None else hit.plan(host_gpus, guest_orders(wa, wb))
    if host_cfgs is None:
        host_cfgs = spb_configs(state, host)
    if guest_cfgs is None:
        guest_cfgs = spb_configs(state, guest)
    return search_pairing(state, host, host_gpus, guest, host_cfgs, guest_cfgs, orders, capacity)


def order_signatures(state: ClusterState, node_sig: tuple[int, ...], types_sig: tuple | None, wb: int) -> tuple:
    """:func:`placement_sig` of a ``wb``-worker guest on each order of :func:`guest_orders` over a
    host whose workers sit on nodes ``node_sig`` (as :func:`host_layout` numbers them: by first
    appearance) with GPU types ``types_sig`` (None on one type): ``placement_sig(state,
    tuple(host_gpus[c] for c in order))`` for each order, read from the layout alone (the nodes'
    numbering does not change whether an order spans nodes). Cached per layout and width: a few
    hundred layouts stand for the hundreds of thousands of GPU tuples a replay meets."""
    cache = named_cache(state.costs, "order_sigs")
    key = (node_sig, types_sig, wb)
    v = cache.get(key)
    if v is None:
        v = cache[key] = tuple([workers_signature([node_sig[c] for c in o],
                                           None if types_sig is None else [types_sig[c] for c in o])
                                for o in guest_orders(len(node_sig), wb)])
    return v


def pairing_layout(state: ClusterState, host_gpus: tuple[int, ...], wb: int) -> tuple[int, np.ndarray]:
    """``(id, capacity)``: everything the default pairing search of a ``wb``-worker guest reads
    in the host's GPUs, as a small integer that every GPU tuple agreeing on it shares, and the
    GPUs' memories (bytes, read-only float64, as :func:`host_layout`'s). What it reads: the host's
    profile, which depends on its GPUs only through their placement signature; the guest's
    profile for each order of :func:`guest_orders` (through that order's placement signature: the
    orders are grouped by it, in order of first appearance); and each GPU's memory. Two hosts on
    different nodes, or spread over nodes in different patterns that give every order the same
    signature (a one-worker guest never spans nodes), are searched once. Cached per (GPUs, wb)."""
    cache = named_cache(state.costs, "pair_layout")
    key = (host_gpus, wb)
    v = cache.get(key)
    if v is None:
        sig, cap = host_layout(state, host_gpus)
        reads = (placement_sig(state, host_gpus), order_signatures(state, sig[0], sig[1], wb), sig[2])
        # never emptied (one entry per distinct reading): an id keeps its meaning for as long as
        # the cached searches keyed by it live
        ids = caches_of(state.costs).setdefault("pair_layout_ids", {})
        v = cache[key] = (ids.setdefault(reads, len(ids)), cap)
    return v


def default_pairing(state: ClusterState, host: JobState, host_gpus: tuple[int, ...], guest: JobState
                    ) -> PairingHit | None:
    """:func:`best_pairing`'s default search (every configuration of both jobs, every order of
    :func:`guest_orders`) as the :class:`PairingHit` it caches (its ``order_index`` into
    ``guest_orders(len(host_gpus), guest.num_gpus)``), or None when no candidate fits in memory.
    ``host_gpus``: a tuple of ints (a JobDecision's).

    The search is fixed by the models, what it reads in the host's GPUs (:func:`pairing_layout`)
    and the phase difference: one lookup of a short key. A caller that only compares values
    (Jigsaw's host search) reads them here and makes a :class:`PairPlan` for the one it keeps."""
    wa, wb = len(host_gpus), guest.num_gpus
    lid, cap = pairing_layout(state, host_gpus, wb)
    rel = phase_difference(state, host, guest, wa)
    key = (host.model, host.batch_size, host.num_gpus, lid, guest.model, guest.batch_size, wb, rel)
    cache = named_cache(state.costs, sharing_tag(state, "pair_default"))
    hit = cache.get(key, False)
    if hit is False:
        all_orders = guest_orders(wa, wb)
        prep_key = key[:-1]
        if not all_orders:
            hit = cache[key] = None
        elif wa > 1 and prep_key in named_cache(state.costs, sharing_tag(state, "pair_prep"), limit=MAX_PREP_ENTRIES):
            # a second phase difference of the same pair (its candidates are prepared: an
            # earlier phase was searched): most pairs that are asked twice are asked about
            # many phases, so search every phase at once (one pass over the candidates, the
            # phases stacked in numpy) and keep them all
            pm = phase_mod(state)
            found = search_pairing_phases(state, host, host_gpus, guest, spb_configs(state, host),
                                           spb_configs(state, guest), all_orders, cap, range(pm), prep_key)
            for r, res in enumerate(found):
                cache[prep_key + (r,)] = res
            hit = found[rel]
        else:
            hit = cache[key] = search_pairing_at(state, host, host_gpus, guest, spb_configs(state, host),
                                               spb_configs(state, guest), all_orders, cap, 0, rel, prep_key)
    return hit


# ------------------------------------------------------------------------------------------------
# reading the sharing structure of the allocation in force
# ------------------------------------------------------------------------------------------------
def current_pairs(state: ClusterState, host_memory: dict[int, int] | None = None) -> dict[int, int]:
    """``{guest_id: host_id}`` for running jobs that share GPUs as a pair whose guest's GPUs are a
    subset of the host's. The host is the one ``host_memory`` (guest -> host, a scheduler's own
    record) names, else the job with more GPUs, else the one that started first.

    Two running jobs form such a pair when each shares GPUs with the other and with no one else:
    a group of exactly two in the connected components of "shares a GPU with". Under a simulator
    those components are kept as they form (``state.shared_ref``) and are read instead of every
    running job's GPUs: the same pairs in the same order (the scan below meets a pair at its
    member that arrived first: running jobs are visited in arrival order)."""
    groups, pos = state.shared_ref, state.arrival_pos
    if groups is not None and pos is not None:
        twos = [sorted(jids, key=pos.__getitem__) for jids in groups.values() if len(jids) == 2]
        if len(twos) > 1:
            twos.sort(key=lambda ab: pos[ab[0]])
        out: dict[int, int] = {}
        for a, b in twos:
            _orient_pair(state, a, b, host_memory, out)
        return out
    running = state.running()
    # one pass over the running jobs' GPUs: each GPU's first holder; a GPU met again is shared, and
    # both its first holder and this job take part in sharing
    first: dict[int, int] = {}
    shared: set[int] = set()
    involved: set[int] = set()
    for j in running:
        jid = j.job_id
        for g in j.placement:
            f = first.setdefault(g, jid)
            if f != jid:
                shared.add(g)
                involved.add(f)
                involved.add(jid)
    if not shared:
        return {}  # nobody shares a GPU
    # GPUs held by two or more jobs, in order of first appearance (the order a map of every GPU
    # would list them in), each with its jobs in running order
    owners: dict[int, list[int]] = {}
    for j in running:
        if j.job_id in involved:
            for g in j.placement:
                if g in shared:
                    owners.setdefault(g, []).append(j.job_id)
    partners: dict[int, set[int]] = {}
    linked: set[tuple[int, ...]] = set()  # holder lists already linked (a pair spans several GPUs)
    for jids in owners.values():
        key = tuple(jids)
        if key in linked:
            continue
        linked.add(key)
        for a in jids:
            partners.setdefault(a, set()).update(x for x in jids if x != a)
    out: dict[int, int] = {}
    for a, ps in partners.items():
        if len(ps) != 1:
            continue
        b = next(iter(ps))
        if len(partners.get(b, ())) != 1 or a in out or b in out:
            continue
        _orient_pair(state, a, b, host_memory, out)
    return out


def _orient_pair(state: ClusterState, a: int, b: int, host_memory: dict[int, int] | None,
                 out: dict[int, int]) -> None:
    """:func:`current_pairs`'s host of two jobs that share GPUs only with each other: sets
    ``out[guest] = host`` when one's GPUs are a subset of the other's (symmetric in ``a``, ``b``:
    distinct ids never tie)."""
    ja, jb = state.jobs[a], state.jobs[b]
    if host_memory and host_memory.get(a) == b and set(ja.placement) <= set(jb.placement):
        out[a] = b
    elif host_memory and host_memory.get(b) == a and set(jb.placement) <= set(ja.placement):
        out[b] = a
    else:
        sa, sb = set(ja.placement), set(jb.placement)
        if sa <= sb and (len(sa) < len(sb) or (ja.first_start_s, a) > (jb.first_start_s, b)):
            out[a] = b
        elif sb <= sa:
            out[b] = a
