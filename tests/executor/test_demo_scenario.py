"""The deploy demo's scenario (``DemoScenario``, docs/deploy.md) on hand-built states, without Ray:
it forces a preemption and an SPB level change only where the policy has made none by their
rounds, and then the ones its docstring names."""
from __future__ import annotations

from jigsaw_env.cluster import ClusterSpec
from jigsaw_env.spb import Pattern, SPBConfig
from jigsaw_env.state import ClusterState, CostModel, Decision, JobDecision, JobState, JobStatus
from jigsaw_executor.demo_scenario import DemoScenario

CLUSTER = ClusterSpec(num_nodes=1, gpus_per_node=2, gpu_types=("cpu",))
SCENARIO = DemoScenario(preempt_by_round=5, level_by_round=7, level_to=2)


def _job(jid: int, status: JobStatus, placement=(), attained: float = 0.0, **kw) -> JobState:
    return JobState(jid, 0.0, 1, "tiny_mlp", 32, 1000, status=status, placement=tuple(placement),
                    attained_gpu_s=attained, **kw)


def _state(rnd: int, *jobs: JobState) -> ClusterState:
    return ClusterState(cluster=CLUSTER, costs=CostModel(CLUSTER, SPBConfig()), time_s=10.0 * rnd, round=rnd,
                        jobs={j.job_id: j for j in jobs}, active_ids=[j.job_id for j in jobs], max_workers_per_gpu=1)


def _running_pair(rnd: int, **kw) -> tuple[ClusterState, Decision]:
    """Jobs 0 and 1 run alone on GPUs 0 and 1 (job 1 has attained more); job 2 waits. The policy
    keeps both running."""
    st = _state(rnd, _job(0, JobStatus.RUNNING, (0,), 50.0, **kw), _job(1, JobStatus.RUNNING, (1,), 80.0),
                _job(2, JobStatus.QUEUED))
    dec = Decision({0: JobDecision((0,), 0, Pattern.ROTATING), 1: JobDecision((1,), 0, Pattern.ROTATING)})
    return st, dec


def test_nothing_is_forced_before_the_rounds():
    st, dec = _running_pair(4)
    assert SCENARIO(st, dec) == (dec, [])


def test_the_job_with_most_service_is_preempted_and_a_waiting_job_takes_its_slot():
    st, dec = _running_pair(5)
    out, forced = SCENARIO(st, dec)
    assert forced == [{"kind": "preempt", "job": 1, "started": [2]}]
    assert dict(out) == {0: JobDecision((0,), 0, Pattern.ROTATING), 2: JobDecision((1,), 0, Pattern.ROTATING)}


def test_nothing_is_forced_once_the_policy_preempted_and_changed_a_level():
    st, dec = _running_pair(9, preemptions=1, level_changes=1)
    assert SCENARIO(st, dec) == (dec, [])


def test_a_level_change_goes_to_the_first_job_alone_on_its_gpus_after_a_preemption_happened():
    st, dec = _running_pair(7, preemptions=1)
    out, forced = SCENARIO(st, dec)
    assert forced == [{"kind": "level", "job": 0, "from": 0, "to": 2}]
    assert out[0] == JobDecision((0,), 2, Pattern.ROTATING) and out[1] == dec[1]


def test_a_job_the_policy_moves_or_changes_is_left_to_the_policy():
    st, dec = _running_pair(7, preemptions=1)
    dec = Decision({0: JobDecision((0,), 1, Pattern.ROTATING), 1: JobDecision((1,), 0, Pattern.ROTATING)})
    out, forced = SCENARIO(st, dec)
    # job 0's level is the policy's change this round; job 1 keeps its slot and level: it is the one
    assert forced == [{"kind": "level", "job": 1, "from": 0, "to": 2}]
    assert out[0] == dec[0] and out[1] == JobDecision((1,), 2, Pattern.ROTATING)


def test_the_scenario_round_trips_through_its_dictionary():
    assert DemoScenario.from_dict(SCENARIO.to_dict()) == SCENARIO
