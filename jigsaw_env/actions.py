"""The discrete action codec and exact action masks, shared by the env and the live executor.

One action is one decision step (as in Decima and spark-sched-sim):

    a = slot * per_job + option * n_lp + lp     run job ``slot`` of the window with placement
                                                ``option`` and SPB (level, pattern) combo ``lp``
    a = slot * per_job + n_opt * n_lp           pause job ``slot`` (leave it out of the round)
    a = K * per_job                             advance: apply the decision, run one round

with ``per_job = n_opt * n_lp + 1``, ``n_opt = len(PLACEMENT_OPTIONS)`` and the level/pattern
combos ``lp``: 0 -> (0, rotating), then (l, rotating), (l, static) for l = 1..L.

A :class:`RoundBuilder` holds the decision being built for the next round (it starts from the
allocation in force) and computes masks exactly: every unmasked action applies cleanly, every
masked one would be rejected (tests/test_env.py checks both directions).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .placement import PLACEMENT_OPTIONS, GpuLedger
from .spb import Pattern, SPBConfig
from .state import ClusterState, JobDecision, JobStatus


class InvalidAction(ValueError):
    """An action that is masked (infeasible) in the current state."""


def level_pattern_combos(spb: SPBConfig) -> list[tuple[int, Pattern]]:
    out = [(0, Pattern.ROTATING)]
    for level in range(1, spb.max_level + 1):
        out += [(level, Pattern.ROTATING), (level, Pattern.STATIC)]
    return out


@dataclass(frozen=True)
class ActionCodec:
    window_k: int
    spb: SPBConfig

    @property
    def combos(self) -> list[tuple[int, Pattern]]:
        return level_pattern_combos(self.spb)

    @property
    def n_lp(self) -> int:
        return 1 + 2 * self.spb.max_level

    @property
    def n_opt(self) -> int:
        return len(PLACEMENT_OPTIONS)

    @property
    def per_job(self) -> int:
        return self.n_opt * self.n_lp + 1

    @property
    def n(self) -> int:
        return self.window_k * self.per_job + 1

    @property
    def advance(self) -> int:
        return self.window_k * self.per_job

    def encode(self, slot: int, option: str | None, level: int = 0, pattern: Pattern = Pattern.ROTATING) -> int:
        """Action index; ``option=None`` means pause."""
        if option is None:
            return slot * self.per_job + self.n_opt * self.n_lp
        lp = self.combos.index((level, Pattern.ROTATING if level == 0 else Pattern.parse(pattern)))
        return slot * self.per_job + PLACEMENT_OPTIONS.index(option) * self.n_lp + lp

    def decode(self, action: int) -> tuple[str, int, str | None, int, Pattern]:
        """("advance"|"pause"|"run", slot, option, level, pattern)."""
        a = int(action)
        if not 0 <= a < self.n:
            raise InvalidAction(f"action {a} is outside 0..{self.n - 1}")
        if a == self.advance:
            return ("advance", -1, None, 0, Pattern.ROTATING)
        slot, r = divmod(a, self.per_job)
        if r == self.n_opt * self.n_lp:
            return ("pause", slot, None, 0, Pattern.ROTATING)
        opt, lp = divmod(r, self.n_lp)
        level, pattern = self.combos[lp]
        return ("run", slot, PLACEMENT_OPTIONS[opt], level, pattern)


def select_window(state: ClusterState, k: int) -> list[int]:
    """The K jobs the agent sees this round, frozen for the round.

    Up to K/2 running jobs (the ones with the most attained service first: the natural
    preemption candidates), then waiting jobs in arrival order, then more running jobs.
    """
    running = sorted((j for j in state.running()), key=lambda j: (-j.attained_gpu_s, j.arrival_s, j.job_id))
    waiting = [j for j in state.active() if j.status is not JobStatus.RUNNING]
    take_run = min(len(running), k // 2)
    out = [j.job_id for j in running[:take_run]]
    out += [j.job_id for j in waiting[: k - len(out)]]
    out += [j.job_id for j in running[take_run: take_run + k - len(out)]]
    return out


class RoundBuilder:
    """The decision under construction for the next round, with exact masks."""

    def __init__(self, state: ClusterState, codec: ActionCodec):
        self.state = state
        self.codec = codec
        self.window = select_window(state, codec.window_k)
        self.ledger = GpuLedger(state, state.current_decision())
        self.acted: set[int] = set()

    # ----- applying
    def candidate(self, slot: int, option: str, level: int, pattern: Pattern) -> JobDecision | None:
        """The JobDecision that ``run`` would apply, or None if infeasible."""
        if slot >= len(self.window):
            return None
        jid = self.window[slot]
        if jid in self.acted:
            return None
        job = self.state.jobs[jid]
        led = self.ledger
        if jid in led.decision:
            led = led.copy()
            led.remove(jid)
        if option == "keep":
            if job.status is not JobStatus.RUNNING or jid not in self.ledger.decision:
                return None
            jd = JobDecision(self.ledger.decision[jid].gpus, level, pattern)
            return jd if led.fits(jid, jd) else None
        return led.place(job, option, level, pattern)

    def apply(self, action: int) -> str:
        """Apply one non-advance action; returns "run" or "pause". Raises InvalidAction."""
        kind, slot, option, level, pattern = self.codec.decode(action)
        if kind == "advance":
            raise InvalidAction("advance is applied by the caller")
        if slot >= len(self.window):
            raise InvalidAction(f"window slot {slot} is empty")
        jid = self.window[slot]
        if jid in self.acted:
            raise InvalidAction(f"job {jid} (slot {slot}) was already decided this round")
        if kind == "pause":
            if jid not in self.ledger.decision:
                raise InvalidAction(f"job {jid} (slot {slot}) is not running, so it cannot be paused")
            self.ledger.remove(jid)
            self.acted.add(jid)
            return "pause"
        jd = self.candidate(slot, option, level, pattern)
        if jd is None:
            raise InvalidAction(f"job {jid} (slot {slot}): placement {option!r} at level {level}/{pattern.value} is infeasible")
        if jid in self.ledger.decision:
            self.ledger.remove(jid)
        self.ledger.add(jid, jd)
        self.acted.add(jid)
        return "run"

    # ----- masks
    def masks(self) -> np.ndarray:
        """Boolean mask over all actions: True = feasible."""
        c = self.codec
        mask = np.zeros(c.n, dtype=bool)
        mask[c.advance] = True
        st = self.state
        cl = st.cluster
        cap_w = st.max_workers_per_gpu
        combos = c.combos
        hetero = len(set(cl.gpu_types)) > 1
        base = self.ledger
        for slot, jid in enumerate(self.window):
            if jid in self.acted:
                continue
            job = st.jobs[jid]
            off = slot * c.per_job
            in_dec = jid in base.decision
            if in_dec:
                mask[off + c.n_opt * c.n_lp] = True  # pause
                led = base.copy()
                led.remove(jid)
            else:
                led = base
            if hetero:
                for o, option in enumerate(PLACEMENT_OPTIONS):
                    for i, (level, pattern) in enumerate(combos):
                        mask[off + o * c.n_lp + i] = self.candidate(slot, option, level, pattern) is not None
                continue
            capacity = float(led.capacity[0])
            n = job.num_gpus
            free_excl = int((led.workers == 0).sum())
            open_gpus = led.workers < cap_w
            peaks_cache: dict = {}
            for i, (level, pattern) in enumerate(combos):
                key = (level, pattern) if (level > 0 and pattern is Pattern.STATIC) else "full"
                peaks = peaks_cache.get(key)
                if peaks is None:
                    peaks = peaks_cache[key] = st.costs.worker_peaks(job, level, pattern)
                need = float(peaks.max())
                # consolidated / spread: exclusive GPUs
                excl_ok = free_excl >= n and need <= capacity
                mask[off + 1 * c.n_lp + i] = excl_ok
                mask[off + 2 * c.n_lp + i] = excl_ok
                # packed: GPUs under the worker cap whose free memory holds the biggest worker
                # (the same expression as GpuLedger._packed, so the mask is exact)
                cnt = int(np.count_nonzero(open_gpus & (led.mem + need <= led.capacity)))
                mask[off + 3 * c.n_lp + i] = cnt >= n
                # keep: the job's own GPUs at the new level
                if in_dec and job.status is JobStatus.RUNNING:
                    g = np.asarray(base.decision[jid].gpus)
                    pk = st.costs.profile(job, level, pattern, tuple(g)).peak_bytes
                    mask[off + 0 * c.n_lp + i] = bool(np.all(led.mem[g] + pk <= led.capacity[g]))
        return mask
