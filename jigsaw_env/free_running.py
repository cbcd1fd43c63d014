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


def _states(corunners: list[tuple[float, list[tuple[float, float]], int]]):
    """Joint states of co-runners given as (d, [(pi_q, alone load_q), ...], batch size): yields
    (probability, the computing ones' loads as WorkerLoads)."""
    options = []
    for d, phases, batch in corunners:
        opts = [(1.0 - d, None)] if d < 1.0 else []
        opts += [(d * pi, WorkerLoad(load, batch)) for pi, load in phases if pi > 0.0 and load > 0.0]
        options.append(opts)
    for combo in itertools.product(*options):
        prob = 1.0
        loads = []
        for pr, load in combo:
            prob *= pr
            if load is not None:
                loads.append(load)
        if prob > 0.0:
            yield prob, tuple(loads)


def _merged_phases(phases: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Phases with equal loads merged (their shares added), in first-seen order."""
    out: dict[float, float] = {}
    for pi, load in phases:
        out[load] = out.get(load, 0.0) + pi
    return [(pi, load) for load, pi in out.items()]


def free_running(jobs: Sequence[FreeRunner], sharing: SharingModel) -> FreeRunning:
    """Eqs. F1-F4 for a group of co-located jobs (see the module docstring). ``sharing`` gives
    the rates of workers together on a GPU and the links each job's sync crosses."""
    n = len(jobs)
    alone = [_alone_per_gpu(j.profile, j.gpus) for j in jobs]
    on_gpu: dict[int, list[int]] = {}
    for i, a in enumerate(alone):
        for g in a:
            on_gpu.setdefault(g, []).append(i)
    links = [sharing.links_of(j.gpus) for j in jobs]
    sync0 = [j.profile.comm_s.astype(np.float64) for j in jobs]
    batch = [j.profile.batch_size for j in jobs]
    comp = [{g: a[g].copy() for g in a} for a in alone]  # c_j,g(p), from the alone times
    sync = [s.copy() for s in sync0]
    rate_memo: dict = {}

    def rate(g: int, mine: WorkerLoad, others: tuple[WorkerLoad, ...]) -> float:
        if not others:
            return 1.0
        key = (g, mine, others)
        x = rate_memo.get(key)
        if x is None:
            x = rate_memo[key] = sharing.rates([mine, *others], sharing.gpu_type_of(g))[0]
        return x

    iterations = 0
    for iterations in range(1, MAX_ITERATIONS + 1):
        step = [np.max(np.stack([comp[i][g] for g in comp[i]]), axis=0) + sync[i] for i in range(n)]
        cycle = [float(s.sum()) for s in step]
        duty = [{g: float(comp[i][g].sum()) / cycle[i] for g in comp[i]} for i in range(n)]
        new_comp = []
        for i in range(n):
            out = {}
            for g, a in alone[i].items():
                others = [o for o in on_gpu[g] if o != i]
                if not others:
                    out[g] = a
                    continue
                corunners = []
                for o in others:
                    total = float(comp[o][g].sum())
                    phases = [(float(c) / total, float(x)) for c, x in zip(comp[o][g], alone[o][g])] if total > 0 else []
                    corunners.append((duty[o][g], _merged_phases(phases), batch[o]))
                n_states = math.prod(1 + len(ph) for _, ph, _ in corunners)
                if n_states > MAX_STATES:
                    corunners = [(d, [(1.0, sum(pi * x for pi, x in ph))], b) for d, ph, b in corunners]
                out[g] = np.array([_expected_time(float(x), batch[i], g, corunners, rate) for x in a])
            new_comp.append(out)
        new_sync = []
        for i in range(n):
            factor = 1.0
            for link in links[i]:
                f = 1.0 + sum(float(sync[o].sum()) / cycle[o] for o in range(n) if o != i and link in links[o])
                factor = max(factor, f)
            new_sync.append(sync0[i] * factor)
        change = max(_relative_change(comp[i][g], new_comp[i][g]) for i in range(n) for g in comp[i])
        change = max(change, max(_relative_change(sync[i], new_sync[i]) for i in range(n)))
        comp, sync = new_comp, new_sync
        if change <= TOLERANCE:
            break
    step = [np.max(np.stack([comp[i][g] for g in comp[i]]), axis=0) + sync[i] for i in range(n)]
    cycle = [float(s.sum()) for s in step]
    duty = [{g: float(comp[i][g].sum()) / cycle[i] for g in comp[i]} for i in range(n)]
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
            a = alone[i][g]
            scale[:, w] = np.divide(comp[i][g], a, out=np.ones_like(a), where=a > 0)
        profiles.append(replace(p, compute_s=p.compute_s * scale, comm_s=sync[i]))
    rates = tuple(tuple(duty[i][g] * share[g] for g in sorted(duty[i])) for i in range(n))
    duties = tuple(tuple(duty[i][g] for g in sorted(duty[i])) for i in range(n))
    return FreeRunning(tuple(profiles), rates, duties, iterations)


def _expected_time(alone_s: float, batch_size: int, gpu: int, corunners, rate) -> float:
    """Eq. F1 for one phase of one job on one GPU: the alone time over the rate, averaged over the
    co-runners' joint states."""
    if alone_s <= 0.0:
        return 0.0
    mine = WorkerLoad(alone_s, batch_size)
    total = 0.0
    for prob, others in _states(corunners):
        total += prob * alone_s / rate(gpu, mine, others)
    return total


def _relative_change(old: np.ndarray, new: np.ndarray) -> float:
    if old.size == 0:
        return 0.0
    scale = np.maximum(np.abs(old), 1e-300)
    return float(np.max(np.abs(new - old) / scale))
