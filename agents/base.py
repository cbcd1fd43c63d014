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

#: the layout of :meth:`Scheduler.state_dict` (a field ``"version"`` of every state)
STATE_VERSION = 1


class Scheduler:
    """Base class. Subclasses set ``name`` and implement :meth:`schedule`."""

    name = "base"

    def reset(self) -> None:
        """Forget per-episode memory (called before each episode)."""

    def schedule(self, state: ClusterState) -> Decision:
        raise NotImplementedError

    # ------------------------------------------------------------------ plain-data state
    def state_dict(self) -> dict:
        """What the scheduler carries from one round to the next, as plain data (JSON-serialisable):
        ``{"version", "scheduler", ...}``. Arguments are not in it (the caller rebuilds the scheduler
        from its name and arguments, then calls :meth:`load_state_dict`), and neither are caches
        that the scheduler rebuilds from the cluster state. Subclasses with memory extend
        :meth:`_state` and :meth:`_load_state`."""
        return {"version": STATE_VERSION, "scheduler": self.name, **self._state()}

    def load_state_dict(self, d: dict) -> None:
        """Take a state written by :meth:`state_dict` of a scheduler of the same name; ValueError
        (one line naming the field and what was expected) otherwise."""
        check_state_dict(d, self.name)
        self.reset()
        self._load_state(d)

    def _state(self) -> dict:
        return {}  # stateless between rounds

    def _load_state(self, d: dict) -> None:
        pass

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


def check_state_dict(d, name: str) -> None:
    """ValueError (one line) unless ``d`` is a scheduler state of this layout for scheduler ``name``."""
    if not isinstance(d, dict):
        raise ValueError(f"scheduler state: expected a JSON object, got {type(d).__name__}")
    if d.get("version") != STATE_VERSION:
        raise ValueError(f"scheduler state: field 'version': expected {STATE_VERSION}, got {d.get('version')!r}")
    if d.get("scheduler") != name:
        raise ValueError(f"scheduler state: field 'scheduler': expected {name!r}, got {d.get('scheduler')!r}")


def host_pairs(host_of: dict[int, int]) -> list[list[int]]:
    """A guest -> host map as ``[guest, host]`` pairs (JSON keys would be strings)."""
    return [[int(g), int(h)] for g, h in host_of.items()]


def host_of_from_pairs(rows) -> dict[int, int]:
    """:func:`host_pairs`'s inverse; ValueError (one line) on anything else."""
    ok = isinstance(rows, list) and all(isinstance(r, list) and len(r) == 2 and all(
        isinstance(x, int) and not isinstance(x, bool) for x in r) for r in rows)
    if not ok:
        raise ValueError("scheduler state: field 'host_of': expected a list of [guest job id, host job id] pairs")
    return {g: h for g, h in rows}


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
