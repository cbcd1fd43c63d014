"""``<base>+spb``: a base heuristic's decision with each job's SPB level/pattern chosen by Jigsaw's
level rule (rule 2), placements untouched. Comparing ``tiresias+spb`` with ``tiresias`` shows what
SPB alone gives; comparing ``jigsaw`` with ``tiresias+spb`` shows what Jigsaw's fitting adds."""
from __future__ import annotations

from jigsaw_env.placement import GpuLedger
from jigsaw_env.state import ClusterState, Decision, JobDecision, JobStatus

from .base import Scheduler, make_scheduler, register_scheduler
from .common import best_pairing, best_solo


class SPBLevels(Scheduler):
    """Wrap ``base``: keep its decision's jobs and GPUs, set SPB levels/patterns.

    A job alone on its GPUs gets :func:`~agents.common.best_solo` on its placement. A pair sharing
    GPUs (one job's GPUs a subset of the other's, as Gandiva packs) gets the best joint
    configuration for its fixed worker placement (:func:`~agents.common.best_pairing` with the one
    order it has). Larger groups keep the base's levels. A running job keeps its configuration
    unless the new one is better by more than ``hysteresis``.
    """

    def __init__(self, base: Scheduler | str, hysteresis: float = 0.01, **base_kwargs):
        self.base = make_scheduler(base, **base_kwargs) if isinstance(base, str) else base
        self.hysteresis = float(hysteresis)
        self.last_base_decision: Decision | None = None

    def reset(self) -> None:
        self.base.reset()
        self.last_base_decision = None

    def _state(self) -> dict:
        # last_base_decision is this round's output, not memory: only the base's state is kept
        return {"base": self.base.state_dict()}

    def _load_state(self, d: dict) -> None:
        self.base.load_state_dict(d.get("base"))

    def quiet_until(self, state: ClusterState) -> float:
        # the level rule reads placements, statuses and static costs only
        return self.base.quiet_until(state)

    def schedule(self, state: ClusterState) -> Decision:
        base = self.base.schedule(state)
        self.last_base_decision = Decision(base)
        owners: dict[int, list[int]] = {}
        for jid, jd in base.items():
            for g in jd.gpus:
                owners.setdefault(g, []).append(jid)
        share: dict[int, set[int]] = {jid: set() for jid in base}
        for jids in owners.values():
            for a in jids:
                share[a].update(x for x in jids if x != a)
        out: dict[int, JobDecision] = {}
        done: set[int] = set()
        for jid, jd in base.items():
            if jid in done:
                continue
            job = state.jobs[jid]
            partners = share[jid]
            if not partners:
                running_here = job.status is JobStatus.RUNNING and job.placement == jd.gpus
                cur = (job.level, job.pattern) if running_here else None
                cfg, _ = best_solo(state, job, jd.gpus, cur, self.hysteresis)
                out[jid] = JobDecision(jd.gpus, cfg[0], cfg[1])
                done.add(jid)
                continue
            other = next(iter(partners))
            if len(partners) == 1 and share[other] == {jid}:
                a, b = jid, other
                ga, gb = base[a].gpus, base[b].gpus
                if not set(gb) <= set(ga):
                    a, b, ga, gb = b, a, gb, ga
                if set(gb) <= set(ga):
                    host, guest = state.jobs[a], state.jobs[b]
                    order = [tuple(ga.index(g) for g in gb)]
                    plan = best_pairing(state, host, ga, guest, orders=order)
                    if plan is not None:
                        unchanged = all(state.jobs[x].status is JobStatus.RUNNING and state.jobs[x].placement == base[x].gpus
                                        for x in (a, b))
                        if unchanged:
                            cur = best_pairing(state, host, ga, guest, [(host.level, host.pattern)],
                                               [(guest.level, guest.pattern)], order)
                            if cur is not None and plan.value <= cur.value * (1.0 + self.hysteresis):
                                plan = cur
                        out[a] = JobDecision(ga, plan.host_cfg[0], plan.host_cfg[1])
                        out[b] = JobDecision(gb, plan.guest_cfg[0], plan.guest_cfg[1])
                        done.update((a, b))
                        continue
            # larger co-location groups: keep the base's configuration
            out[jid] = jd
            done.add(jid)
        # memory: every configuration here is feasible by construction; fall back job by job if not
        ledger = GpuLedger(state)
        for jid, jd in out.items():
            if not ledger.fits(jid, jd):
                jd = base[jid]
            ledger.add(jid, jd)
        return ledger.decision


def _variant(name: str, base: str):
    @register_scheduler(name)
    class _Wrapped(SPBLevels):
        __doc__ = f"``{base}`` with SPB levels by Jigsaw's level rule (placements are {base}'s)."

        def __init__(self, hysteresis: float = 0.01, **base_kwargs):
            super().__init__(base, hysteresis, **base_kwargs)

    _Wrapped.__name__ = _Wrapped.__qualname__ = name.replace("+", "_").title().replace("_", "")
    return _Wrapped


FifoSPB = _variant("fifo+spb", "fifo")
SRTFSPB = _variant("srtf+spb", "srtf")
TiresiasSPB = _variant("tiresias+spb", "tiresias")
GandivaSPB = _variant("gandiva+spb", "gandiva")
