"""The live executor's work-conserving idle guard (jigsaw_executor.policies.idle_guard)."""
from __future__ import annotations

from jigsaw_env.cluster import ClusterSpec
from jigsaw_env.simulator import SimConfig, Simulator
from jigsaw_env.state import Decision, JobDecision, JobState
from jigsaw_executor.policies import idle_guard


def _state(t: float):
    jobs = [JobState(0, 0.0, 1, "tiny_mlp", 32, 50.0), JobState(1, 5.0, 2, "tiny_cnn", 32, 50.0),
            JobState(2, 6.0, 4, "tiny_cnn", 32, 50.0)]
    sim = Simulator(ClusterSpec.from_gpus(4, gpus_per_node=4, gpu_type="cpu"), jobs, SimConfig(round_s=1.0))
    while sim.state.time_s < t:
        sim.step(Decision())  # nothing runs: every job waits
    return sim.state


def test_guard_starts_waiting_jobs_in_arrival_order_once_one_has_waited_long_enough():
    st = _state(30.0)
    d, forced = idle_guard(st, Decision(), 30.0)
    # job 0 (1 GPU) and job 1 (2 GPUs) fit on 4 GPUs; job 2 (4 GPUs) no longer does
    assert sorted(d) == [0, 1] and forced == [{"kind": "idle_guard", "started": [0, 1]}]
    assert all(jd.level == 0 for jd in d.values())
    assert len({g for jd in d.values() for g in jd.gpus}) == 3


def test_guard_does_nothing_before_the_wait_or_when_something_runs_or_when_off():
    st = _state(10.0)
    assert idle_guard(st, Decision(), 30.0) == (Decision(), [])      # waited 10 s < 30 s
    st = _state(30.0)
    busy = Decision({2: JobDecision((0, 1, 2, 3))})
    assert idle_guard(st, busy, 30.0) == (busy, [])                   # the policy runs a job
    assert idle_guard(st, Decision(), None) == (Decision(), [])       # guard off
