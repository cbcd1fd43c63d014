"""Jigsaw: the SPB-aware scheduler. It fits SPB workers' per-iteration demands together.

The paper's algorithm is not public; this is our design. docs/schedulers.md gives the reason for
every rule. Per round:

1. Order (no duration knowledge): discretized 2D-LAS exactly as ``tiresias`` (same queues, FIFO by
   arrival inside a queue, starvation guard), so a JCT comparison with Tiresias isolates what SPB
   and fitting add. ``jigsaw-srtf`` (:class:`JigsawSRTF`) orders by the oracle 2D-SRTF instead
   (least remaining GPU-seconds first, :mod:`jigsaw_env.remaining`), the rest unchanged.
2. Exclusive set: take jobs top-down until GPUs run out (skipping jobs that do not fit) and place
   them from the highest priority down. Running jobs that stay keep their GPUs unless a move to
   fewer nodes pays for its restart (rule 5); new ones get consolidated GPUs; a job whose only
   placement would span nodes it does not need at a real cost in speed displaces lower-priority
   running jobs or is deferred to fitting (rule 4). Free GPUs left go to lower-priority jobs.
3. Fitting: the jobs left over (top ``max_waiting`` by priority, plus current guests) may each
   join one host job of the exclusive set on a subset of its GPUs. For each candidate host (the
   ``max_hosts`` lowest-priority hosts with at least as many GPUs) search both jobs' SPB
   level/pattern and the guest's worker order, scored by the simulator's pace (the engine's exact
   lockstep step over the hyper-period, or the free pace's one-step estimate of eqs. F1-F3) with
   memory checked at each process's peak (``common.best_pairing``). Accept the
   best host only if the pair's useful work beats the host alone by ``1 + margin``
   (``keep_margin`` for a pair already running, which moves no one). A running guest put on its
   own GPUs in another order keeps its order, the host taking the mirrored one, where that
   changes nothing else (:func:`guest_keeps_its_order`).
4. SPB level of every job left alone on its GPUs: the (level, pattern) that maximises eta x
   dedicated full-backprop time / its actual step there (rule 2), with hysteresis.
5. With ``spill`` (``jigsaw-spill``, ``jigsaw-srtf-spill``): every job still waiting runs if it
   can, on free GPUs, or on the free GPUs plus GPUs of the lowest-priority jobs, shared
   (:mod:`jigsaw_env.spill`).
"""
from __future__ import annotations

import bisect
import operator
from typing import Sequence

from jigsaw_env.placement import GpuLedger, consolidated_from_counts
from jigsaw_env.remaining import ORDER_NAME as SRTF_ORDER
from jigsaw_env.remaining import RemainingOrder
from jigsaw_env.spb import Pattern
from jigsaw_env.spill import spill_waiting
from jigsaw_env.state import ClusterState, Decision, JobDecision, JobState, JobStatus

from .base import Scheduler, host_of_from_pairs, host_pairs, register_scheduler
from .common import (LASQueues, PairPlan, best_pairing, best_solo, current_pairs, default_pairing, guest_orders,
                     job_decision, pair_value_bound, pairing_layout, parse_thresholds, phase_difference,
                     placement_sig, profile_summary, select_by_budget, spb_configs, syncs_share_a_link)


_JOB_ID = operator.attrgetter("job_id")
#: the priorities Jigsaw orders by (rule 1)
ORDERS = ("2d-las", SRTF_ORDER)


class _SoloEntry:
    """Rule 2's configuration (level, pattern) for a job alone on its decision's GPUs, kept for
    the decision and job objects and the running state (``keeps``: it runs on those GPUs now,
    so hysteresis applies) it was found for."""
    __slots__ = ("decision", "job", "keeps", "config")

    def __init__(self, decision, job, keeps: bool, config: tuple):
        self.decision, self.job, self.keeps, self.config = decision, job, keeps, config


class _StayEntry:
    """What staying put means for a running job: its decision in force, whether its spread
    passes rule 4 and whether rule 2 keeps that configuration, for the placement object, job,
    level and pattern it was found for."""
    __slots__ = ("placement", "job", "level", "pattern", "decision", "spread_ok", "keeps_config")

    def __init__(self, placement, job, level: int, pattern, decision, spread_ok: bool, keeps_config: bool):
        self.placement, self.job, self.level, self.pattern = placement, job, level, pattern
        self.decision, self.spread_ok, self.keeps_config = decision, spread_ok, keeps_config


class _HostEntry:
    """A host's useful work alone on its GPUs at its best configuration (``alone``, GPU-
    equivalents), those GPUs, and its pairing bounds by guest width (``bounds``), kept for the
    very JobState and GPU tuple they were made for."""
    __slots__ = ("alone", "gpus", "bounds", "host")

    def __init__(self, alone: float, gpus: tuple, bounds: dict, host):
        self.alone, self.gpus, self.bounds, self.host = alone, gpus, bounds, host


class _KeepEntry:
    """A running pair's plan, kept for the host and guest objects and ``inputs`` (both GPU
    tuples, both configurations, their phase difference) it was found for."""
    __slots__ = ("host", "guest", "inputs", "plan")

    def __init__(self, host, guest, inputs: tuple, plan):
        self.host, self.guest, self.inputs, self.plan = host, guest, inputs, plan


@register_scheduler("jigsaw")
class Jigsaw(Scheduler):
    """SPB-aware scheduling: 2D-LAS order, consolidated exclusive placement, SPB-aware fitting of
    leftover jobs onto running jobs' GPUs, SPB level per job against eta. See the module docstring.

    order: the priority, ``2d-las`` (Tiresias's, no duration knowledge) or ``2d-srtf`` (least
        remaining GPU-seconds first: an oracle, :mod:`jigsaw_env.remaining`).
    thresholds / starve_factor: the LAS queues (as ``tiresias``; ``2d-las`` only).
    margin: a new pair must give ``(1 + margin)`` x the host's useful work alone.
    keep_margin: the same test for a pair already running (lower: keeping it moves nothing).
    max_waiting / max_hosts: bounds of the fitting search per round (guests x hosts).
    hysteresis: relative gain needed to change a running job's SPB configuration.
    spread_tolerance: a job spans more nodes than it needs only if it keeps this share of its speed.
    restart_s / horizon_s: a move must gain more than ``restart_s`` of work within ``horizon_s``
        (the simulator's default restart cost and round length; the state does not carry them).
    spill: apply rule 5 (:func:`jigsaw_env.spill.spill_waiting`) to the decision.
    """

    def __init__(self, thresholds: Sequence[float] | str | float = (3600.0,), starve_factor: float | None = 10.0,
                 margin: float = 0.0, keep_margin: float = -0.02, max_waiting: int = 8, max_hosts: int = 8,
                 hysteresis: float = 0.01, spread_tolerance: float = 0.9, restart_s: float = 30.0,
                 horizon_s: float = 300.0, displace: bool = True, order: str = "2d-las", spill: bool = False):
        if order not in ORDERS:
            raise ValueError(f"jigsaw: order must be one of {list(ORDERS)}, got {order!r}")
        self.order = order
        #: the priority (rule 1): the LAS queues, or the 2D-SRTF order, which keeps no history
        self.priority = (LASQueues(parse_thresholds(thresholds), starve_factor) if order == "2d-las"
                         else RemainingOrder())
        self.margin = float(margin)
        self.keep_margin = float(keep_margin)
        self.max_waiting = int(max_waiting)
        self.max_hosts = int(max_hosts)
        self.hysteresis = float(hysteresis)
        self.spread_tolerance = float(spread_tolerance)
        self.restart_s = float(restart_s)
        self.horizon_s = float(horizon_s)
        self.displace = bool(displace)
        self.spill = bool(spill)
        self._host_of: dict[int, int] = {}
        self._hosts: dict[int, tuple] = {}
        self._memo_costs = None
        self._memo: dict = {}
        # skip pairing searches that a bound shows cannot matter (speed only; valid while the
        # restart discount keeps a pair's work at most its value)
        self.prune = self.restart_s >= 0 and self.horizon_s > 0

    def reset(self) -> None:
        self.priority.reset()
        self._host_of = {}
        self._hosts = {}
        self._memo_costs = None
        self._memo = {}

    def _state(self) -> dict:
        """The priority's bookkeeping (``las``: the LAS queues' history; empty for ``2d-srtf``) and
        which guest runs on which host (``[guest, host]`` pairs). The memo tables (``_memo``,
        ``_hosts``) are caches of pure functions: rebuilt on demand."""
        return {"las": self.priority.state_dict(), "host_of": host_pairs(self._host_of)}

    def _load_state(self, d: dict) -> None:
        self.priority.load_state_dict(d.get("las"))
        self._host_of = host_of_from_pairs(d.get("host_of", []))

    # ----------------------------------------------------------------------------------------
    # memos of pure functions of static inputs (speed only: each returns what the call would)
    def _memos(self, state: ClusterState) -> dict:
        """This scheduler's memo tables, valid for one cost model (its eta knobs, SPB config)."""
        if self._memo_costs is not state.costs:
            self._memo_costs = state.costs
            self._memo = {name: {} for name in ("spread", "bound", "solo", "keep", "stay", "peaks", "hosts")}
        return self._memo

    def _job_memo(self, state: ClusterState, name: str) -> dict:
        """One of :meth:`_memos`' per-job tables (``solo``, ``keep``, ``stay``, ``peaks``,
        ``hosts``: job id -> an entry that names the objects it was made for), emptied when it
        outgrows the jobs in the system (finished jobs' entries are never asked again)."""
        memo = self._memos(state)[name]
        if len(memo) > 4 * max(64, len(state.active_ids)):
            memo.clear()
        return memo

    def _solo_config(self, state: ClusterState, solo: dict, jd: JobDecision, job: JobState) -> tuple[int, Pattern]:
        """Rule 2 for ``job`` alone on ``jd``'s GPUs: ``best_solo``'s (level, pattern), keeping
        ``jd``'s under hysteresis when the job runs on those GPUs now. ``solo`` (the ``solo``
        :meth:`_job_memo`) keeps a :class:`_SoloEntry` per job: the value
        depends on nothing else (the job's model and size, the GPUs, the level and pattern, the
        cost model), so an entry answers only for the very decision and job objects and the
        running state it was made for; a running job that keeps its ``job_decision`` object costs
        a lookup."""
        keeps = job.status is JobStatus.RUNNING and jd.gpus == job.placement
        e = solo.get(job.job_id)
        if e is not None and e.decision is jd and e.job is job and e.keeps is keeps:
            return e.config
        cfg, _ = best_solo(state, job, jd.gpus, (jd.level, jd.pattern) if keeps else None, self.hysteresis)
        solo[job.job_id] = _SoloEntry(jd, job, keeps, cfg)
        return cfg

    def _solo_levels(self, state: ClusterState, ledger: GpuLedger, paired: set[int],
                     settled: set[int] | frozenset = frozenset()) -> None:
        """Rule 2 for every job of ``ledger`` not in ``paired``: its (level, pattern) alone on its
        GPUs (:meth:`_solo_config`, whose memo is looked up inline here: most jobs hit it), set
        in the ledger when it changes and still fits. ``settled``: jobs known to be at that
        configuration already (:meth:`_exclusive`'s), skipped."""
        solo = self._job_memo(state, "solo")
        jobs = state.jobs
        RUNNING = JobStatus.RUNNING
        # (each step changes only its own job's entry: the snapshot's later entries stay current)
        for jid, jd in list(ledger.decision.items()):
            if jid in paired or jid in settled:
                continue
            job = jobs[jid]
            e = solo.get(jid)  # _solo_config's memo, looked up inline (most jobs hit it)
            if (e is not None and e.decision is jd and e.job is job
                    and e.keeps is (job.status is RUNNING and jd.gpus == job.placement)):
                cfg = e.config
            else:
                cfg = self._solo_config(state, solo, jd, job)
            if cfg[0] != jd.level or cfg[1] is not jd.pattern:
                new = job_decision(jd.gpus, cfg[0], cfg[1])
                ledger.remove(jid)
                if ledger.fits(jid, new):
                    ledger.add(jid, new, checked=True)
                else:
                    ledger.add(jid, jd)

    def _bounds_of(self, state: ClusterState, host: JobState, hgpus: tuple[int, ...], width: int) -> dict:
        """The memo of :func:`pairing_bound` for this host's kind and what a ``width``-worker
        guest's pairing reads in its GPUs (``common.pairing_layout``'s id: the bound reads the
        host's placement signature and its guest orders' signatures, which that id covers):
        ``{(guest model, batch size): bound}``."""
        memo = self._memos(state)["bound"]
        key = (host.model, host.batch_size, host.num_gpus, width, pairing_layout(state, hgpus, width)[0],
               None if state.sharing is None else (state.sharing.mode, state.sharing.pace))
        bounds = memo.get(key)
        if bounds is None:
            if len(memo) > 10_000:
                memo.clear()
            bounds = memo[key] = {}
        return bounds

    def quiet_until(self, state: ClusterState) -> float:
        # every rule reads the priority order, statuses, placements and static costs: only the
        # order changes with time alone
        return self.priority.quiet_until(state)

    # ----------------------------------------------------------------------------------------
    def schedule(self, state: ClusterState) -> Decision:
        self.priority.observe(state)
        order = self.priority.order_active(state)
        rank = dict(zip(map(_JOB_ID, order), range(len(order))))  # job id -> position in the order
        pairs = current_pairs(state, self._host_of)           # guest -> host, as running now
        chosen, rest = select_by_budget(order, state.cluster.num_gpus)
        # 2. exclusive set (rules 4 and 5)
        settled: set[int] = set()
        ledger, rest = self._exclusive(state, chosen, rest, pairs, rank, settled)
        # 3. fitting
        self._host_of = {}
        self._hosts = self._job_memo(state, "hosts")
        # every job of the exclusive set holds its GPUs alone (the pass adds a job only on GPUs
        # with no worker), so each may host a guest
        hostable = set(ledger.decision)
        # the guests of running pairs that are left over (every active job is in the ledger or in
        # ``rest``; current_pairs names running jobs): sorted by rank with the others below
        dec = ledger.decision
        guests = [state.jobs[g] for g in pairs if g not in dec]
        if self.max_waiting >= 0:
            waiting = 0
            for j in rest:  # the first max_waiting others
                if waiting >= self.max_waiting:
                    break
                if j.job_id not in pairs:
                    guests.append(j)
                    waiting += 1
        else:  # a negative bound slices from the end
            guests += [j for j in rest if j.job_id not in pairs][: self.max_waiting]
        if len(guests) > 1:
            guests.sort(key=lambda j: rank[j.job_id])
        paired: set[int] = set()
        if state.max_workers_per_gpu >= 2 and hostable:
            # lowest priority first (ranks are distinct: reversed ascending order is descending order)
            hosts_by_priority = list(map(state.jobs.__getitem__, sorted(hostable, key=rank.__getitem__, reverse=True)))
            for guest in guests:
                plan = None
                host_id = pairs.get(guest.job_id)
                if host_id is not None and host_id in hostable:
                    plan = self._keep_pair(state, ledger, state.jobs[host_id], guest)
                if plan is None:
                    host_id, plan = self._find_host(state, ledger, hosts_by_priority, hostable, guest)
                if plan is None:
                    continue
                if self._apply_pair(state, ledger, state.jobs[host_id], guest, plan):
                    hostable.discard(host_id)
                    paired.update((host_id, guest.job_id))
                    self._host_of[guest.job_id] = host_id
                    # (the host stays in hosts_by_priority: _find_host skips hosts no longer hostable)
        # 4. SPB level of every job alone on its GPUs (a settled job is alone on the GPUs and in
        # the configuration the exclusive pass gave it: a pairing attempt that fails puts the
        # host's decision object back, and one that succeeds puts it in ``paired``)
        self._solo_levels(state, ledger, paired, settled)
        if self.spill:  # 5. every job still waiting that can run, on free or shared GPUs
            spill_waiting(state, ledger, order, rank)
        return ledger.decision

    # ----------------------------------------------------------------------------------------
    def _spread_ok(self, state: ClusterState, job: JobState, gpus) -> bool:
        """Rule 4: a job may sit on more nodes than it needs only if it keeps ``spread_tolerance``
        of the useful throughput it has on the fewest nodes (its comm share is small)."""
        memo = self._memos(state)["spread"]
        key = (job.model, job.batch_size, job.num_gpus, tuple(gpus))
        ok = memo.get(key)
        if ok is None:
            if len(memo) > 100_000:
                memo.clear()
            ok = memo[key] = self._spread_ok_uncached(state, job, gpus)
        return ok

    def _spread_ok_uncached(self, state: ClusterState, job: JobState, gpus) -> bool:
        if nodes_spanned(state, gpus) <= fewest_nodes(state, job):
            return True
        _, x = best_solo(state, job, gpus, None, 0.0)
        _, x_ref = best_solo(state, job, tuple(range(job.num_gpus)), None, 0.0)  # fewest nodes
        return x >= self.spread_tolerance * x_ref

    def _exclusive(self, state, chosen, rest, pairs, rank,
                   settled: set[int] | None = None) -> tuple[GpuLedger, list[JobState]]:
        """Place the exclusive set; returns the ledger and the jobs left for fitting (priority order).
        ``settled``: if given, the ids of the running jobs that stay on their GPUs in a
        configuration rule 2 keeps there (:meth:`_solo_levels` has nothing to do for them while
        their decision in the ledger is the one this pass added) are added to it.

        Jobs are placed from the highest priority down, so the best placements go to the jobs that
        matter most under LAS, and the top job always gets the fewest nodes (the cluster is empty
        for it): no job waits forever. A running job keeps its GPUs if no higher-priority job took
        them and they span no more nodes than needed (or its comm share is small); otherwise it
        moves to fewer nodes when that gains more than its restart costs (rule 5). A job needing
        GPUs takes consolidated GPUs among those truly free (not held by lower-priority running
        jobs); if that spans nodes it does not need at a real cost in speed (rule 4), it may
        displace lower-priority running jobs to get a consolidated placement; failing both it is
        deferred to fitting (it may run as a guest on one node). GPUs left free go to
        lower-priority jobs that fit them well (backfilling).
        """
        # the ledger's memo of worker peaks is kept across calls (by job, for the very job and
        # decision objects): a running job that stays finds its peaks without the cost model
        ledger = GpuLedger(state, peak_memo=self._job_memo(state, "peaks"))
        gpus = _ExclusiveGpus(state, ledger, chosen)
        deferred = self._place_chosen(state, gpus, chosen, settled)
        left = self._backfill(state, gpus, rest)
        if deferred:  # both lists are in priority order already: insert the (few) deferred jobs
            key = lambda x: rank[x.job_id]  # noqa: E731
            for j in deferred:
                bisect.insort(left, j, key=key)
        return ledger, left

    def _place_chosen(self, state, gpus: "_ExclusiveGpus", chosen, settled) -> list[JobState]:
        """The exclusive set in priority order: a running job stays (rule 2, or rule 5 when moving
        does not pay for its restart), a job needing GPUs takes consolidated free ones (or, with
        ``displace``, unheld ones; rule 4). Returns the jobs deferred to fitting."""
        wl = gpus.wl
        RUNNING = JobStatus.RUNNING
        deferred: list[JobState] = []
        for j in chosen:
            own = j.status is RUNNING and bool(j.placement)
            cur = None
            if own:
                if not any(map(wl.__getitem__, j.placement)):  # none of its GPUs is in the ledger yet
                    cur, ok, same = self._stay_config(state, j)
                    if ok:
                        # it stays: add() (a GPU still reserved goes from reserved to held, so
                        # the free GPUs do not change; one whose reservation a job sharing it
                        # lifted was counted free)
                        gpus.add(j.job_id, cur)
                        if same and settled is not None:
                            settled.add(j.job_id)
                        continue
                gpus.release(j.placement)  # its own reservation no longer blocks anyone
            ledger = gpus.ledger
            jd = consolidated_decision(ledger, j, consolidated_from_counts(gpus.free_n, gpus.free_on, j.num_gpus))
            if self.displace and (jd is None or not self._spread_ok(state, j, jd.gpus)):
                # displace lower-priority running jobs if that gives a good placement
                alt = consolidated_decision(ledger, j, consolidated_from_counts(gpus.unheld, gpus.unheld_on, j.num_gpus))
                if alt is not None and self._spread_ok(state, j, alt.gpus):
                    jd = alt
            if own and cur is not None:
                # a running job on too many nodes: move only if it pays for the restart (rule 5)
                if jd is None or not self._move_pays(state, j, cur, jd):
                    gpus.add(j.job_id, cur)  # its GPUs are still free (nothing was added since): it fits
                    continue
            if jd is None or not self._spread_ok(state, j, jd.gpus):
                deferred.append(j)
                continue
            gpus.add(j.job_id, jd)
        return deferred

    def _stay_config(self, state, j: JobState) -> tuple:
        """(its current JobDecision, whether its spread passes, whether rule 2 keeps that
        configuration there) for running job ``j``, memoised for the placement object, job,
        level and pattern they were made for (all three are pure functions of those). A running
        job's own configuration on GPUs nobody else holds yet always fits: the simulator
        validated it in force with at least these workers on them (so the ledger's check is
        skipped)."""
        stay_memo = self._job_memo(state, "stay")
        pl = j.placement
        e = stay_memo.get(j.job_id)
        if e is not None and e.placement is pl and e.job is j and e.level == j.level and e.pattern is j.pattern:
            return e.decision, e.spread_ok, e.keeps_config
        cur = job_decision(j.placement, j.level, j.pattern)
        ok = self._spread_ok(state, j, cur.gpus)
        same = False
        if ok:
            cfg = self._solo_config(state, self._job_memo(state, "solo"), cur, j)
            same = cfg[0] == cur.level and cfg[1] is cur.pattern
        stay_memo[j.job_id] = _StayEntry(pl, j, j.level, j.pattern, cur, ok, same)
        return cur, ok, same

    def _move_pays(self, state, j: JobState, cur: JobDecision, jd: JobDecision) -> bool:
        """Rule 5: running job ``j`` moves from ``cur`` to ``jd`` only to fewer nodes and when the
        speed it gains over ``horizon_s`` exceeds what its restart costs."""
        if nodes_spanned(state, jd.gpus) >= nodes_spanned(state, cur.gpus):
            return False
        _, x_old = best_solo(state, j, cur.gpus, None, 0.0)
        _, x_new = best_solo(state, j, jd.gpus, None, 0.0)
        return (x_new - x_old) * self.horizon_s > x_new * self.restart_s

    def _backfill(self, state, gpus: "_ExclusiveGpus", rest) -> list[JobState]:
        """Free GPUs go to lower-priority jobs (in priority order) that fit them well: a running
        job stays on its own when they are still free, another takes consolidated unheld GPUs.
        Returns the jobs left for fitting."""
        wl = gpus.wl
        ledger = gpus.ledger
        RUNNING = JobStatus.RUNNING
        left = []
        nfree = sum(gpus.unheld)
        # a job that cannot take consolidated free GPUs: with the ledger unchanged, neither can
        # another job of the same model, batch size and width (the outcome depends on nothing else)
        no_fit: set[tuple] = set()
        # consolidated free GPUs per width, on the ledger as it is (they depend on nothing else)
        cons: dict[int, list[int] | None] = {}
        pending = iter(rest)
        for j in pending:
            if nfree <= 0:  # no free GPU left: every job needs one or more (the simulator checks)
                left.append(j)
                left.extend(pending)
                break
            if j.num_gpus <= nfree:
                jd = None
                stays = j.status is RUNNING and j.placement and not any(map(wl.__getitem__, j.placement))
                if stays:  # stays where it is: no restart (its own configuration on free GPUs fits)
                    jd = job_decision(j.placement, j.level, j.pattern)
                kind = (j.model, j.batch_size, j.num_gpus)
                if jd is None and kind not in no_fit:
                    n = j.num_gpus
                    found = cons[n] if n in cons else cons.setdefault(
                        n, consolidated_from_counts(gpus.unheld, gpus.unheld_on, n))
                    jd = consolidated_decision(ledger, j, found)
                    if jd is None or not self._spread_ok(state, j, jd.gpus):
                        no_fit.add(kind)
                if jd is not None and self._spread_ok(state, j, jd.gpus):
                    gpus.add(j.job_id, jd)
                    nfree -= j.num_gpus
                    no_fit.clear()
                    cons.clear()
                    continue
            left.append(j)
        return left

    def _host_info(self, state: ClusterState, ledger: GpuLedger, host: JobState) -> _HostEntry:
        """The :class:`_HostEntry` of a host in this round's fitting: its useful work
        alone on its GPUs at its best configuration, those GPUs (its decision's) and its
        :func:`pairing_bound` memos by guest width (filled by :meth:`_find_host` from
        :meth:`_bounds_of`). All three are functions of the host's kind and GPUs, so they are
        kept (``self._hosts``, the ``hosts`` :meth:`_job_memo`) for the very JobState and GPU tuple they were
        made for: a host that keeps its placement from round to round, whose decision object is
        kept with it, asks once. (A pairing re-chooses only a host's configuration.)"""
        gpus = ledger.decision[host.job_id].gpus
        v = self._hosts.get(host.job_id)
        if v is None or v.gpus is not gpus or v.host is not host:
            _, rate = best_solo(state, host, gpus, None, 0.0)
            v = self._hosts[host.job_id] = _HostEntry(host.num_gpus * rate, gpus, {}, host)
        return v

    def _host_alone(self, state: ClusterState, ledger: GpuLedger, host: JobState) -> float:
        """The host's useful work alone on its GPUs at its best configuration (:meth:`_host_info`)."""
        return self._host_info(state, ledger, host).alone

    def _keep_pair(self, state, ledger, host, guest) -> PairPlan | None:
        """A running pair stays where it is if it still beats the host alone by ``keep_margin``;
        only the SPB configurations are re-chosen (that moves no one).

        The plan is kept per guest (the ``keep`` :meth:`_job_memo`) for the host and guest objects, the host's
        GPUs, the guest's, both configurations and their phase difference it was found for: a
        pair in lockstep keeps its phase difference (under the free pace none is read), so a pair
        that stays asks once. The margin
        test against the host alone is made every time."""
        hgpus = ledger.decision[host.job_id].gpus
        if hgpus != host.placement or not set(guest.placement) <= set(hgpus):
            return None
        rel = phase_difference(state, host, guest, len(hgpus))
        inputs = (hgpus, guest.placement, host.level, host.pattern, guest.level, guest.pattern, rel)
        memo = self._job_memo(state, "keep")
        e = memo.get(guest.job_id)
        if e is not None and e.host is host and e.guest is guest and e.inputs == inputs:
            plan = e.plan
        else:
            order = [tuple(hgpus.index(g) for g in guest.placement)]
            plan = best_pairing(state, host, hgpus, guest, orders=order)
            if plan is not None:
                cur = best_pairing(state, host, hgpus, guest, [(host.level, host.pattern)],
                                   [(guest.level, guest.pattern)], order)
                if cur is not None and plan.value <= cur.value * (1.0 + self.hysteresis):
                    plan = cur
            memo[guest.job_id] = _KeepEntry(host, guest, inputs, plan)
        if plan is None:
            return None
        alone = self._host_alone(state, ledger, host)
        return plan if plan.value >= alone * (1.0 + self.keep_margin) else None

    def _find_host(self, state, ledger, hosts_by_priority, hostable, guest) -> tuple[int | None, PairPlan | None]:
        """The host (among the lowest-priority ones that are wide enough) whose pairing adds the
        most useful work, if it clears ``1 + margin``."""
        best_gain, best = -float("inf"), (None, None)
        n = 0
        # a paused guest restarts with any plan, so its work is at most the bound times the
        # restart discount below: the bound can prune with it (on Philly most paused guests'
        # pairings fail the margin only because of that discount; docs/simulator.md section 8)
        discount = 1.0 - self.restart_s / self.horizon_s if self.horizon_s > 0 else 1.0
        paused = guest.status is JobStatus.PAUSED
        running = guest.status is JobStatus.RUNNING
        scale = discount if paused and 0.0 <= discount <= 1.0 else 1.0
        kind = (guest.model, guest.batch_size)
        width = guest.num_gpus
        found = None  # (host, its GPUs, default_pairing's PairingHit) of the best
        hosts_memo, dec = self._hosts, ledger.decision
        for host in hosts_by_priority:
            hid = host.job_id
            if hid not in hostable or host.num_gpus < width:
                continue
            n += 1
            if n > self.max_hosts:
                break
            # _host_info's memo, looked up inline (most hosts hit it)
            v = hosts_memo.get(hid)
            if v is None or v.gpus is not dec[hid].gpus or v.host is not host:
                v = self._host_info(state, ledger, host)
            alone, hgpus, by_width = v.alone, v.gpus, v.bounds
            if self.prune:
                bounds = by_width.get(width)
                if bounds is None:
                    bounds = by_width[width] = self._bounds_of(state, host, hgpus, width)
                ub = bounds.get(kind)
                if ub is None:
                    ub = bounds[kind] = pairing_bound(state, host, hgpus, guest)
                if ub * scale * (1.0 + 1e-9) < max(alone * (1.0 + self.margin) - 1e-9, alone + best_gain + 1e-12):
                    # no pairing can clear the margin or beat the best host so far (the work
                    # below is at most the plan's value, times the discount when the guest is
                    # paused, and the value at most the bound): skip the search
                    continue
            # best_pairing(state, host, hgpus, guest), read as the values it is made of
            hit = default_pairing(state, host, hgpus, guest)
            if hit is None:
                continue
            ggpus = None
            # a guest that resumes or moves restarts, and the lockstep pair waits for it (rule 5):
            # over the horizon the pair works horizon - restart seconds, the host alone horizon
            restarts = paused
            if running:
                ggpus = tuple([hgpus[i] for i in guest_orders(len(hgpus), width)[hit.order_index]])
                restarts = guest.placement != ggpus
            value = hit.value
            work = value * (1.0 - self.restart_s / self.horizon_s) if restarts else value
            if work < alone * (1.0 + self.margin) - 1e-9:
                continue
            gain = work - alone
            if gain > best_gain + 1e-12:
                best_gain, found = gain, (host, hgpus, hit)
        if found is None:
            return best
        host, hgpus, hit = found
        return host.job_id, hit.plan(hgpus, guest_orders(len(hgpus), width))

    @staticmethod
    def _apply_pair(state, ledger: GpuLedger, host: JobState, guest: JobState, plan: PairPlan) -> bool:
        old = ledger.decision[host.job_id]
        hgpus, ggpus = guest_keeps_its_order(state, ledger, host, old.gpus, guest, plan.guest_gpus)
        # job_decision: the same (immutable) objects for a pair kept from round to round
        hjd = job_decision(hgpus, plan.host_cfg[0], plan.host_cfg[1])
        gjd = job_decision(ggpus, plan.guest_cfg[0], plan.guest_cfg[1])
        ledger.remove(host.job_id)
        if ledger.fits(host.job_id, hjd):
            ledger.add(host.job_id, hjd, checked=True)
            if ledger.fits(guest.job_id, gjd):
                ledger.add(guest.job_id, gjd, checked=True)
                return True
            ledger.remove(host.job_id)
        ledger.add(host.job_id, old)
        return False


@register_scheduler("jigsaw-srtf")
class JigsawSRTF(Jigsaw):
    """Jigsaw ordered by the oracle 2D-SRTF (least remaining GPU-seconds first,
    :mod:`jigsaw_env.remaining`) in place of 2D-LAS; every other rule as ``jigsaw``. It reads job
    durations, as ``srtf`` does, so it is a reference for what duration knowledge adds (and the
    teacher of the shipped ``learned`` policy, whose observation carries the same oracle), not a
    scheduler for a cluster that cannot know them. It has no starvation guard: a long job waits
    while shorter work keeps arriving."""

    def __init__(self, **kwargs):
        kwargs.setdefault("order", SRTF_ORDER)
        super().__init__(**kwargs)


@register_scheduler("jigsaw-spill")
class JigsawSpill(Jigsaw):
    """``jigsaw`` with rule 5: after fitting, every job still waiting runs if it can, on free GPUs,
    or on the free GPUs plus GPUs of the lowest-priority jobs, shared (:mod:`jigsaw_env.spill`).
    A reference for what spilling does under 2D-LAS."""

    def __init__(self, **kwargs):
        kwargs.setdefault("spill", True)
        super().__init__(**kwargs)


@register_scheduler("jigsaw-srtf-spill")
class JigsawSRTFSpill(JigsawSRTF):
    """``jigsaw-srtf`` with rule 5 (:mod:`jigsaw_env.spill`): no job waits beside GPUs that
    could hold it. An environment with ``spill=True`` applies the same rule when the agent ends
    a round, so a policy that plays ``jigsaw-srtf``'s decisions there plays this scheduler."""

    def __init__(self, **kwargs):
        kwargs.setdefault("spill", True)
        super().__init__(**kwargs)


def guest_keeps_its_order(state: ClusterState, ledger: GpuLedger, host: JobState, hgpus: tuple[int, ...],
                          guest: JobState, ggpus: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The host's and the guest's GPUs of a pairing, with a running guest kept on its own worker
    order where that changes nothing else: when the plan puts the guest on the very GPUs it runs
    on in another order (``ggpus``, a permutation of ``guest.placement``), and the host starts or
    moves this round anyway (``hgpus`` is not its placement), the same worker pairs go on the
    guest's order: the GPU under guest worker ``k`` becomes ``guest.placement[k]`` and the host
    worker beside it moves with it. Done only when every such move stays on its node and on a GPU
    of the same memory (so the same type, links and bytes): the pair computes and syncs exactly as
    planned, and the guest is spared a migration's restart. Otherwise ``(hgpus, ggpus)``."""
    now = guest.placement
    if ggpus == now or hgpus == host.placement or len(now) != len(ggpus) or set(now) != set(ggpus):
        return hgpus, ggpus
    gpn = state.cluster.gpus_per_node
    capacity = ledger.capacity_per_gpu
    for a, b in zip(ggpus, now):
        if a // gpn != b // gpn or capacity[a] != capacity[b]:
            return hgpus, ggpus
    moved = dict(zip(ggpus, now))
    return tuple([moved.get(g, g) for g in hgpus]), now


def consolidated_decision(ledger: GpuLedger, job: JobState, gpus: list[int] | None) -> JobDecision | None:
    """``job`` at level 0 on ``gpus`` (consolidated GPUs found for it), if it fits the ledger.
    (``placement.consolidated_from_counts`` returns distinct GPUs of the cluster: the
    ledger's check skips those two tests, as for its own placements.)"""
    if gpus is None:
        return None
    jd = job_decision(tuple(gpus), 0, Pattern.ROTATING)
    return jd if ledger.check(job.job_id, jd, _chosen=True) is None else None


def fewest_nodes(state: ClusterState, job: JobState) -> int:
    """The fewest nodes ``job``'s GPUs can span."""
    return -(-job.num_gpus // state.cluster.gpus_per_node)


def nodes_spanned(state: ClusterState, gpus) -> int:
    """How many nodes ``gpus`` span."""
    gpn = state.cluster.gpus_per_node
    return len({g // gpn for g in gpus})


def pairing_bound(state: ClusterState, host: JobState, hgpus: tuple[int, ...], guest: JobState) -> float:
    """An upper bound on ``best_pairing(state, host, hgpus, guest).value`` (-inf when it has no
    candidate order): the bound its own branch and bound ranks candidates by, maximised over
    every (host config, guest config, guest placement group), :func:`common.pair_value_bound`
    (which depends on the sharing mode and the pace), so no candidate's value exceeds it. It
    does not depend on the jobs' phases, so it is memoised by models, batch sizes, the guest's
    width and what the pairing reads in the host's GPUs (``common.pairing_layout``: the host's
    and the guest orders' placement signatures; the profiles depend on nothing else in the GPUs)
    (``Jigsaw._bounds_of``; ``Jigsaw._find_host`` looks them up there, per host and guest width
    once a round)."""
    costs = state.costs
    wa, wb = len(hgpus), guest.num_gpus
    reps = {}  # one guest placement per placement signature (its profile depends on nothing else)
    for o in guest_orders(wa, wb):
        g = tuple(hgpus[c] for c in o)
        reps.setdefault(placement_sig(state, g), g)
    iso_h, iso_g = costs.isolated_iteration_s(host), costs.isolated_iteration_s(guest)
    linked = [(g, syncs_share_a_link(state, hgpus, g)) for g in reps.values()]
    ub = -float("inf")
    for hc in spb_configs(state, host) if reps else ():
        ph = costs.profile(host, hc[0], hc[1], hgpus)
        summary_h = profile_summary(costs, ph)
        for gc in spb_configs(state, guest):
            for g, shared in linked:
                pg = costs.profile(guest, gc[0], gc[1], g)
                ub = max(ub, pair_value_bound(state, hgpus, wb, ph, pg, iso_h, iso_g, summary_h,
                                              profile_summary(costs, pg), shared))
    return ub


class _ExclusiveGpus:
    """The GPUs of Jigsaw's exclusive pass as jobs are placed: the ledger, and per GPU whether a
    chosen running job not yet placed holds it ("reserved"); per node the GPUs with no worker in
    the ledger ("unheld") and, of those, the ones not reserved ("free"). A reservation is read
    only while its GPU has no worker in the ledger, and the pass never removes one, so a GPU that
    gets a worker keeps whatever flag it had. Kept as jobs are added and reservations lifted, so
    that a job needing GPUs finds consolidated ones from per-node counts, not from masks of every
    GPU (``placement.consolidated_from_counts``: the ledger's rule, the one
    ``common.consolidated_gpus`` applies to masks)."""

    def __init__(self, state, ledger: GpuLedger, chosen):
        cl = state.cluster
        gpn = self.gpn = cl.gpus_per_node
        self.ledger = ledger
        self.wl = ledger.worker_counts()  # the ledger's per-GPU worker counts (updated by its adds)
        self.reserved = reserved = [False] * cl.num_gpus
        self.unheld = [gpn] * cl.num_nodes
        self.free_n = free_n = list(self.unheld)
        running = JobStatus.RUNNING
        for j in chosen:
            if j.status is running and j.placement:
                for g in j.placement:
                    if not reserved[g]:  # (a pair's two jobs reserve their shared GPUs once)
                        reserved[g] = True
                        free_n[g // gpn] -= 1

    def add(self, jid: int, jd: JobDecision) -> None:
        """Job ``jid`` on ``jd``: every job of the pass lands on GPUs with no worker (free or
        unheld ones, or a running job's own when none of them is held yet)."""
        gpn, reserved, unheld, free_n = self.gpn, self.reserved, self.unheld, self.free_n
        for g in jd.gpus:
            k = g // gpn
            unheld[k] -= 1
            if not reserved[g]:
                free_n[k] -= 1
        self.ledger.add_alone(jid, jd)

    def release(self, placement) -> None:
        """Lift the reservation of a running job that does not stay on ``placement``."""
        reserved, wl, free_n, gpn = self.reserved, self.wl, self.free_n, self.gpn
        for g in placement:
            if reserved[g]:
                reserved[g] = False
                if wl[g] == 0:
                    free_n[g // gpn] += 1

    def free_on(self, k: int) -> list[int]:
        """Node ``k``'s GPUs with no worker and no reservation."""
        gpn, wl, reserved = self.gpn, self.wl, self.reserved
        return [g for g in range(k * gpn, k * gpn + gpn) if wl[g] == 0 and not reserved[g]]

    def unheld_on(self, k: int) -> list[int]:
        """Node ``k``'s GPUs with no worker."""
        gpn, wl = self.gpn, self.wl
        return [g for g in range(k * gpn, k * gpn + gpn) if wl[g] == 0]
