"""jigsaw_env.gc_tuning: the collector's first threshold is raised while a loop runs, and the
caller's thresholds come back afterwards (nested, concurrent, on an exception)."""
from __future__ import annotations

import gc
import threading

import pytest

from jigsaw_env.gc_tuning import LOOP_THRESHOLD0, fewer_collections


@pytest.fixture
def thresholds():
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*saved)


def test_raises_only_the_first_threshold_and_restores_all_three(thresholds):
    gc.set_threshold(500, 7, 3)
    with fewer_collections():
        assert gc.get_threshold() == (LOOP_THRESHOLD0, 7, 3)
    assert gc.get_threshold() == (500, 7, 3)
    gc.set_threshold(50_000, 7, 3)  # already higher: kept
    with fewer_collections(20_000):
        assert gc.get_threshold() == (50_000, 7, 3)
    assert gc.get_threshold() == (50_000, 7, 3)


def test_a_first_threshold_of_zero_stays_zero(thresholds):
    gc.set_threshold(0, 10, 10)  # automatic collection off
    with fewer_collections():
        assert gc.get_threshold()[0] == 0
    assert gc.get_threshold() == (0, 10, 10)


def test_nested_uses_and_exceptions_restore_the_outer_thresholds(thresholds):
    with pytest.raises(RuntimeError):
        with fewer_collections(2_000):
            with fewer_collections(5_000):
                assert gc.get_threshold()[0] == 5_000
            assert gc.get_threshold()[0] == 5_000  # the inner exit is not the last one
            raise RuntimeError("stop")
    assert gc.get_threshold() == (700, 10, 10)


def test_overlapping_threads_restore_once_the_last_leaves(thresholds):
    inside, leave = threading.Event(), threading.Event()

    def other():
        with fewer_collections():
            inside.set()
            leave.wait(10)

    t = threading.Thread(target=other)
    with fewer_collections():
        t.start()
        assert inside.wait(10)
    assert gc.get_threshold()[0] == LOOP_THRESHOLD0  # the thread is still inside
    leave.set()
    t.join(10)
    assert gc.get_threshold() == (700, 10, 10)


@pytest.mark.parametrize("bad", [0, -5, 1.5, "100", True, None])
def test_bad_threshold_is_refused_by_name(bad, thresholds):
    with pytest.raises(ValueError, match="threshold0 must be a positive int"):
        with fewer_collections(bad):
            pass
    assert gc.get_threshold() == (700, 10, 10)


def test_simulator_run_raises_the_threshold_while_it_runs_and_restores_it(thresholds):
    from agents import make_scheduler
    from jigsaw_env.cluster import ClusterSpec
    from jigsaw_env.simulator import SimConfig, Simulator
    from traces import load_trace

    seen = []
    fifo = make_scheduler("fifo")

    def policy(state):
        seen.append(gc.get_threshold())
        return fifo(state)

    jobs = load_trace("synthetic:jobs=6,seed=1", cluster_gpus=8).jobs
    sim = Simulator(ClusterSpec.from_gpus(8), jobs, SimConfig())
    sim.run(policy)
    assert len(seen) >= 6 and all(t == (LOOP_THRESHOLD0, 10, 10) for t in seen)
    assert gc.get_threshold() == (700, 10, 10)

    def failing(state):
        raise KeyError("policy bug")

    sim = Simulator(ClusterSpec.from_gpus(8), jobs, SimConfig())
    with pytest.raises(KeyError):
        sim.run(failing)
    assert gc.get_threshold() == (700, 10, 10)
