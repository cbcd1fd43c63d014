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
from functools import cached_property

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

    @cached_property
    def combos(self) -> list[tuple[int, Pattern]]:
        return level_pattern_combos(self.spb)

    @cached_property
    def n_lp(self) -> int:
        return 1 + 2 * self.spb.max_level

    @cached_property
    def n_opt(self) -> int:
        return len(PLACEMENT_OPTIONS)

    @cached_property
    def per_job(self) -> int:
        return self.n_opt * self.n_lp + 1

    @cached_property
    def n(self) -> int:
        return self.window_k * self.per_job + 1

    @cached_property
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
        self.ledger = GpuLedger(state, state.current_decision(), checked=True)
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
        self.ledger.add(jid, jd, checked=True)
        self.acted.add(jid)
        return "run"

    # ----- masks
    def masks(self) -> np.ndarray:
        """Boolean mask over all actions: True = feasible.

        Vectorised over the level/pattern combos of each job; the arithmetic repeats that of
        :class:`GpuLedger` (remove, ``_packed``'s candidate filter, ``check``) operation for
        operation, so a mask entry is True exactly when the action would apply.
        """
        c = self.codec
        mask = np.zeros(c.n, dtype=bool)
        mask[c.advance] = True
        st = self.state
        cl = st.cluster
        if len(set(cl.gpu_types)) > 1:
            return self._masks_exhaustive(mask)
        cap_w = st.max_workers_per_gpu
        combos = c.combos
        n_lp = c.n_lp
        base = self.ledger
        capacity = base.capacity
        cap0 = float(capacity[0])
        base_free = int(np.count_nonzero(base.workers == 0))
        base_open = base.workers < cap_w
        pause = c.n_opt * n_lp
        for slot, jid in enumerate(self.window):
            if jid in self.acted:
                continue
            job = st.jobs[jid]
            off = slot * c.per_job
            peaks = st.costs.peak_matrix(job, combos)  # (n_lp, W)
            need = peaks.max(axis=1)                   # (n_lp,)
            n = job.num_gpus
            jd = base.decision.get(jid)
            if jd is not None:
                mask[off + pause] = True
                g = np.asarray(jd.gpus)
                mem = base.mem.copy()
                workers = base.workers.copy()
                mem[g] -= base.peaks(job, jd)
                workers[g] -= 1
                mem[g] = np.where(workers[g] == 0, 0.0, np.maximum(mem[g], 0.0))
                free_excl = int(np.count_nonzero(workers == 0))
                open_gpus = workers < cap_w
            else:
                mem, free_excl, open_gpus = base.mem, base_free, base_open
            excl_ok = (free_excl >= n) & (need <= cap0)
            mask[off + n_lp: off + 2 * n_lp] = excl_ok           # consolidated
            mask[off + 2 * n_lp: off + 3 * n_lp] = excl_ok       # spread
            fits = open_gpus[None, :] & (mem[None, :] + need[:, None] <= capacity[None, :])
            mask[off + 3 * n_lp: off + 4 * n_lp] = fits.sum(axis=1) >= n  # packed
            if jd is not None and job.status is JobStatus.RUNNING:
                mask[off: off + n_lp] = np.all(mem[g][None, :] + peaks <= capacity[g][None, :], axis=1)  # keep
        return mask

    def _masks_exhaustive(self, mask: np.ndarray) -> np.ndarray:
        """Exact masks by trying every action (clusters with several GPU types)."""
        c = self.codec
        for slot, jid in enumerate(self.window):
            if jid in self.acted:
                continue
            off = slot * c.per_job
            mask[off + c.n_opt * c.n_lp] = jid in self.ledger.decision
            for o, option in enumerate(PLACEMENT_OPTIONS):
                for i, (level, pattern) in enumerate(c.combos):
                    mask[off + o * c.n_lp + i] = self.candidate(slot, option, level, pattern) is not None
        return mask
