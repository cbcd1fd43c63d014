"""Known-answer tests of the 2D-SRTF order (jigsaw_env/remaining.py) and of ``jigsaw-srtf``, Jigsaw
ordered by it, on the toy world of tests/conftest.py (TOY4: a 1-GPU iteration takes 11 s, a
2-GPU one 11 s of compute plus 4 s of sync, 15 s)."""
from __future__ import annotations

import pytest

from conftest import BS, TOY4, toy_cluster
from agents import make_scheduler
from agents.jigsaw import Jigsaw, JigsawSRTF
from jigsaw_env.remaining import RemainingOrder, remaining_gpu_s, remaining_order, remaining_rank
from jigsaw_env.simulator import SimConfig, Simulator
from jigsaw_env.state import JobState


def _three_jobs(**config) -> Simulator:
    """Two GPUs on one node; at t=0: job 1 on 2 GPUs with 20 iterations (20 x 15 x 2 = 600 GPU-s,
    300 s), job 2 on 1 GPU with 50 (50 x 11 = 550 GPU-s, 550 s), job 3 on 1 GPU with 30 (330 GPU-s,
    330 s)."""
    jobs = [JobState(1, 0.0, 2, TOY4, BS, 20.0), JobState(2, 0.0, 1, TOY4, BS, 50.0),
            JobState(3, 0.0, 1, TOY4, BS, 30.0)]
    return Simulator(toy_cluster(2, 2), jobs, SimConfig(round_s=60.0, restart_s=0.0, **config))


def test_remaining_gpu_seconds_and_the_order_by_them():
    st = _three_jobs().state
    assert [remaining_gpu_s(st, st.jobs[j]) for j in (1, 2, 3)] == pytest.approx([600.0, 550.0, 330.0])
    # by GPU-seconds: 3, 2, 1 (by time alone it would be 1, 3, 2)
    assert [j.job_id for j in remaining_order(st)] == [3, 2, 1]
    assert remaining_rank(st) == {3: 0, 2: 1, 1: 2}


def test_ties_go_by_arrival_then_id():
    jobs = [JobState(5, 10.0, 1, TOY4, BS, 30.0), JobState(4, 10.0, 1, TOY4, BS, 30.0),
            JobState(1, 20.0, 1, TOY4, BS, 30.0)]
    sim = Simulator(toy_cluster(2, 2), jobs, SimConfig(round_s=60.0))
    while len(sim.state.active()) < 3:
        sim.step({})
    assert [j.job_id for j in remaining_order(sim.state)] == [4, 5, 1]


def test_jigsaw_srtf_starts_the_least_remaining_work_where_jigsaw_starts_the_first_arrival():
    # one worker per GPU: the exclusive pass alone decides. 2D-LAS serves queue 0 by arrival and id
    # (job 1 takes both GPUs); 2D-SRTF takes jobs 3 and 2 (330 and 550 GPU-s) before job 1 (600)
    first = _three_jobs(max_workers_per_gpu=1)
    assert set(make_scheduler("jigsaw").schedule(first.state)) == {1}
    second = _three_jobs(max_workers_per_gpu=1)
    assert set(make_scheduler("jigsaw-srtf").schedule(second.state)) == {2, 3}


def test_jigsaw_srtf_runs_the_short_jobs_first_and_the_wide_one_at_the_next_round():
    # job 1 has 60 iterations (1,800 GPU-s). 2D-LAS: job 1 (queue 0 throughout: under 3,600 GPU-s)
    # runs from 0 to its end, then jobs 2 and 3 start. 2D-SRTF: jobs 3 and 2 run from 0, and job 1
    # starts at the first round boundary (60 s rounds) after job 2, the later of them, ends.
    def run(name: str):
        jobs = [JobState(1, 0.0, 2, TOY4, BS, 60.0), JobState(2, 0.0, 1, TOY4, BS, 50.0),
                JobState(3, 0.0, 1, TOY4, BS, 30.0)]
        sim = Simulator(toy_cluster(2, 2), jobs, SimConfig(round_s=60.0, restart_s=0.0, max_workers_per_gpu=1))
        sim.run(make_scheduler(name))
        return sim.jobs_frame().set_index("job_id"), float(sim.metrics()["avg_jct_s"])

    las, las_jct = run("jigsaw")
    assert las.loc[1, "start_s"] == 0.0 and las.loc[2, "start_s"] == las.loc[3, "start_s"] == las.loc[1, "finish_s"]
    srtf, srtf_jct = run("jigsaw-srtf")
    assert srtf.loc[2, "start_s"] == srtf.loc[3, "start_s"] == 0.0
    assert srtf.loc[3, "finish_s"] < srtf.loc[2, "finish_s"] <= srtf.loc[1, "start_s"] < srtf.loc[2, "finish_s"] + 60.0
    assert srtf.loc[1, "start_s"] % 60.0 == 0.0
    assert srtf_jct < las_jct


def test_order_argument_and_state():
    assert JigsawSRTF().order == "2d-srtf" and isinstance(JigsawSRTF().priority, RemainingOrder)
    assert Jigsaw(order="2d-srtf").order == "2d-srtf" and Jigsaw().order == "2d-las"
    with pytest.raises(ValueError, match=r"jigsaw: order must be one of \['2d-las', '2d-srtf'\], got 'srtf'"):
        Jigsaw(order="srtf")
    sched = make_scheduler("jigsaw-srtf")
    sim = _three_jobs()
    sim.step(sched.schedule(sim.state))
    state = sched.state_dict()
    assert state["las"] == {}
    again = make_scheduler("jigsaw-srtf")
    again.load_state_dict(state)
    assert again.schedule(sim.state) == sched.schedule(sim.state)
    with pytest.raises(ValueError, match=r"a 2d-srtf order keeps no state, got \['base'\]"):
        RemainingOrder().load_state_dict({"base": {}})
