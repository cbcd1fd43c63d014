"""Pieces the heuristics share: priority queues, exclusive placement, and co-location arithmetic.

Everything here reads a :class:`~jigsaw_env.state.ClusterState` and never changes it.

* :class:`LASQueues` -- Tiresias's discretized 2D-LAS: attained GPU-seconds, K queues, FIFO by
  arrival inside a queue, and the starvation guard. Used by ``tiresias`` and ``jigsaw``.
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
``cluster_efficiency`` sums (DESIGN.md section 5).
"""
from __future__ import annotations

import bisect
import math
import weakref
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Sequence

import numpy as np

from jigsaw_env.actions import level_pattern_combos
from jigsaw_env.placement import GpuLedger
from jigsaw_env.spb import Pattern
from jigsaw_env.state import ClusterState, CostModel, JobDecision, JobState, JobStatus

Config = tuple[int, Pattern]  # (SPB level, pattern)
LEVEL0: Config = (0, Pattern.ROTATING)

# per-CostModel caches (a CostModel belongs to one simulator: its eta knobs and SPB config)
_CACHES: "weakref.WeakKeyDictionary[CostModel, dict]" = weakref.WeakKeyDictionary()
_MAX_CACHE = 200_000


def _cache(costs: CostModel, name: str) -> dict:
    per = _CACHES.get(costs)
    if per is None:
        per = _CACHES[costs] = {}
    c = per.get(name)
    if c is None or len(c) > _MAX_CACHE:
        c = per[name] = {}
    return c


# ------------------------------------------------------------------------------------------------
# priority: discretized 2D-LAS (Tiresias)
# ------------------------------------------------------------------------------------------------
class LASQueues:
    """Tiresias's discretized two-dimensional least-attained-service priority.

    Attained service is GPU-seconds held (``JobState.attained_gpu_s``: GPUs x time, the "2D").
    A job is in queue ``k`` = number of thresholds its service has passed (queue 0 is the highest
    priority). Inside a queue jobs are served FIFO by arrival. No job durations are used.

    Starvation guard (Tiresias section 4.2, optional): a job that has run before and has now waited
    longer than ``starve_factor`` x the length of its last continuous run is promoted back to
    queue 0 (its service is counted afresh from that moment). ``starve_factor=None`` disables it.
    Waits and runs are observed at each :meth:`observe` call (one per round).
    """

    def __init__(self, thresholds: Sequence[float] = (3600.0,), starve_factor: float | None = 10.0):
        th = [float(t) for t in thresholds]
        if any(t <= 0 for t in th) or th != sorted(th):
            raise ValueError(f"LAS thresholds must be increasing GPU-seconds > 0, got {list(thresholds)!r}")
        if starve_factor is not None and not starve_factor > 0:
            raise ValueError(f"starve_factor must be > 0 or None, got {starve_factor!r}")
        self.thresholds = tuple(th)
        self.starve_factor = starve_factor
        self.reset()

    def reset(self) -> None:
        self._run_since: dict[int, float] = {}
        self._last_run: dict[int, float] = {}
        self._wait_since: dict[int, float] = {}
        self._base: dict[int, float] = {}  # attained service at the last promotion
        self.promotions = 0

    def observe(self, state: ClusterState) -> None:
        """Update run/wait bookkeeping from the state at the start of a round; promote starved jobs."""
        now = state.time_s
        for j in state.active():
            jid = j.job_id
            if j.status is JobStatus.RUNNING:
                self._run_since.setdefault(jid, now)
                self._wait_since.pop(jid, None)
                continue
            start = self._run_since.pop(jid, None)
            if start is not None:
                self._last_run[jid] = max(now - start, 1e-9)
                self._wait_since[jid] = now
            if self.starve_factor is not None and jid in self._wait_since:
                if now - self._wait_since[jid] >= self.starve_factor * self._last_run[jid]:
                    self._base[jid] = j.attained_gpu_s
                    self._wait_since[jid] = now
                    self.promotions += 1
        if len(self._last_run) > 4 * max(64, len(state.active_ids)):
            live = set(state.active_ids)
            for d in (self._run_since, self._last_run, self._wait_since, self._base):
                for k in [k for k in d if k not in live]:
                    del d[k]

    def quiet_until(self, state: ClusterState) -> float:
        """The earliest time the priority order can change without arrivals or completions: a
        running job's service reaching its next threshold (service grows GPUs x seconds), or a
        waiting job's starvation promotion."""
        now = state.time_s
        t = float("inf")
        th = self.thresholds
        for j in state.active():
            if j.status is JobStatus.RUNNING:
                s = self.service(j)
                k = bisect.bisect_right(th, s)
                if k < len(th):
                    t = min(t, now + (th[k] - s) / j.num_gpus)
            elif self.starve_factor is not None and j.job_id in self._wait_since:
                t = min(t, self._wait_since[j.job_id] + self.starve_factor * self._last_run[j.job_id])
        return t

    def service(self, job: JobState) -> float:
        return job.attained_gpu_s - self._base.get(job.job_id, 0.0)

    def queue_of(self, job: JobState) -> int:
        return bisect.bisect_right(self.thresholds, self.service(job))

    def order(self, jobs: Iterable[JobState]) -> list[JobState]:
        """Jobs from the highest priority down: (queue, arrival, id)."""
        return sorted(jobs, key=lambda j: (self.queue_of(j), j.arrival_s, j.job_id))


def parse_thresholds(value) -> tuple[float, ...]:
    """``3600`` / ``"3600,36000"`` / a sequence -> tuple of GPU-second thresholds."""
    if isinstance(value, (int, float)):
        return (float(value),)
    if isinstance(value, str):
        return tuple(float(x) for x in value.split(",") if x.strip())
    return tuple(float(x) for x in value)


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
    for j in order:
        if j.num_gpus <= budget:
            chosen.append(j)
            budget -= j.num_gpus
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
    for j in chosen:
        if j.status is JobStatus.RUNNING and j.placement and not np.any(led.workers[list(j.placement)]):
            jd = JobDecision(j.placement, j.level if keep_config else 0, j.pattern if keep_config else Pattern.ROTATING)
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


def _placement_sig(state: ClusterState, gpus: Sequence[int]) -> tuple:
    cl = state.cluster
    nodes = [g // cl.gpus_per_node for g in gpus]
    cross = len(set(nodes)) > 1
    if state.costs.homogeneous:
        return (len(gpus), cross)
    return (len(gpus), cross, tuple(cl.gpu_type(g) for g in gpus))


def best_solo(state: ClusterState, job: JobState, gpus: Sequence[int], current: Config | None = None,
              hysteresis: float = 0.01, allow_spb: bool = True) -> tuple[Config, float]:
    """Rule 2 for a job alone on ``gpus``: the (level, pattern) maximising :func:`solo_rate`.

    ``current`` is kept unless the best beats it by more than ``hysteresis`` (relative), so a
    running job's configuration does not flip on rounding noise.
    """
    key = (job.model, job.batch_size, _placement_sig(state, gpus), allow_spb)
    cache = _cache(state.costs, "solo")
    rates = cache.get(key)
    if rates is None:
        cfgs = spb_configs(state, job) if allow_spb else [LEVEL0]
        rates = {c: solo_rate(state, job, c, gpus) for c in cfgs}
        cache[key] = rates
    best = max(rates, key=lambda c: (rates[c], -c[0]))
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


def _phase_mod(state: ClusterState) -> int:
    m = 1
    for p in range(1, state.spb.num_slots + 1):
        m = _lcm(m, p)
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
    host_gpus = tuple(int(g) for g in host_gpus)
    default = host_cfgs is None and guest_cfgs is None and orders is None and capacity is None
    if default:
        # the default search is fixed by the models, the host's exact GPUs and the phase
        # difference: one lookup instead of rebuilding the full key (the plan is immutable)
        pm = _phase_mod(state)
        fast_key = (host.model, host.batch_size, host_gpus, guest.model, guest.batch_size, wb,
                    (guest.iteration - host.iteration) % pm if wa > 1 else 0)
        fast = _cache(state.costs, "pair_default")
        hit = fast.get(fast_key, False)
        if hit is not False:
            return hit
        plan = best_pairing(state, host, host_gpus, guest, spb_configs(state, host), spb_configs(state, guest),
                            guest_orders(wa, wb), np.array([state.cluster.memory_of(g) for g in host_gpus], dtype=np.float64))
        fast[fast_key] = plan
        return plan
    if host_cfgs is None:
        host_cfgs = spb_configs(state, host)
    if guest_cfgs is None:
        guest_cfgs = spb_configs(state, guest)
    orders = guest_orders(wa, wb) if orders is None else [tuple(int(i) for i in o) for o in orders]
    if not orders:
        return None
    cl = state.cluster
    if capacity is None:
        capacity = np.array([cl.memory_of(g) for g in host_gpus], dtype=np.float64)
    pm = _phase_mod(state)
    layout: dict[int, int] = {}
    node_sig = tuple(layout.setdefault(g // cl.gpus_per_node, len(layout)) for g in host_gpus)
    types_sig = None if state.costs.homogeneous else tuple(cl.gpu_type(g) for g in host_gpus)
    # the mean over a hyper-period depends on the phases only through their difference (shifting
    # both counters by k rotates the step sequence), and every period divides pm
    rel = (guest.iteration - host.iteration) % pm if wa > 1 else 0  # one GPU: loads just add up
    key = (host.model, host.batch_size, node_sig, types_sig, guest.model, guest.batch_size, wb, rel,
           tuple(host_cfgs), tuple(guest_cfgs), tuple(orders), tuple(capacity))
    cache = _cache(state.costs, "pair")
    hit = cache.get(key, False)
    if hit is not False:
        if hit is None:
            return None
        hc, gc, oi, value, xh, xg, step = hit
        return PairPlan(hc, gc, tuple(host_gpus[i] for i in orders[oi]), value, xh, xg, step)
    plan = _search_pairing(state, host, host_gpus, guest, host_cfgs, guest_cfgs, orders, capacity, 0, rel)
    if plan is None:
        cache[key] = None
        return None
    hc, gc, oi, value, xh, xg, step = plan
    cache[key] = plan
    return PairPlan(hc, gc, tuple(host_gpus[i] for i in orders[oi]), value, xh, xg, step)


def _summary(costs: CostModel, prof) -> tuple[float, float, float]:
    """(mean over the cycle of the summed compute of all workers, of the slowest worker's compute,
    of the sync time) of a profile: the ingredients of a lower bound on a shared step."""
    cache = _cache(costs, "summary")
    key = id(prof)  # profiles live in the CostModel's cache for its whole life
    v = cache.get(key)
    if v is None:
        c = prof.compute_s
        v = cache[key] = (float(c.sum(axis=1).mean()), float(c.max(axis=1).mean()), float(prof.comm_s.mean()))
    return v


def _search_pairing(state, host, host_gpus, guest, host_cfgs, guest_cfgs, orders, capacity, i_host, i_guest):
    """Branch and bound over (host config, guest config, order group). A lower bound on the mean
    shared step -- the busiest GPU carries at least the average load over the host's GPUs and at
    least either job's slowest worker, and the sync is at least either job's mean sync -- gives an
    upper bound on each candidate's value; candidates are evaluated exactly in decreasing bound
    order until the bound falls below the best value found. Ties go to the first candidate in
    enumeration order (host config, guest config, order), as an exhaustive search would."""
    costs = state.costs
    wa, wb = len(host_gpus), guest.num_gpus
    iso_h, iso_g = costs.isolated_iteration_s(host), costs.isolated_iteration_s(guest)
    cols = np.asarray(orders, dtype=np.int64)  # (O, wb) host worker indices
    # group orders by the guest's own placement signature (cross-node or not, GPU types)
    groups: dict[tuple, list[int]] = {}
    for i, o in enumerate(orders):
        groups.setdefault(_placement_sig(state, [host_gpus[c] for c in o]), []).append(i)
    cands = []
    for hc in host_cfgs:
        ph = costs.profile(host, hc[0], hc[1], host_gpus)
        th, mh, ch = _summary(costs, ph)
        for gc in guest_cfgs:
            for idx in groups.values():
                pg = costs.profile(guest, gc[0], gc[1], tuple(host_gpus[c] for c in orders[idx[0]]))
                tg, mg, cg = _summary(costs, pg)
                lb = max((th + tg) / wa, mh, mg) + max(ch, cg)
                ub = (wa * ph.eta * iso_h + wb * pg.eta * iso_g) / lb if lb > 0 else float("inf")
                cands.append((-ub, len(cands), hc, gc, idx, ph, pg))
    cands.sort(key=lambda c: (c[0], c[1]))
    best = None
    for neg_ub, rank, hc, gc, idx, ph, pg in cands:
        if best is not None and -neg_ub < best[3] - 1e-12:
            break
        sub = cols[idx]
        n = len(idx)
        sa = np.arange(n)
        # memory at each process's peak, per host GPU
        mem = np.broadcast_to(ph.peak_bytes, (n, wa)).copy()
        for w in range(wb):
            mem[sa, sub[:, w]] += pg.peak_bytes[w]
        ok = np.all(mem <= capacity[None, :], axis=1)
        if not ok.any():
            continue
        H = _lcm(ph.period, pg.period)
        ks = np.arange(H)
        pha = (i_host + ks) % ph.period
        phb = (i_guest + ks) % pg.period
        la = ph.compute_s[pha]  # (H, wa)
        lb = pg.compute_s[phb]  # (H, wb)
        loads = np.broadcast_to(la, (n, H, wa)).copy()
        for w in range(wb):
            loads[sa, :, sub[:, w]] += lb[:, w][None, :]
        comm = np.maximum(ph.comm_s[pha], pg.comm_s[phb])
        step = (loads.max(axis=2) + comm[None, :]).mean(axis=1)  # (n,)
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


# ------------------------------------------------------------------------------------------------
# reading the sharing structure of the allocation in force
# ------------------------------------------------------------------------------------------------
def current_pairs(state: ClusterState, host_memory: dict[int, int] | None = None) -> dict[int, int]:
    """``{guest_id: host_id}`` for running jobs that share GPUs as a pair whose guest's GPUs are a
    subset of the host's. The host is the one ``host_memory`` (guest -> host, a scheduler's own
    record) names, else the job with more GPUs, else the one that started first."""
    owners: dict[int, list[int]] = {}
    for j in state.running():
        for g in j.placement:
            owners.setdefault(g, []).append(j.job_id)
    partners: dict[int, set[int]] = {}
    for jids in owners.values():
        if len(jids) > 1:
            for a in jids:
                partners.setdefault(a, set()).update(x for x in jids if x != a)
    out: dict[int, int] = {}
    for a, ps in partners.items():
        if len(ps) != 1:
            continue
        b = next(iter(ps))
        if len(partners.get(b, ())) != 1 or a in out or b in out:
            continue
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
    return out
