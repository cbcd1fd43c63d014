"""Co-located jobs that each run at their own pace (the ``free`` pace, the simulator's default).

Jobs that share GPUs are not held together: each steps through its own SPB cycle, so one job's
compute fills another's sync time and SPB slack, and their phases drift apart. A job's iteration
in phase ``p`` still waits for its slowest worker, then syncs (eq. T1). What changes is how long
each worker computes and each sync takes, given what the co-runners do at a random moment of
their own cycles (docs/colocation.md, eqs. F1-F4; times in seconds):

    a_j,g(p)  = job j's compute alone on GPU g in phase p (its workers there, summed)
    d_o,g     = sum_q c_o,g(q) / sum_q T_o(q)         (co-runner o computes on g this share of time)
    pi_o,g(q) = c_o,g(q) / sum_q' c_o,g(q')           (and, while it does, is in phase q this share)
    c_j,g(p)  = sum over states S of Pr(S) * a_j,g(p) / x_j(p, S)                       (eq. F1)
    s_j(p)    = s0_j(p) * max over j's links l of (1 + sum of co-runners' u_o,l)        (eq. F2)
    u_o,l     = sum_q s_o(q) / sum_q T_o(q)           (co-runner o syncs over link l this share)
    T_j(p)    = max over j's GPUs g of c_j,g(p) + s_j(p)                                (eq. F3)

A *state* S gives each co-runner on g either "not computing" (probability 1 - d_o,g) or
"computing in phase q" (probability d_o,g * pi_o,g(q)), independently; ``x_j(p, S)`` is job j's
normalized rate beside the computing ones (eq. I2 under the fitted sharing, 1/n time-sliced; 1
when none computes). Eq. F1 averages the time of a whole compute interval over the states it may
meet (each interval meets one state); for two 1-GPU jobs without syncs it is eq. I2 averaged over
the co-runner's phases, how Gavel ran the pairs the model is checked against. Eq. F2: a sync that overlaps another over the same link
shares its bandwidth, and it meets one with the probability that the other is syncing. The
shares ``d`` and ``u`` depend on the times they produce; they are iterated from the alone times
to their fixed point (each step can only lengthen times, so the iteration rises to it).

A shared GPU is busy while any job computes on it, ``U_g = 1 - prod_o (1 - d_o,g)`` of the time
(the jobs' phases independent), and each job is credited busy seconds on it at the rate

    r_j,g = U_g * d_j,g / sum_o d_o,g                     (busy seconds per second of running, eq. F4)

so the busy seconds of a shared GPU count once and never exceed the time that passes.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from operator import mul
from typing import Sequence

import numpy as np

from .interference import SharingModel, WorkerLoad
from .spb import JobProfile

PACES = ("free", "lockstep")
DEFAULT_PACE = "free"

#: the fixed point of the shares stops when no time changes by more than this fraction
TOLERANCE = 1e-12
MAX_ITERATIONS = 200
#: the most joint states of a GPU's co-runners enumerated exactly (eq. F1); beyond it each
#: co-runner's phases are merged into one load, their time-weighted mean (a stated approximation,
#: met only with several co-runners of long SPB cycles on one GPU)
MAX_STATES = 4096


def check_pace(value: str) -> str:
    """``value`` if it names a pace; else ValueError listing them."""
    if value not in PACES:
        raise ValueError(f"pace must be one of {', '.join(PACES)}, got {value!r}")
    return value


@dataclass(frozen=True)
class FreeRunner:
    """One job of a group of co-located jobs: its profile alone and the GPUs of its workers."""

    profile: JobProfile
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class FreeRunning:
    """What :func:`free_running` gives each job of a group, in the group's order.

    profiles: the job's profile with each worker's compute and each phase's sync as they take
        beside the others (eqs. F1, F2); eta, bytes and memory unchanged.
    busy_rate: per job, per GPU of the job (its distinct GPUs, ascending) the busy seconds per
        second of running credited to it there (eq. F4; its ``d`` on a GPU it has to itself).
    duty: per job, per GPU of the job (the same order) the share of time it computes there
        (eq. F1's ``d``).
    iterations: the fixed point's iterations.
    """

    profiles: tuple[JobProfile, ...]
    busy_rate: tuple[tuple[float, ...], ...]
    duty: tuple[tuple[float, ...], ...]
    iterations: int


def _alone_per_gpu(p: JobProfile, gpus: Sequence[int]) -> dict[int, np.ndarray]:
    """GPU -> (period,) the job's compute alone on it per phase (its workers there summed, as the
    engine adds a job's own workers on one GPU)."""
    out: dict[int, np.ndarray] = {}
    for w, g in enumerate(gpus):
        col = p.compute_s[:, w]
        out[g] = out[g] + col if g in out else col.astype(np.float64).copy()
    return out


@dataclass
class _SharedSlot:
    """One job's compute on one GPU it shares, prepared once for eq. F1's iteration: the job's
    alone times on it per phase, its co-runners there, each co-runner's phases grouped by equal
    alone load, and the inverse rate of each of the job's phases in each joint state of the
    co-runners (rates depend on alone loads only, so only the states' probabilities change from
    one iteration to the next). Python floats: the lists are a few phases long, where numpy's
    per-call cost outweighs the arithmetic."""

    job: int
    gpu: int
    alone: list                # per phase, seconds
    others: list               # co-runner jobs
    groups: list               # per co-runner: the load group of each of its phases
    sizes: list                # per co-runner: its number of load groups
    inv_rate: list             # per phase, per state: 1 / x_j(p, S) (0 where the job does not compute)


def _shared_slot(i: int, g: int, alone: list, others: list, batch: list, sharing: SharingModel) -> _SharedSlot:
    """:class:`_SharedSlot` of job ``i`` on GPU ``g``. Its tables (:func:`_slot_tables`) depend
    only on the alone loads and batch sizes on the GPU and its type; they are kept in
    ``sharing.slot_tables`` by those."""
    mine = tuple(alone[i][g])
    co = tuple([(tuple(alone[o][g]), batch[o]) for o in others])
    gpu_type = sharing.gpu_type_of(g)
    key = (mine, batch[i], co, gpu_type)
    memo = sharing.slot_tables
    tables = memo.get(key)
    if tables is None:
        if len(memo) > 50_000:
            memo.clear()
        tables = memo[key] = _slot_tables(mine, batch[i], co, gpu_type, sharing)
    groups, sizes, inv = tables
    return _SharedSlot(i, g, list(mine), list(others), groups, sizes, inv)


def _slot_tables(mine: tuple, mine_batch: int, co: tuple, gpu_type: str, sharing: SharingModel) -> tuple:
    """(groups, sizes, inv_rate) of :class:`_SharedSlot` for a job whose alone loads per phase on
    a GPU of ``gpu_type`` are ``mine`` beside co-runners ``co`` ((their alone loads per phase,
    batch size) each). The states enumerate, per co-runner, "not computing" then each of its load
    groups, in ``itertools.product`` order (the order in which :func:`_state_probabilities`
    multiplies the options' probabilities out)."""
    groups, sizes, options = [], [], []
    for loads, _ in co:
        uniq: dict = {}
        groups.append([uniq.setdefault(x, len(uniq)) for x in loads])
        sizes.append(len(uniq))
        options.append([None, *uniq])
    if math.prod(1 + k for k in sizes) > MAX_STATES:
        # each co-runner's phases as one load: their mean weighted by time
        options = []
        for j, (loads, _) in enumerate(co):
            total = sum(loads)
            options.append([None, sum(x * x for x in loads) / total if total > 0 else 0.0])
            groups[j] = [0] * len(loads)
            sizes[j] = 1
    states = [tuple(WorkerLoad(x, b) for x, (_, b) in zip(combo, co) if x is not None and x > 0.0)
              for combo in itertools.product(*options)]
    inv = []
    memo: dict = {}
    for x in mine:
        row = [0.0] * len(states)
        if x > 0.0:
            load = WorkerLoad(x, mine_batch)
            for k, st in enumerate(states):
                if not st:
                    row[k] = 1.0
                    continue
                r = memo.get((load, st))
                if r is None:
                    r = memo[(load, st)] = sharing.rates([load, *st], gpu_type)[0]
                row[k] = 1.0 / r
        inv.append(row)
    return groups, sizes, inv


def _state_probabilities(slot: _SharedSlot, comp: list, duty: list) -> list:
    """The probability of each joint state of ``slot``'s co-runners: each not computing with
    probability ``1 - d``, computing in a load group with ``d`` times the group's share of its
    compute on the GPU, independently of each other."""
    g = slot.gpu
    probs = None  # the product of the options so far (None: the empty product, [1.0])
    for o, grp, k in zip(slot.others, slot.groups, slot.sizes):
        c = comp[o][g]
        total = sum(c)
        d = duty[o][g]
        opt = [1.0 - d] + [0.0] * k
        if total > 0:
            for q, x in zip(grp, c):
                opt[q + 1] += d * x / total
        # (1.0 * w is w exactly: the first co-runner's options are the product so far)
        probs = opt if probs is None else [p * w for p in probs for w in opt]
    return [1.0] if probs is None else probs


def _slot_time(slot: _SharedSlot, comp: list, duty: list) -> list:
    """Eq. F1 for every phase of ``slot``'s job on its GPU: its alone time times the mean inverse
    rate over the co-runners' joint states."""
    probs = _state_probabilities(slot, comp, duty)
    return [a * sum(map(mul, row, probs)) for a, row in zip(slot.alone, slot.inv_rate)]


def free_running(jobs: Sequence[FreeRunner], sharing: SharingModel) -> FreeRunning:
    """Eqs. F1-F4 for a group of co-located jobs (see the module docstring). ``sharing`` gives
    the rates of workers together on a GPU and the links each job's sync crosses."""
    n = len(jobs)
    alone = [{g: x.tolist() for g, x in _alone_per_gpu(j.profile, j.gpus).items()} for j in jobs]
    on_gpu: dict[int, list[int]] = {}
    for i, a in enumerate(alone):
        for g in a:
            on_gpu.setdefault(g, []).append(i)
    links = [sharing.links_of(j.gpus) for j in jobs]
    sync0 = [[float(x) for x in j.profile.comm_s] for j in jobs]
    batch = [j.profile.batch_size for j in jobs]
    comp = [{g: list(a[g]) for g in a} for a in alone]  # c_j,g(p), from the alone times
    sync = [list(s) for s in sync0]
    slots = [_shared_slot(i, g, alone, [o for o in on_gpu[g] if o != i], batch, sharing)
             for i in range(n) for g in alone[i] if len(on_gpu[g]) > 1]
    # per job and link, the other jobs whose syncs cross it (eq. F2)
    linked = [[[o for o in range(n) if o != i and link in links[o]] for link in links[i]] for i in range(n)]
    # the jobs whose links no other job's syncs cross: their syncs keep their alone times
    unshared_sync = [not any(others) for others in linked]

    def shares(comp, sync):
        cycle, duty = [], []
        for i in range(n):
            per_gpu = list(comp[i].values())
            total = 0.0
            # per phase, its slowest GPU's compute plus its sync
            for slowest, s in zip(map(max, zip(*per_gpu)), sync[i]):
                total += slowest + s
            cycle.append(total)
            duty.append({g: sum(c) / total for g, c in comp[i].items()})
        return cycle, duty

    iterations = 0
    for iterations in range(1, MAX_ITERATIONS + 1):
        cycle, duty = shares(comp, sync)
        syncing = [sum(sync[o]) / cycle[o] for o in range(n)]
        new_comp = [dict(c) for c in comp]
        # the largest relative change of a time, as far as the stop needs it (once it is above
        # the tolerance, the iteration goes on whatever the rest)
        change = 0.0
        for slot in slots:
            new = _slot_time(slot, comp, duty)
            if change <= TOLERANCE:
                change = max(change, _relative_change(comp[slot.job][slot.gpu], new))
            new_comp[slot.job][slot.gpu] = new
        new_sync = []
        for i in range(n):
            if unshared_sync[i]:
                new_sync.append(sync0[i])
                continue
            factor = 1.0
            for others in linked[i]:
                factor = max(factor, 1.0 + sum(syncing[o] for o in others))
            new = [x * factor for x in sync0[i]]
            if change <= TOLERANCE:
                change = max(change, _relative_change(sync[i], new))
            new_sync.append(new)
        comp, sync = new_comp, new_sync
        if change <= TOLERANCE:
            break
    cycle, duty = shares(comp, sync)
    share = {}
    for g, members in on_gpu.items():
        ds = [duty[i][g] for i in members]
        total = sum(ds)
        union = 1.0 - math.prod(1.0 - d for d in ds)
        share[g] = union / total if total > 0 else 0.0
    profiles = []
    for i, j in enumerate(jobs):
        p = j.profile
        scale = np.ones_like(p.compute_s, dtype=np.float64)
        for w, g in enumerate(j.gpus):
            a = np.array(alone[i][g])
            scale[:, w] = np.divide(np.array(comp[i][g]), a, out=np.ones_like(a), where=a > 0)
        profiles.append(replace(p, compute_s=p.compute_s * scale, comm_s=np.array(sync[i], dtype=np.float64)))
    rates = tuple(tuple(duty[i][g] * share[g] for g in sorted(duty[i])) for i in range(n))
    duties = tuple(tuple(duty[i][g] for g in sorted(duty[i])) for i in range(n))
    return FreeRunning(tuple(profiles), rates, duties, iterations)


def _relative_change(old: list, new: list) -> float:
    """The largest relative change from ``old`` to ``new`` (0 for empty lists)."""
    out = 0.0
    for a, b in zip(old, new):
        d = abs(b - a) / max(abs(a), 1e-300)
        if d > out:
            out = d
    return out
