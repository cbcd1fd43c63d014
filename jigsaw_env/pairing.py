"""The pairing search: the best co-location of a guest job on a host job's GPUs.

:func:`search_pairing` scores each candidate (both jobs' SPB configuration and the guest's worker
order over the host's GPUs) by the simulator's pace: under the lockstep pace with the engine's
exact step formula over the hyper-period (``jigsaw_env.engine``, eq. K1/K2), under the free pace
with a one-step estimate of each job's iteration time from eqs. F1-F3
(:func:`_free_candidate_values`); memory checked at each process's peak. Jigsaw's fitting
(``agents.common.best_pairing``, ``agents.jigsaw``) and the environment's pair-with-host
placement options (``jigsaw_env.actions``) both choose a guest's GPUs with it, so a pairing the
heuristic builds is one the action menu can express.

Normalised useful throughput of a job ``j`` is ``x_j = eta_j * T_iso_j / step_j`` (full-backprop-
equivalent iterations per second relative to the job alone at level 0 on dedicated consolidated
GPUs, ``CostModel.isolated_iteration_s``); a pairing's value is ``n_host * x_host + n_guest *
x_guest`` (docs/design.md section 5).
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple, Sequence

import numpy as np

from .interference import pair_rates, pair_terms, shared_gpu_time
from .spb import Pattern
from .state import ClusterState, CostModel, JobState

Config = tuple[int, Pattern]  # (SPB level, pattern)

_CACHES: "weakref.WeakKeyDictionary[CostModel, dict]" = weakref.WeakKeyDictionary()


MAX_CACHE_ENTRIES = 200_000


MAX_PREP_ENTRIES = 4_000


class _LastLookup:
    """The CostModel :func:`caches_of` looked up last (a weak reference) and its caches, kept at
    hand: most lookups in a row are of the same model."""

    __slots__ = ("ref", "caches")

    def __init__(self) -> None:
        self.ref = None
        self.caches: dict | None = None


_LAST = _LastLookup()


def caches_of(costs: CostModel) -> dict:
    """The per-CostModel dict of named caches (the last one looked up is kept at hand)."""
    last = _LAST
    ref = last.ref
    if ref is not None and ref() is costs:
        return last.caches
    per = _CACHES.get(costs)
    if per is None:
        per = _CACHES[costs] = {}
    last.ref, last.caches = weakref.ref(costs), per
    return per


def free_pace(state: ClusterState) -> bool:
    """Whether the simulator steps co-located jobs each at its own pace (eqs. F1-F4): the pairing
    search then scores a pair with :func:`_free_candidate_values`, else as one lockstep component."""
    sharing = state.sharing
    return sharing is not None and sharing.pace == "free"


def sharing_tag(state: ClusterState, name: str) -> str:
    """A cache name per sharing mode and pace: a pairing's value depends on how the pair shares
    its GPUs and how it steps, and one CostModel may serve simulators of either."""
    sharing = state.sharing
    if sharing is None:
        return name
    return name + "/" + sharing.mode if sharing.pace == "lockstep" else name + "/" + sharing.mode + "/free"


def phase_difference(state: ClusterState, host: JobState, guest: JobState, width: int) -> int:
    """The guest's SPB phase relative to its ``width``-GPU host's, modulo :func:`phase_mod`: all
    a pairing's score reads of the two iteration counters (the mean step over a hyper-period
    depends on the phases only through their difference: shifting both counters by k rotates the
    step sequence, and every period divides the modulus). 0 on one GPU (the loads just add up)
    and under the free pace (:func:`free_pace`: the pair's phases drift, and its score does not
    read them)."""
    if width <= 1 or free_pace(state):
        return 0
    return (guest.iteration - host.iteration) % phase_mod(state)


def named_cache(costs: CostModel, name: str, limit: int = MAX_CACHE_ENTRIES) -> dict:
    """A named cache of ``costs`` (emptied when it grows past ``limit`` entries: every entry is a
    pure function of its key, so recomputing one gives the same value)."""
    per = caches_of(costs)
    c = per.get(name)
    if c is None or len(c) > limit:
        c = per[name] = {}
    return c


def placement_sig(state: ClusterState, gpus: Sequence[int]) -> tuple:
    """What a job's profile depends on in its GPUs: their number, whether they span nodes, and
    (on a mixed cluster) their types. Cached per GPU tuple."""
    key = gpus if type(gpus) is tuple else tuple(gpus)
    cache = named_cache(state.costs, "psig")
    sig = cache.get(key)
    if sig is None:
        cl = state.cluster
        sig = cache[key] = workers_signature([g // cl.gpus_per_node for g in key],
                                      None if state.costs.homogeneous else [cl.gpu_type(g) for g in key])
    return sig


def workers_signature(nodes: Sequence, types: Sequence | None) -> tuple:
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
    cache = named_cache(state.costs, "layout")
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


@dataclass(frozen=True)
class PairPlan:
    """A co-location: the guest's workers on a subset of the host's GPUs.

    value: n_host * x_host + n_guest * x_guest (dedicated-GPU equivalents of useful work).
    step_s: the host's estimated mean iteration time (s): the mean lockstep step over the
        hyper-period under the lockstep pace (both jobs step together), the host's one-step
        free-pace estimate under the free pace (:func:`_free_candidate_values`).
    """

    host_cfg: Config
    guest_cfg: Config
    guest_gpus: tuple[int, ...]
    value: float
    x_host: float
    x_guest: float
    step_s: float


class PairingHit(NamedTuple):
    """What the pairing search finds and caches: a :class:`PairPlan` with the guest's worker order
    as its index in the searched orders (``order_index``), so that one cached search serves every
    host with the same layout (the caller maps the order onto its own GPUs). ``step_s``: as
    :class:`PairPlan`'s."""

    host_cfg: Config
    guest_cfg: Config
    order_index: int
    value: float
    x_host: float
    x_guest: float
    step_s: float

    def plan(self, host_gpus: Sequence[int], orders: Sequence[tuple[int, ...]]) -> PairPlan:
        """The :class:`PairPlan` on ``host_gpus``, the guest's workers on ``orders[order_index]``."""
        return PairPlan(self.host_cfg, self.guest_cfg, tuple([host_gpus[i] for i in orders[self.order_index]]),
                        self.value, self.x_host, self.x_guest, self.step_s)


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


def phase_mod(state: ClusterState) -> int:
    """A common multiple of every SPB cycle length (lcm of 1..num_slots): phases matter modulo it."""
    per = caches_of(state.costs)
    m = per.get("phase_mod")
    if m is None:
        m = 1
        for p in range(1, state.spb.num_slots + 1):
            m = math.lcm(m, p)
        per["phase_mod"] = m
    return m


def profile_summary(costs: CostModel, prof) -> tuple[float, float, float]:
    """(mean over the cycle of the summed compute of all workers, of the slowest worker's compute,
    of the sync time) of a profile: the ingredients of a lower bound on a shared step."""
    cache = named_cache(costs, "summary")
    key = id(prof)  # profiles live in the CostModel's cache for its whole life
    v = cache.get(key)
    if v is None:
        c = prof.compute_s
        v = cache[key] = (float(c.sum(axis=1).mean()), float(c.max(axis=1).mean()), float(prof.comm_s.mean()))
    return v


def search_pairing_at(state, host, host_gpus, guest, host_cfgs, guest_cfgs, orders, capacity, i_host, i_guest,
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
    free = free_pace(state)
    best = None
    for c in cands:
        neg_ub, rank, hc, gc, idx, ph, pg, arrays = c
        if best is not None and -neg_ub < best[3] - 1e-12:
            break
        if free:
            if arrays is None:  # first visit: every order's value (phase-independent, kept)
                arrays = c[7] = _free_candidate_values(state, host_gpus, cols[idx], capacity, ph, pg,
                                                       wa * ph.eta * iso_h, wb * pg.eta * iso_g)
            found = _free_best(arrays, ph, pg, iso_h, iso_g)
        else:
            if arrays is None:  # first visit of this candidate: its phase-independent arrays
                arrays = c[7] = _candidate_arrays(state, host_gpus, cols[idx], capacity, ph, pg)
            found = _lockstep_best(arrays, ph, pg, iso_h, iso_g, wa, wb, i_host, i_guest)
        if found is None:  # no order of this group fits in memory
            continue
        k, value, xh, xg, s = found
        if (best is None or value > best[3] + 1e-12
                or (abs(value - best[3]) <= 1e-12 and rank < best[7])):
            best = (hc, gc, idx[k], value, xh, xg, s, rank)
    return None if best is None else PairingHit(*best[:7])


def _lockstep_best(arrays: tuple, ph, pg, iso_h: float, iso_g: float, wa: int, wb: int, i_host: int,
                   i_guest: int) -> tuple | None:
    """``(order index, value, x_host, x_guest, step)`` of a candidate's best order under the
    lockstep pace (the shortest mean step, :func:`_lockstep_steps`), or None when none fits."""
    step = _lockstep_steps(arrays, ph, pg, i_host, i_guest)
    if step is None:
        return None
    k = int(np.argmin(step))
    if not np.isfinite(step[k]):
        return None
    s = float(step[k])
    xh = ph.eta * iso_h / s
    xg = pg.eta * iso_g / s
    return k, wa * xh + wb * xg, xh, xg, s


def _free_best(arrays: tuple, ph, pg, iso_h: float, iso_g: float) -> tuple | None:
    """``(order index, value, x_host, x_guest, host iteration time)`` of a candidate's best order
    under the free pace (the largest value of :func:`_free_candidate_values`; ties: the first),
    or None when none fits."""
    values, t_host, t_guest = arrays
    if values is None:
        return None
    k = int(np.argmax(values))
    if not np.isfinite(values[k]):
        return None
    s = float(t_host[k])
    return k, float(values[k]), ph.eta * iso_h / s, pg.eta * iso_g / float(t_guest[k]), s


def _lockstep_steps(arrays: tuple, ph, pg, i_host: int, i_guest: int) -> np.ndarray | None:
    """Per order of a candidate (:func:`_candidate_arrays`' ``arrays``), the mean lockstep step
    over the hyper-period with the host at phase ``i_host`` and the guest at ``i_guest`` (inf
    where the order does not fit in memory), or None when no order fits."""
    ok, inv, H, la0, zg, together, linked = arrays
    if inv is None:
        return None
    wa = len(la0)
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
    return np.where(ok, step, np.inf)


def pair_value_bound(state: ClusterState, host_gpus, wb: int, ph, pg, iso_h: float, iso_g: float,
                     summary_h: tuple, summary_g: tuple, linked: bool) -> float:
    """An upper bound on the value of every order of a candidate (host profile ``ph`` on
    ``host_gpus``, guest profile ``pg`` of ``wb`` workers, their :func:`profile_summary`
    ``summary_h`` and ``summary_g``, syncs sharing a link when ``linked``): under the lockstep
    pace both jobs' useful work over :func:`pair_step_lower_bound`, under the free pace
    :func:`free_value_bound`."""
    wa = len(host_gpus)
    if free_pace(state):
        return free_value_bound(state, host_gpus, wb, ph, pg, iso_h, iso_g, summary_h, summary_g, linked)
    th, mh, ch = summary_h
    tg, mg, cg = summary_g
    lb = pair_step_lower_bound(state, th, mh, ch, tg, mg, cg, wa, linked)
    return (wa * ph.eta * iso_h + wb * pg.eta * iso_g) / lb if lb > 0 else float("inf")


def free_value_bound(state: ClusterState, host_gpus, wb: int, ph, pg, iso_h: float, iso_g: float,
                     summary_h: tuple, summary_g: tuple, linked: bool) -> float:
    """An upper bound on :func:`_free_candidate_values` over every order of a candidate (the
    arguments as :func:`pair_value_bound`'s). Each job's mean iteration is at least its
    slowest worker's mean compute ``m`` plus its mean sync ``s`` alone (no factor of the estimate
    is below 1), and more where every order slows it alike:

    - a linked sync takes exactly ``s * (1 + u_other)``, ``u = s / (m + s)`` of the other alone;
    - every guest worker shares a GPU with a host worker, whose duty is at least ``d_min`` (the
      least of its workers' alone compute over its alone cycle), and beside it runs at a rate no
      higher than ``1 / inv_min`` (:func:`_least_inverse_rates`): its compute takes at least
      ``1 + d_min * (inv_min - 1)`` times its alone time;
    - the host likewise on the GPUs of the guest's workers: on every GPU when the guest is as
      wide, else at least on its lightest worker's."""
    wa = len(host_gpus)
    _, mh, ch = summary_h
    _, mg, cg = summary_g
    cyc_h, cyc_g = mh + ch, mg + cg  # alone mean iteration times (s)
    if cyc_h <= 0 or cyc_g <= 0:
        return float("inf")
    least_h, light_h = _worker_summary(state.costs, ph)
    least_g, _ = _worker_summary(state.costs, pg)
    inv_h, inv_g = _least_inverse_rates(state, host_gpus, ph, pg)
    slow_h = 1.0 + least_g / (pg.period * cyc_g) * (inv_h - 1.0)
    slow_g = 1.0 + least_h / (ph.period * cyc_h) * (inv_g - 1.0)
    comp_h = slow_h * mh if wb == wa else max(mh, slow_h * light_h)
    sync_h = ch * (1.0 + cg / cyc_g) if linked else ch
    sync_g = cg * (1.0 + ch / cyc_h) if linked else cg
    return wa * ph.eta * iso_h / (comp_h + sync_h) + wb * pg.eta * iso_g / (slow_g * mg + sync_g)


def _worker_summary(costs: CostModel, prof) -> tuple[float, float]:
    """(the least of a profile's workers' compute summed over its cycle, the mean over the cycle
    of its lightest worker's compute), seconds, cached like :func:`profile_summary`."""
    cache = named_cache(costs, "worker_summary")
    key = id(prof)
    v = cache.get(key)
    if v is None:
        c = prof.compute_s
        v = cache[key] = (float(c.sum(axis=0).min()), float(c.min(axis=1).mean()))
    return v


def _least_inverse_rates(state: ClusterState, host_gpus, ph, pg) -> tuple[float, float]:
    """The least ``1 / x`` of the host's worker beside a guest worker and of a guest worker beside
    the host's, over every phase of both and every host GPU (eq. I1 is linear in the logs of the
    alone times, so its least value is at their extremes; 2 time-sliced). 1 for a job that never
    computes (its duty is then 0 and it slows no one). Cached per pair of profiles and model: a
    host profile fixes its GPUs' types, hence their peaks (the placement signature holds the types
    on a mixed cluster), and profiles live in the CostModel's cache for its whole life."""
    sharing = state.sharing
    if not sharing.fitted:
        return 2.0, 2.0
    cache = named_cache(state.costs, "least_inverse_rates")
    key = (id(ph), id(pg), sharing.model)
    v = cache.get(key)
    if v is None:
        v = cache[key] = _least_inverse_rates_of(state, host_gpus, ph, pg)
    return v


def _least_inverse_rates_of(state: ClusterState, host_gpus, ph, pg) -> tuple[float, float]:
    """:func:`_least_inverse_rates` under the fitted sharing, computed."""
    sharing = state.sharing
    rh, rg = _log_compute_range(state.costs, ph), _log_compute_range(state.costs, pg)
    if rh is None or rg is None:
        return 1.0, 1.0
    bh, bg = math.log(ph.batch_size), math.log(pg.batch_size)
    model = sharing.model
    inv_h = inv_g = math.inf
    for peak in sharing.distinct_peaks(host_gpus):
        if not math.isfinite(peak):  # a time-sliced device
            inv_h, inv_g = min(inv_h, 2.0), min(inv_g, 2.0)
            continue
        lp = math.log(peak)
        for a in rh:
            for b in rg:
                inv_h = min(inv_h, 1.0 + math.exp(model.combine(pair_terms(a, b, bh, bg, lp))))
                inv_g = min(inv_g, 1.0 + math.exp(model.combine(pair_terms(b, a, bg, bh, lp))))
    return inv_h, inv_g


def _log_compute_range(costs: CostModel, prof) -> tuple[float, float] | None:
    """The logs of a profile's least positive compute time and of its largest (s), or None when
    it never computes; cached like :func:`profile_summary`."""
    cache = named_cache(costs, "log_compute_range")
    key = id(prof)
    v = cache.get(key, False)
    if v is False:
        c = prof.compute_s
        positive = c > 0
        v = cache[key] = ((math.log(float(c[positive].min())), math.log(float(c.max())))
                          if positive.any() else None)
    return v


def pair_step_lower_bound(state: ClusterState, host_load: float, host_slowest: float, host_sync: float,
                          guest_load: float, guest_slowest: float, guest_sync: float, host_width: int,
                          linked: bool = False) -> float:
    """A lower bound (s) on the mean lockstep step of a host and a guest on its GPUs, from
    :func:`profile_summary`'s means: the busiest GPU computes at least either job's slowest worker
    and, time-sliced, at least the average summed load; under the fitted model two workers may
    take less than their sum, but no rate exceeds 1, so a GPU computes at least its host worker's
    load and at least half the summed load, on average over the GPUs too. The sync lasts at least
    the longer mean sync, and when the two syncs share a link (``linked``, :func:`syncs_share_a_link`)
    the sum of the means: eq. L1 adds them at every step."""
    summed = (host_load + guest_load) / host_width
    fitted = state.sharing is not None and state.sharing.fitted
    mean_load = max(host_load / host_width, summed / 2.0) if fitted else summed
    sync = host_sync + guest_sync if linked else max(host_sync, guest_sync)
    return max(mean_load, host_slowest, guest_slowest) + sync


def syncs_share_a_link(state: ClusterState, host_gpus: Sequence[int], guest_gpus: Sequence[int]) -> bool:
    """Whether a host's sync and a guest's on a subset of its GPUs cross a common link (eq. L1):
    they do when the guest spans nodes exactly when the host does. False without the simulator's
    sharing model (syncs then overlap freely)."""
    sharing = state.sharing
    return sharing is not None and bool(sharing.links_of(host_gpus) & sharing.links_of(guest_gpus))


def _pair_prep(state, host, host_gpus, guest, host_cfgs, guest_cfgs, orders, capacity, prep_key=None) -> tuple:
    """:func:`_pair_candidates`, cached by ``prep_key`` when given."""
    if prep_key is None:
        return _pair_candidates(state, host, host_gpus, guest, host_cfgs, guest_cfgs, orders, capacity)
    # entries hold arrays per visited candidate (up to tens of kB): a smaller bound keeps a
    # whole-trace replay's memory under its 2 GiB target (200k entries took it to 2.7 GiB)
    cache = named_cache(state.costs, sharing_tag(state, "pair_prep"), limit=MAX_PREP_ENTRIES)
    prep = cache.get(prep_key)
    if prep is None:
        prep = cache[prep_key] = _pair_candidates(state, host, host_gpus, guest, host_cfgs, guest_cfgs, orders,
                                                  capacity)
    return prep


def search_pairing_phases(state, host, host_gpus, guest, host_cfgs, guest_cfgs, orders, capacity, phases,
                           prep_key=None) -> list:
    """``[search_pairing_at(..., 0, r, prep_key) for r in phases]`` in one pass over the candidates:
    the same branch and bound for every guest phase offset ``r`` at once, each phase leaving the
    search where its own would stop (its best value above the next candidate's bound), its step
    means computed in one numpy expression over the phases still searching. The same floats: the
    loads, maxima and sums are those of the single search, element by element, and each mean is
    a reduction over one contiguous row of the hyper-period, as there. (The single search keeps
    its own two-dimensional arrays: run through this function for one phase, the first 10,000
    Philly jobs with Jigsaw took 7 % longer.) Under the free pace no score reads the phases:
    every phase gets the one search's answer."""
    if free_pace(state):
        hit = search_pairing_at(state, host, host_gpus, guest, host_cfgs, guest_cfgs, orders, capacity, 0, 0, prep_key)
        return [hit] * len(phases)
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
    return [None if b is None else PairingHit(*b[:7]) for b in best]


_ARANGE: dict[int, np.ndarray] = {}


def _arange(n: int) -> np.ndarray:
    a = _ARANGE.get(n)
    if a is None:
        a = _ARANGE[n] = np.arange(n)
        a.setflags(write=False)
    return a


def _pair_candidates(state, host, host_gpus, guest, host_cfgs, guest_cfgs, orders, capacity) -> tuple:
    """The phase-independent part of :func:`search_pairing_at`: ``(wa, wb, iso_h, iso_g, cands,
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
    group_linked = [syncs_share_a_link(state, host_gpus, [host_gpus[c] for c in orders[idx[0]]])
                    for idx in groups.values()]
    cands = []
    for hc in host_cfgs:
        ph = costs.profile(host, hc[0], hc[1], host_gpus)
        th, mh, ch = profile_summary(costs, ph)
        for gc in guest_cfgs:
            for idx, linked in zip(groups.values(), group_linked):
                pg = costs.profile(guest, gc[0], gc[1], tuple(host_gpus[c] for c in orders[idx[0]]))
                ub = pair_value_bound(state, host_gpus, wb, ph, pg, iso_h, iso_g, (th, mh, ch),
                                      profile_summary(costs, pg), linked)
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
    wa = len(host_gpus)
    inv = _guest_on_gpu(sub, wa)
    ok = _memory_ok(ph, pg, inv, capacity)
    if not ok.any():
        return ok, None, 0, None, None, None, False
    H = math.lcm(ph.period, pg.period)
    la0 = np.ascontiguousarray(ph.compute_s[_arange(H) % ph.period].T)  # (wa, H)
    zg = np.concatenate([pg.compute_s.T, np.zeros((1, pg.period))], axis=0)  # (wb + 1, period)
    sharing = state.sharing
    together = None
    linked = syncs_share_a_link(state, host_gpus, [host_gpus[c] for c in sub[0]])
    if sharing is not None and sharing.fitted:
        peaks = sharing.peaks_of(host_gpus)[:, None, None, None]
        host = ph.compute_s.T[:, :, None, None]  # (wa, Ph, 1, 1)
        together = shared_gpu_time(host, zg[None, None, :, :], ph.batch_size, pg.batch_size, peaks,
                                   sharing.model)  # (wa, Ph, wb + 1, Pg)
    return ok, inv, H, la0, zg, together, linked


def _memory_ok(ph, pg, inv: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Per order of :func:`_guest_on_gpu`'s ``inv`` (the guest worker on each host GPU, or the
    guest's width for none), whether every host GPU holds its processes' peaks (bytes: the host's
    worker and the guest's on it, if any) in ``capacity``."""
    guest_peaks = np.append(pg.peak_bytes, 0.0)  # the last entry: no guest worker
    return np.all(ph.peak_bytes[None, :] + guest_peaks[inv] <= capacity[None, :], axis=1)


def _guest_on_gpu(sub: np.ndarray, wa: int) -> np.ndarray:
    """``inv[o, g]``: the guest worker on host GPU ``g`` in order ``o`` of ``sub``, or the
    guest's width (no worker)."""
    n, wb = sub.shape
    inv = np.full((n, wa), wb, dtype=np.int64)
    inv[_arange(n)[:, None], sub] = _arange(wb)[None, :]
    return inv


def _alone_shares(compute: np.ndarray, sync: np.ndarray) -> tuple:
    """A job's shares alone, from its ``compute`` (period x workers, s) and ``sync`` (period, s):
    ``(duty per worker, phase weights per worker (workers x period), sync share)``: the share of
    its alone cycle ``T0 = sum_p (max_w compute + sync)`` each worker computes, the share of a
    worker's compute in each phase, and the share of the cycle it syncs (eqs. F1, F2 at alone
    times)."""
    cycle = float((compute.max(axis=1) + sync).sum())
    total = compute.sum(axis=0)
    duty = total / cycle if cycle > 0 else np.zeros_like(total)
    weights = np.divide(compute.T, total[:, None], out=np.zeros(compute.T.shape), where=total[:, None] > 0)
    return duty, weights, (float(sync.sum()) / cycle if cycle > 0 else 0.0)


def _alone_shares_of(costs: CostModel, prof) -> tuple:
    """:func:`_alone_shares` of a profile, cached like :func:`profile_summary`."""
    cache = named_cache(costs, "alone_shares")
    key = id(prof)
    v = cache.get(key)
    if v is None:
        v = cache[key] = _alone_shares(prof.compute_s, prof.comm_s)
    return v


def _free_rates(state: ClusterState, host_gpus, ph, pg) -> tuple:
    """``(x_host, x_guest)``, each (host GPUs, host period, guest workers, guest period): the
    normalized rates of the host's worker on each host GPU in each phase and of each guest worker
    in each phase, computing together there (eq. I2 under the fitted sharing; 1/2 time-sliced,
    as the simulator's ``SharingModel.rates``)."""
    a_h = ph.compute_s.T[:, :, None, None]
    a_g = pg.compute_s.T[None, None, :, :]
    sharing = state.sharing
    if not sharing.fitted:
        half = np.full((a_h.shape[0], a_h.shape[1], a_g.shape[2], a_g.shape[3]), 0.5)
        return half, half
    peaks = sharing.peaks_of(host_gpus)[:, None, None, None]
    with np.errstate(invalid="ignore"):
        xh, xg = pair_rates(np.where(a_h > 0, a_h, 1.0), np.where(a_g > 0, a_g, 1.0), ph.batch_size, pg.batch_size,
                            peaks, sharing.model)
    # (the host's times, the guest's and the peaks broadcast to the full shape); a time-sliced
    # device (NaN peak) shares its time evenly
    return np.where(np.isfinite(xh), xh, 0.5), np.where(np.isfinite(xg), xg, 0.5)


@dataclass(frozen=True)
class _FreeSlowdowns:
    """What the free-pace score of a pair of profiles needs beyond the guest's order
    (:func:`_free_slowdowns_of`). ``host[g, p, w]``: the factor by which the host's worker on host
    GPU ``g`` in phase ``p`` slows beside guest worker ``w`` (eq. F1 with one co-runner; a last
    column of ones for no guest worker); ``guest[g, w, q]``: guest worker ``w``'s in phase ``q``
    on host GPU ``g``; ``host_sync_share``, ``guest_sync_share``: each job's sync share ``u``
    alone (eq. F2)."""

    host: np.ndarray
    guest: np.ndarray
    host_sync_share: float
    guest_sync_share: float


def _free_slowdowns_of(state: ClusterState, host_gpus, ph, pg) -> _FreeSlowdowns:
    """:class:`_FreeSlowdowns` of a host profile on ``host_gpus`` and a guest profile, cached per
    pair of profiles, sharing mode and model as :func:`_least_inverse_rates` is (a host profile
    fixes its GPUs' types, hence their peaks)."""
    cache = named_cache(state.costs, sharing_tag(state, "free_slowdowns"))
    key = (id(ph), id(pg), state.sharing.model)
    v = cache.get(key)
    if v is None:
        duty_h, pi_h, u_h = _alone_shares_of(state.costs, ph)
        duty_g, pi_g, u_g = _alone_shares_of(state.costs, pg)
        xh, xg = _free_rates(state, host_gpus, ph, pg)
        f_h = (pi_g[None, None, :, :] / xh).sum(axis=3)
        f_h = np.concatenate([(1.0 - duty_g) + duty_g * f_h, np.ones((len(host_gpus), f_h.shape[1], 1))], axis=2)
        f_g = (pi_h[:, :, None, None] / xg).sum(axis=1)
        f_g = (1.0 - duty_h)[:, None, None] + duty_h[:, None, None] * f_g
        v = cache[key] = _FreeSlowdowns(f_h, f_g, u_h, u_g)
    return v


def _free_candidate_values(state: ClusterState, host_gpus, sub: np.ndarray, capacity: np.ndarray, ph, pg,
                           work_h: float, work_g: float) -> tuple:
    """A candidate's value per order under the free pace: a one-step estimate of eqs. F1-F2 (no
    fixed point), ``(values, host iteration s, guest iteration s)`` per order of ``sub`` (orders x
    guest workers, host worker indices), -inf / inf where an order does not fit in memory, or
    ``(None, None, None)`` when none fits. ``work_h``, ``work_g``: each job's workers times its eta
    times its isolated iteration time (s).

    With a job's duty ``d`` per worker, phase weights ``pi`` and sync share ``u`` at its alone
    times (:func:`_alone_shares`), and ``x`` the pair's rates (:func:`_free_rates`), the host's
    compute on a GPU with guest worker ``w`` in phase ``p`` is ``a_h(p) * ((1 - d_w) + d_w * sum_q
    pi_w(q) / x_h(p, q))`` (eq. F1 with one co-runner), unchanged on a GPU without one; the
    guest's likewise (those factors: :func:`_free_slowdowns_of`, per pair of profiles). A sync
    over a link the other's sync crosses takes ``s(p) * (1 + u_other)`` (eq. F2). Each job's
    iteration time is the mean over its phases of its slowest worker's compute plus its sync (eq.
    F3), and the value is ``work_h / T_h + work_g / T_g``."""
    wa, wb = len(host_gpus), sub.shape[1]
    inv = _guest_on_gpu(sub, wa)
    ok = _memory_ok(ph, pg, inv, capacity)
    if not ok.any():
        return None, None, None
    slow = _free_slowdowns_of(state, host_gpus, ph, pg)
    # the host's slowdowns gathered per order into (orders, wa, Ph), the guest's into (orders, wb, Pg)
    slow_h = slow.host[_arange(wa)[None, :, None], _arange(ph.period)[None, None, :], inv[:, :, None]]
    comp_h = ph.compute_s.T[None, :, :] * slow_h
    comp_g = pg.compute_s.T[None, :, :] * slow.guest[sub[:, :, None], _arange(wb)[None, :, None],
                                                     _arange(pg.period)[None, None, :]]
    linked = syncs_share_a_link(state, host_gpus, [host_gpus[c] for c in sub[0]])
    sync_h = ph.comm_s * (1.0 + slow.guest_sync_share) if linked else ph.comm_s
    sync_g = pg.comm_s * (1.0 + slow.host_sync_share) if linked else pg.comm_s
    # means over the phases, as sums over the period (what ndarray.mean computes, without its
    # Python-level wrapper)
    t_h = (comp_h.max(axis=1) + sync_h[None, :]).sum(axis=1) / ph.period
    t_g = (comp_g.max(axis=1) + sync_g[None, :]).sum(axis=1) / pg.period
    values = np.where(ok, work_h / t_h + work_g / t_g, -np.inf)
    return values, np.where(ok, t_h, np.inf), np.where(ok, t_g, np.inf)


def search_pairing(state: ClusterState, host: JobState, host_gpus: Sequence[int], guest: JobState,
                   host_cfgs: Sequence[Config], guest_cfgs: Sequence[Config],
                   orders: Sequence[tuple[int, ...]] | None = None, capacity: np.ndarray | None = None) -> PairPlan | None:
    """The best co-location of ``guest`` on ``host``'s GPUs over the given candidates, or None when
    none fits in memory.

    Searches every host configuration in ``host_cfgs`` x guest configuration in ``guest_cfgs`` x
    guest worker order in ``orders`` (host worker indices, default :func:`guest_orders`). Under
    the lockstep pace each candidate is scored exactly as the simulator will time it: the two
    jobs form one lockstep component whose step ``k`` is ``max_g (load of the host on g + load of
    the guest on g) + max(comm_host, comm_guest)`` (engine eq. K1/K2; the syncs summed over a
    shared link, eq. L1), with the phases the jobs' iteration counters give now, averaged over
    the hyper-period. Under the free pace each job's mean iteration time is estimated one step
    from eqs. F1-F3 (:func:`_free_candidate_values`), reading no phases. Infeasible candidates
    (a GPU's summed process peaks above its memory) are dropped. Returns the candidate with the
    largest ``value`` (ties: the first in enumeration order, host configuration, guest
    configuration, order).

    Results are cached by what they depend on (models, sizes, node layout, under the lockstep
    pace the phases mod the hyper-period, candidate sets), so repeated rounds cost a dictionary
    lookup.
    """
    wa, wb = len(host_gpus), guest.num_gpus
    if type(host_gpus) is not tuple or not all(type(g) is int for g in host_gpus):
        host_gpus = tuple(int(g) for g in host_gpus)
    orders = guest_orders(wa, wb) if orders is None else [tuple(int(i) for i in o) for o in orders]
    if not orders:
        return None
    if capacity is None:
        sig, capacity = host_layout(state, host_gpus)
    else:
        (node_sig, types_sig, _), _ = host_layout(state, host_gpus)
        sig = (node_sig, types_sig, tuple(capacity))
    rel = phase_difference(state, host, guest, wa)
    key = (host.model, host.batch_size, sig, guest.model, guest.batch_size, wb, rel,
           tuple(host_cfgs), tuple(guest_cfgs), tuple(orders))
    cache = named_cache(state.costs, sharing_tag(state, "pair"))
    hit = cache.get(key, False)
    if hit is not False:
        return None if hit is None else hit.plan(host_gpus, orders)
    prep_key = key[:6] + key[7:]
    if wa > 1 and prep_key in named_cache(state.costs, sharing_tag(state, "pair_prep"), limit=MAX_PREP_ENTRIES):
        # a second phase difference of the same candidates (free-running pairs drift through
        # them round after round): search every difference at once and keep them all
        every = search_pairing_phases(state, host, host_gpus, guest, host_cfgs, guest_cfgs, orders, capacity,
                                       range(phase_mod(state)), prep_key)
        for r, res in enumerate(every):
            cache[key[:6] + (r,) + key[7:]] = res
        found = every[rel]
    else:
        found = cache[key] = search_pairing_at(state, host, host_gpus, guest, host_cfgs, guest_cfgs, orders, capacity,
                                             0, rel, prep_key)
    return None if found is None else found.plan(host_gpus, orders)
