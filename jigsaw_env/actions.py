"""The discrete action codec and exact action masks, shared by the env and the live executor.

One action is one decision step (as in Decima and spark-sched-sim):

    a = slot * per_job + option * n_lp + lp     run job ``slot`` of the window with placement
                                                ``option`` and SPB (level, pattern) combo ``lp``
    a = slot * per_job + n_opt * n_lp           pause job ``slot``: take it out of the decision (and
                                                of the round; with ``pause="requeue"`` it goes to the
                                                back of the round's line instead)
    a = K * per_job                             advance: apply the decision, run one round

with ``per_job = n_opt * n_lp + 1`` and the level/pattern combos ``lp``: 0 -> (0, rotating), then
(l, rotating), (l, static) for l = 1..L. The options (:attr:`ActionCodec.options`, ``n_opt`` of
them) are the menu of :data:`~jigsaw_env.placement.PLACEMENT_OPTIONS`, then one pair-with-host
option ``host:r`` per host slot ``r`` < H (:data:`~jigsaw_env.encoder.HOST_SLOTS`): the guest
shares the GPUs of the ``r``-th job of :meth:`RoundBuilder.hosts` (the jobs of the decision being
built alone on their GPUs, lowest 2D-LAS priority first; the observation shows each one), its
workers in the order :func:`jigsaw_env.pairing.search_pairing` scores best at the host's
configuration in that decision and the guest's level/pattern ``lp`` (the order Jigsaw's fitting
chooses for that pair of configurations), when the host is at least as wide as the guest. A job
wider than the host slot's job is placed *around* it instead: on the GPUs the ``consolidated``
option picks with that job's GPUs counted free, which must include them all; the slot's job stays
where it is, as the new job's guest (Jigsaw's exclusive pass gives a new wide job the GPUs of a
lower-priority running one, which then pairs with it on the GPUs it holds).

A :class:`RoundBuilder` holds the decision being built for the next round (it starts from the
allocation in force) and computes masks exactly: every unmasked action applies cleanly, every
masked one would be rejected (tests/env/test_env.py checks both directions). Its window slides: once a
slot's job is decided, the slot shows the next job behind the window, so a round can start every
job of an arrival burst, not only the first K. What a pause does with the job is the builder's
``pause`` mode (:data:`PAUSE_MODES`): ``leave`` (the default) decides it for the round, out of the
decision; ``requeue`` sends it to the back of that line, and when it shows again it can be placed
like a waiting job, so a running job can be released from its GPUs, others placed, and it moved
after them (the order some of Jigsaw's rounds need).

A *work-conserving* builder (``work_conserving=True``) also masks advance while the decision being
built runs nothing and some window job could start: a policy then cannot leave the whole cluster
idle while a job fits (no heuristic does), the way an undertrained policy stalls.

The window's order (:data:`WINDOW_ORDERS`, :func:`window_order`) is ``attained`` (waiting jobs by
least attained GPU-seconds), ``las`` (by the round's 2D-LAS rank, the order Tiresias and Jigsaw
start jobs in, starvation promotions included) or ``remaining`` (by least remaining GPU-seconds,
the oracle 2D-SRTF rank of :mod:`jigsaw_env.remaining`, the order ``jigsaw-srtf`` starts jobs in).
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from .encoder import HOST_SLOTS
from .pairing import guest_orders, phase_difference, search_pairing
from .placement import PLACEMENT_OPTIONS, GpuLedger
from .spb import Pattern, SPBConfig
from .spill import spill_left_waiting
from .state import ClusterState, Decision, JobDecision, JobStatus, trusted_decision


class InvalidAction(ValueError):
    """An action that is masked (infeasible) in the current state."""


def level_pattern_combos(spb: SPBConfig) -> list[tuple[int, Pattern]]:
    out = [(0, Pattern.ROTATING)]
    for level in range(1, spb.max_level + 1):
        out += [(level, Pattern.ROTATING), (level, Pattern.STATIC)]
    return out


def host_option(r: int) -> str:
    """The name of the pair-with-host option of host slot ``r``."""
    return f"host:{r}"


@dataclass(frozen=True)
class ActionCodec:
    """The action layout (module docstring) for a window of ``window_k`` slots, the SPB levels of
    ``spb`` and ``host_slots`` pair-with-host options."""

    window_k: int
    spb: SPBConfig
    host_slots: int = HOST_SLOTS

    @cached_property
    def combos(self) -> list[tuple[int, Pattern]]:
        return level_pattern_combos(self.spb)

    @cached_property
    def n_lp(self) -> int:
        return 1 + 2 * self.spb.max_level

    @cached_property
    def options(self) -> tuple[str, ...]:
        """The placement options, in action order: the menu, then ``host:0`` .. ``host:H-1``."""
        return PLACEMENT_OPTIONS + tuple(host_option(r) for r in range(self.host_slots))

    @cached_property
    def n_opt(self) -> int:
        return len(self.options)

    @cached_property
    def n_menu(self) -> int:
        """Options of the menu (:data:`PLACEMENT_OPTIONS`), ahead of the host options."""
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
        return slot * self.per_job + self.options.index(option) * self.n_lp + lp

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
        return ("run", slot, self.options[opt], level, pattern)


#: what a pause does with the job (:class:`RoundBuilder`): ``leave``: it is decided for the round
#: (out of the decision); ``requeue``: it goes to the back of the round's line and may be placed
#: again when the window shows it
PAUSE_MODES = ("leave", "requeue")


def check_pause_mode(mode: str) -> str:
    """``mode`` if it is one of :data:`PAUSE_MODES`; else ValueError listing them."""
    if mode not in PAUSE_MODES:
        raise ValueError(f"pause must be one of {list(PAUSE_MODES)}, got {mode!r}")
    return mode


#: how the window lists the active jobs (:func:`window_order`)
WINDOW_ORDERS = ("attained", "las", "remaining")
#: the window orders that rank the jobs by a priority the caller passes (:class:`RoundBuilder`)
RANKED_WINDOW_ORDERS = ("las", "remaining")


def check_window_order(order: str) -> str:
    """``order`` if it is one of :data:`WINDOW_ORDERS`, else ValueError naming it and them."""
    if order not in WINDOW_ORDERS:
        raise ValueError(f"window_order must be one of {list(WINDOW_ORDERS)}, got {order!r}")
    return order


def window_order(state: ClusterState, k: int, priority: dict[int, int] | None = None) -> list[int]:
    """Every active job in the order the agent sees them this round (the first K are the window).

    Up to K/2 running jobs (the natural preemption candidates, lowest priority first), then the
    waiting jobs from the highest priority down, then the other running jobs. The priority is
    ``priority``, each active job's rank this round (0: the highest), when given: its 2D-LAS rank
    (``ObservationEncoder.las_rank``: Tiresias's and Jigsaw's order, queues and starvation guard
    included) or its 2D-SRTF rank (``jigsaw_env.remaining.remaining_rank``); otherwise the least
    attained service (GPU-seconds, ties by arrival: 2D-LAS without its queues and guard). In
    arrival order a queue whose oldest jobs have run long and been preempted hides the newly
    arrived ones behind them, and only acting on a job brings the next one into view: on the first training window of the PPO study's Philly split,
    Jigsaw played as env actions then left new arrivals waiting for 2,251 h
    (docs/environment.md). By attained service, a job that Jigsaw's 2D-LAS ranks high (a promoted
    one, or a wide job in a high queue) can sit behind the window when K narrower jobs have run
    less, and Jigsaw's decision to start it cannot be played (docs/environment.md, "The window").
    """
    jobs = state.jobs
    running, waiting = [], []
    for x in state.active_ids:  # one pass, in arrival order (state.running() and the waiting jobs)
        if jobs[x].status is JobStatus.RUNNING:
            running.append(x)
        else:
            waiting.append(x)
    if priority is not None:
        rank = priority.__getitem__
        if len(running) > 1:
            running.sort(key=lambda x: (-rank(x), x))
        if len(waiting) > 1:
            waiting.sort(key=rank)
    else:
        if len(running) > 1:
            running.sort(key=lambda x: (-jobs[x].attained_gpu_s, jobs[x].arrival_s, x))
        if len(waiting) > 1:
            waiting.sort(key=lambda x: (jobs[x].attained_gpu_s, jobs[x].arrival_s, x))
    take_run = min(len(running), k // 2)
    return running[:take_run] + waiting + running[take_run:]


def priority_rank(state: ClusterState, priority: dict[int, int] | None = None) -> dict[int, int]:
    """Each active job's rank (0: the highest priority): ``priority`` when given, otherwise by
    least attained GPU-seconds (ties: arrival, id), the order :func:`window_order` falls back on."""
    if priority is not None:
        return priority
    jobs = state.jobs
    ids = sorted(state.active_ids, key=lambda x: (jobs[x].attained_gpu_s, jobs[x].arrival_s, x))
    return {x: i for i, x in enumerate(ids)}


def select_window(state: ClusterState, k: int, priority: dict[int, int] | None = None) -> list[int]:
    """The K jobs the agent sees at the start of a round (the first K of :func:`window_order`)."""
    return window_order(state, k, priority)[:k]


def around_gpus(led: GpuLedger, n: int, host_gpus: tuple[int, ...],
                emptied: tuple[int, ...] = ()) -> tuple[int, ...] | None:
    """The GPUs of an ``n``-GPU job placed around the host on ``host_gpus`` (module docstring),
    before the memory check: the ``consolidated`` option's choice on ``led`` with the host's
    GPUs (and ``emptied``, GPUs the job being placed holds alone, when ``led`` still holds
    it) counted free, or None when it does not hold all of the host's GPUs."""
    gpus = led.consolidated_gpus(n, also_free=host_gpus + emptied)
    if gpus is None or not set(host_gpus).issubset(gpus):
        return None
    return tuple(gpus)


def around_fits(led: GpuLedger, job, gpus: tuple[int, ...], level: int, pattern: Pattern) -> JobDecision | None:
    """``job``'s JobDecision on ``gpus`` (:func:`around_gpus`) at ``(level, pattern)`` if it fits
    in memory beside the host's workers on ``led``, else None. (The GPUs are distinct and
    hold at most the host's one worker, so the worker cap, at least 2 where hosts exist, holds.)"""
    jd = trusted_decision(gpus, level, pattern)
    return jd if led.check(job.job_id, jd, _chosen=True) is None else None


def pair_fits(state: ClusterState, ledger: GpuLedger, job, hid: int, level: int, pattern: Pattern) -> bool:
    """Whether some candidate order of :func:`search_pairing` puts ``job`` (at ``level``,
    ``pattern``) on host ``hid``'s GPUs of ``ledger`` within memory: each GPU's host worker peak
    plus the guest worker's, the ledger's own sum and comparison (the host holds its GPUs alone,
    so the ledger's bytes there are its peaks). ``RoundBuilder._pair_on`` is not None exactly
    then (the search drops exactly the orders that do not fit, whatever the phases), so the
    masks read this, which needs no step means."""
    costs = state.costs
    hjd = ledger.decision[hid]
    hg = hjd.gpus
    ph = costs.peak_list(state.jobs[hid], hjd.level, hjd.pattern, hg)
    cl = ledger.capacity_per_gpu
    for o in guest_orders(len(hg), job.num_gpus):
        gpus = tuple([hg[c] for c in o])
        pg = costs.peak_list(job, level, pattern, gpus)
        for w, c in enumerate(o):
            if ph[c] + pg[w] > cl[hg[c]]:
                break
        else:
            return True
    return False


def pair_rows_of(cache: dict, host, host_decision: JobDecision) -> dict:
    """The masks' cache (``cache``, a builder's) of a host slot's ``host:r`` rows over every combo,
    by the guest's (model, batch size, width): a row depends on those and on the host's model,
    batch size and decision, not on the phase difference. Whether an option is feasible does not
    depend on it: the search returns None exactly when no order fits in memory (phases change
    only the steps it ranks), and its memory test is the ledger's (each GPU's host peak plus the
    guest worker's, the same profile bytes, against its capacity). One dict per host kind and
    decision, so that a mask hashes the host's decision once per host, not once per guest."""
    key = ("pair rows", host.model, host.batch_size, host_decision)
    rows = cache.get(key)
    if rows is None:
        rows = cache[key] = {}
    return rows


class RoundBuilder:
    """The decision under construction for the next round, with exact masks."""

    def __init__(self, state: ClusterState, codec: ActionCodec, ledger: GpuLedger | None = None,
                 cache: dict | None = None, priority: dict[int, int] | None = None,
                 work_conserving: bool = False, order: str = "attained", pause: str = "leave",
                 spill: bool = False):
        """``ledger``: the allocation in force, if the caller has it (the simulator keeps one);
        otherwise it is built from the running jobs. The builder owns and changes it.
        ``cache``: a dict the masks may keep results in (speed only), shared by the builders of
        one episode (the env passes it: what it holds depends only on the episode's jobs and the
        cluster, so it stays valid from round to round); default: a fresh one.
        ``priority``: each active job's 2D-LAS rank this round (0: the highest priority;
        ``ObservationEncoder.las_rank``), which orders the host slots; default: the rank by
        attained GPU-seconds, then arrival (2D-LAS without its queues and starvation guard).
        ``work_conserving``: mask advance while the decision runs nothing and a window job could
        start (:meth:`masks`). ``order``: the window's order, one of :data:`WINDOW_ORDERS`
        (``las`` and ``remaining`` need ``priority``). ``pause``: what a pause does with the job,
        one of :data:`PAUSE_MODES`. ``spill``: :meth:`finish` runs the jobs left waiting where they
        can (free or shared GPUs, :mod:`jigsaw_env.spill`), by the rank the window orders by."""
        self.state = state
        self.spill = bool(spill)
        self.work_conserving = work_conserving
        self.priority = priority
        self._hosts: list[int] | None = None  # hosts(), made when first asked after each change
        self.codec = codec
        ranked = check_window_order(order) in RANKED_WINDOW_ORDERS
        if ranked and priority is None:
            raise ValueError(f"order={order!r} needs priority, the rank of every active job in that order")
        self._ranked = priority if ranked else None  # the window's rank (None: by least attained service)
        order = window_order(state, codec.window_k, self._ranked)
        self.window = order[: codec.window_k]
        self._queue = order[codec.window_k:][::-1]  # the jobs still behind the window, next one last
        self.pause = check_pause_mode(pause)
        # steps before the round advances by itself: a decision per job (requeue: a pause and a run)
        n_jobs = codec.window_k + len(self._queue)
        self.step_cap = (2 * n_jobs if pause == "requeue" else n_jobs + codec.window_k) + 2
        self.ledger = ledger if ledger is not None else GpuLedger(state, state.current_decision(), checked=True)
        self.acted: set[int] = set()
        # the masks' cache (speed only): per-job constants, which keep their finished mask rows
        self._need_cache = cache if cache is not None else {}

    def copy(self) -> "RoundBuilder":
        """An independent builder at the same point of the round, to try actions on (the state,
        codec, priorities and masks' cache shared: what the cache holds outlives the round)."""
        new = RoundBuilder.__new__(RoundBuilder)
        new.__dict__.update(self.__dict__)
        new.ledger = self.ledger.copy()
        new.window = list(self.window)
        new._queue = list(self._queue)
        new.acted = set(self.acted)
        new._hosts = None
        return new

    @property
    def behind_window(self) -> int:
        """How many jobs wait behind the window in this round's line."""
        return len(self._queue)

    # ----- host slots
    def hosts(self) -> list[int]:
        """The host slots' jobs: the jobs of the decision being built alone on their GPUs (each
        holds only the job's worker; none when the worker cap is 1), lowest priority first (the
        hosts Jigsaw's fitting tries first), at most H of them."""
        h = self._hosts
        if h is None:
            ids = [jid for jid, _ in self.ledger.host_decisions()]
            rank = self.priority
            if rank is not None:
                ids.sort(key=lambda x: (-rank.get(x, -1), x))
            else:
                jobs = self.state.jobs
                ids.sort(key=lambda x: (-jobs[x].attained_gpu_s, -jobs[x].arrival_s, -x))
            h = self._hosts = ids[: self.codec.host_slots]
        return h

    def _pair_key(self, job, hid: int, level: int, pattern: Pattern) -> tuple:
        """The masks' cache key of :meth:`_pair_on`'s result for ``job`` on host ``hid`` at
        ``(level, pattern)``. The result depends on the guest's model, batch size and width, the
        host's model, batch size and decision (its GPUs hold only its workers' peaks) and the
        pair's phase difference, which the search reads modulo the SPB cycles' common multiple
        (none on one GPU), not on the job ids."""
        host = self.state.jobs[hid]
        hjd = self.ledger.decision[hid]
        rel = phase_difference(self.state, host, job, len(hjd.gpus))
        return ("pair", job.model, job.batch_size, job.num_gpus, host.model, host.batch_size, hjd, rel, level, pattern)

    def _pair_on(self, led: GpuLedger, job, r: int, level: int, pattern: Pattern) -> JobDecision | None:
        """The ``host:r`` option's JobDecision for ``job`` on ``led`` (the ledger with the job taken
        out), or None: the host slot must hold a job other than ``job``. If that job is at least
        as wide, the guest's GPUs are :func:`search_pairing`'s best order at the host's
        configuration in the decision and the guest's ``(level, pattern)``, and must pass the
        ledger's check; if it is narrower, ``job`` is placed around it (:func:`around_gpus`).

        The result is kept in the masks' cache by what it depends on (:meth:`_pair_key`: a host
        holds its GPUs alone, so their bytes are its workers' peaks, and the guest, on GPUs of its
        own or beside a job that is then no host, frees none of them)."""
        hosts = self.hosts()
        if r >= len(hosts) or hosts[r] == job.job_id:
            return None
        hid = hosts[r]
        hjd = self.ledger.decision[hid]
        if len(hjd.gpus) < job.num_gpus:
            gpus = around_gpus(led, job.num_gpus, hjd.gpus)
            return None if gpus is None else around_fits(led, job, gpus, level, pattern)
        host = self.state.jobs[hid]
        key = self._pair_key(job, hid, level, pattern)
        cache = self._need_cache
        if key in cache:
            return cache[key]
        plan = search_pairing(self.state, host, hjd.gpus, job, [(hjd.level, hjd.pattern)], [(level, pattern)])
        jd = None
        if plan is not None:
            jd = trusted_decision(plan.guest_gpus, level, pattern)
            if led.check(job.job_id, jd, _chosen=True) is not None:
                jd = None
        if len(cache) > 200_000:
            cache.clear()
        cache[key] = jd
        return jd

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
        return self._candidate_on(led, job, option, level, pattern)

    def _candidate_on(self, led: GpuLedger, job, option: str, level: int, pattern: Pattern) -> JobDecision | None:
        """:meth:`candidate` on ``led``, the ledger with the job taken out."""
        if option.startswith("host:"):
            return self._pair_on(led, job, int(option[5:]), level, pattern)
        if option == "keep":
            jid = job.job_id
            if job.status is not JobStatus.RUNNING or jid not in self.ledger.decision:
                return None
            jd = JobDecision(self.ledger.decision[jid].gpus, level, pattern)
            return jd if led.fits(jid, jd) else None
        return led.place(job, option, level, pattern)

    def apply(self, action: int, decoded: tuple | None = None) -> str:
        """Apply one non-advance action; returns "run" or "pause". Raises InvalidAction.
        ``decoded``: ``codec.decode(action)``, if the caller has it already."""
        kind, slot, option, level, pattern = decoded if decoded is not None else self.codec.decode(action)
        if kind == "advance":
            raise InvalidAction("advance is applied by the caller")
        if slot >= len(self.window):
            raise InvalidAction(f"window slot {slot} is empty")
        jid = self.window[slot]
        if jid in self.acted:
            raise InvalidAction(f"job {jid} (slot {slot}) was already decided this round")
        led = self.ledger
        if kind == "pause":
            if jid not in led.decision:
                raise InvalidAction(f"job {jid} (slot {slot}) is not running, so it cannot be paused")
            led.remove(jid)
            self._hosts = None
            if self.pause == "requeue":
                # to the back of the round's line: the window slides as for a decision, and the job
                # comes back (undecided, out of the decision) once the jobs behind it have shown
                self._queue.insert(0, jid)
            else:
                self.acted.add(jid)
            self._slide(slot)
            return "pause"
        job = self.state.jobs[jid]
        if option.startswith("host:"):
            jd = self.candidate(slot, option, level, pattern)  # the host slots as they are, before any change
            if jd is None:
                raise InvalidAction(f"job {jid} (slot {slot}): placement {option!r} at level {level}/{pattern.value} "
                                    f"is infeasible")
            if jid in led.decision:
                led.remove(jid)
        elif jid in led.decision:
            # take the job out of the ledger itself (not a copy, as candidate() does: the same
            # arithmetic), and put the exact bytes and order back if the action is infeasible
            snap = led.snapshot(jid)
            if option == "keep":
                jd = JobDecision(snap[0].gpus, level, pattern)  # candidate()'s keep, with the job's GPUs read first
            led.remove(jid)
            if option == "keep":
                if job.status is not JobStatus.RUNNING or not led.fits(jid, jd):
                    jd = None
            else:
                jd = led.place(job, option, level, pattern)
            if jd is None:
                led.restore(jid, snap)
        else:
            jd = None if option == "keep" else led.place(job, option, level, pattern)
        if jd is None:
            raise InvalidAction(f"job {jid} (slot {slot}): placement {option!r} at level {level}/{pattern.value} is infeasible")
        led.add(jid, jd, checked=True)
        self.acted.add(jid)
        self._hosts = None
        self._slide(slot)
        return "run"

    def finish(self) -> Decision:
        """The round's decision when the agent advances; a spilling builder first runs the jobs it
        leaves waiting where they can (:func:`jigsaw_env.spill.spill_left_waiting`, by :func:`priority_rank`)."""
        if self.spill and spill_left_waiting(self.state, self.ledger, priority_rank(self.state, self._ranked)):
            self._hosts = None
        return self.ledger.decision

    def _slide(self, slot: int) -> None:
        """The window slides: a decided job's slot shows the next job behind the window, so one
        round can decide every active job, however many arrived at once (Philly's arrivals come
        in bursts of dozens), while the other slots keep their jobs."""
        if self._queue:
            self.window[slot] = self._queue.pop()

    # ----- masks
    def masks(self) -> np.ndarray:
        """Boolean mask over all actions: True = feasible. A work-conserving builder masks advance
        while the decision being built holds no job and some other action is feasible (with the
        decision empty there is nothing to pause, so that action runs a job)."""
        mask = self._feasible_masks()
        if self.work_conserving and not self.ledger.decision and mask[:-1].any():
            mask[self.codec.advance] = False
        return mask

    def _feasible_masks(self) -> np.ndarray:
        """Boolean mask over all actions: True = feasible.

        The arithmetic repeats that of :class:`GpuLedger` (remove, ``_packed``'s candidate
        filter, ``check``) operation for operation, so a mask entry is True exactly when the
        action would apply. Each window slot's row of ``per_job`` entries is assembled as bytes
        from per-job constants (cached for the episode) and the few ledger numbers it depends on:

        * a job not in the decision: ``consolidated``/``spread`` fit iff ``n`` GPUs are free and
          a worker fits an empty GPU; ``packed`` fits iff the ``n``-th smallest memory among the
          GPUs under the worker cap (``mem + need <= capacity`` is monotone in mem) leaves room;
        * a running job: the same with its own GPUs as they would be with it taken out, plus
          ``keep`` (its workers on its own GPUs) and ``pause``.

        The ``host:r`` columns: whether some candidate order fits in memory (:func:`pair_fits`,
        kept per pair of job kinds and host decision), for every host slot that holds a job.
        """
        c = self.codec
        st = self.state
        if not st.costs.homogeneous:
            mask = np.zeros(c.n, dtype=bool)
            mask[c.advance] = True
            return masks_by_trying(self, mask)
        rows = self._menu_rows()
        if c.host_slots == 0:
            rows.append(b"\1")
            return np.frombuffer(bytearray(b"".join(rows)), dtype=bool)
        # each slot's menu row, widened by the host options' columns before its pause entry
        hosts = self._host_columns()
        parts = []
        for row, cols in zip(rows, hosts):
            parts += (row[:-1], cols, row[-1:])
        parts.append(b"\1")
        return np.frombuffer(bytearray(b"".join(parts)), dtype=bool)

    def _host_columns(self) -> list[bytes]:
        """The ``host:r`` columns of each window slot (``host_slots x n_lp`` entries per slot)."""
        c = self.codec
        hosts = self.hosts()
        n_lp = c.n_lp
        blank = bytes(c.host_slots * n_lp)
        if not hosts:
            return [blank] * c.window_k
        combos = c.combos
        jobs, dec = self.state.jobs, self.ledger.decision
        widths = [len(dec[hid].gpus) for hid in hosts]
        per_host: list = [None] * len(hosts)  # each host's rows by guest kind (pair_rows_of), when first needed
        none = bytes(n_lp)
        pad = bytes((c.host_slots - len(hosts)) * n_lp)  # the host slots without a job
        around: dict = {}  # (width, host, emptied GPUs) -> the GPUs placed around the host (_around_row)
        out = [blank] * c.window_k
        for slot, jid in enumerate(self.window):
            if jid in self.acted:
                continue
            job = jobs[jid]
            kind = (job.model, job.batch_size, job.num_gpus)
            rows = []
            emptied = ()  # a running job's GPUs that it holds alone: free once it is taken out
            if jid in dec:
                wl = self.ledger.workers_per_gpu
                emptied = tuple([g for g in dec[jid].gpus if wl[g] == 1])
            for r, hid in enumerate(hosts):
                if hid == jid:
                    rows.append(none)
                    continue
                if widths[r] < job.num_gpus:
                    rows.append(self._around_row(job, hid, emptied, around))
                    continue
                by_kind = per_host[r]
                if by_kind is None:
                    by_kind = per_host[r] = pair_rows_of(self._need_cache, jobs[hid], dec[hid])
                row = by_kind.get(kind)
                if row is None:
                    row = by_kind[kind] = bytes([pair_fits(self.state, self.ledger, job, hid, level, pattern)
                                                 for level, pattern in combos])
                rows.append(row)
            rows.append(pad)
            out[slot] = b"".join(rows)
        return out

    def _around_row(self, job, hid: int, emptied: tuple[int, ...], memo: dict) -> bytes:
        """The ``host:r`` mask row (per combo) of ``job`` placed around host ``hid``: the GPUs of
        :func:`around_gpus` on the ledger with the job taken out (its GPUs ``emptied``, those it
        holds alone, counted free too; kept in ``memo`` for the call by width, host and those),
        and whether its workers fit there beside the host's (the ledger's bytes, 0.0 on the
        emptied GPUs: its check's arithmetic)."""
        key = (job.num_gpus, hid, emptied)
        gpus = memo.get(key, 0)
        led = self.ledger
        if gpus == 0:
            gpus = memo[key] = around_gpus(led, job.num_gpus, led.decision[hid].gpus, emptied)
        if gpus is None:
            return bytes(self.codec.n_lp)
        ml = led.bytes_per_gpu
        return keep_row(self.ledger, self.codec, job, gpus, [0.0 if g in emptied else ml[g] for g in gpus])

    def _menu_rows(self) -> list[bytes]:
        """Each window slot's mask row over the menu's actions (menu options x combos, then pause),
        as bytes, on a homogeneous cluster; zeros for an empty slot or a job acted on this round."""
        c = self.codec
        st = self.state
        base = self.ledger
        wl = base.workers_per_gpu
        n_free = base.gpus_by_worker_count[0]
        dec = base.decision
        acted = self.acted
        jobs = st.jobs
        info_of = self._need_cache
        zero = _zero_row(c.n_menu * c.n_lp + 1)
        parts = []
        om = [None]  # the sorted open memory (_open_mem), made when first needed
        hm = None    # the hosts' smallest memories for the paired option (_HostMins), likewise
        for jid in self.window:
            if jid in acted:
                parts.append(zero)
                continue
            job = jobs[jid]
            info = info_of.get(jid)
            if info is None:
                info = self._job_info(job)
            jd = dec.get(jid)
            n = info.n
            if hm is None:
                hm = _HostMins(base)
            if jd is None:
                hmin = hm.min_without(n, jid)
                if n <= n_free:
                    # the n-th smallest open memory is a free GPU's 0.0
                    row = info.fit_rows.get(hmin)
                    if row is None:
                        row = info.fit_rows[hmin] = info.fit_row + info.fit_bytes(hmin) + b"\0"
                    parts.append(row)
                    continue
                open_mem = om[0]
                if open_mem is None:
                    open_mem = om[0] = self._open_mem()
                nth = float(open_mem[n - 1]) if n <= open_mem.size else math.inf
                key = (nth, hmin)
                row = info.packed_rows.get(key)
                if row is None:
                    row = info.packed_rows[key] = (info.blank2 + info.blank + info.fit_bytes(nth)
                                                   + info.fit_bytes(hmin) + b"\0")
                parts.append(row)
                continue
            gpus = jd.gpus
            running = job.status is JobStatus.RUNNING
            for g in gpus:
                if wl[g] != 1:
                    break
            else:
                # the job alone on its GPUs: taken out, they are free (memory 0.0), so every option
                # is limited only by a worker fitting an empty GPU; paired by the other hosts
                key = (gpus, running)
                row = info.alone_rows.get(key)
                if row is None:
                    keep = keep_row(self.ledger, self.codec, job, gpus, [0.0] * len(gpus)) if running else info.blank
                    row = info.alone_rows[key] = keep + info.nlc * 3
                parts.append(row + info.fit_bytes(hm.min_without(n, jid)) + b"\1")
                continue
            parts.append(self._shared_row(job, jd, info, n_free, om, hm, running))
        parts.extend([zero] * (c.window_k - len(self.window)))
        return parts

    def _open_mem(self) -> np.ndarray:
        """Sorted memory of the GPUs under the worker cap."""
        base = self.ledger
        return np.sort(base.mem[base.workers < self.state.max_workers_per_gpu])

    def _shared_row(self, job, jd: JobDecision, info: "_JobInfo", n_free: int, om: list, hm: "_HostMins",
                    running: bool) -> bytes:
        """The mask row of a running job that shares a GPU: its GPUs as they would be with it taken
        out (GpuLedger.remove's arithmetic), in scalar Python (a running job has few workers).
        ``om``: a holder of the sorted open memory, made here if needed and kept for the call;
        ``hm``: the hosts as they are (the job, sharing a GPU, is none of them)."""
        base = self.ledger
        wl, ml = base.workers_per_gpu, base.bytes_per_gpu
        cap_w = self.state.max_workers_per_gpu
        gpus = jd.gpus
        m_new, opened = [], []
        n_emptied = 0
        for g, p in zip(gpus, base.peak_list(job, jd)):
            w = wl[g] - 1
            if w == 0:
                m_new.append(0.0)
                n_emptied += 1
                opened.append(0.0)
            else:
                m = max(ml[g] - p, 0.0)
                m_new.append(m)
                if w < cap_w:
                    opened.append(m)
        excl = info.nlc if n_free + n_emptied >= info.n else info.blank
        nj = info.n
        # the nj + W smallest open memories start with the free GPUs' zeros; taking out the job's
        # own open GPUs' values removes at most one zero each (those holding 0.0): with enough
        # free GPUs the nj-th smallest stays 0.0 and packed fits where a worker fits an empty GPU
        z = 0
        for g in gpus:
            if wl[g] < cap_w and ml[g] == 0.0:
                z += 1
        if n_free >= nj + z:
            packed = info.nlc
        else:
            open_mem = om[0]
            if open_mem is None:
                open_mem = om[0] = self._open_mem()
            # n-th smallest memory among GPUs under the worker cap, with its GPUs changed: only
            # the n + W smallest of the unchanged sorted list can matter
            pref = open_mem[: nj + len(m_new)].tolist()
            for g in gpus:
                if wl[g] < cap_w:
                    try:
                        pref.remove(ml[g])
                    except ValueError:
                        pass  # beyond the prefix: larger than everything kept
            pref += opened
            pref.sort()
            if nj <= len(pref):
                packed = info.fit_bytes(pref[nj - 1])
            else:
                packed = info.blank
        # paired: the hosts stay hosts (the job is on none of their GPUs); a job it shares a GPU
        # with becomes one if, without the job, each of that job's GPUs holds only its worker
        jid = job.job_id
        hmin = hm.min_without(nj, jid)
        if cap_w >= 2:
            seen: set[int] = set()
            after = None  # this job's GPUs -> their memory without it
            for g in gpus:
                if wl[g] != 2:
                    continue
                # g holds one other worker: its job k is a host without this one if each of k's
                # GPUs then holds only k's worker
                k = hm.partner(jid, g)
                if k in seen:
                    continue
                seen.add(k)
                kg = base.decision[k].gpus
                if len(kg) < nj:
                    continue
                if after is None:
                    after = dict(zip(gpus, m_new))
                for x in kg:
                    if wl[x] != (2 if x in after else 1):
                        break
                else:
                    mk = max([after.get(x, ml[x]) for x in kg[len(kg) - nj:]])
                    if mk < hmin:
                        hmin = mk
        paired = info.fit_bytes(hmin)
        if running:
            kk = (gpus, tuple(m_new))
            keep = info.keep.get(kk)
            if keep is None:
                if len(info.keep) > 4096:
                    info.keep.clear()
                keep = info.keep[kk] = keep_row(self.ledger, self.codec, job, gpus, m_new)
        else:
            keep = info.blank
        return keep + excl + excl + packed + paired + b"\1"

    def _job_info(self, job) -> "_JobInfo":
        """The job's per-episode mask constants (cached by job id, shared by model and size)."""
        c = self.codec
        key = ("info", job.model, job.batch_size, job.num_gpus)
        info = self._need_cache.get(key)
        if info is None:
            need = self.state.costs.need_vector(job, c.combos)
            info = self._need_cache[key] = _JobInfo(job.num_gpus, need, float(self.ledger.capacity[0]))
        self._need_cache[job.job_id] = info
        return info


def keep_row(ledger: GpuLedger, codec: ActionCodec, job, gpus: tuple[int, ...], m_new: list[float]) -> bytes:
    """Per level/pattern combo of ``codec``: do the job's workers fit its own GPUs, holding
    ``m_new`` bytes without it (``m + peak <= capacity`` on every GPU, in GPU order)? The callers
    keep the rows, by the job's model, size, GPUs and those bytes (:class:`_JobInfo`): it depends
    on nothing else."""
    cl = ledger.capacity_per_gpu
    caps = [cl[g] for g in gpus]
    add, le = operator.add, operator.le
    return bytes([all(map(le, map(add, m_new, r), caps)) for r in ledger.state.costs.peak_rows(job, codec.combos)])


def masks_by_trying(b: RoundBuilder, mask: np.ndarray) -> np.ndarray:
    """``mask`` (advance set) completed with exact masks found by trying every action of ``b``'s
    window (clusters with several GPU types)."""
    c = b.codec
    for slot, jid in enumerate(b.window):
        if jid in b.acted:
            continue
        off = slot * c.per_job
        mask[off + c.n_opt * c.n_lp] = jid in b.ledger.decision
        for o, option in enumerate(c.options):
            for i, (level, pattern) in enumerate(c.combos):
                mask[off + o * c.n_lp + i] = b.candidate(slot, option, level, pattern) is not None
    return mask


@lru_cache(maxsize=None)
def _zero_row(n: int) -> bytes:
    return bytes(n)


class _JobInfo:
    """A job's constants for the masks (by model, batch size and GPU count): its largest worker
    peak at each level/pattern combo, which combos fit an empty GPU, and finished rows."""

    __slots__ = ("n", "need", "cap0", "nlc", "blank", "blank2", "fit_row", "fit_rows", "packed_rows", "alone_rows",
                 "packed", "keep")

    def __init__(self, n: int, need: np.ndarray, cap0: float):
        self.n = n
        self.need = need.tolist()
        self.cap0 = cap0
        self.nlc = bytes([x <= cap0 for x in self.need])       # a worker fits an empty GPU
        self.blank = bytes(len(self.need))
        self.blank2 = self.blank * 2
        # not in the decision, with n free GPUs: consolidated, spread and packed (0.0 + need) fit alike
        self.fit_row = self.blank + self.nlc * 3
        self.fit_rows: dict[float, bytes] = {}                   # fit_row + paired + pause, by the hosts' memory
        self.packed_rows: dict[tuple, bytes] = {}                # by the n-th smallest open memory and the hosts'
        self.alone_rows: dict[tuple, bytes] = {}                 # running alone (keep to packed), by GPUs and status
        self.packed: dict[float, bytes] = {}                     # fit_bytes, by the memory already on the GPU
        self.keep: dict[tuple, bytes] = {}                       # keep rows, by GPUs and their memory

    def fit_bytes(self, m: float) -> bytes:
        """Per combo: does the largest worker fit a GPU already holding ``m`` bytes (packed's n-th
        smallest open memory, paired's smallest host memory; ``inf`` when there is none)?"""
        row = self.packed.get(m)
        if row is None:
            cap0 = self.cap0
            row = self.packed[m] = bytes([m + x <= cap0 for x in self.need])
        return row


class _HostMins:
    """The ``paired`` option's hosts (``GpuLedger.hosts``) for one masks() call: for a guest of
    ``n`` GPUs, the smallest of the hosts' largest memory on their last ``n`` GPUs (bytes), over
    the hosts with at least ``n`` GPUs; the guest's combos that fit it are the feasible ones."""

    __slots__ = ("ledger", "items", "ml", "by_n", "_ids")

    def __init__(self, ledger: GpuLedger):
        self.ledger = ledger
        self.items = ledger.host_decisions()
        self.ml = ledger.bytes_per_gpu
        self.by_n: dict[int, tuple[float, int, float]] = {}
        self._ids: dict[int, int] | None = None

    def partner(self, jid: int, g: int) -> int:
        """The other job on GPU ``g``, which holds two workers, one of them job ``jid``'s: the sum of
        the job ids on each two-worker GPU (one pass over the decision, when first asked) less
        ``jid``."""
        ids = self._ids
        if ids is None:
            ids = self._ids = {}
            wl = self.ledger.workers_per_gpu
            for k, kd in self.ledger.decision.items():
                for x in kd.gpus:
                    if wl[x] == 2:
                        ids[x] = ids.get(x, 0) + k
        return ids[g] - jid

    def best(self, n: int) -> tuple[float, int, float]:
        """(smallest memory, its host, the next smallest from another host); ``inf`` when none."""
        r = self.by_n.get(n)
        if r is None:
            m1 = m2 = math.inf
            j1 = -1
            ml = self.ml
            if n == 1:  # the common guest: one read per host, its last GPU
                for hid, jd in self.items:
                    m = ml[jd.gpus[-1]]
                    if m < m1:
                        m1, j1, m2 = m, hid, m1
                    elif m < m2:
                        m2 = m
            else:
                for hid, jd in self.items:
                    gpus = jd.gpus
                    if len(gpus) >= n:
                        m = max([ml[g] for g in gpus[len(gpus) - n:]])
                        if m < m1:
                            m1, j1, m2 = m, hid, m1
                        elif m < m2:
                            m2 = m
            r = self.by_n[n] = (m1, j1, m2)
        return r

    def min_without(self, n: int, jid: int) -> float:
        """:meth:`best`'s smallest memory over the hosts other than job ``jid``."""
        m1, j1, m2 = self.best(n)
        return m2 if j1 == jid else m1
