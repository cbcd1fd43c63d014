"""Gandiva-style packing and time-slicing, without SPB (Xiao et al., OSDI 2018)."""
from __future__ import annotations

from jigsaw_env.gavel_data import gavel_throughputs
from jigsaw_env.placement import GpuLedger
from jigsaw_env.spb import Pattern
from jigsaw_env.state import ClusterState, Decision, JobDecision, JobState

from .base import Scheduler, host_of_from_pairs, host_pairs, register_scheduler
from .common import LEVEL0, best_pairing, current_pairs, solo_rate


@register_scheduler("gandiva")
class Gandiva(Scheduler):
    """Start jobs in arrival order on exclusive consolidated GPUs (backfilling past a job that does
    not fit); when waiting jobs remain and exclusive GPUs do not, pack a waiting job onto a running
    job's GPUs (two workers per GPU at most, memory permitting) if the predicted co-location keeps
    the pair's combined normalised throughput at least ``min_gain`` x what the host does alone;
    unpack (migrate the guest to exclusive GPUs) as soon as exclusive GPUs free up; evict a guest
    whose pair no longer meets the test (Gandiva's introspection). Running jobs are never preempted
    otherwise. Full backprop always.

    Co-location is predicted with the simulator's own cost and sharing model and pace (the
    lockstep step of ``jigsaw_env.engine`` or the free pace's one-step estimate of eqs. F1-F3,
    under the fitted interference model or time-slicing, whichever the simulator runs;
    docs/colocation.md), which is what Gandiva's introspection would measure in this simulated
    cluster; ``colocation="gavel"`` uses Gavel's measured pair throughputs instead where both jobs
    are single-GPU and have Gavel job types (docs/schedulers.md says why that is not the default).
    """

    def __init__(self, min_gain: float = 1.0, max_waiting: int = 16, max_hosts: int = 16,
                 colocation: str = "model"):
        if colocation not in ("model", "gavel"):
            raise ValueError(f"colocation must be 'model' or 'gavel', got {colocation!r}")
        self.min_gain = float(min_gain)
        self.max_waiting = int(max_waiting)
        self.max_hosts = int(max_hosts)
        self.colocation = colocation
        self.reset()

    def reset(self) -> None:
        self._host_of: dict[int, int] = {}

    def _state(self) -> dict:
        return {"host_of": host_pairs(self._host_of)}  # which guest runs on which host

    def _load_state(self, d: dict) -> None:
        self._host_of = host_of_from_pairs(d.get("host_of", []))

    # ----------------------------------------------------------------------------------------
    def _pair_ratio(self, state: ClusterState, host: JobState, host_gpus, guest: JobState, orders=None):
        """(PairPlan at level 0, combined value / host alone value) or (None, 0)."""
        plan = best_pairing(state, host, host_gpus, guest, [LEVEL0], [LEVEL0], orders)
        if plan is None:
            return None, 0.0
        alone = host.num_gpus * solo_rate(state, host, LEVEL0, host_gpus)
        value = plan.value
        if self.colocation == "gavel":
            g = _gavel_pair(state, host, guest)
            if g is not None:
                value = g[0] + g[1]
                alone = 1.0
        return plan, value / alone

    def schedule(self, state: ClusterState) -> Decision:
        ledger = GpuLedger(state, state.current_decision())
        pairs = current_pairs(state, self._host_of)
        self._host_of = dict(pairs)
        # introspection: a pair that no longer pays is split (the guest goes back to the queue)
        for guest_id, host_id in list(pairs.items()):
            host, guest = state.jobs[host_id], state.jobs[guest_id]
            orders = [tuple(host.placement.index(g) for g in guest.placement)]
            _, ratio = self._pair_ratio(state, host, host.placement, guest, orders)
            if ratio < self.min_gain - 1e-9:
                ledger.remove(guest_id)
                del self._host_of[guest_id]
        waiting = [j for j in state.active() if j.job_id not in ledger.decision]
        # 1. FIFO on exclusive GPUs, backfilling
        left = []
        nfree = int((ledger.workers == 0).sum())
        for j in waiting:
            if j.num_gpus <= nfree and ledger.place_and_add(j, "consolidated", 0) is not None:
                nfree -= j.num_gpus
            else:
                left.append(j)
        # 2. unpack: a guest moves to exclusive GPUs when they are free
        for guest_id, host_id in list(self._host_of.items()):
            if guest_id not in ledger.decision:
                continue
            trial = ledger.copy()
            trial.remove(guest_id)
            jd = trial.place(state.jobs[guest_id], "consolidated", 0)
            if jd is not None:
                trial.add(guest_id, jd, checked=True)
                ledger = trial
                del self._host_of[guest_id]
        # 3. pack waiting jobs onto single running jobs when exclusive GPUs ran out
        if left and state.max_workers_per_gpu >= 2:
            hosts = [state.jobs[jid] for jid in ledger.decision
                     if all(ledger.workers[g] == 1 for g in ledger.decision[jid].gpus)]
            hosts.sort(key=lambda j: (j.arrival_s, j.job_id))
            for guest in left[: self.max_waiting]:
                best = None
                for host in [h for h in hosts if h.num_gpus >= guest.num_gpus][: self.max_hosts]:
                    gpus = ledger.decision[host.job_id].gpus
                    plan, ratio = self._pair_ratio(state, host, gpus, guest)
                    if plan is None or ratio < self.min_gain - 1e-9:
                        continue
                    score = (ratio, -abs(host.num_gpus - guest.num_gpus))
                    if best is None or score > best[0]:
                        best = (score, host, plan)
                if best is None:
                    continue
                _, host, plan = best
                jd = JobDecision(plan.guest_gpus, 0, Pattern.ROTATING)
                if ledger.fits(guest.job_id, jd):
                    ledger.add(guest.job_id, jd, checked=True)
                    self._host_of[guest.job_id] = host.job_id
                    hosts.remove(host)
        return ledger.decision


# ------------------------------------------------------------------------------------------------
# Gavel's measured co-location throughputs (optional prior)
# ------------------------------------------------------------------------------------------------
_GAVEL: dict | None = None


def use_gavel_throughputs(throughputs: dict) -> None:
    """Pair by ``throughputs`` (the form :func:`gavel_throughputs` returns) in this process
    instead of reading ``$JIGSAW_DATA`` (a Ray worker is sent the measurements this way)."""
    global _GAVEL
    _GAVEL = throughputs


def _gavel_pair(state: ClusterState, a: JobState, b: JobState) -> tuple[float, float] | None:
    """Normalised throughputs (a, b) of two single-GPU jobs co-located, from Gavel's measurements
    (``$JIGSAW_DATA/gavel/simulation_throughputs.json``), or None when not measured."""
    global _GAVEL
    if a.num_gpus != 1 or b.num_gpus != 1:
        return None
    gpu = state.cluster.gpu_type(0)
    ta = state.costs.table(a.model, a.batch_size, gpu)
    tb = state.costs.table(b.model, b.batch_size, gpu)
    ja, jb = ta.meta.get("gavel_job"), tb.meta.get("gavel_job")
    if not ja or not jb:
        return None
    if _GAVEL is None:
        try:
            _GAVEL = gavel_throughputs()
        except (FileNotFoundError, ValueError):
            _GAVEL = {}
    table = _GAVEL.get(gpu, {})
    ka, kb = str((f"{ja} (batch size {a.batch_size})", 1)), str((f"{jb} (batch size {b.batch_size})", 1))
    ea = table.get(ka)
    if not ea or not ea.get("null") or kb not in table or not table[kb].get("null"):
        return None
    pair = ea.get(kb)
    if not pair or not pair[0] or not pair[1]:  # [0, 0]: not measured or infeasible
        return None
    return float(pair[0]) / float(ea["null"]), float(pair[1]) / float(table[kb]["null"])
