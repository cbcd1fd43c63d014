"""Plug-in schedulers for tests/app/test_ray_scale.py.

``GatedFifo``: FIFO that waits at a gate: each run, when it starts, leaves ``started-<node>-<pid>``
in the folder ``$JIGSAW_TEST_GATE`` and waits (at most 60 s) until that folder holds ``open``, so
the test can remove a Ray node while a run is on it. ``FailsAtFirstRound``: raises a ValueError
(a user error: a failed run, not retried)."""
from __future__ import annotations

import os
import time
from pathlib import Path

from agents.fifo import FIFO


class GatedFifo(FIFO):
    def reset(self) -> None:
        super().reset()
        gate = os.environ.get("JIGSAW_TEST_GATE")
        if not gate:
            return
        node = "local"
        try:
            import ray
            if ray.is_initialized():
                node = ray.get_runtime_context().get_node_id()
        except ImportError:  # pragma: no cover
            pass
        Path(gate, f"started-{node}-{os.getpid()}").touch()
        deadline = time.time() + 60
        while not Path(gate, "open").exists() and time.time() < deadline:
            time.sleep(0.05)


class FailsAtFirstRound(FIFO):
    def schedule(self, state):
        raise ValueError(f"no decision at t = {state.time_s:g} s (a test scheduler that always fails)")
