"""Timing of jobs that share GPUs: lockstep co-location groups, solved per phase of the SPB cycle.

A *component* is a set of running jobs connected through shared GPUs (a job alone on its GPUs is a
component of one). Jobs of a component advance in lockstep, one iteration each per *step*, as the
live executor runs them (docs/spb_model.md section 5):

    load_g(k) = sum over workers (j, w) on GPU g of compute_j[phase_j(k), w]      (eq. K1)
    step(k)   = max_g load_g(k) + max_j comm_j[phase_j(k)] + b                  (eqs. K2, K3)
    phase_j(k) = (i_j + k) mod P_j, i_j = job j's iteration counter when the component formed
    b = the lockstep barrier (``SimConfig.lockstep_s``) for a component of two or more jobs,
        0 for a job alone; 0 by default (eq. K3 in docs/spb_model.md)

Eq. K1 is the ``timeslice`` sharing mode: workers of different jobs on one GPU take turns, so
their work adds up. Under the default ``fitted`` mode a GPU with several workers computes them
concurrently at the rates of the interference model, and its load is the time until the last one
is done (eq. K1', ``jigsaw_env.interference.concurrent_time``; docs/colocation.md). The step waits
for the busiest GPU, then for the slowest sync. The step sequence repeats with the hyper-period
``H = lcm(P_j)``, so anti-phased rotations (a heavy phase of one job on the light phase of the
other) shorten steps, and in-phase ones do not: the cycle is modelled, not averaged away.
"""
from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import numpy as np

from .declared import seal_declared_classes
from .interference import SharingModel, WorkerLoad, linked_sync_s
from .spb import JobProfile

_EPS = 1e-9
_RANGES: dict[int, tuple[int, ...]] = {}  # n -> (0, ..., n-1)


@dataclass
class Member:
    job_id: int
    profile: JobProfile
    gpus: tuple[int, ...]
    iteration0: int  # iteration counter of the job when the component formed
    iso_s: float = 0.0  # the job's isolated iteration time (s), cached by the simulator
    slot: int = -1  # the job's row in the simulator's running-job arrays, while it runs


def _computed(row: list[float], partial: float) -> float:
    """GPU-seconds computed ``partial`` seconds into a step whose per-GPU loads are ``row``
    (compute comes first in a step: min(load, partial) on each GPU)."""
    if partial <= 0:
        return 0.0
    if len(row) == 1:
        return row[0] if row[0] < partial else partial
    return sum(x if x < partial else partial for x in row)


def _step_tables(members: list[Member], col: dict[int, int], barrier_s: float = 0.0,
                 sharing: SharingModel | None = None) -> tuple:
    """A component's step tables over its hyper-period (eqs. K1, K2), in the order
    ``Component.__init__`` unpacks them: H, per-GPU loads (H, C) as a read-only array, the cycle,
    then as tuples of Python floats what the scalar path reads (cumulative step times, loads per
    step, the per-step total load's running sum, cumulative bytes per member, cumulative loads)
    and the step times and bytes per member per step; a component makes its other arrays
    (``Component._SHARED``) from the tuples when they are first read.

    Built in Python lists (the tables are a few steps by a few GPUs, usually 1-4 steps: numpy's
    per-call overhead cost more than the arithmetic), then kept as tuples. Every value is the
    one the numpy formulas give, bit for bit (tests/sim/test_perf.py holds them to those formulas):
    loads add each worker's compute in member and worker order (K1), a step is the busiest GPU
    plus the slowest sync (K2), cumulative sums run in step order, and the per-step total load is
    numpy's row sum (its pairwise order). ``sharing`` (a component of several members): under the
    fitted mode each GPU's load is ``sharing.time_on(gpu, workers)`` instead of the sum (eq. K1'),
    and in either mode the step's sync is eq. L1's (syncs over one link share it) instead of the
    slowest member's."""
    H = 1
    for m in members:
        H = H * m.profile.period // math.gcd(H, m.profile.period)
    n = len(col)
    loads = [[0.0] * n for _ in range(H)]
    comm = [0.0] * H
    phase_bytes = []  # per member: bytes at each step of the hyper-period
    for m in members:
        p = m.profile
        P = p.period
        i0 = m.iteration0
        compute, sync, by = p.compute_s.tolist(), p.comm_s.tolist(), p.bytes.tolist()
        cols = [col[g] for g in m.gpus]
        pb = []
        for k in range(H):
            ph = (i0 + k) % P
            row = loads[k]
            for c, x in zip(cols, compute[ph]):
                row[c] += x
            if sync[ph] > comm[k]:
                comm[k] = sync[ph]
            pb.append(by[ph])
        phase_bytes.append(pb)
    if sharing is not None:
        if sharing.fitted:
            _concurrent_loads(members, col, H, loads, sharing)
        comm = _linked_comm(members, H, sharing)
    step = [max(row) + c for row, c in zip(loads, comm)]
    if barrier_s and len(members) > 1:
        step = [s + barrier_s for s in step]  # eq. K3: co-located jobs meet at a barrier before every step
    if any(s <= 0 for s in step):
        raise ValueError("a co-location step of zero length: cost tables must have positive times")
    cum = _running_sum(step)
    cycle = cum[-1]
    cum_loads = [[0.0] * n]
    for row in loads:
        cum_loads.append([a + x for a, x in zip(cum_loads[-1], row)])
    cum_bytes = [_running_sum(pb) for pb in phase_bytes]
    a_loads = np.array(loads, dtype=np.float64).reshape(H, n)
    a_loads.setflags(write=False)  # shared between components: read-only
    # kept as tuples of floats, which the garbage collector stops tracking after its first look
    # (lists it would walk at every full collection: a long-lived env's cache of tens of
    # thousands of tables made each one take 0.5 s; docs/simulator.md section 8)
    cum, loads, cum_bytes, cum_loads = tuple(cum), _tuples(loads), _tuples(cum_bytes), _tuples(cum_loads)
    return (H, a_loads, cycle, cum, _EPS * max(1.0, cycle), loads, tuple(_running_sum(a_loads.sum(axis=1).tolist())),
            cum_bytes, cum_loads, tuple(step), _tuples(phase_bytes))


def _linked_comm(members: list[Member], H: int, sharing: SharingModel) -> list[float]:
    """Per step of the hyper-period, the sync time of members whose syncs share links (eq. L1)."""
    links = [sharing.links_of(m.gpus) for m in members]
    out = []
    for k in range(H):
        syncs = [float(m.profile.comm_s[(m.iteration0 + k) % m.profile.period]) for m in members]
        out.append(linked_sync_s(syncs, links))
    return out


def _concurrent_loads(members: list[Member], col: dict[int, int], H: int, loads: list[list[float]],
                      sharing: SharingModel) -> None:
    """Rewrite ``loads[k][c]`` of every GPU holding two or more workers with the time the GPU takes
    to compute them together at the fitted rates (eq. K1'); a GPU with one worker keeps its load."""
    gpu_of = {c: g for g, c in col.items()}
    for k in range(H):
        on: dict[int, list[WorkerLoad]] = {}
        for m in members:
            p = m.profile
            row = p.compute_s[(m.iteration0 + k) % p.period]
            for g, x in zip(m.gpus, row.tolist()):
                on.setdefault(col[g], []).append(WorkerLoad(x, p.batch_size))
        for c, workers in on.items():
            if len(workers) > 1:
                loads[k][c] = sharing.time_on(gpu_of[c], workers)


def _tuples(rows: list[list[float]]) -> tuple[tuple[float, ...], ...]:
    return tuple([tuple(r) for r in rows])


def _frozen(values) -> np.ndarray:
    """A read-only float64 array of ``values`` (a tuple, or a tuple of equal-length tuples)."""
    a = np.array(values, dtype=np.float64)
    a.setflags(write=False)
    return a


def _running_sum(xs: list[float]) -> list[float]:
    """``[0, x0, x0 + x1, ...]``: numpy's cumsum (one addition after another) with a leading 0."""
    out = [0.0]
    t = 0.0
    for x in xs:
        t += x
        out.append(t)
    return out


class Component:
    """A lockstep group of jobs. Times are seconds relative to ``origin_s`` (when stepping began)."""

    # the simulator numbers the components it forms (their order in its dict of live ones)
    seq: int = -1

    # the step tables a component reads, the same values for components with the same profiles,
    # phases and layout (the tuples and ``loads`` shared; step, cum, cum_loads, phase_bytes and
    # cum_bytes made per component when first read); arrays are read-only
    _SHARED = ("H", "loads", "step", "cum", "cycle", "cum_loads", "phase_bytes", "cum_bytes", "_cum_l", "_eps",
               "_loads_l", "_cum_tot", "_cum_bytes_l", "_cum_loads_l", "_step_l", "_phase_bytes_l")

    def __init__(self, members: list[Member], ready_s: float, cache: dict | None = None, barrier_s: float = 0.0,
                 formed_s: float = 0.0, sharing: SharingModel | None = None):
        """``cache``: a dict the caller keeps for one cost model (the simulator does); components
        whose members have the same profiles, phases modulo their periods and GPU layout share
        their step tables (read-only arrays), computed once. ``barrier_s``: seconds every step of
        a component of two or more jobs waits at the lockstep barrier (eq. K3; ignored for one job).
        ``formed_s``: the simulated time it formed (s; the simulator advances it from then).
        ``sharing``: how members share GPUs (eq. K1 or K1') and links (eq. L1); None time-slices
        GPUs and lets syncs overlap freely (eqs. K1, K2)."""
        self.members = members
        self.ready_s = ready_s  # no step starts before this (restart delays)
        self.formed_s = formed_s
        if len(members) == 1:
            # one job alone (the usual case): its GPUs are distinct, so the columns are the ranks
            # of its GPUs; in ascending order (most placements) they are 0..n-1
            m = members[0]
            mg = m.gpus
            gpus = sorted(set(mg))
            if gpus == list(mg):
                cols = _RANGES.get(len(gpus))
                if cols is None:
                    cols = _RANGES[len(gpus)] = tuple(range(len(gpus)))
                col = None
            else:
                col = {g: i for i, g in enumerate(gpus)}
                cols = tuple(col[g] for g in mg)
            key = ((id(m.profile), m.iteration0 % m.profile.period, cols), len(gpus))
        else:
            gpus = sorted({g for m in members for g in m.gpus})
            col = {g: i for i, g in enumerate(gpus)}
            key = tuple((id(m.profile), m.iteration0 % m.profile.period, tuple(col[g] for g in m.gpus))
                        for m in members) + (len(gpus), barrier_s)
            if sharing is not None:
                key += (sharing.mode, tuple(sharing.gpu_type_of(g) for g in gpus), sharing.node_signature(gpus))
        self.gpu_list = gpus  # the component's GPUs, ascending (Python ints; ``gpus`` as an array)
        if cache is None:
            tables = _step_tables(members, col if col is not None else {g: i for i, g in enumerate(gpus)}, barrier_s,
                                  sharing if len(members) > 1 else None)
        else:
            # the tables depend on each member's profile, its phase offset (i0 + k) mod P and which
            # columns its workers load; the profile object is kept in the entry so its id stays its own
            hit = cache.get(key)
            if hit is not None:
                profs = hit[1]
                if len(profs) == 1:
                    if profs[0] is not members[0].profile:
                        hit = None
                elif any(p is not m.profile for p, m in zip(profs, members)):
                    hit = None  # an id reused by another profile (a copied simulator): recompute
            if hit is None:
                if len(cache) > 50_000:
                    cache.clear()
                if col is None:
                    col = {g: i for i, g in enumerate(gpus)}
                hit = cache[key] = (_step_tables(members, col, barrier_s, sharing if len(members) > 1 else None),
                                    tuple([m.profile for m in members]))
            tables = hit[0]
        (self.H, self.loads, self.cycle, self._cum_l, self._eps, self._loads_l, self._cum_tot, self._cum_bytes_l,
         self._cum_loads_l, self._step_l, self._phase_bytes_l) = tables
        self.k = 0            # steps completed since the component formed
        self.partial = 0.0    # seconds into step k
        self.finish: tuple[float, list[int]] | None = None  # cached by the simulator
        self.slot = -1  # its slot in a ComponentSet, while it is in one
        # GPUs charged to it as allocated (its own, or under the free pace its share of the GPUs
        # it shares with other jobs' components: 1 / jobs on each), and those components
        self.alloc_gpus = float(len(gpus))
        self.group: tuple | None = None
        self.group_key: tuple | None = None
        # under the free pace, the busy seconds per second of running credited to it on each of
        # its GPUs (eq. F4; None: busy seconds are the compute of its steps), and their sum
        self.busy_rate: tuple[float, ...] | None = None
        self.busy_rate_sum = 0.0

    def set_busy_rate(self, rates: Sequence[float]) -> None:
        """Credit busy time at ``rates`` (busy seconds per second of running, per GPU of
        ``gpu_list``) instead of by its steps' compute: a free-paced job shares its GPUs with
        jobs whose compute overlaps its own (eq. F4)."""
        if len(rates) != len(self.gpu_list):
            raise ValueError(f"busy rates: one per GPU of the component ({len(self.gpu_list)}), got {len(rates)}")
        self.busy_rate = tuple(float(r) for r in rates)
        total = 0.0
        for r in self.busy_rate:
            total += r
        self.busy_rate_sum = total

    @cached_property
    def gpus(self) -> np.ndarray:
        """The component's GPUs, ascending, as an int64 array (made when first read: the simulator
        reads ``gpu_list``)."""
        return np.array(self.gpu_list, dtype=np.int64)

    # ----- the tables as read-only arrays, made when first read (the simulator's stepping reads the
    # tuples and ``loads``; only advance(), busy_vector() and readers of the tables use these)
    @cached_property
    def step(self) -> np.ndarray:
        """(H,) seconds of each step of the hyper-period (eq. K2)."""
        return _frozen(self._step_l)

    @cached_property
    def cum(self) -> np.ndarray:
        """(H + 1,) cumulative step seconds, from 0."""
        return _frozen(self._cum_l)

    @cached_property
    def cum_loads(self) -> np.ndarray:
        """(H + 1, GPUs) cumulative compute seconds per GPU, from 0."""
        return _frozen(self._cum_loads_l)

    @cached_property
    def phase_bytes(self) -> list[np.ndarray]:
        """Per member, (H,) bytes on the wire at each step."""
        return [_frozen(b) for b in self._phase_bytes_l]

    @cached_property
    def cum_bytes(self) -> list[np.ndarray]:
        """Per member, (H + 1,) cumulative bytes, from 0."""
        return [_frozen(b) for b in self._cum_bytes_l]

    # ----- step arithmetic -----
    def T(self, x: int) -> float:
        """Seconds from the first step's start to the end of step ``x`` (x steps done)."""
        q, r = divmod(x, self.H)
        return q * self.cycle + self._cum_l[r]

    def steps_within(self, elapsed: float) -> int:
        """Steps fully completed ``elapsed`` seconds after the first step began (a step that ends
        within a relative tolerance of 1e-9 after ``elapsed`` counts as done)."""
        q = int(elapsed // self.cycle)
        r = elapsed - q * self.cycle
        j = bisect_right(self._cum_l, r + self._eps) - 1
        return q * self.H + min(j, self.H)

    def elapsed(self) -> float:
        return self.T(self.k) + self.partial

    def time_to_steps(self, m: int, now_s: float) -> float:
        """Seconds from ``now_s`` until ``m`` more steps are done."""
        wait = max(0.0, self.ready_s - now_s)
        return wait + self.T(self.k + m) - self.elapsed()

    def time_to_next_step(self, now_s: float) -> float:
        return self.time_to_steps(1, now_s)

    def _sum_over(self, cum: np.ndarray, k0: int, k1: int) -> np.ndarray | float:
        """Sum of a per-step quantity over steps k0..k1-1 from its cumulative array (length H+1)."""
        def S(x):
            q, r = divmod(x, self.H)
            return q * cum[-1] + cum[r]
        return S(k1) - S(k0)

    def advance(self, now_s: float, dt: float) -> "Advance":
        """Advance by ``dt`` seconds from ``now_s``; return what happened."""
        wait = min(dt, max(0.0, self.ready_s - now_s))
        run = dt - wait
        k0, partial0 = self.k, self.partial
        if run > 0:
            target = self.elapsed() + run
            k1 = self.steps_within(target)
            self.k = k1
            self.partial = max(0.0, target - self.T(k1))
        k1 = self.k
        # GPU busy seconds: each step's compute comes first, then its sync. Full steps k0..k1-1,
        # plus the computed part of the step now in flight, minus what an earlier call counted.
        busy = (self._sum_over(self.cum_loads, k0, k1)
                + np.minimum(self.loads[k1 % self.H], self.partial)
                - np.minimum(self.loads[k0 % self.H], partial0))
        if self.busy_rate is not None:
            busy = run * np.array(self.busy_rate)
        bytes_ = [float(self._sum_over(cb, k0, k1)) for cb in self.cum_bytes]
        return Advance(steps=k1 - k0, run_s=run, busy=np.asarray(busy, dtype=np.float64), bytes=bytes_)

    def advance_totals(self, now_s: float, dt: float) -> tuple[int, float, float, list[float]]:
        """:meth:`advance` without the per-GPU busy vector (the simulator's hot path): returns
        (steps, run seconds, busy GPU-seconds summed over the component's GPUs, bytes per member).
        The per-GPU busy seconds since the component formed are :meth:`busy_vector`."""
        wait = min(dt, max(0.0, self.ready_s - now_s))
        run = dt - wait
        k0, p0 = self.k, self.partial
        H = self.H
        if H == 1:
            # the same arithmetic with the one-step cycle folded in (cum = [0, cycle]): T(x) is
            # x * cycle, steps_within's search is one comparison, sums over steps are multiples
            c = self.cycle
            if run > 0:
                target = k0 * c + p0 + run
                q = int(target // c)
                x = target - q * c + self._eps
                k1 = q + (1 if x >= c else (0 if x >= 0.0 else -1))
                self.k = k1
                self.partial = max(0.0, target - k1 * c)
            dk = self.k - k0
            if self.busy_rate is not None:
                busy = run * self.busy_rate_sum
            else:
                row = self._loads_l[0]
                busy = dk * self._cum_tot[-1] + _computed(row, self.partial) - _computed(row, p0)
            return dk, run, busy, [dk * cb[-1] for cb in self._cum_bytes_l]
        if run > 0:
            q, r = divmod(k0, H)
            target = q * self.cycle + self._cum_l[r] + p0 + run
            k1 = self.steps_within(target)
            q, r = divmod(k1, H)
            self.k = k1
            self.partial = max(0.0, target - (q * self.cycle + self._cum_l[r]))
        k1, p1 = self.k, self.partial
        ct = self._cum_tot
        q0, r0 = divmod(k0, H)
        q1, r1 = divmod(k1, H)
        busy = (q1 - q0) * ct[-1] + ct[r1] - ct[r0] + _computed(self._loads_l[r1], p1) - _computed(self._loads_l[r0], p0)
        if self.busy_rate is not None:
            busy = run * self.busy_rate_sum
        return k1 - k0, run, busy, self.bytes_between(k0, k1)

    def bytes_between(self, k0: int, k1: int) -> list[float]:
        """Bytes each member sent over its steps ``k0`` to ``k1 - 1`` (the same sums as
        :meth:`advance_totals`)."""
        H = self.H
        q0, r0 = divmod(k0, H)
        q1, r1 = divmod(k1, H)
        return [(q1 - q0) * cb[-1] + cb[r1] - cb[r0] for cb in self._cum_bytes_l]

    def busy_list(self) -> list[float]:
        """:meth:`busy_vector` as Python floats, element by element with the same operations
        (numpy's per-call overhead dominates for a component's few GPUs)."""
        if self.busy_rate is not None:
            e = self.elapsed()
            return [e * r for r in self.busy_rate]
        q, r = divmod(self.k, self.H)
        last, cl, lr, p = self._cum_loads_l[-1], self._cum_loads_l[r], self._loads_l[r], self.partial
        return [q * a + b + (x if x < p else p) for a, b, x in zip(last, cl, lr)]

    def busy_vector(self) -> np.ndarray:
        """(len(gpus),) compute seconds per GPU since the component formed (steps 0..k-1 plus the
        computed part of step k): the sum of every :meth:`advance`'s ``busy``."""
        if self.busy_rate is not None:
            return np.array(self.busy_list())
        q, r = divmod(self.k, self.H)
        return q * self.cum_loads[-1] + self.cum_loads[r] + np.minimum(self.loads[r], self.partial)


@dataclass
class Advance:
    steps: int
    run_s: float
    busy: np.ndarray  # per component GPU, seconds of compute
    bytes: list[float]  # per member, bytes on the wire


class ComponentSet:
    """The live components' step state in arrays, so one round advances all of them at once.

    Each live :class:`Component` holds a slot: its step counter ``k``, the seconds ``partial`` into
    step ``k``, its cumulative step times and loads, and (in a flat pool) its per-GPU loads per
    phase. :meth:`advance` does :meth:`Component.advance_totals`' arithmetic for every given slot
    with numpy, operation for operation in the same order, so the results are the same floats
    (tests/sim/test_perf.py compares them with the scalar path). Times in seconds.

    After :meth:`advance` the set's ``k`` and ``partial`` are ahead of the objects; :meth:`sync`
    writes them back (the simulator does it at the end of each round), and :meth:`load` refreshes a
    slot from its object after the object was advanced on its own (the simulator's scalar path).
    ``fin`` holds what the simulator writes there (the absolute time the slot's component next
    sees a job finish); a free slot's is +inf, so a scan of every slot finds only live ones.
    """

    #: the pool, when rewritten, holds this many times the live loads: the space a replay's new
    #: components fill before the next rewrite (each copies every live component's loads in a
    #: Python loop). Jigsaw on the first 10,000 Philly jobs: 454 rewrites at 2x, 65 at 8x
    POOL_SLACK = 8
    #: the pool's smallest size (float64 loads)
    POOL_MIN = 1024

    def __init__(self, capacity: int = 64, width: int = 2):
        self._cap = 0
        self._width = width  # H + 1 of the longest hyper-period seen
        self._free: list[int] = []
        self._pool = np.zeros(self.POOL_MIN)
        self._pool_used = 0
        self.comps: dict[int, Component] = {}  # slot -> component
        self._pending: dict[int, Component] = {}  # slot -> component, arrays not filled yet
        self._grow(capacity)

    # ----- storage
    _INT = ("H", "k", "ncol", "off")
    _FLOAT = ("cycle", "eps", "ready", "partial", "ctH", "prev", "fin", "rsum")

    def _grow(self, cap: int) -> None:
        """Room for ``cap`` slots (existing slots keep their values)."""
        old = self._cap
        for name in self._INT + self._FLOAT:
            new = (np.full(cap, np.inf) if name == "fin"  # (a free slot's: see remove())
                   else np.full(cap, np.nan) if name == "rsum"  # (NaN: busy time from the steps)
                   else np.zeros(cap, dtype=np.int64 if name in self._INT else np.float64))
            if old:
                new[:old] = getattr(self, name)
            setattr(self, name, new)
        for name, fill in (("cum", np.inf), ("ct", 0.0)):
            new = np.full((cap, self._width), fill)
            if old:
                new[:old] = getattr(self, name)
            setattr(self, name, new)
        self._free.extend(range(cap - 1, old - 1, -1))
        self._cap = cap

    def _widen(self, width: int) -> None:
        cum = np.full((self._cap, width), np.inf)
        cum[:, : self._width] = self.cum
        ct = np.zeros((self._cap, width))
        ct[:, : self._width] = self.ct
        self.cum, self.ct, self._width = cum, ct, width

    def _pool_put(self, loads: np.ndarray) -> int:
        """Store a component's (H, C) loads in the flat pool; returns the offset."""
        n = loads.size
        if self._pool_used + n > self._pool.size:
            self._compact(n)
        off = self._pool_used
        self._pool[off: off + n] = loads.ravel()
        self._pool_used += n
        return off

    def _compact(self, extra: int) -> None:
        """Rewrite the pool with only the live components' loads (and room for ``extra`` more)."""
        filled = [(slot, c) for slot, c in self.comps.items() if slot not in self._pending]
        live = sum(c.loads.size for _, c in filled)
        size = max(self.POOL_MIN, self.POOL_SLACK * (live + extra))
        pool = np.zeros(size)
        used = 0
        for slot, c in filled:
            n = c.loads.size
            pool[used: used + n] = c.loads.ravel()
            self.off[slot] = used
            used += n
        self._pool, self._pool_used = pool, used

    # ----- membership
    def add(self, comp: Component) -> int:
        """Give ``comp`` a slot; returns the slot. The slot's arrays are filled from the object
        (its current ``k`` and ``partial`` included) when the arrays are next read
        (:meth:`materialize`); until then the object is the truth."""
        if not self._free:
            self._grow(2 * self._cap)
        slot = self._free.pop()
        self.comps[slot] = comp
        self._pending[slot] = comp
        comp.slot = slot
        return slot

    def materialize(self) -> None:
        """Fill the slots added since the last call from their components."""
        pend = self._pending
        if not pend:
            return
        width = max(c.H for c in pend.values()) + 1
        if width > self._width:
            self._widen(width)
        slots = list(pend)
        comps = list(pend.values())
        idx = np.array(slots, dtype=np.intp)  # (converted once for the writes below)
        self.H[idx] = [c.H for c in comps]
        self.k[idx] = [c.k for c in comps]
        self.partial[idx] = [c.partial for c in comps]
        self.cycle[idx] = [c.cycle for c in comps]
        self.eps[idx] = [c._eps for c in comps]
        self.ready[idx] = [c.ready_s for c in comps]
        self.ctH[idx] = [c._cum_tot[-1] for c in comps]
        self.rsum[idx] = [np.nan if c.busy_rate is None else c.busy_rate_sum for c in comps]
        self.ncol[idx] = [c.loads.shape[1] for c in comps]
        # the computed part of the step in flight, already counted (nothing before the first step)
        self.prev[idx] = [_computed(c._loads_l[c.k % c.H], c.partial) for c in comps]
        # each slot's first H + 1 entries of cum and ct, and inf in the rest of cum: two scatters
        # of the concatenated rows instead of three writes per slot
        cum, ct = self.cum, self.ct
        cum[idx] = np.inf
        rr: list[int] = []
        cc: list[int] = []
        vc: list[float] = []
        vt: list[float] = []
        for slot, c in zip(slots, comps):
            n = c.H + 1
            rr += [slot] * n
            cc += range(n)
            vc += c._cum_l
            vt += c._cum_tot
        cum[rr, cc] = vc
        ct[rr, cc] = vt
        pend.clear()  # before the pool puts: a compaction rewrites only filled slots
        for slot, c in zip(slots, comps):
            self.off[slot] = self._pool_put(c.loads)

    def load(self, comp: Component) -> None:
        """Refresh ``comp``'s slot from the object (after it was advanced by the scalar path)."""
        if self._pending:
            self.materialize()
        slot = comp.slot
        self.k[slot] = comp.k
        self.partial[slot] = comp.partial
        self.prev[slot] = _computed(comp._loads_l[comp.k % comp.H], comp.partial)

    def remove(self, comp: Component, write_back: bool = True) -> None:
        """Free ``comp``'s slot, first writing its state back to the object (unless the object
        is the more recent: ``write_back=False``, or the slot was never filled)."""
        slot = comp.slot
        if self._pending.pop(slot, None) is None and write_back:
            comp.k = int(self.k[slot])
            comp.partial = float(self.partial[slot])
        del self.comps[slot]
        self.fin[slot] = np.inf  # a free slot is never a next completion (the simulator scans fin)
        self._free.append(slot)
        comp.slot = -1

    def sync(self) -> None:
        """Write every live slot's ``k`` and ``partial`` back to its component object (slots not
        filled yet are skipped: their objects are current)."""
        if not self.comps:
            return
        pend = self._pending
        if pend:
            items = [(s, c) for s, c in self.comps.items() if s not in pend]
            if not items:
                return
            slots = [s for s, _ in items]
            comps = [c for _, c in items]
        else:
            slots = list(self.comps)
            comps = self.comps.values()
        for c, k, p in zip(comps, self.k[slots].tolist(), self.partial[slots].tolist()):
            c.k, c.partial = k, p

    # ----- stepping
    def gather(self, slots: np.ndarray) -> tuple:
        """What :meth:`advance` reads of ``slots`` that does not change while they live: H, the
        cycle, the tolerance, the ready time, the cumulative step times and loads, and the pool
        indices of each slot's first load row (computed once per set of live components)."""
        if self._pending:
            self.materialize()
        n = self.ncol[slots]
        seg = np.repeat(np.arange(len(slots)), n)
        base = np.arange(int(n.sum())) - (np.cumsum(n) - n)[seg] + self.off[slots][seg]
        rsum = self.rsum[slots]
        rate = None if np.isnan(rsum).all() else (np.isnan(rsum), rsum)
        return (slots, self.H[slots], self.cycle[slots], self.eps[slots][:, None], self.ready[slots], self.cum[slots],
                self.ct[slots], self.ctH[slots], n, seg, base, np.arange(len(slots)), rate)

    def computed(self, g: tuple, rows: np.ndarray, partial: np.ndarray) -> np.ndarray:
        """Per slot of ``g`` (:meth:`gather`), :func:`_computed` of load row ``rows[i]`` at
        ``partial[i]`` seconds: the sum over the component's GPUs of min(load, partial), added in
        GPU order as ``_computed`` does (np.bincount adds each bin's weights in input order), 0
        where ``partial <= 0``."""
        n, seg, base = g[8], g[9], g[10]
        vals = np.minimum(self._pool[base + (rows * n)[seg]], partial[seg])
        out = np.bincount(seg, weights=vals, minlength=len(n))
        return np.where(partial > 0, out, 0.0)

    def advance(self, g: tuple, now_s: float, dt: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Advance the components of ``g`` (:meth:`gather`) by ``dt`` seconds from ``now_s``: per
        slot, (steps, run seconds, busy GPU-seconds), as :meth:`Component.advance_totals` returns
        them, with the same operations in the same order."""
        if self._pending:
            self.materialize()
        slots, H, cyc, eps, ready, cum, ct, ctH, _, _, _, ar, rate = g
        run = dt - np.minimum(dt, np.maximum(0.0, ready - now_s))
        k0 = self.k[slots]
        p0 = self.partial[slots]
        q0, r0 = np.divmod(k0, H)
        target = q0 * cyc + cum[ar, r0] + p0 + run
        # steps_within(target): whole cycles, then the last step boundary within the cycle
        q = np.floor_divide(target, cyc)
        j = np.count_nonzero(cum <= (target - q * cyc)[:, None] + eps, axis=1) - 1
        k1 = q.astype(np.int64) * H + np.minimum(j, H)
        q1, r1 = np.divmod(k1, H)
        p1 = np.maximum(0.0, target - (q1 * cyc + cum[ar, r1]))
        moved = run > 0
        if not moved.all():
            k1 = np.where(moved, k1, k0)
            p1 = np.where(moved, p1, p0)
            q1 = np.where(moved, q1, q0)
            r1 = np.where(moved, r1, r0)
        c1 = self.computed(g, r1, p1)
        busy = (q1 - q0) * ctH + ct[ar, r1] - ct[ar, r0] + c1 - self.prev[slots]
        if rate is not None:  # free-paced components credit busy time at their rates (eq. F4)
            busy = np.where(rate[0], busy, run * rate[1])
        self.k[slots] = k1
        self.partial[slots] = p1
        self.prev[slots] = c1
        return k1 - k0, run, busy


seal_declared_classes(globals())  # the classes engine.pxd declares behave as compiled (jigsaw_env/declared.py)
