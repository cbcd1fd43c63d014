"""Timing of jobs that share GPUs: lockstep co-location groups, solved per phase of the SPB cycle.

A *component* is a set of running jobs connected through shared GPUs (a job alone on its GPUs is a
component of one). Jobs of a component advance in lockstep, one iteration each per *step*, as the
live executor runs them (docs/spb_model.md section 5):

    load_g(k) = sum over workers (j, w) on GPU g of compute_j[phase_j(k), w]      (eq. K1)
    step(k)   = max_g load_g(k) + max_j comm_j[phase_j(k)]                          (eq. K2)
    phase_j(k) = (i_j + k) mod P_j, i_j = job j's iteration counter when the component formed

Workers of different jobs on one GPU are time-sliced, so their work adds up (K1); the step waits
for the busiest GPU, then for the slowest sync. The step sequence repeats with the hyper-period
``H = lcm(P_j)``, so anti-phased rotations (a heavy phase of one job on the light phase of the
other) shorten steps, and in-phase ones do not: the cycle is modelled, not averaged away.
"""
from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

from .spb import JobProfile

_EPS = 1e-9


@dataclass
class Member:
    job_id: int
    profile: JobProfile
    gpus: tuple[int, ...]
    iteration0: int  # iteration counter of the job when the component formed
    iso_s: float = 0.0  # the job's isolated iteration time (s), cached by the simulator


def _computed(row: list[float], partial: float) -> float:
    """GPU-seconds computed ``partial`` seconds into a step whose per-GPU loads are ``row``
    (compute comes first in a step: min(load, partial) on each GPU)."""
    if partial <= 0:
        return 0.0
    if len(row) == 1:
        return row[0] if row[0] < partial else partial
    return sum(x if x < partial else partial for x in row)


class Component:
    """A lockstep group of jobs. Times are seconds relative to ``origin_s`` (when stepping began)."""

    def __init__(self, members: list[Member], ready_s: float):
        self.members = members
        self.ready_s = ready_s  # no step starts before this (restart delays)
        self.H = 1
        for m in members:
            self.H = self.H * m.profile.period // math.gcd(self.H, m.profile.period)
        gpus = sorted({g for m in members for g in m.gpus})
        self.gpus = np.array(gpus, dtype=np.int64)
        col = {g: i for i, g in enumerate(gpus)}
        H = self.H
        loads = np.zeros((H, len(gpus)))
        comm = np.zeros(H)
        self.phase_bytes = []  # per member: (H,) bytes at each step of the hyper-period
        ks = np.arange(H)
        for m in members:
            ph = (m.iteration0 + ks) % m.profile.period
            c = m.profile.compute_s[ph]  # (H, W)
            for w, g in enumerate(m.gpus):
                loads[:, col[g]] += c[:, w]
            comm = np.maximum(comm, m.profile.comm_s[ph])
            self.phase_bytes.append(m.profile.bytes[ph])
        self.loads = loads
        self.step = loads.max(axis=1) + comm
        if np.any(self.step <= 0):
            raise ValueError("a co-location step of zero length: cost tables must have positive times")
        self.cum = np.concatenate([[0.0], np.cumsum(self.step)])
        self.cycle = float(self.cum[-1])
        self.cum_loads = np.vstack([np.zeros(len(gpus)), np.cumsum(loads, axis=0)])
        self.cum_bytes = [np.concatenate([[0.0], np.cumsum(b)]) for b in self.phase_bytes]
        self.k = 0            # steps completed since the component formed
        self.partial = 0.0    # seconds into step k
        # Python-float copies for the scalar fast path (advance_totals): the same numbers, read
        # without numpy's per-call overhead, which dominates for the usual 1-4 step cycles
        self._cum_l = self.cum.tolist()
        self._eps = _EPS * max(1.0, self.cycle)
        self._loads_l = loads.tolist()
        self._cum_tot = np.concatenate([[0.0], np.cumsum(loads.sum(axis=1))]).tolist()
        self._cum_bytes_l = [cb.tolist() for cb in self.cum_bytes]
        self.finish: tuple[float, list[int]] | None = None  # cached by the simulator

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
        bytes_ = [(q1 - q0) * cb[-1] + cb[r1] - cb[r0] for cb in self._cum_bytes_l]
        return k1 - k0, run, busy, bytes_

    def busy_vector(self) -> np.ndarray:
        """(len(gpus),) compute seconds per GPU since the component formed (steps 0..k-1 plus the
        computed part of step k): the sum of every :meth:`advance`'s ``busy``."""
        q, r = divmod(self.k, self.H)
        return q * self.cum_loads[-1] + self.cum_loads[r] + np.minimum(self.loads[r], self.partial)


@dataclass
class Advance:
    steps: int
    run_s: float
    busy: np.ndarray  # per component GPU, seconds of compute
    bytes: list[float]  # per member, bytes on the wire
