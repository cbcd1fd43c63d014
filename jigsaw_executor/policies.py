"""Schedulers for the live executor: a heuristic by name, or a learned policy (an exported ONNX
file, or a training RUN_DIR) through the env's own observation encoder and action codec.

A learned policy drives the live cluster through ``agents.rl.LearnedScheduler``, the very loop the
simulator uses (same window, encoder, exact masks, one action per decision step until
*advance*). :class:`RecordingAgent` sits between it and the policy and keeps every (observation,
mask, action) of a round, for the decision log. The layout check (observation size, action count,
window K, SPB levels and slots) runs when the scheduler is built, before any job starts.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from agents import make_scheduler
from agents.rl import EvalSpaces, LearnedAgent, LearnedScheduler
from agents.shipped import is_shipped_name, shipped_onnx
from jigsaw_env.placement import GpuLedger
from jigsaw_env.spb import SPBConfig
from jigsaw_env.state import Decision, JobStatus

from .onnx_policy import OnnxPolicy

__all__ = ["RecordingAgent", "load_policy", "build_scheduler", "scheduler_spec", "is_policy_path"]


class RecordingAgent:
    """Forwards ``act`` (and ``window_k``, ``config``, ``check_compatible``) to a policy and records
    every call; :meth:`take` returns and clears the record."""

    def __init__(self, agent: Any):
        self.agent = agent
        self.steps: list[tuple[np.ndarray, np.ndarray, int]] = []

    @property
    def window_k(self) -> int:
        return int(self.agent.window_k)

    @property
    def config(self) -> dict:
        return self.agent.config

    def check_compatible(self, *a, **kw):
        return self.agent.check_compatible(*a, **kw)

    def act(self, obs: np.ndarray, mask: np.ndarray) -> int:
        a = int(self.agent.act(obs, mask))
        self.steps.append((np.array(obs, dtype=np.float32, copy=True), np.array(mask, dtype=bool, copy=True), a))
        return a

    def take(self) -> list[tuple[np.ndarray, np.ndarray, int]]:
        s, self.steps = self.steps, []
        return s


def is_policy_path(spec: str) -> bool:
    p = Path(spec)
    return spec.endswith(".onnx") or p.is_file() or (p.is_dir() and (p / "config.json").is_file())


def load_policy(path: str | Path):
    """An :class:`~jigsaw_executor.onnx_policy.OnnxPolicy` (``*.onnx``) or a
    :class:`~agents.rl.LearnedAgent` (RUN_DIR)."""
    p = Path(path)
    if p.is_dir():
        return LearnedAgent(p)
    if not p.exists():
        raise FileNotFoundError(f"policy not found: {p}")

    return OnnxPolicy(p)


def scheduler_spec(policy: str, kwargs: dict | None = None) -> dict:
    """What to build for ``policy``: a shipped policy's name (``learned``: its ONNX,
    :mod:`agents.shipped`), a policy file or RUN_DIR, or a heuristic name."""
    if is_shipped_name(policy):
        onnx = shipped_onnx(policy)
        if onnx is None:
            raise FileNotFoundError(f"the shipped policy {policy!r} is not installed (expected "
                                    f"agents/policies/{policy}/policy.onnx)")
        return {"kind": "policy", "path": str(onnx), "shipped": policy}
    if is_policy_path(policy):
        return {"kind": "policy", "path": str(Path(policy).resolve())}
    if Path(policy).is_dir():
        raise ValueError(f"policy {policy} is a folder but not a training run: expected config.json, "
                         f"model.zip and vecnormalize.npz written by `jigsaw train`")
    return {"kind": "heuristic", "name": policy, "kwargs": dict(kwargs or {})}


def build_scheduler(spec: dict, spb: SPBConfig):
    """(scheduler, recorder or None) from a :func:`scheduler_spec`. A policy's layout is checked
    against ``spb`` here: a mismatch raises ValueError (one line) before anything runs."""
    if spec["kind"] == "heuristic":
        kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in spec.get("kwargs", {}).items()}
        return make_scheduler(spec["name"], **kw), None

    pol = load_policy(spec["path"])
    pol.check_compatible(EvalSpaces(None, spb.max_level, spb.num_slots))
    rec = RecordingAgent(pol)
    sched = LearnedScheduler(agent=rec)
    sched.name = "policy"
    spec.setdefault("window_k", rec.window_k)
    spec.setdefault("observe_remaining", bool(rec.config["env"].get("observe_remaining", True)))
    return sched, rec


def start_where_they_fit(ledger, jobs) -> list[int]:
    """Add each of ``jobs`` in order to ``ledger`` at level 0 on consolidated GPUs where it fits;
    returns the ids started (the demo scenario's and the idle guard's fallback placement)."""
    started = []
    for j in jobs:
        if ledger.place_and_add(j, "consolidated", 0) is not None:
            started.append(j.job_id)
    return started


def idle_guard(state, decision, wait_s: float | None):
    """Work-conserving fallback for live runs: when ``decision`` runs nothing although a waiting
    job has waited at least ``wait_s`` seconds, start waiting jobs in arrival order (level 0,
    consolidated) where they fit. A policy that keeps the cluster idle (an undertrained one can
    choose "advance" forever) would otherwise stall the run. A pure function of the state, so the
    decision-log replay re-applies it. Returns (decision, forced records)."""
    if wait_s is None or len(decision) > 0:
        return decision, []
    waiting = [j for j in state.active() if j.status is not JobStatus.RUNNING]
    if not any(state.time_s - j.arrival_s >= wait_s for j in waiting):
        return decision, []
    led = GpuLedger(state)
    started = start_where_they_fit(led, waiting)
    if not started:
        return decision, []
    return Decision(led.decision), [{"kind": "idle_guard", "started": started}]
