"""The scheduler interface: one small class against the simulator's state and decision type.

A scheduler reads a :class:`~jigsaw_env.state.ClusterState` (read-only) and returns a
:class:`~jigsaw_env.state.Decision`: the jobs that run in the next round, each with its GPUs, SPB
level and pattern. It needs no Gymnasium wrapper, so the same class drives the simulator
(``jigsaw simulate --agent NAME``) and the live executor.
"""
from __future__ import annotations

from typing import Callable

from jigsaw_env.placement import GpuLedger
from jigsaw_env.state import ClusterState, Decision

_REGISTRY: dict[str, Callable[..., "Scheduler"]] = {}


class Scheduler:
    """Base class. Subclasses set ``name`` and implement :meth:`schedule`."""

    name = "base"

    def reset(self) -> None:
        """Forget per-episode memory (called before each episode)."""

    def schedule(self, state: ClusterState) -> Decision:
        raise NotImplementedError

    def __call__(self, state: ClusterState) -> Decision:
        return self.schedule(state)

    def quiet_until(self, state: ClusterState) -> float:
        """Simulated time (s) before which :meth:`schedule` is guaranteed to return the same
        decision as now, as long as no job arrives or finishes (time alone changes nothing the
        scheduler reads). The simulator's :meth:`~jigsaw_env.simulator.Simulator.run` uses it to
        skip calling the scheduler in quiet rounds once it has returned the allocation in force.
        The default, ``state.time_s``, promises nothing: the scheduler is asked every round."""
        return state.time_s

    @staticmethod
    def ledger(state: ClusterState, keep_running: bool = True) -> GpuLedger:
        """A GPU ledger that starts from the allocation in force (or empty), its decision in
        arrival order (``state.current_decision()``'s). Asked by ``Simulator.run`` it is a copy of
        the simulator's own ledger (``state.in_force``), reordered: the same bytes and worker counts
        per GPU as adding every running job again (memory is whole bytes, exact in any order),
        without reading every waiting job or re-adding every running one."""
        if not keep_running:
            return GpuLedger(state)
        led = state.in_force
        if led is None:
            return GpuLedger(state, state.current_decision(), checked=True)
        dec = led.decision
        return led.copy(Decision({jid: dec[jid] for jid in state.running_ids_by_arrival()}))


def register_scheduler(name: str):
    """Class decorator: make a scheduler available by ``name`` (e.g. ``--agent NAME``)."""
    def deco(cls):
        _REGISTRY[name] = cls
        cls.name = name
        return cls
    return deco


def available_schedulers() -> list[str]:
    return sorted(_REGISTRY)


def make_scheduler(name: str, **kwargs) -> Scheduler:
    """Build a registered scheduler; ValueError naming the allowed names on an unknown one."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown agent {name!r}; allowed: {available_schedulers()}")
    return _REGISTRY[name](**kwargs)
