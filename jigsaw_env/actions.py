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
masked one would be rejected (tests/test_env.py checks both directions). Its window slides: once a
slot's job is decided, the slot shows the next job behind the window, so a round can start every
job of an arrival burst, not only the first K.
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


def window_order(state: ClusterState, k: int) -> list[int]:
    """Every active job in the order the agent sees them this round (the first K are the window).

    Up to K/2 running jobs (the ones with the most attained service first: the natural
    preemption candidates), then waiting jobs in arrival order, then the other running jobs.
    """
    running = sorted((j for j in state.running()), key=lambda j: (-j.attained_gpu_s, j.arrival_s, j.job_id))
    waiting = [j for j in state.active() if j.status is not JobStatus.RUNNING]
    take_run = min(len(running), k // 2)
    return [j.job_id for j in running[:take_run]] + [j.job_id for j in waiting] + [j.job_id for j in running[take_run:]]


def select_window(state: ClusterState, k: int) -> list[int]:
    """The K jobs the agent sees at the start of a round (the first K of :func:`window_order`)."""
    return window_order(state, k)[:k]


class RoundBuilder:
    """The decision under construction for the next round, with exact masks."""

    def __init__(self, state: ClusterState, codec: ActionCodec, ledger: GpuLedger | None = None):
        """``ledger``: the allocation in force, if the caller has it (the simulator keeps one);
        otherwise it is built from the running jobs. The builder owns and changes it."""
        self.state = state
        self.codec = codec
        order = window_order(state, codec.window_k)
        self.window = order[: codec.window_k]
        self._queue = order[codec.window_k:][::-1]  # the jobs still behind the window, next one last
        self.step_cap = 2 * codec.window_k + 2 + len(self._queue)
        self.ledger = ledger if ledger is not None else GpuLedger(state, state.current_decision(), checked=True)
        self.acted: set[int] = set()
        self._need_cache: dict[tuple, np.ndarray] = {}  # masks' per-round caches (speed only)
        self._keep_cache: dict[tuple, list[bool]] = {}

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
            self._slide(slot)
            return "pause"
        jd = self.candidate(slot, option, level, pattern)
        if jd is None:
            raise InvalidAction(f"job {jid} (slot {slot}): placement {option!r} at level {level}/{pattern.value} is infeasible")
        if jid in self.ledger.decision:
            self.ledger.remove(jid)
        self.ledger.add(jid, jd, checked=True)
        self.acted.add(jid)
        self._slide(slot)
        return "run"

    def _slide(self, slot: int) -> None:
        """The window slides: a decided job's slot shows the next job behind the window, so one
        round can decide every active job, however many arrived at once (Philly's arrivals come
        in bursts of dozens), while the other slots keep their jobs."""
        if self._queue:
            self.window[slot] = self._queue.pop()

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
        if not st.costs.homogeneous:
            return self._masks_exhaustive(mask)
        slots = [(slot, jid) for slot, jid in enumerate(self.window) if jid not in self.acted]
        if not slots:
            return mask
        cap_w = st.max_workers_per_gpu
        combos = c.combos
        n_lp = c.n_lp
        base = self.ledger
        capacity = base.capacity
        cap0 = float(capacity[0])
        base_free = base._wl.count(0)
        jobs = [st.jobs[jid] for _, jid in slots]
        need = self._need_matrix(jobs)                                      # (S, n_lp)
        n = np.array([job.num_gpus for job in jobs])                        # (S,)
        # packed: ``mem + need <= capacity`` is monotone in mem, so at least n GPUs under the
        # worker cap fit iff the n-th smallest memory among them does (same float comparison)
        open_mem = np.sort(base.mem[base.workers < cap_w])
        nth = np.full(len(slots), np.inf)
        ok_n = n <= open_mem.size
        nth[ok_n] = open_mem[n[ok_n] - 1]
        packed_ok = nth[:, None] + need <= cap0                             # (S, n_lp)
        free_excl = np.full(len(slots), base_free)
        keep_rows = []
        wl, ml, cl = base._wl, base._ml, base._cl
        for i, job in enumerate(jobs):
            jd = base.decision.get(job.job_id)
            if jd is None:
                continue
            # the job's GPUs as they would be with it taken out (GpuLedger.remove's arithmetic),
            # in scalar Python: a running job has few workers
            m_new, w_new = [], []
            for g, p in zip(jd.gpus, base._peak_list(job, jd)):
                w = wl[g] - 1
                w_new.append(w)
                m_new.append(0.0 if w == 0 else max(ml[g] - p, 0.0))
            free_excl[i] += w_new.count(0)
            # n-th smallest memory among GPUs under the worker cap, with its GPUs changed: only the
            # n + W smallest of the unchanged sorted list can matter
            nj = job.num_gpus
            pref = open_mem[: nj + len(m_new)].tolist()
            for g in jd.gpus:
                if wl[g] < cap_w:
                    try:
                        pref.remove(ml[g])
                    except ValueError:
                        pass  # beyond the prefix: larger than everything kept
            pref.extend(m for m, w in zip(m_new, w_new) if w < cap_w)
            pref.sort()
            packed_ok[i] = (pref[nj - 1] + need[i] <= cap0) if nj <= len(pref) else False
            if job.status is JobStatus.RUNNING:
                keep_rows.append((i, self._keep_row(job, jd.gpus, m_new)))
        excl_ok = (free_excl[:, None] >= n[:, None]) & (need <= cap0)          # (S, n_lp)
        rows = mask[: c.advance].reshape(c.window_k, c.per_job)             # a view into mask
        idx = np.array([slot for slot, _ in slots])
        rows[idx, n_lp: 2 * n_lp] = excl_ok                                  # consolidated
        rows[idx, 2 * n_lp: 3 * n_lp] = excl_ok                              # spread
        rows[idx, 3 * n_lp: 4 * n_lp] = packed_ok
        pause = c.n_opt * n_lp
        for i, (slot, jid) in enumerate(slots):
            if jid in base.decision:
                rows[slot, pause] = True
        for i, keep in keep_rows:
            rows[slots[i][0], :n_lp] = keep
        return mask

    def _need_matrix(self, jobs: list) -> np.ndarray:
        """(S, n_lp) the largest worker peak (bytes) of each job at each combo, stacked (cached
        for the round by the window's jobs: it depends on nothing else)."""
        key = tuple(j.job_id for j in jobs)
        need = self._need_cache.get(key)
        if need is None:
            combos = self.codec.combos
            need = self._need_cache[key] = np.stack([self.state.costs.need_vector(j, combos) for j in jobs])
        return need

    def _keep_row(self, job, gpus: tuple[int, ...], m_new: list[float]) -> list[bool]:
        """Per combo: do the job's workers fit its own GPUs, holding ``m_new`` bytes without it
        (``m + peak <= capacity`` on every GPU)? Cached for the round by the job's model, size,
        GPUs and those bytes: it depends on nothing else."""
        key = (job.model, job.batch_size, gpus, tuple(m_new))
        row = self._keep_cache.get(key)
        if row is None:
            cl = self.ledger._cl
            caps = [cl[g] for g in gpus]
            row = self._keep_cache[key] = [all(m + p <= c for m, p, c in zip(m_new, r, caps))
                                           for r in self.state.costs.peak_rows(job, self.codec.combos)]
        return row

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
