"""The scheduler interface: one small class against the simulator's state and decision type.

A scheduler reads a :class:`~jigsaw_env.state.ClusterState` (read-only) and returns a
:class:`~jigsaw_env.state.Decision`: the jobs that run in the next round, each with its GPUs, SPB
level and pattern. It needs no Gymnasium wrapper, so the same class drives the simulator
(``jigsaw simulate --agent NAME``) and the live executor.
"""
from __future__ import annotations

import importlib
from importlib.metadata import entry_points
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


#: the entry-point group through which an installed package adds schedulers by name, e.g. in its
#: pyproject.toml: ``[project.entry-points."jigsaw.schedulers"] mine = "mypkg.mod:MyScheduler"``
ENTRY_POINT_GROUP = "jigsaw.schedulers"


def _entry_points() -> dict:
    """Installed schedulers of :data:`ENTRY_POINT_GROUP`, by name (read on every call: cheap, and
    a package installed during a session is seen)."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def is_import_path(name: str) -> bool:
    """``name`` has the ``module.path:ClassName`` form of a plug-in scheduler."""
    mod, sep, attr = name.partition(":")
    return bool(sep and mod and attr) and all(part.isidentifier() for part in mod.split(".") + attr.split("."))


def _load_plugin(name: str, target: str) -> type:
    """The scheduler class ``target`` (``module.path:ClassName``) names; ValueError naming
    ``name`` and what went wrong when it cannot be imported or is not a Scheduler subclass."""
    mod_name, _, attr = target.partition(":")
    try:
        obj = importlib.import_module(mod_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"agent {name!r}: cannot load {target!r} ({type(e).__name__}: {e})") from None
    if not (isinstance(obj, type) and issubclass(obj, Scheduler)):
        raise ValueError(f"agent {name!r}: {target!r} is not a subclass of agents.base.Scheduler")
    return obj


def scheduler_class(name: str) -> type:
    """The class behind a scheduler name: a registered name, an installed entry point of
    :data:`ENTRY_POINT_GROUP`, or a ``module.path:ClassName`` import path. ValueError (one line)
    naming the allowed names otherwise."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if is_import_path(name):
        return _load_plugin(name, name)
    ep = _entry_points().get(name)
    if ep is not None:
        return _load_plugin(name, ep.value)
    raise ValueError(f"unknown agent {name!r}; allowed: {available_schedulers()} or a plug-in "
                     f"module.path:ClassName")


def is_scheduler(name: str) -> bool:
    """``name`` resolves to a scheduler class (see :func:`scheduler_class`)."""
    try:
        scheduler_class(name)
    except ValueError:
        return False
    return True


def available_schedulers() -> list[str]:
    """Registered scheduler names and installed entry points, sorted."""
    return sorted(set(_REGISTRY) | set(_entry_points()))


def make_scheduler(name: str, **kwargs) -> Scheduler:
    """Build a scheduler by name (:func:`scheduler_class`); ValueError naming the allowed names on
    an unknown one."""
    cls = scheduler_class(name)
    sched = cls(**kwargs)
    if name not in _REGISTRY and getattr(sched, "name", "base") == "base":
        sched.name = name  # a plug-in that sets no name is known by the name it was asked by
    return sched
