"""Garbage-collector settings for a long simulation loop.

A replay allocates a great many short-lived container objects (tuples, lists, decisions) while it
keeps hundreds of thousands of long-lived ones (jobs, cost tables, the schedulers' memos).
CPython's default first threshold (700 net container allocations) then starts a young collection
every few hundred allocations, and each of them, with the middle ones they trigger, walks objects
that are still alive: 4.3 s of an 86 s Jigsaw replay of the whole Philly trace on 512 GPUs, and
0.93 s of 21 s on its first 20,000 jobs (measured with ``gc.callbacks``; docs/simulator.md
section 8, "Memory and the garbage collector"). With a first threshold of 10,000 the same replays spend 1.5 s and 0.18 s.

:func:`fewer_collections` raises the first threshold while a loop runs and restores the caller's
thresholds after it; collection itself stays on (reference cycles are still freed, only in larger
batches), and the middle and oldest thresholds are left as they are.
"""
from __future__ import annotations

import gc
import threading
from contextlib import contextmanager
from typing import Iterator

#: the first-generation threshold while a loop runs (net container allocations between young
#: collections; CPython's default is 700)
LOOP_THRESHOLD0 = 10_000

_lock = threading.Lock()
_depth = 0
_saved: tuple[int, int, int] | None = None


@contextmanager
def fewer_collections(threshold0: int = LOOP_THRESHOLD0) -> Iterator[None]:
    """Run the body with the collector's first threshold at least ``threshold0``.

    Nested and concurrent uses (threads) share one setting: the first to enter saves the
    thresholds in force and the last to leave restores them. A threshold changed by the body is
    overwritten on exit. A first threshold of 0 (automatic collection off) is left at 0.
    ``threshold0`` must be a positive int."""
    if isinstance(threshold0, bool) or not isinstance(threshold0, int) or threshold0 <= 0:
        raise ValueError(f"threshold0 must be a positive int (net allocations between young collections), "
                         f"got {threshold0!r}")
    global _depth, _saved
    with _lock:
        if _depth == 0:
            _saved = gc.get_threshold()
        _depth += 1
        t0, t1, t2 = gc.get_threshold()
        if 0 < t0 < threshold0:  # (0: automatic collection is off; left off)
            gc.set_threshold(threshold0, t1, t2)
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                gc.set_threshold(*_saved)
                _saved = None
