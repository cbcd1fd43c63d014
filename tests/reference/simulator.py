"""The simulator's reference step, for tests/sim/test_sim_step_parity.py: a :class:`Simulator` with none
of the incremental shortcuts of :meth:`Simulator.step`.

Every round it validates the whole decision on a copy of the ledger in force (every job
compared), applies the whole decision (every running job visited) and recounts the jobs per SPB
level; it recounts the allocated and shared GPUs from the ledger's per-GPU workers, computes
every component's step tables and every free-pace group's times afresh (no shared cache), fills
the component and job arrays as soon as components form, brings the job objects up to date at
every round's end (quiet rounds of ``run`` too) and finds the next completion with the
vectorised scan over every slot. Same results, slower: the parity tests run both side by side.
"""
from __future__ import annotations

import numpy as np

from jigsaw_env.placement import GpuLedger, InfeasibleDecision
from jigsaw_env.sim_advance import end_round
from jigsaw_env.sim_validation import as_decision
from jigsaw_env.simulator import Simulator
from jigsaw_env.state import Decision, JobDecision, apply_job_bookkeeping


class _Unkept(dict):
    """A cache that keeps nothing: every lookup misses, so every value is computed afresh."""

    def __setitem__(self, key, value) -> None:
        pass


def validate_full(in_force: GpuLedger, decision: Decision) -> GpuLedger:
    """The ledger of ``decision`` built from a copy of ``in_force``: every job of the decision
    compared with the allocation in force (jobs that leave or change removed, then the new and
    changed ones added with checks). Raises InfeasibleDecision."""
    led = in_force.copy()
    for jid, jd in in_force.decision.items():
        if decision.get(jid) != jd:
            led.remove(jid)
    for jid, jd in decision.items():
        if not isinstance(jd, JobDecision):
            raise InfeasibleDecision(f"decision for job {jid} must be a JobDecision, got {type(jd).__name__}")
        if jid not in led.decision:
            led.add(jid, jd)
    return led


class ReferenceSimulator(Simulator):
    """:class:`Simulator` on its reference path (module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.costs.free_running = _Unkept()

    def reset(self):
        state = super().reset()
        self.live.tables = None  # no shared step tables: each component computes its own
        self.live.vector_min_finish = 0  # the vectorised scan for the next completion, whatever the count
        return state

    def _materialize(self) -> None:
        self.live.cset.materialize()
        self.live.rjobs.materialize()

    def _take_decision(self, decision, ledger) -> tuple:
        self._round_token = object()  # never adopts a ledger
        decision = Decision(self._in_force.decision) if decision is None else as_decision(decision)
        return decision, validate_full(self._in_force, decision), None, None

    def _apply_changes(self, decision, removed, added) -> None:
        self.live.rebuild(apply_job_bookkeeping(self.state, decision, self.config.restart_s,
                                            running_ids=list(self._in_force.decision)))
        self._materialize()
        self._levels = [0] * 8
        for jd in decision.values():
            self._levels[min(jd.level, 7)] += 1

    def _complete(self, job_ids, now, ledger, rnd) -> None:
        super()._complete(job_ids, now, ledger, rnd)
        self._materialize()

    def _gpu_counts(self, ledger: GpuLedger) -> tuple[int, int]:
        return int(np.count_nonzero(ledger.workers > 0)), int(np.count_nonzero(ledger.workers > 1))

    def _close_round(self, rnd, t_end: float) -> None:
        end_round(self.live)  # the objects current at every round's end, quiet rounds too
        super()._close_round(rnd, t_end)
