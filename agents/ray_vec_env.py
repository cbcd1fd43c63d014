"""A stable-baselines3 VecEnv whose environments are Ray actors (``jigsaw train --ray``).

:class:`RayVecEnv` is :class:`~stable_baselines3.common.vec_env.SubprocVecEnv` with each worker
process replaced by a Ray actor: every VecEnv method (``step_async`` / ``step_wait``, ``reset``,
``env_method`` and so ``action_masks`` for sb3-contrib's MaskablePPO, ``get_attr``, ``set_attr``,
``env_is_wrapped``, ``render``) is SubprocVecEnv's own code, and inside each actor the
environment is served by SubprocVecEnv's own worker loop (``subproc_vec_env._worker``). Only the
transport differs: a message to env ``i`` is a call of actor ``i`` (``ray.get`` of its reply instead
of a pipe's ``recv``), so ``step_async`` sends every env its action at once and the envs step in
parallel on whatever nodes they were placed. The same env factories and seeds give the same
observations, rewards, dones, infos and masks as SubprocVecEnv (tests/app/test_ray_scale.py).

One round trip per step: an env with ``action_masks`` sends its masks with every ``step`` and
``reset`` reply (computed right after, as the next ``env_method("action_masks")`` would), and
``env_method("action_masks")`` answers from them when nothing was sent to the env since; any other
message drops them, so the answer is always the env's current masks.

Actors ask for ``num_cpus`` each (default 1) and are spread over the cluster's nodes (Ray's
``SPREAD`` strategy). The caller connects to Ray first
(:func:`jigsaw_executor.cluster_ray.connect`).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import socket
import threading
from collections import deque
from typing import Any, Callable

from stable_baselines3.common.vec_env import SubprocVecEnv
from stable_baselines3.common.vec_env.base_vec_env import CloudpickleWrapper, VecEnv
from stable_baselines3.common.vec_env.subproc_vec_env import _worker

from jigsaw_env.cost_table import CostTable, register_table


#: the messages after which an actor sends the env's action masks with its reply
MASKED = ("step", "reset")


class EnvActor:
    """One environment behind SubprocVecEnv's worker loop, run in a thread of this actor's process
    and spoken to through an in-process pipe, exactly as a SubprocVecEnv worker process is."""

    def __init__(self, env_fn: Callable[[], Any]):
        self.conn, child = mp.Pipe()
        _, unused = mp.Pipe()  # the worker closes its copy of the parent's end; here there is none
        self.error: BaseException | None = None

        def serve() -> None:
            try:
                _worker(child, unused, CloudpickleWrapper(env_fn))
            except BaseException as e:  # noqa: BLE001 - reported to the caller of call()
                self.error = e
            finally:
                child.close()

        self.thread = threading.Thread(target=serve, name="jigsaw-env", daemon=True)
        self.thread.start()
        self.pid = os.getpid()
        #: whether the env has action masks, sent with every step and reset reply
        self.masks = bool(self._call(("has_attr", "action_masks")))

    def _call(self, message: tuple[str, Any]) -> Any:
        self.conn.send(message)
        try:
            return self.conn.recv()
        except EOFError:
            if self.error is not None:
                raise self.error
            raise

    def call(self, message: tuple[str, Any]) -> tuple[Any, Any]:
        """The worker loop's reply, and after a step or a reset the env's action masks (else None)."""
        reply = self._call(message)
        if self.masks and message[0] in MASKED:
            return reply, self._call(("env_method", ("action_masks", (), {})))
        return reply, None

    def close(self) -> None:
        self.conn.send(("close", None))
        self.thread.join(timeout=30)
        self.conn.close()

    def where(self) -> dict:
        import ray
        return {"node": ray.get_runtime_context().get_node_id(), "host": socket.gethostname(), "pid": self.pid}


class _ActorConnection:
    """What SubprocVecEnv's methods expect of a pipe end: ``send`` starts a call of the actor,
    ``recv`` waits for the oldest call's reply."""

    def __init__(self, actor):
        self.actor = actor
        self.pending: deque = deque()
        #: the env's action masks as of its last step or reset; None once anything else was sent
        self.masks = None

    def send(self, message: tuple[str, Any]) -> None:
        self.masks = None
        self.pending.append(self.actor.call.remote(message))

    def recv(self) -> Any:
        import ray
        reply, masks = ray.get(self.pending.popleft())
        if masks is not None and not self.pending:
            self.masks = masks
        return reply

    def close(self) -> None:
        self.pending.clear()


class with_tables:  # noqa: N801 - used like a function
    """An env factory that first registers cost tables (``CostTable.to_dict()`` dicts) in the
    process that builds the env: tables travel with the factory instead of a ``--tables`` folder."""

    def __init__(self, env_fn: Callable[[], Any], tables: list[dict]):
        self.env_fn, self.tables = env_fn, list(tables)

    def __call__(self):
        for d in self.tables:
            register_table(CostTable.from_dict(d, origin="shipped cost table"))
        return self.env_fn()


class RayVecEnv(SubprocVecEnv):
    """SubprocVecEnv over Ray actors (module docstring).

    ``runtime_env``: the actors' Ray runtime environment (default
    :func:`jigsaw_executor.cluster_ray.code_runtime_env`); ``ready_timeout_s``: how long to wait for
    every actor to be placed and to build its env (ValueError, one line, when the cluster does not
    have ``num_envs x num_cpus`` free CPUs by then)."""

    def __init__(self, env_fns: list[Callable[[], Any]], num_cpus: float = 1.0, runtime_env: dict | None = None,
                 ready_timeout_s: float = 300.0):
        import ray

        if runtime_env is None:
            from jigsaw_executor.cluster_ray import code_runtime_env
            runtime_env = code_runtime_env()
        self.waiting = False
        self.closed = False
        remote = ray.remote(EnvActor).options(num_cpus=num_cpus, scheduling_strategy="SPREAD",
                                              runtime_env=runtime_env or None, max_restarts=0)
        self.actors = [remote.remote(fn) for fn in env_fns]
        self.remotes = [_ActorConnection(a) for a in self.actors]
        self.processes: list = []
        where = [a.where.remote() for a in self.actors]
        ready, _ = ray.wait(where, num_returns=len(where), timeout=ready_timeout_s)
        if len(ready) < len(where):
            free = ray.available_resources().get("CPU", 0.0)
            for a in self.actors:
                ray.kill(a)
            raise ValueError(f"only {len(ready)} of {len(where)} env actors started within {ready_timeout_s:g} s: "
                             f"each needs {num_cpus:g} CPU and the Ray cluster has {free:g} free")
        #: where each env runs: Ray node id, host name, process id
        self.placement = ray.get(where)
        self.remotes[0].send(("get_spaces", None))
        observation_space, action_space = self.remotes[0].recv()
        VecEnv.__init__(self, len(env_fns), observation_space, action_space)

    def env_method(self, method_name: str, *method_args, indices=None, **method_kwargs) -> list[Any]:
        """SubprocVecEnv's ``env_method``; ``action_masks()`` from the masks the envs sent with their
        last step or reset when nothing was sent to them since (module docstring)."""
        if method_name == "action_masks" and not method_args and not method_kwargs:
            targets = self._get_target_remotes(indices)
            if all(r.masks is not None for r in targets):
                return [r.masks for r in targets]
        return super().env_method(method_name, *method_args, indices=indices, **method_kwargs)

    def close(self) -> None:
        import ray

        if self.closed:
            return
        if self.waiting:
            for remote in self.remotes:
                remote.recv()
        try:
            ray.get([a.close.remote() for a in self.actors], timeout=60)
        except Exception:  # noqa: BLE001 - an actor already gone: nothing left to close there
            pass
        for a in self.actors:
            ray.kill(a)
        self.closed = True
