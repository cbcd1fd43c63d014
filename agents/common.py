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
  configuration of both and the guest's worker order, scored with the engine's exact lockstep
  step formula over the hyper-period (``jigsaw_env.engine``, eq. K1/K2), memory checked at each
  process's peak.

Normalised useful throughput of a job ``j`` (the unit every rule compares in) is
``x_j = eta_j * T_iso_j / step_j``: full-backprop-equivalent iterations per second relative to the
job alone at level 0 on dedicated consolidated GPUs (``CostModel.isolated_iteration_s``).
``n_j * x_j`` is the useful work it turns out, in dedicated-GPU equivalents -- the quantity
``cluster_efficiency`` sums (docs/design.md section 5).
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np

from jigsaw_env.actions import level_pattern_combos
from jigsaw_env.interference import shared_gpu_time
from jigsaw_env.las import LASQueues, parse_thresholds  # noqa: F401 (re-exported: the heuristics' priority)
from jigsaw_env.placement import GpuLedger
from jigsaw_env.spb import Pattern
from jigsaw_env.state import ClusterState, CostModel, JobState, JobStatus, job_decision

Config = tuple[int, Pattern]  # (SPB level, pattern)
LEVEL0: Config = (0, Pattern.ROTATING)

# per-CostModel caches (a CostModel belongs to one simulator: its eta knobs and SPB config)
_CACHES: "weakref.WeakKeyDictionary[CostModel, dict]" = weakref.WeakKeyDictionary()
_MAX_CACHE = 200_000
_MAX_PREP = 4_000


_LAST: list = [None, None]  # (weak reference to the CostModel looked up last, its caches)


def _caches_of(costs: CostModel) -> dict:
    """The per-CostModel dict of named caches (the last one looked up is kept at hand)."""
    ref = _LAST[0]
    if ref is not None and ref() is costs:
        return _LAST[1]
    per = _CACHES.get(costs)
    if per is None:
        per = _CACHES[costs] = {}
    _LAST[0], _LAST[1] = weakref.ref(costs), per
    return per


def _sharing_tag(state: ClusterState, name: str) -> str:
    """A cache name per sharing mode: a pairing's value depends on how the pair shares its GPUs,
    and one CostModel may serve simulators of either mode."""
    return name if state.sharing is None else name + "/" + state.sharing.mode


def _cache(costs: CostModel, name: str, limit: int = _MAX_CACHE) -> dict:
    """A named cache of ``costs`` (emptied when it grows past ``limit`` entries: every entry is a
    pure function of its key, so recomputing one gives the same value)."""
    per = _caches_of(costs)
    c = per.get(name)
    if c is None or len(c) > limit:
        c = per[name] = {}
    return c


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
    wl = led._wl  # the ledger's per-GPU worker counts (a list mirror of ``led.workers``)
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
    cache = _cache(state.costs, "configs")
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


def placement_sig(state: ClusterState, gpus: Sequence[int]) -> tuple:
    """What a job's profile depends on in its GPUs: their number, whether they span nodes, and
    (on a mixed cluster) their types. Cached per GPU tuple."""
    key = gpus if type(gpus) is tuple else tuple(gpus)
    cache = _cache(state.costs, "psig")
    sig = cache.get(key)
    if sig is None:
        cl = state.cluster
        sig = cache[key] = _signature([g // cl.gpus_per_node for g in key],
                                      None if state.costs.homogeneous else [cl.gpu_type(g) for g in key])
    return sig


def _signature(nodes: Sequence, types: Sequence | None) -> tuple:
    """The placement signature of workers on ``nodes`` (node numbers in any numbering) with GPU
    ``types`` (None on a cluster of one type): :func:`placement_sig`'s value, also read from a
    host's layout by :func:`order_signatures`."""
    cross = len(set(nodes)) > 1
    return (len(nodes), cross) if types is None else (len(nodes), cross, tuple(types))


def host_layout(state: ClusterState, gpus: tuple[int, ...]) -> tuple[tuple, np.ndarray]:
    """``(signature, capacity)`` of a host's GPUs (a tuple, in worker order), cached.

    signature: everything a pairing on these GPUs depends on in them -- each GPU's node as the
    index of its first appearance (the node layout), the GPU types on a mixed cluster (else None)
    and each GPU's memory. capacity: the memories as a read-only float64 array."""
    cache = _cache(state.costs, "layout")
    v = cache.get(gpus)
    if v is None:
        cl = state.cluster
        layout: dict[int, int] = {}
        node_sig = tuple(layout.setdefault(g // cl.gpus_per_node, len(layout)) for g in gpus)
        types_sig = None if state.costs.homogeneous else tuple(cl.gpu_type(g) for g in gpus)
        cap = np.array([cl.memory_of(g) for g in gpus], dtype=np.float64)
        cap.setflags(write=False)
        v = cache[gpus] = ((node_sig, types_sig, tuple(cap.tolist())), cap)
    return v


def best_solo(state: ClusterState, job: JobState, gpus: Sequence[int], current: Config | None = None,
              hysteresis: float = 0.01, allow_spb: bool = True) -> tuple[Config, float]:
    """Rule 2 for a job alone on ``gpus``: the (level, pattern) maximising :func:`solo_rate`.

    ``current`` is kept unless the best beats it by more than ``hysteresis`` (relative), so a
    running job's configuration does not flip on rounding noise.
    """
    key = (job.model, job.batch_size, placement_sig(state, gpus), allow_spb)
    cache = _cache(state.costs, "solo")
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
@dataclass(frozen=True)
class PairPlan:
    """A co-location: the guest's workers on a subset of the host's GPUs.

    value: n_host * x_host + n_guest * x_guest (dedicated-GPU equivalents of useful work).
    """

    host_cfg: Config
    guest_cfg: Config
    guest_gpus: tuple[int, ...]
    value: float
    x_host: float
    x_guest: float
    step_s: float  # mean lockstep step over the hyper-period


@lru_cache(maxsize=1024)
def guest_orders(wa: int, wb: int, max_orders: int = 32) -> tuple[tuple[int, ...], ...]:
    """Candidate worker orders of a ``wb``-worker guest over a ``wa``-worker host, as host worker
    indices: windows of consecutive host workers at every cyclic offset, forwards and backwards.

    Forward shifts set the relative phase of two rotating patterns (anti-phasing); backward windows
    put the guest's full-depth worker next to the host's lightest one (static complement)."""
    if wb > wa:
        return ()
    offsets = range(wa) if 2 * wa <= max_orders else sorted({int(x) for x in np.linspace(0, wa - 1, max_orders // 2)})
    out, seen = [], set()
    for off in offsets:
        for sign in (1, -1):
            o = tuple((off + sign * w) % wa for w in range(wb))
            if o not in seen:
                seen.add(o)
                out.append(o)
    return tuple(out)


def _lcm(a: int, b: int) -> int:
    return a * b // math.gcd(a, b)


def phase_mod(state: ClusterState) -> int:
    """A common multiple of every SPB cycle length (lcm of 1..num_slots): phases matter modulo it."""
    per = _caches_of(state.costs)
    m = per.get("phase_mod")
    if m is None:
        m = 1
        for p in range(1, state.spb.num_slots + 1):
            m = _lcm(m, p)
        per["phase_mod"] = m
    return m


def best_pairing(state: ClusterState, host: JobState, host_gpus: Sequence[int], guest: JobState,
                 host_cfgs: Sequence[Config] | None = None, guest_cfgs: Sequence[Config] | None = None,
                 orders: Sequence[tuple[int, ...]] | None = None, capacity: np.ndarray | None = None) -> PairPlan | None:
    """The best co-location of ``guest`` on ``host``'s GPUs, or None when none fits in memory.

    Searches every host configuration in ``host_cfgs`` x guest configuration in ``guest_cfgs``
    (default: all of :func:`spb_configs`) x guest worker order in ``orders`` (host worker indices,
    default :func:`guest_orders`). Each candidate is scored exactly as the simulator will time it:
    the two jobs form one lockstep component whose step ``k`` is
    ``max_g (load of the host on g + load of the guest on g) + max(comm_host, comm_guest)``
    (engine eq. K1/K2), with the phases the jobs' iteration counters give now, averaged over the
    hyper-period. Infeasible candidates (a GPU's summed process peaks above its memory) are
    dropped. Returns the candidate with the largest ``value``.

    Results are cached by what they depend on (models, sizes, node layout, phases mod the
    hyper-period, candidate sets), so repeated rounds cost a dictionary lookup.
    """
    wa, wb = len(host_gpus), guest.num_gpus
    if type(host_gpus) is not tuple or not all(type(g) is int for g in host_gpus):
        host_gpus = tuple(int(g) for g in host_gpus)
    default = host_cfgs is None and guest_cfgs is None and orders is None and capacity is None
    if default:
        hit = default_pairing(state, host, host_gpus, guest)
        if hit is None:
            return None
        hc, gc, oi, value, xh, xg, step = hit
        return PairPlan(hc, gc, tuple([host_gpus[i] for i in guest_orders(wa, wb)[oi]]), value, xh, xg, step)
    if host_cfgs is None:
        host_cfgs = spb_configs(state, host)
    if guest_cfgs is None:
        guest_cfgs = spb_configs(state, guest)
    orders = guest_orders(wa, wb) if orders is None else [tuple(int(i) for i in o) for o in orders]
    if not orders:
        return None
    if capacity is None:
        sig, capacity = host_layout(state, host_gpus)
    else:
        (node_sig, types_sig, _), _ = host_layout(state, host_gpus)
        sig = (node_sig, types_sig, tuple(capacity))
    pm = phase_mod(state)
    # the mean over a hyper-period depends on the phases only through their difference (shifting
    # both counters by k rotates the step sequence), and every period divides pm
    rel = (guest.iteration - host.iteration) % pm if wa > 1 else 0  # one GPU: loads just add up
    key = (host.model, host.batch_size, sig, guest.model, guest.batch_size, wb, rel,
           tuple(host_cfgs), tuple(guest_cfgs), tuple(orders))
    cache = _cache(state.costs, _sharing_tag(state, "pair"))
    hit = cache.get(key, False)
    if hit is not False:
        if hit is None:
            return None
        hc, gc, oi, value, xh, xg, step = hit
        return PairPlan(hc, gc, tuple(host_gpus[i] for i in orders[oi]), value, xh, xg, step)
    plan = _search_pairing(state, host, host_gpus, guest, host_cfgs, guest_cfgs, orders, capacity, 0, rel,
                           key[:6] + key[7:])
    if plan is None:
        cache[key] = None
        return None
    hc, gc, oi, value, xh, xg, step = plan
    cache[key] = plan
    return PairPlan(hc, gc, tuple(host_gpus[i] for i in orders[oi]), value, xh, xg, step)


def order_signatures(state: ClusterState, node_sig: tuple[int, ...], types_sig: tuple | None, wb: int) -> tuple:
    """:func:`placement_sig` of a ``wb``-worker guest on each order of :func:`guest_orders` over a
    host whose workers sit on nodes ``node_sig`` (as :func:`host_layout` numbers them: by first
    appearance) with GPU types ``types_sig`` (None on one type): ``placement_sig(state,
    tuple(host_gpus[c] for c in order))`` for each order, read from the layout alone (the nodes'
    numbering does not change whether an order spans nodes). Cached per layout and width: a few
    hundred layouts stand for the hundreds of thousands of GPU tuples a replay meets."""
    cache = _cache(state.costs, "order_sigs")
    key = (node_sig, types_sig, wb)
    v = cache.get(key)
    if v is None:
        v = cache[key] = tuple([_signature([node_sig[c] for c in o],
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
    cache = _cache(state.costs, "pair_layout")
    key = (host_gpus, wb)
    v = cache.get(key)
    if v is None:
        sig, cap = host_layout(state, host_gpus)
        reads = (placement_sig(state, host_gpus), order_signatures(state, sig[0], sig[1], wb), sig[2])
        # never emptied (one entry per distinct reading): an id keeps its meaning for as long as
        # the cached searches keyed by it live
        ids = _caches_of(state.costs).setdefault("pair_layout_ids", {})
        v = cache[key] = (ids.setdefault(reads, len(ids)), cap)
    return v


def default_pairing(state: ClusterState, host: JobState, host_gpus: tuple[int, ...], guest: JobState) -> tuple | None:
    """:func:`best_pairing`'s default search (every configuration of both jobs, every order of
    :func:`guest_orders`) as the raw tuple it caches: ``(host cfg, guest cfg, index of the
    guest's order in guest_orders(len(host_gpus), guest.num_gpus), value, x_host, x_guest, mean
    step s)``, or None when no candidate fits in memory. ``host_gpus``: a tuple of ints (a
    JobDecision's).

    The search is fixed by the models, what it reads in the host's GPUs (:func:`pairing_layout`)
    and the phase difference: one lookup of a short key. A caller that only compares values
    (Jigsaw's host search) reads them here and makes a :class:`PairPlan` for the one it keeps."""
    wa, wb = len(host_gpus), guest.num_gpus
    lid, cap = pairing_layout(state, host_gpus, wb)
    rel = (guest.iteration - host.iteration) % phase_mod(state) if wa > 1 else 0
    key = (host.model, host.batch_size, host.num_gpus, lid, guest.model, guest.batch_size, wb, rel)
    cache = _cache(state.costs, _sharing_tag(state, "pair_default"))
    hit = cache.get(key, False)
    if hit is False:
        all_orders = guest_orders(wa, wb)
        prep_key = key[:-1]
        if not all_orders:
            hit = cache[key] = None
        elif wa > 1 and prep_key in _cache(state.costs, _sharing_tag(state, "pair_prep"), limit=_MAX_PREP):
            # a second phase difference of the same pair (its candidates are prepared: an
            # earlier phase was searched): most pairs that are asked twice are asked about
            # many phases, so search every phase at once (one pass over the candidates, the
            # phases stacked in numpy) and keep them all
            pm = phase_mod(state)
            found = _search_pairing_phases(state, host, host_gpus, guest, spb_configs(state, host),
                                           spb_configs(state, guest), all_orders, cap, range(pm), prep_key)
            for r, res in enumerate(found):
                cache[prep_key + (r,)] = res
            hit = found[rel]
        else:
            hit = cache[key] = _search_pairing(state, host, host_gpus, guest, spb_configs(state, host),
                                               spb_configs(state, guest), all_orders, cap, 0, rel, prep_key)
    return hit


def profile_summary(costs: CostModel, prof) -> tuple[float, float, float]:
    """(mean over the cycle of the summed compute of all workers, of the slowest worker's compute,
    of the sync time) of a profile: the ingredients of a lower bound on a shared step."""
    cache = _cache(costs, "summary")
    key = id(prof)  # profiles live in the CostModel's cache for its whole life
    v = cache.get(key)
    if v is None:
        c = prof.compute_s
        v = cache[key] = (float(c.sum(axis=1).mean()), float(c.max(axis=1).mean()), float(prof.comm_s.mean()))
    return v


def _search_pairing(state, host, host_gpus, guest, host_cfgs, guest_cfgs, orders, capacity, i_host, i_guest,
                    prep_key=None):
    """Branch and bound over (host config, guest config, order group). A lower bound on the mean
    shared step -- the busiest GPU carries at least the average load over the host's GPUs and at
    least either job's slowest worker, and the sync is at least either job's mean sync -- gives an
    upper bound on each candidate's value; candidates are evaluated exactly in decreasing bound
    order until the bound falls below the best value found. Ties go to the first candidate in
    enumeration order (host config, guest config, order), as an exhaustive search would.

    The candidates, their bounds and their memory feasibility do not depend on the phases: they
    are prepared once (:func:`_pair_candidates`, cached by ``prep_key`` when given; a candidate's
    arrays on its first visit) and only the phase-dependent step means are computed per call."""
    wa, wb, iso_h, iso_g, cands, cols, capacity = _pair_prep(state, host, host_gpus, guest, host_cfgs, guest_cfgs,
                                                             orders, capacity, prep_key)
    best = None
    for c in cands:
        neg_ub, rank, hc, gc, idx, ph, pg, arrays = c
        if best is not None and -neg_ub < best[3] - 1e-12:
            break
        if arrays is None:  # first visit of this candidate: its phase-independent arrays
            arrays = c[7] = _candidate_arrays(state, host_gpus, cols[idx], capacity, ph, pg)
        ok, inv, H, la0, zg, together, linked = arrays
        if inv is None:  # no order of this group fits in memory
            continue
        ks = _arange(H)
        if i_host == 0:
            pha, la = ks % ph.period, la0
        else:
            pha = (i_host + ks) % ph.period
            la = ph.compute_s[pha].T
        phb = (i_guest + ks) % pg.period
        # loads[o, g, k]: the host's compute on its GPU g at step k plus the guest worker's on it
        # (a zero column for a GPU without a guest worker): the sums the engine forms, per order;
        # under the fitted sharing the engine's concurrent time, read from the candidate's table
        if together is None:
            loads = la[None, :, :] + zg[:, phb][inv]
        else:
            loads = together[_arange(wa)[None, :, None], pha[None, None, :], inv[:, :, None], phb[None, None, :]]
        comm = ph.comm_s[pha] + pg.comm_s[phb] if linked else np.maximum(ph.comm_s[pha], pg.comm_s[phb])
        step = np.ascontiguousarray(loads.max(axis=1) + comm[None, :]).mean(axis=1)  # (n,)
        step = np.where(ok, step, np.inf)
        k = int(np.argmin(step))
        if not np.isfinite(step[k]):
            continue
        s = float(step[k])
        xh = ph.eta * iso_h / s
        xg = pg.eta * iso_g / s
        value = wa * xh + wb * xg
        if (best is None or value > best[3] + 1e-12
                or (abs(value - best[3]) <= 1e-12 and rank < best[7])):
            best = (hc, gc, idx[k], value, xh, xg, s, rank)
    return None if best is None else best[:7]


def pair_step_lower_bound(state: ClusterState, host_load: float, host_slowest: float, host_sync: float,
                          guest_load: float, guest_slowest: float, guest_sync: float, host_width: int) -> float:
    """A lower bound (s) on the mean lockstep step of a host and a guest on its GPUs, from
    :func:`profile_summary`'s means: the busiest GPU computes at least either job's slowest worker
    and, time-sliced, at least the average summed load; under the fitted model two workers may
    take less than their sum, but no rate exceeds 1, so a GPU computes at least its host worker's
    load and at least half the summed load, on average over the GPUs too. The sync lasts at least
    the longer mean sync (eq. L1 can only add to it)."""
    summed = (host_load + guest_load) / host_width
    fitted = state.sharing is not None and state.sharing.fitted
    mean_load = max(host_load / host_width, summed / 2.0) if fitted else summed
    return max(mean_load, host_slowest, guest_slowest) + max(host_sync, guest_sync)


def _pair_prep(state, host, host_gpus, guest, host_cfgs, guest_cfgs, orders, capacity, prep_key=None) -> tuple:
    """:func:`_pair_candidates`, cached by ``prep_key`` when given."""
    if prep_key is None:
        return _pair_candidates(state, host, host_gpus, guest, host_cfgs, guest_cfgs, orders, capacity)
    # entries hold arrays per visited candidate (up to tens of kB): a smaller bound keeps a
    # whole-trace replay's memory under its 2 GiB target (200k entries took it to 2.7 GiB)
    cache = _cache(state.costs, _sharing_tag(state, "pair_prep"), limit=_MAX_PREP)
    prep = cache.get(prep_key)
    if prep is None:
        prep = cache[prep_key] = _pair_candidates(state, host, host_gpus, guest, host_cfgs, guest_cfgs, orders,
                                                  capacity)
    return prep


def _search_pairing_phases(state, host, host_gpus, guest, host_cfgs, guest_cfgs, orders, capacity, phases,
                           prep_key=None) -> list:
    """``[_search_pairing(..., 0, r, prep_key) for r in phases]`` in one pass over the candidates:
    the same branch and bound for every guest phase offset ``r`` at once, each phase leaving the
    search where its own would stop (its best value above the next candidate's bound), its step
    means computed in one numpy expression over the phases still searching. The same floats: the
    loads, maxima and sums are those of the single search, element by element, and each mean is
    a reduction over one contiguous row of the hyper-period, as there. (The single search keeps
    its own two-dimensional arrays: run through this function for one phase, the first 10,000
    Philly jobs with Jigsaw took 7 % longer.)"""
    wa, wb, iso_h, iso_g, cands, cols, capacity = _pair_prep(state, host, host_gpus, guest, host_cfgs, guest_cfgs,
                                                             orders, capacity, prep_key)
    phases = list(phases)
    best: list = [None] * len(phases)
    searching = list(range(len(phases)))
    for c in cands:
        neg_ub, rank, hc, gc, idx, ph, pg, arrays = c
        searching = [i for i in searching if best[i] is None or not -neg_ub < best[i][3] - 1e-12]
        if not searching:
            break
        if arrays is None:
            arrays = c[7] = _candidate_arrays(state, host_gpus, cols[idx], capacity, ph, pg)
        ok, inv, H, la0, zg, together, linked = arrays
        if inv is None:
            continue
        ks = _arange(H)
        pha = ks % ph.period
        phb = (np.array([phases[i] for i in searching])[:, None] + ks[None, :]) % pg.period  # (P, H)
        if together is None:
            loads = la0[None, :, None, :] + zg[:, phb][inv]  # (orders, wa, P, H)
        else:
            loads = together[_arange(wa)[None, :, None, None], pha[None, None, None, :], inv[:, :, None, None],
                             phb[None, None, :, :]]
        sync_h, sync_g = ph.comm_s[pha][None, :], pg.comm_s[phb]
        comm = sync_h + sync_g if linked else np.maximum(sync_h, sync_g)  # (P, H)
        step = np.ascontiguousarray(loads.max(axis=1) + comm[None, :, :]).mean(axis=2)  # (orders, P)
        step = np.where(ok[:, None], step, np.inf)
        ks_best = np.argmin(step, axis=0).tolist()
        for col, i in enumerate(searching):
            k = ks_best[col]
            if not np.isfinite(step[k, col]):
                continue
            s = float(step[k, col])
            xh = ph.eta * iso_h / s
            xg = pg.eta * iso_g / s
            value = wa * xh + wb * xg
            b = best[i]
            if b is None or value > b[3] + 1e-12 or (abs(value - b[3]) <= 1e-12 and rank < b[7]):
                best[i] = (hc, gc, idx[k], value, xh, xg, s, rank)
    return [None if b is None else b[:7] for b in best]


_ARANGE: dict[int, np.ndarray] = {}


def _arange(n: int) -> np.ndarray:
    a = _ARANGE.get(n)
    if a is None:
        a = _ARANGE[n] = np.arange(n)
        a.setflags(write=False)
    return a


def _pair_candidates(state, host, host_gpus, guest, host_cfgs, guest_cfgs, orders, capacity) -> tuple:
    """The phase-independent part of :func:`_search_pairing`: ``(wa, wb, iso_h, iso_g, cands,
    cols, capacity)`` with the candidates sorted by decreasing bound (ties by enumeration rank),
    each a list ``[-bound, rank, host cfg, guest cfg, order indices, host profile, guest profile,
    arrays]`` where ``arrays`` is None until the search first visits the candidate and fills it in
    with :func:`_candidate_arrays`; ``cols`` (orders x guest workers) holds every order's host
    worker indices and ``capacity`` each host GPU's memory (bytes)."""
    costs = state.costs
    wa, wb = len(host_gpus), guest.num_gpus
    iso_h, iso_g = costs.isolated_iteration_s(host), costs.isolated_iteration_s(guest)
    cols = np.asarray(orders, dtype=np.int64)  # (O, wb) host worker indices
    # group orders by the guest's own placement signature (cross-node or not, GPU types)
    groups: dict[tuple, list[int]] = {}
    for i, o in enumerate(orders):
        groups.setdefault(placement_sig(state, tuple([host_gpus[c] for c in o])), []).append(i)
    cands = []
    for hc in host_cfgs:
        ph = costs.profile(host, hc[0], hc[1], host_gpus)
        th, mh, ch = profile_summary(costs, ph)
        for gc in guest_cfgs:
            for idx in groups.values():
                pg = costs.profile(guest, gc[0], gc[1], tuple(host_gpus[c] for c in orders[idx[0]]))
                tg, mg, cg = profile_summary(costs, pg)
                lb = pair_step_lower_bound(state, th, mh, ch, tg, mg, cg, wa)
                ub = (wa * ph.eta * iso_h + wb * pg.eta * iso_g) / lb if lb > 0 else float("inf")
                cands.append((-ub, len(cands), hc, gc, idx, ph, pg))
    cands.sort(key=lambda c: (c[0], c[1]))
    # the arrays of a candidate (memory feasibility per order, gather map, loads) are made on its
    # first visit by the branch and bound (:func:`_candidate_arrays`): most candidates fall below
    # the best value found and are never visited
    return wa, wb, iso_h, iso_g, [[*c, None] for c in cands], cols, capacity


def _candidate_arrays(state: ClusterState, host_gpus, sub: np.ndarray, capacity: np.ndarray, ph, pg) -> tuple:
    """One candidate's phase-independent arrays, for its orders ``sub`` (orders x guest workers,
    host worker indices): ``(memory-ok per order, gather map or None when no order fits,
    hyper-period, host loads at phase 0 (wa, H), guest compute padded with a zero worker (wb + 1,
    period), the fitted sharing's GPU times or None, whether the two syncs share a link)``.
    ``inv[o, g]`` is the guest worker on host GPU ``g`` in order ``o``, or ``wb`` (the zero row)
    for none. Under the fitted sharing ``together[g, p, w, q]`` is the time host GPU ``g``
    computes when the host is in phase ``p`` and guest worker ``w`` (the zero row: none) in phase
    ``q`` (:func:`jigsaw_env.interference.shared_gpu_time`, the engine's eq. K1'); time-sliced,
    the loads add up. The syncs share a link (eq. L1: summed) when the guest on the host's GPUs
    spans nodes exactly when the host does (every order of a candidate has the same signature)."""
    wa, wb = len(host_gpus), sub.shape[1]
    n = len(sub)
    sa = np.arange(n)
    # memory at each process's peak, per host GPU
    mem = np.broadcast_to(ph.peak_bytes, (n, wa)).copy()
    for w in range(wb):
        mem[sa, sub[:, w]] += pg.peak_bytes[w]
    ok = np.all(mem <= capacity[None, :], axis=1)
    if not ok.any():
        return ok, None, 0, None, None, None, False
    inv = np.full((n, wa), wb, dtype=np.int64)
    for w in range(wb):
        inv[sa, sub[:, w]] = w
    H = _lcm(ph.period, pg.period)
    la0 = np.ascontiguousarray(ph.compute_s[_arange(H) % ph.period].T)  # (wa, H)
    zg = np.concatenate([pg.compute_s.T, np.zeros((1, pg.period))], axis=0)  # (wb + 1, period)
    sharing = state.sharing
    together, linked = None, False
    if sharing is not None:
        guest_gpus = [host_gpus[c] for c in sub[0]]
        linked = bool(sharing.links_of(host_gpus) & sharing.links_of(guest_gpus))
        if sharing.fitted:
            peaks = sharing.peaks_of(host_gpus)[:, None, None, None]
            host = ph.compute_s.T[:, :, None, None]  # (wa, Ph, 1, 1)
            together = shared_gpu_time(host, zg[None, None, :, :], ph.batch_size, pg.batch_size, peaks,
                                       sharing.model)  # (wa, Ph, wb + 1, Pg)
    return ok, inv, H, la0, zg, together, linked


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
