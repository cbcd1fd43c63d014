"""End-to-end known-answer tests of the simulator, its logs and its metrics.

Toy world (tests/conftest.py): TOY4 compute by start group c = [11, 9, 7, 5] s; 1000 parameter
bytes per group; one node of 4 GPUs with alpha = 0 and 1000 B/s, so each group's sync between
2 workers takes 1 s (ring: 2*(2-1)*(1000/2/1000) = 1; reduce+broadcast with one contributor:
(0+1)*1000/1000 = 1).

  Job A: 2 GPUs, level 0:       step = 11 + 4*1 = 15 s, eta 1.
  Job B: 2 GPUs, level 3 rot.:  phases (starts) (0,1) (1,2) (2,3) (3,0)
                                compute max 11, 9, 7, 11; groups that sync 4, 3, 2, 4
                                steps 15, 12, 9, 15 -> cycle 51 s per 4 iterations;
                                eta = 1 - 0.5 * mean start/B = 1 - 0.5 * 1.5/4 = 0.8125.
"""
from __future__ import annotations

import copy
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as hst

from conftest import BS, TOY3, TOY4, make_toy4, toy_cluster
from jigsaw_env.cluster import GiB, ClusterSpec
from jigsaw_env.cost_table import register_table, unregister_table
from jigsaw_env.encoder import JOB_FEATURES, ObservationEncoder
from jigsaw_env.metrics import compute_metrics, fairness
from jigsaw_env.placement import InfeasibleDecision, validate_decision
from jigsaw_env.simulator import SimConfig, Simulator, jobs_from_table
from jigsaw_env.spb import Pattern, SPBConfig
from jigsaw_env.state import Decision, JobDecision, JobState, JobStatus

REL = 1e-9
ETA_B = 0.8125


def job(jid, gpus, iters, arrival=0.0, model=TOY4):
    return JobState(jid, arrival, gpus, model, BS, float(iters))


def two_jobs(a_iters=10, b_iters=13, b_arrival=0.0):
    return [job(1, 2, a_iters), job(2, 2, b_iters, arrival=b_arrival)]


A_DEC = JobDecision((0, 1), 0)
B_DEC = JobDecision((2, 3), 3, Pattern.ROTATING)


def run(sim, policy):
    """Step until done; ``policy(sim) -> Decision``."""
    for _ in range(100_000):
        if sim.done:
            return sim
        sim.step(policy(sim))
    raise AssertionError("simulation did not end")


def keep_both(sim):
    d = Decision()
    if 1 in sim.state.active_ids:
        d[1] = A_DEC
    if 2 in sim.state.active_ids:
        d[2] = B_DEC
    return d


def by_id(df):
    return df.set_index("job_id")


# ---------------------------------------------------------------- end-to-end scenario
def test_two_jobs_hand_computed_finish_times():
    sim = Simulator(toy_cluster(), two_jobs(), SimConfig(round_s=100.0, backlogged=True))
    run(sim, keep_both)
    jf = by_id(sim.jobs_frame())
    # A: 10 iterations x 15 s = 150 s. B: 13 / 0.8125 = 16 steps = 4 cycles x 51 s = 204 s
    assert jf.loc[1, "finish_s"] == pytest.approx(150.0, rel=REL)
    assert jf.loc[2, "finish_s"] == pytest.approx(204.0, rel=REL)
    assert jf.loc[1, "raw_iterations"] == 10 and jf.loc[2, "raw_iterations"] == 16
    assert (jf["status"] == "done").all()
    assert jf.loc[1, "run_s"] == pytest.approx(150.0) and jf.loc[2, "run_s"] == pytest.approx(204.0)
    # isolated time: iterations x dedicated level-0 iteration (15 s)
    assert jf.loc[2, "isolated_s"] == pytest.approx(13 * 15.0)

    rf = sim.rounds_frame()
    # round 0 (0..100): A floor(100/15) = 6 steps; B 100 = 51 + 49, 49 >= 15+12+9 = 36 -> 4+3 = 7 steps
    r0 = by_id(rf[rf["round"] == 0])
    assert r0.loc[1, "steps"] == 6 and r0.loc[2, "steps"] == 7
    assert r0.loc[2, "progress"] == pytest.approx(7 * ETA_B)
    # round 1 (100..200): A reaches 10 steps at 150 -> 4; B by 200 = 3*51 + 47 -> 12 + 3 = 15 -> 8
    r1 = by_id(rf[rf["round"] == 1])
    assert r1.loc[1, "steps"] == 4 and r1.loc[2, "steps"] == 8
    assert r1.loc[1, "run_s"] == pytest.approx(50.0)
    # bytes: A 8000 per iteration x 10; B 20000 per cycle x 4 (test_spb_model)
    tot = rf.groupby("job_id")["bytes"].sum()
    assert tot[1] == pytest.approx(80000) and tot[2] == pytest.approx(80000)

    m = sim.metrics()
    assert m["makespan_s"] == pytest.approx(204.0)
    assert m["avg_jct_s"] == pytest.approx((150 + 204) / 2)
    # backlogged efficiency: useful = (10 x 15 x 2) + (13 x 15 x 2) = 300 + 390 = 690 GPU-s;
    # capacity 4 GPUs x 204 s = 816 -> 0.845588...
    assert m["useful_gpu_s"] == pytest.approx(690.0)
    assert m["cluster_efficiency"] == pytest.approx(690 / 816, rel=REL)
    # allocated utilization: (150*2 + 204*2) / (4 * 204)
    assert m["gpu_utilization"] == pytest.approx((300 + 408) / 816, rel=REL)
    # compute utilization: busy GPU-s. A: each step 11 s on both GPUs -> 10*11*2 = 220.
    # B per cycle: GPU2 (worker 0: starts 0,1,2,3) 11+9+7+5 = 32, GPU3 (1,2,3,0) 9+7+5+11 = 32 -> 4*64 = 256
    assert m["compute_utilization"] == pytest.approx((220 + 256) / 816, rel=REL)
    # the episode ends at the last completion, not at the end of the last 100-s round
    assert sim.state.time_s == pytest.approx(204.0)
    assert m["simulated_s"] == pytest.approx(204.0)


def test_work_conservation_from_rounds_frame():
    """Independent check: integrate each job's rate x run_s (and the progress column) over the
    per-round log; it must equal the iterations the job needed (rounding: 1e-9 relative)."""
    jobs = [job(1, 2, 10), job(2, 2, 13), job(3, 1, 7.3), job(4, 1, 5.55)]

    def policy(sim):
        d = Decision()
        ids = sim.state.active_ids
        if 1 in ids:
            d[1] = A_DEC
        if 2 in ids:
            d[2] = JobDecision((2, 3), 2, Pattern.STATIC)
        if 3 in ids:
            d[3] = JobDecision((0,), 3, Pattern.ROTATING)   # shares GPU 0 with job 1
        if 4 in ids:
            d[4] = JobDecision((3,), 1, Pattern.ROTATING)   # shares GPU 3 with job 2
        return d

    for round_s in (100.0, 13.0, None):
        sim = run(Simulator(toy_cluster(), copy.deepcopy(jobs), SimConfig(round_s=round_s)), policy)
        rf = sim.rounds_frame()
        integ = (rf["rate"] * rf["run_s"]).groupby(rf["job_id"]).sum()
        prog = rf.groupby("job_id")["progress"].sum()
        for j in jobs:
            assert integ[j.job_id] == pytest.approx(j.iterations, rel=REL), (round_s, j.job_id)
            assert prog[j.job_id] == pytest.approx(j.iterations, rel=REL), (round_s, j.job_id)


def test_preemption_and_resume_pays_restart():
    sim = Simulator(toy_cluster(), two_jobs(), SimConfig(round_s=100.0, restart_s=30.0))
    # round 0: both; round 1 (100..200): A preempted; round 2 on: A back on the same GPUs
    sim.step(keep_both(sim))
    a = sim.state.jobs[1]
    # by t=100 A has done 6 steps (90 s); the 10 s of its 7th step are lost
    assert a.iteration == 6 and a.progress == pytest.approx(6.0)
    sim.step(Decision({2: B_DEC}))
    assert a.status is JobStatus.PAUSED and a.preemptions == 1 and a.placement == ()
    assert a.iteration == 6
    run(sim, keep_both)
    # resume at 200, restart until 230, 4 steps x 15 s -> 290
    assert a.finish_s == pytest.approx(290.0, rel=REL)
    assert a.preemptions == 1 and a.migrations == 0
    # held GPUs: 0..100 and 200..290 (restart included) x 2 GPUs; ran 100 + 60 s
    assert a.attained_gpu_s == pytest.approx(2 * (100 + 90))
    assert a.run_s == pytest.approx(160.0)
    assert sim.state.jobs[2].finish_s == pytest.approx(204.0)   # B unaffected


def test_job_history_fields_follow_starts_and_preemptions():
    """status_since_s / last_run_s (the observation's features 17 and 18): NaN and 0 before the
    first start; a preemption at 100 s after a run from 0 s records a 100 s run; a resume at
    300 s resets status_since_s and keeps last_run_s."""
    sim = Simulator(toy_cluster(), [job(1, 2, 1000), job(2, 2, 1000)], SimConfig(round_s=100.0, restart_s=30.0))
    a, b = sim.state.jobs[1], sim.state.jobs[2]
    assert np.isnan(a.status_since_s) and a.last_run_s == 0.0
    sim.step(Decision({1: A_DEC}))                 # round 0 (0..100): A starts at 0
    assert a.status_since_s == 0.0 and a.last_run_s == 0.0 and np.isnan(b.status_since_s)
    sim.step(Decision({2: B_DEC}))                 # round 1 (100..200): A preempted at 100, B starts
    assert a.status is JobStatus.PAUSED and a.status_since_s == 100.0 and a.last_run_s == 100.0
    assert b.status_since_s == 100.0
    sim.step(Decision({2: B_DEC}))                 # round 2 (200..300): nothing changes
    assert a.status_since_s == 100.0 and b.status_since_s == 100.0
    sim.step(Decision({1: A_DEC, 2: B_DEC}))       # round 3: A resumes at 300
    assert a.status is JobStatus.RUNNING and a.status_since_s == 300.0 and a.last_run_s == 100.0
    sim.step(Decision({1: A_DEC}))                 # round 4: B preempted at 400 after 300 s
    assert b.status_since_s == 400.0 and b.last_run_s == 300.0


def test_job_history_of_a_running_job_built_without_it():
    """A RUNNING job whose status_since_s is unknown (a hand-built state, or a decision log written
    before the field existed) falls back to its first start (set to 40 s here): preempted at 100 s,
    its last run is 60 s, not NaN; with no first start either, 0 s, and its time in status counts
    from its arrival (0 s)."""
    sim = Simulator(toy_cluster(), [job(1, 2, 1000), job(2, 2, 1000)], SimConfig(round_s=100.0, restart_s=30.0))
    sim.step(Decision({1: A_DEC, 2: B_DEC}))      # round 0: both start at 0
    a, b = sim.state.jobs[1], sim.state.jobs[2]
    a.status_since_s = b.status_since_s = float("nan")
    a.first_start_s, b.first_start_s = 40.0, float("nan")
    obs = ObservationEncoder(4).encode(sim.state, [1, 2], sim.in_force_ledger(), set())
    assert obs[17] == pytest.approx(math.log1p(60.0) / 16)    # job 1: 60 s since its first start
    assert obs[JOB_FEATURES + 17] == pytest.approx(math.log1p(100.0) / 16)  # job 2: since arrival
    sim.step(Decision({}))                        # round 1: both preempted at 100
    assert a.last_run_s == 60.0 and a.status_since_s == 100.0
    assert b.last_run_s == 0.0 and b.status_since_s == 100.0


def test_memory_use_feature_is_the_occupied_gpus_bytes_over_their_capacity():
    """Cluster feature 3 (after the K window blocks and the host-slot blocks), by hand. TOY4 at level 0 peaks at 5 GiB per
    worker (conftest). On the 16 GiB toy cluster, jobs 1 and 2 alone on GPUs 0-1 and 2-3:
    20 / (16 x 4) = 0.3125; job 2 paired onto job 1's GPUs: 20 / (16 x 2) = 0.625; nothing
    running: 0. On a cluster of 16 GiB v100 and 32 GiB p100 GPUs, each occupied GPU's bytes over
    its own capacity, averaged: (5/16 + 5/16 + 5/32 + 5/32) / 4 = 0.234375."""
    def mem_use(sim, decision):
        enc = ObservationEncoder(2)
        obs = enc.encode(sim.state, [1, 2], validate_decision(sim.state, decision), set())
        return float(obs[(2 + enc.host_slots) * JOB_FEATURES + 3])

    sim = Simulator(toy_cluster(), two_jobs(1e6, 1e6), SimConfig(restart_s=0.0))
    assert mem_use(sim, Decision({})) == 0.0
    assert mem_use(sim, Decision({1: JobDecision((0, 1)), 2: JobDecision((2, 3))})) == 0.3125
    assert mem_use(sim, Decision({1: JobDecision((0, 1)), 2: JobDecision((1, 0))})) == 0.625
    register_table(make_toy4(device="p100"))
    try:
        mixed = ClusterSpec(num_nodes=2, gpus_per_node=2, gpu_types=("v100", "p100"),
                            gpu_memory_bytes={"v100": 16 * GiB, "p100": 32 * GiB})
        sim = Simulator(mixed, two_jobs(1e6, 1e6), SimConfig(restart_s=0.0))
        assert mem_use(sim, Decision({1: JobDecision((0, 1)), 2: JobDecision((2, 3))})) == 0.234375
    finally:
        unregister_table(TOY4, BS, "p100")


def test_observation_shows_the_las_queue_and_its_starvation_promotion():
    """Features 19-21 (Tiresias's queue, thresholds 3600 GPU-s, starvation factor 10), by hand.
    Job 1 (2 GPUs) runs the first 2000 s round (4000 GPU-s: queue 1 of 1) and is preempted by the
    decision taken at 2000 s. The queue observes each round's start, as Tiresias does: it sees the
    job running at 2000 s and waiting at 4000 s, so it records a 2000-s run and a wait from
    4000 s. At 12000 s the job has waited 8000 of the 20000 s that promote it; at 24000 s it is
    promoted: its service counts afresh (0 GPU-s, queue 0) and its wait restarts, while feature 7
    keeps its 4000 attained GPU-s."""
    sim = Simulator(toy_cluster(), [job(1, 2, 1e7), job(2, 2, 1e7)], SimConfig(round_s=2000.0, restart_s=0.0))
    enc = ObservationEncoder(4)
    enc.reset()
    seen = {}
    for r in range(14):
        obs = enc.encode(sim.state, [1, 2], sim.in_force_ledger(), set())
        obs2 = enc.encode(sim.state, [1, 2], sim.in_force_ledger(), set())  # a second step: no new observe
        assert obs2.tobytes() == obs.tobytes()
        seen[sim.state.time_s] = obs[:JOB_FEATURES].copy()
        sim.step(Decision({1: A_DEC}) if r == 0 else Decision({2: B_DEC}))
    log_s = math.log1p(4000.0) / 20
    assert tuple(seen[0.0][19:22]) == (0.0, 0.0, 0.0)
    assert seen[2000.0][19:22] == pytest.approx((1.0, log_s, 0.0))
    assert seen[4000.0][19:22] == pytest.approx((1.0, log_s, 0.0))
    assert seen[12000.0][19:22] == pytest.approx((1.0, log_s, 0.4))
    assert seen[22000.0][21] == pytest.approx(0.9)
    assert tuple(seen[24000.0][19:22]) == (0.0, 0.0, 0.0) and seen[24000.0][7] == pytest.approx(log_s)
    assert seen[26000.0][21] == pytest.approx(0.1)
    assert enc._las.promotions == 1
    enc.reset()                                   # a new episode forgets the promotion
    obs = enc.encode(sim.state, [1, 2], sim.in_force_ledger(), set())
    assert obs[19] == 1.0
    # so does an episode begun without reset(), once time goes back
    enc2 = ObservationEncoder(4)
    enc2._las._base[1] = 4000.0                   # as if job 1 had been promoted in an earlier episode
    enc2._las_t = 1e9
    obs = enc2.encode(sim.state, [1, 2], sim.in_force_ledger(), set())
    assert obs[19] == 1.0 and enc2._las._base == {}


def test_observation_places_each_job_in_the_las_fill():
    """Features 22-25 by hand on 8 GPUs. After a first round five jobs wait, all in queue 0, so the 2D-LAS
    order is by arrival: 1 (4 GPUs), 2 (8), 3 (2), 4 (2), 5 (4). The fill takes 1 (4 left), skips
    2, takes 3 and 4 (0 left) and skips 5. Per job: GPUs ahead / 8 (at most 2) / 2, GPUs left / 8,
    taken, log1p(skipped ahead) / 4. Job 2 then runs one 1000-s round on all 8 GPUs: 8000 GPU-s
    puts it in queue 1, behind the others, and the fill takes 1, 3 and 4 and skips 5 and 2."""
    sim = Simulator(toy_cluster(8, 4), [job(1, 4, 1e7), job(2, 8, 1e7, arrival=1.0), job(3, 2, 1e7, arrival=2.0),
                                        job(4, 2, 1e7, arrival=3.0), job(5, 4, 1e7, arrival=4.0)],
                    SimConfig(round_s=1000.0, restart_s=0.0))
    enc = ObservationEncoder(5)
    sim.step(Decision({}))
    assert len(sim.state.active_ids) == 5
    ids = [1, 2, 3, 4, 5]

    def fill(obs):
        return {jid: tuple(obs[s * JOB_FEATURES + 22: s * JOB_FEATURES + 26]) for s, jid in enumerate(ids)}

    l1 = math.log1p(1) / 4
    got = fill(enc.encode(sim.state, ids, sim.in_force_ledger(), set()))
    want = {1: (0.0, 1.0, 1.0, 0.0), 2: (0.25, 0.5, 0.0, 0.0), 3: (0.75, 0.5, 1.0, l1), 4: (0.875, 0.25, 1.0, l1),
            5: (1.0, 0.0, 0.0, l1)}
    for jid in ids:
        assert got[jid] == pytest.approx(want[jid], abs=1e-7), jid
    sim.step(Decision({2: JobDecision(tuple(range(8)), 0)}))
    assert sim.state.jobs[2].attained_gpu_s == pytest.approx(8000.0)
    got = fill(enc.encode(sim.state, ids, sim.in_force_ledger(), set()))
    want = {1: (0.0, 1.0, 1.0, 0.0), 3: (0.25, 0.5, 1.0, 0.0), 4: (0.375, 0.25, 1.0, 0.0), 5: (0.5, 0.0, 0.0, 0.0),
            2: (0.75, 0.0, 0.0, l1)}
    for jid in ids:
        assert got[jid] == pytest.approx(want[jid], abs=1e-7), jid


def test_observation_shows_which_jobs_share_a_gpu_in_the_decision_being_built():
    """Feature 26: jobs 1 and 2 share GPUs 0-1 and job 3 is alone on 2-3; once job 2 leaves the
    decision being built, job 1 is alone too. Feature 2 (placed) is unchanged for job 1."""
    sim = Simulator(toy_cluster(), [job(1, 2, 1e7), job(2, 2, 1e7), job(3, 2, 1e7)], SimConfig(round_s=100.0))
    sim.step(Decision({1: JobDecision((0, 1), 0), 2: JobDecision((0, 1), 0), 3: JobDecision((2, 3), 0)}))
    enc = ObservationEncoder(3)
    led = sim.in_force_ledger()
    obs = enc.encode(sim.state, [1, 2, 3], led, set())
    assert [obs[s * JOB_FEATURES + 26] for s in range(3)] == [1.0, 1.0, 0.0]
    led.remove(2)
    obs = enc.encode(sim.state, [1, 2, 3], led, {2})
    assert [obs[s * JOB_FEATURES + 26] for s in range(3)] == [0.0, 0.0, 0.0]
    assert [obs[s * JOB_FEATURES + 2] for s in range(3)] == [1.0, 0.0, 1.0]


def test_migration_counts_and_pays_restart():
    sim = Simulator(toy_cluster(), [job(1, 2, 10)], SimConfig(round_s=100.0, restart_s=30.0))
    sim.step(Decision({1: A_DEC}))
    run(sim, lambda s: Decision({1: JobDecision((2, 3), 0)}))
    a = sim.state.jobs[1]
    # 6 steps by 100; move -> restart until 130; 4 steps -> 190
    assert a.migrations == 1 and a.preemptions == 0
    assert a.finish_s == pytest.approx(190.0, rel=REL)


def test_spb_level_change_without_restart():
    sim = Simulator(toy_cluster(), two_jobs(), SimConfig(round_s=100.0, restart_s=30.0))
    sim.step(keep_both(sim))
    b = sim.state.jobs[2]
    assert b.iteration == 7 and b.progress == pytest.approx(7 * ETA_B)   # 5.6875
    # same GPUs, level 3 -> 0: no restart; remaining 13 - 5.6875 = 7.3125 -> ceil = 8 steps x 15 s
    run(sim, lambda s: Decision({j: (A_DEC if j == 1 else JobDecision((2, 3), 0)) for j in s.state.active_ids}))
    assert b.finish_s == pytest.approx(100 + 8 * 15.0, rel=REL)   # 220
    assert b.level_changes == 1 and b.migrations == 0 and b.preemptions == 0
    assert b.iteration == 15


def test_arrival_queueing_and_trace_window_efficiency():
    # B arrives at 50; rounds of 100 s -> admitted at 100, starts then.
    sim = Simulator(toy_cluster(), two_jobs(b_arrival=50.0), SimConfig(round_s=100.0))
    assert sim.state.active_ids == [1]
    with pytest.raises(InfeasibleDecision):
        sim.step(Decision({1: A_DEC, 2: B_DEC}))          # B has not arrived yet
    run(sim, keep_both)
    jf = by_id(sim.jobs_frame())
    assert jf.loc[2, "start_s"] == 100.0 and jf.loc[2, "queue_s"] == pytest.approx(50.0)
    assert jf.loc[2, "finish_s"] == pytest.approx(304.0)
    cf = sim.cluster_frame()
    # round 0 job-seconds: A 100 s + B from its arrival at 50 -> 150
    assert cf.loc[0, "job_seconds"] == pytest.approx(150.0)
    m = sim.metrics()
    # trace window = 0..50 (first..last arrival): A did 3 steps (45 s) -> 3 x 15 s x 2 GPUs = 90
    # GPU-s of useful work; capacity 4 x 50 = 200 -> 0.45
    assert m["efficiency_form"] == "trace-window"
    assert m["cluster_efficiency"] == pytest.approx(0.45, rel=REL)


def test_active_ids_keep_the_arrived_unfinished_jobs_in_arrival_order():
    """After every round: the jobs active before it that did not finish, in the same order, then
    the jobs admitted in it; rounds in which several jobs finish, some ahead of jobs that stay."""
    from agents import make_scheduler
    from traces import load_trace

    jobs = load_trace("synthetic:jobs=80,load=2.0,seed=4", cluster_gpus=16).jobs
    sim = Simulator(ClusterSpec.from_gpus(16), jobs, SimConfig())
    sched = make_scheduler("tiresias")
    st = sim.state
    multi = middle = 0
    while not sim.done:
        before = list(st.active_ids)
        r = sim.step(sched(st))
        kept = [x for x in before if st.jobs[x].status is not JobStatus.DONE]
        assert set(r.finished) == set(before) - set(kept)
        assert st.active_ids[:len(kept)] == kept
        new = st.active_ids[len(kept):]
        assert all(st.jobs[x].status is JobStatus.QUEUED and x not in before for x in new)
        assert [st.jobs[x].arrival_s for x in new] == sorted(st.jobs[x].arrival_s for x in new)
        multi += len(r.finished) > 1
        middle += any(before.index(x) < len(before) - len(r.finished) for x in r.finished)
    assert multi > 0 and middle > 0
    assert st.active_ids == [] and sim.num_finished == 80


def test_colocated_jobs_in_simulator_follow_k1_k2():
    # X and Y, 1 GPU each on GPU 0: X level 0 (11 s), Y level 3 rotating (11, 9, 7, 5):
    # lockstep steps 22, 20, 18, 16. Y: 8 iterations at eta 0.8125 -> 6.5 needed -> 8 steps:
    # 2 cycles = 152 s. X: 10 iterations; after Y leaves at 152 (8 steps) it runs alone at 11 s:
    # 2 more -> 152 + 22 = 174.
    jobs = [job(1, 1, 10), job(2, 1, 6.5)]
    dec = {1: JobDecision((0,), 0), 2: JobDecision((0,), 3, Pattern.ROTATING)}
    sim = Simulator(toy_cluster(), jobs, SimConfig(round_s=50.0, sharing="timeslice", pace="lockstep"))
    run(sim, lambda s: Decision({j: dec[j] for j in s.state.active_ids}))
    jf = by_id(sim.jobs_frame())
    assert jf.loc[2, "finish_s"] == pytest.approx(152.0, rel=REL)
    assert jf.loc[1, "finish_s"] == pytest.approx(174.0, rel=REL)
    cf = sim.cluster_frame()
    assert cf.loc[0, "shared_gpus"] == 1
    # GPU 0 computed the whole time (both jobs' loads add up and it is the busiest GPU)
    assert sim.busy_per_gpu()[0] == pytest.approx(174.0)
    assert np.all(sim.busy_per_gpu() <= sim.state.time_s + 1e-9)
    # one GPU held for 174 s out of 4 x 174 GPU-s: a GPU shared by two jobs is held once
    # (allocated utilization can never exceed 1); it computed all the time -> same compute utilization
    m = sim.metrics()
    assert m["gpu_utilization"] == pytest.approx(174 / (4 * 174))
    assert m["compute_utilization"] == pytest.approx(174 / (4 * 174))
    # each job's attained service still counts its own GPU: 152 s and 174 s
    assert jf.loc[2, "attained_gpu_s"] == pytest.approx(152.0) and jf.loc[1, "attained_gpu_s"] == pytest.approx(174.0)


def test_colocated_jobs_in_simulator_run_free_by_default():
    # the same X and Y, each at its own pace (eqs. F1-F4): time-sliced, each runs at 1/2 while the
    # other computes, and with no sync the other always computes: X takes 22 s an iteration, Y
    # 22, 18, 14, 10 s (64 s a cycle). Y's 8 steps take 2 cycles: 128 s. X has done 5 iterations
    # by then (110 s; its sixth, 18 s in, starts over when it is re-formed alone) and runs its
    # other 5 alone at 11 s: 128 + 55 = 183 s.
    jobs = [job(1, 1, 10), job(2, 1, 6.5)]
    dec = {1: JobDecision((0,), 0), 2: JobDecision((0,), 3, Pattern.ROTATING)}
    sim = Simulator(toy_cluster(), jobs, SimConfig(round_s=50.0, sharing="timeslice"))
    assert sim.config.pace == "free"
    run(sim, lambda s: Decision({j: dec[j] for j in s.state.active_ids}))
    jf = by_id(sim.jobs_frame())
    assert jf.loc[2, "finish_s"] == pytest.approx(128.0, rel=REL)
    assert jf.loc[1, "finish_s"] == pytest.approx(183.0, rel=REL)
    # GPU 0 is busy all the time (both always compute: U = 1, each credited 1/2 of it), and the
    # two jobs hold it once: 1/2 a GPU each while together
    assert sim.busy_per_gpu()[0] == pytest.approx(183.0)
    m = sim.metrics()
    assert m["gpu_utilization"] == pytest.approx(183 / (4 * 183))
    assert m["compute_utilization"] == pytest.approx(183 / (4 * 183))


# ---------------------------------------------------------------- round-length parity
def parity_jobs():
    return [job(1, 2, 13), job(2, 2, 9.5), job(3, 1, 20), job(4, 1, 7), job(5, 1, 3.25)]


PARITY_DEC = {
    1: JobDecision((0, 1), 3, Pattern.ROTATING),   # co-located with job 2 on GPUs 0, 1
    2: JobDecision((1, 0), 2, Pattern.ROTATING),   # period 3 -> hyper-period 12
    3: JobDecision((2,), 0),                       # co-located with job 4 on GPU 2
    4: JobDecision((2,), 3, Pattern.ROTATING),
    5: JobDecision((3,), 3, Pattern.STATIC),       # alone (static single worker: full depth)
}


def test_round_length_parity():
    """Same decisions (all jobs start at t=0 and keep their allocation until they finish) at
    round_s = 300, 7.3 and None (iteration granularity): finish times agree within 1e-6 relative."""
    TOL = 1e-6
    finishes, metrics = {}, {}
    for round_s in (300.0, 7.3, None):
        sim = Simulator(toy_cluster(), parity_jobs(), SimConfig(round_s=round_s))
        run(sim, lambda s: Decision({j: PARITY_DEC[j] for j in s.state.active_ids}))
        finishes[round_s] = by_id(sim.jobs_frame())["finish_s"]
        metrics[round_s] = sim.metrics()
    ref = finishes[300.0]
    assert ref.notna().all()
    for rs in (7.3, None):
        np.testing.assert_allclose(finishes[rs].to_numpy(), ref.to_numpy(), rtol=TOL)
        for k in ("makespan_s", "gpu_utilization", "compute_utilization", "useful_gpu_s"):
            assert metrics[rs][k] == pytest.approx(metrics[300.0][k], rel=TOL), (rs, k)
    # the static single-worker job 5 runs full depth: 3.25 -> 4 steps x 11 s = 44 s
    assert ref[5] == pytest.approx(44.0, rel=REL)


# ---------------------------------------------------------------- invalid decisions
def snapshot(sim):
    st = sim.state
    return (repr(sorted(st.jobs.items())), st.time_s, st.round, list(st.active_ids),
            sorted((k, c.k, c.partial, c.ready_s) for k, c in sim.live.components.items()),
            len(sim.log.round_rows), len(sim.log.cluster_rows), sim.num_finished)


@pytest.mark.parametrize("bad,match", [
    (Decision({1: JobDecision((0,), 0)}), "needs 2 GPUs"),                          # wrong GPU count
    (Decision({1: JobDecision((0, 0), 0)}), "distinct"),                           # duplicate GPUs
    (Decision({1: JobDecision((0, 4), 0)}), "out of range"),                       # no GPU 4
    (Decision({1: JobDecision((0, 1), 4)}), r"0\.\.3"),                            # level 4
    (Decision({99: JobDecision((0, 1), 0)}), "job 99"),                            # unknown job id
    # memory: 9 GiB GPUs; two rotating workers on GPU 0 need 5 + 5 = 10 GiB
    (Decision({1: JobDecision((0, 1), 0), 2: JobDecision((0, 2), 0)}), "memory"),
    # worker cap 2: jobs 1, 2, 3 all on GPU 1 (memory would fit 5 + 2 + 2 = 9 GiB)
    (Decision({2: JobDecision((0, 1), 3, "static"), 1: JobDecision((2, 1), 0),
               3: JobDecision((3, 1), 3, "static")}), "more than 2 workers"),
    ({1: "not a decision"}, "JobDecision"),
])
def test_invalid_decision_raises_and_leaves_state(bad, match):
    jobs = [job(1, 2, 10), job(2, 2, 13), job(3, 2, 5)]
    sim = Simulator(toy_cluster(gpu_memory_gib=9), jobs, SimConfig(round_s=10.0))
    sim.step(Decision({1: JobDecision((2, 3), 0), 2: JobDecision((0, 1), 3)}))  # some state to protect
    before = snapshot(sim)
    deep = copy.deepcopy(sim.state.jobs)
    with pytest.raises((InfeasibleDecision, ValueError), match=match):
        sim.step(bad)
    assert snapshot(sim) == before
    assert repr(sorted(deep.items())) == repr(sorted(sim.state.jobs.items()))
    sim.step(None)  # still usable


def test_static_light_worker_fits_where_rotating_does_not():
    # 9 GiB GPUs: GPU 0 holds A's rotating worker (5 GiB). A second job's worker there fits only
    # if it is a static light worker: static level 3 worker 1 starts at group 1 -> 1 + 3 = 4 GiB
    # (5 + 4 = 9 <= 9), where a rotating worker needs 5 (5 + 5 = 10 > 9).
    sim = Simulator(toy_cluster(gpu_memory_gib=9), two_jobs(), SimConfig(round_s=10.0))
    with pytest.raises(InfeasibleDecision, match="memory"):
        sim.step(Decision({1: JobDecision((0, 1), 0), 2: JobDecision((2, 0), 3, "rotating")}))
    sim.step(Decision({1: JobDecision((0, 1), 0), 2: JobDecision((2, 0), 3, "static")}))
    assert sim.cluster_frame().loc[0, "shared_gpus"] == 1


# ---------------------------------------------------------------- metrics on hand-built frames
def hand_frames():
    jobs = pd.DataFrame({
        "job_id": [1, 2, 3], "arrival_s": [0.0, 0.0, 10.0], "start_s": [0.0, 5.0, 10.0],
        "finish_s": [10.0, 20.0, 30.0], "jct_s": [10.0, 20.0, 20.0], "queue_s": [0.0, 5.0, 0.0],
        "num_gpus": [2, 1, 1], "isolated_s": [5.0, 10.0, 20.0], "preemptions": [0, 1, 0],
        "migrations": [0, 0, 2], "level_changes": [1, 0, 0], "status": ["done"] * 3})
    cluster = pd.DataFrame({
        "start_s": [0.0, 10.0, 20.0], "end_s": [10.0, 20.0, 30.0],
        # active jobs: 2 in [0,10), 2 in [10,20) (job 1 left at 10, job 3 arrived), 1 in [20,30)
        "job_seconds": [20.0, 20.0, 10.0],
        "busy_gpu_s": [15.0, 12.0, 6.0], "allocated_gpu_s": [20.0, 20.0, 10.0],
        "useful_gpu_s": [10.0, 8.0, 4.0]})
    return jobs, cluster


def test_metrics_hand_built():
    jobs, cluster = hand_frames()
    m = compute_metrics(jobs, cluster, num_gpus=2, backlogged=True, window=(0.0, 10.0), useful_at_window_end=10.0)
    # JCT 10, 20, 20: mean 16.667; p50 20; numpy linear percentile p95 = 20, p99 = 20
    assert m["avg_jct_s"] == pytest.approx(50 / 3)
    assert m["p50_jct_s"] == 20.0 and m["p95_jct_s"] == 20.0 and m["p99_jct_s"] == 20.0
    assert m["jct_by_gpus_s"] == {"1": 20.0, "2": 10.0}
    assert m["makespan_s"] == 30.0                       # last finish 30 - first arrival 0
    assert m["avg_queue_s"] == pytest.approx(5 / 3)
    # utilization over (end 30 - first arrival 0) x 2 GPUs = 60 GPU-s
    assert m["gpu_utilization"] == pytest.approx(50 / 60)
    assert m["compute_utilization"] == pytest.approx(33 / 60)
    # backlogged efficiency: useful 22 / (2 GPUs x makespan 30)
    assert m["cluster_efficiency"] == pytest.approx(22 / 60)
    assert (m["preemptions"], m["migrations"], m["level_changes"]) == (1, 2, 1)
    # trace-window form: window 0..10, useful done by its end 10 -> 10 / (2 x 10) = 0.5
    m2 = compute_metrics(jobs, cluster, 2, backlogged=False, window=(0.0, 10.0), useful_at_window_end=10.0)
    assert m2["efficiency_form"] == "trace-window" and m2["cluster_efficiency"] == pytest.approx(0.5)


def test_percentiles_linear():
    jobs = pd.DataFrame({"job_id": range(5), "arrival_s": 0.0, "start_s": 0.0,
                         "finish_s": [1.0, 2.0, 3.0, 4.0, 100.0], "jct_s": [1.0, 2.0, 3.0, 4.0, 100.0],
                         "queue_s": 0.0, "num_gpus": 1, "isolated_s": 1.0, "preemptions": 0,
                         "migrations": 0, "level_changes": 0, "status": "done"})
    cluster = pd.DataFrame({"start_s": [0.0], "end_s": [100.0], "job_seconds": [110.0],
                            "busy_gpu_s": [0.0], "allocated_gpu_s": [0.0], "useful_gpu_s": [0.0]})
    m = compute_metrics(jobs, cluster, 1, backlogged=True, window=(0, 0), useful_at_window_end=None)
    # sorted 1,2,3,4,100; p95 at rank 0.95*4 = 3.8 -> 4 + 0.8*(100-4) = 80.8; p99: 4 + 0.96*96 = 96.16
    assert m["p50_jct_s"] == 3.0
    assert m["p95_jct_s"] == pytest.approx(80.8)
    assert m["p99_jct_s"] == pytest.approx(96.16)


def test_fairness_rho_tiny():
    jobs, cluster = hand_frames()
    rho = fairness(jobs, cluster, num_gpus=2)
    # job 1 (0..10, 2 GPUs, isolated 5): n = 20 job-s / 10 s = 2; fair share 2/2 = 1 GPU;
    #   T_fair = 5 x max(1, 2/1) = 10; rho = 10/10 = 1
    # job 2 (0..20, 1 GPU, isolated 10): n = 40/20 = 2; share 1; T_fair = 10 x 1 = 10; rho = 2
    # job 3 (10..30, 1 GPU, isolated 20): n = (20 + 10)/20 = 1.5; share 4/3; demand 1 -> stretch 1;
    #   T_fair = 20; rho = 20/20 = 1
    np.testing.assert_allclose(rho, [1.0, 2.0, 1.0], rtol=1e-12)
    m = compute_metrics(jobs, cluster, 2, backlogged=True, window=(0, 10), useful_at_window_end=None)
    assert m["ftf_mean"] == pytest.approx(4 / 3) and m["ftf_max"] == pytest.approx(2.0)


# ---------------------------------------------------------------- bad configuration
@pytest.mark.parametrize("gpus", [0, -4])
def test_cluster_bad_gpus(gpus):
    with pytest.raises(ValueError, match="gpus"):
        ClusterSpec.from_gpus(gpus)


def test_cluster_bad_other_fields():
    with pytest.raises(ValueError, match="gpus_per_node"):
        ClusterSpec.from_gpus(8, gpus_per_node=3)
    with pytest.raises(ValueError, match="gpu_memory_gib"):
        ClusterSpec.from_gpus(4, gpu_memory_gib=0)
    with pytest.raises(ValueError, match="gpu type"):
        ClusterSpec.from_gpus(4, gpu_type="a100")


def test_memory_too_small_for_a_job():
    # TOY4 needs 5 GiB per worker at full depth (slot 0 is in every level and pattern); 4 GiB GPUs
    with pytest.raises(ValueError, match="memory"):
        Simulator(toy_cluster(gpu_memory_gib=4), [job(1, 1, 10)], SimConfig())


def test_unknown_model():
    with pytest.raises(ValueError, match="unknown model"):
        Simulator(toy_cluster(), [job(1, 1, 10, model="_no_such_model")], SimConfig())
    df = pd.DataFrame({"job_id": [1], "arrival_s": [0.0], "num_gpus": [1], "model": ["_no_such_model"],
                       "batch_size": [BS], "iterations": [10.0]})
    with pytest.raises(ValueError, match="unknown model"):
        jobs_from_table(df, toy_cluster())


def test_bad_jobs():
    with pytest.raises(ValueError, match="job_id"):
        Simulator(toy_cluster(), [job(1, 1, 10), job(1, 1, 5)], SimConfig())
    with pytest.raises(ValueError, match="iterations"):
        Simulator(toy_cluster(), [job(1, 1, 0)], SimConfig())
    with pytest.raises(ValueError, match="GPUs"):
        Simulator(toy_cluster(), [job(1, 8, 10)], SimConfig())
    df = pd.DataFrame({"job_id": [1], "arrival_s": [0.0], "num_gpus": [1], "model": [TOY3], "batch_size": [BS]})
    with pytest.raises(ValueError, match="iterations"):
        jobs_from_table(df, toy_cluster())
    with pytest.raises(ValueError, match="num_gpus"):
        jobs_from_table(df.drop(columns="num_gpus"), toy_cluster())


@pytest.mark.parametrize("kw,field", [
    ({"round_s": 0}, "round_s"), ({"round_s": -5.0}, "round_s"), ({"round_s": float("nan")}, "round_s"),
    ({"restart_s": -1.0}, "restart_s"), ({"max_workers_per_gpu": 0}, "max_workers_per_gpu"),
    ({"max_workers_per_gpu": 1.5}, "max_workers_per_gpu"), ({"max_time_s": 0}, "max_time_s"),
    ({"idle_round_s": 0}, "idle_round_s"),
])
def test_bad_simconfig(kw, field):
    with pytest.raises(ValueError, match=field):
        SimConfig(**kw)


@pytest.mark.parametrize("kw,field", [
    ({"max_level": -1}, "max_level"), ({"num_slots": 0}, "num_slots"),
    ({"average_over": "some"}, "average_over"), ({"eta_prior_slope": 1.5}, "eta_prior_slope"),
])
def test_bad_spbconfig(kw, field):
    with pytest.raises(ValueError, match=field):
        SPBConfig(**kw)


@pytest.mark.parametrize("kw,field", [({"eta_override": 1.5}, "eta_override"), ({"eta_scale": 0}, "eta_scale")])
def test_bad_eta_knobs(kw, field):
    with pytest.raises(ValueError, match=field):
        Simulator(toy_cluster(), [job(1, 1, 10)], SimConfig(**kw))


def test_eta_override_applies_to_spb_only():
    # eta_override 0.5 at level 3: 6.5 iterations -> 13 steps; level 0 ignores it
    sim = Simulator(toy_cluster(), [job(1, 1, 6.5), job(2, 1, 3)], SimConfig(round_s=1000.0, eta_override=0.5))
    run(sim, lambda s: Decision({j: {1: JobDecision((0,), 3), 2: JobDecision((1,), 0)}[j] for j in s.state.active_ids}))
    jf = by_id(sim.jobs_frame())
    assert jf.loc[1, "raw_iterations"] == 13
    # 13 steps of a single worker rotating through 11, 9, 7, 5: 3 cycles (96) + 11 = 107
    assert jf.loc[1, "finish_s"] == pytest.approx(107.0)
    assert jf.loc[2, "finish_s"] == pytest.approx(33.0)


@pytest.mark.parametrize("agent", ["jigsaw", "gandiva+spb"])
def test_schedulers_see_the_table_eta_not_the_swept_one(agent):
    """An eta sweep sets the simulated true eta; schedulers and the observation keep the tables'
    estimate (CostModel.estimate), so their decisions do not depend on the swept value. Were they
    to read the true eta, both agents would run every job at level 0 at eta 0.05 (SPB then loses
    95 % of each iteration) and every job at level 3 at eta 1.0: different decisions."""
    from agents import make_scheduler
    from jigsaw_env.cost_table import default_batch_size

    specs = [(1, "resnet18"), (2, "transformer_small"), (1, "lstm_lm"), (1, "tiny_cnn")]

    def first_decision(eta_override):
        jobs = [JobState(i, 0.0, g, m, default_batch_size(m), 500.0) for i, (g, m) in enumerate(specs)]
        sim = Simulator(ClusterSpec.from_gpus(4), jobs, SimConfig(eta_override=eta_override))
        d = make_scheduler(agent)(sim.state)
        return sim, {j: (jd.gpus, jd.level, jd.pattern) for j, jd in d.items()}

    _, plain = first_decision(None)
    levels = {lv for _, lv, _ in plain.values()}
    assert 0 in levels and max(levels) > 0  # SPB on for some jobs, off for others
    for eta in (0.05, 1.0):
        sim, got = first_decision(eta)
        assert got == plain, eta
        j0 = sim.state.jobs[0]
        # resnet18 has 10 groups and no measured eta: level 3 slots (0, 2, 4, 7), mean skipped
        # fraction 3.25 / 10, prior 1 - 0.5 x 0.325 = 0.8375 (eq. E1); the simulator uses the sweep's
        assert sim.state.costs.profile(j0, 3, Pattern.ROTATING, (0,)).eta == pytest.approx(0.8375)
        assert sim.costs.profile(j0, 3, Pattern.ROTATING, (0,)).eta == eta
        # the observation's feature 14 (eta at the half level, 2: slots (0, 1, 3, 5), 2.25 / 10
        # skipped): 1 - 0.5 x 0.225 = 0.8875, not the swept value
        obs = ObservationEncoder(4).encode(sim.state, [0, 1, 2, 3], sim.in_force_ledger(), set())
        assert obs[14] == pytest.approx(0.8875)
    # without a sweep the scheduler's cost model is the simulator's own
    sim, _ = first_decision(None)
    assert sim.state.costs is sim.costs and sim.costs.estimate() is sim.costs


def test_write_logs(tmp_path):
    sim = run(Simulator(toy_cluster(), two_jobs(), SimConfig(round_s=100.0)), keep_both)
    sim.write_logs(tmp_path)
    jobs = pd.read_csv(tmp_path / "jobs.csv")
    rounds = pd.read_csv(tmp_path / "rounds.csv")
    cluster = pd.read_csv(tmp_path / "cluster.csv")
    assert len(jobs) == 2 and set(rounds["job_id"]) == {1, 2}
    assert len(cluster) == sim.state.round
    assert rounds.groupby("job_id")["progress"].sum().tolist() == pytest.approx([10.0, 13.0])


# ---------------------------------------------------------------- regressions and properties
@pytest.mark.parametrize("round_s", [1100.0 - 5e-7, 1100.0, 1100.0 + 5e-7])
def test_round_ending_just_before_last_step_end(round_s):
    """A round that ends within the engine's step tolerance (1e-9 x cycle) before the job's last
    step ends: the step is counted, so the job must finish then (not loop forever, one extra step
    per round, never finishing)."""
    from jigsaw_env.cluster import GiB
    from jigsaw_env.cost_table import CostTable, LayerGroup, register_table, unregister_table
    # one group of 100 s each way x 4 groups: compute(0) = 400 + 400 + 300 = 1100 s
    register_table(CostTable("_t_slow", BS, "v100", tuple(LayerGroup(f"g{i}", 0, 1, 100.0, 100.0, 100.0)
                                                          for i in range(4)), 0.0, GiB))
    try:
        sim = Simulator(toy_cluster(), [job(1, 1, 1, model="_t_slow")], SimConfig(round_s=round_s))
        for _ in range(5):
            if sim.done:
                break
            sim.step(Decision({1: JobDecision((0,), 0)}))
        j = sim.state.jobs[1]
        assert sim.done and j.iteration == 1
        assert j.finish_s == pytest.approx(1100.0, rel=1e-9)
    finally:
        unregister_table("_t_slow", BS, "v100")



@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=hst.integers(0, 10_000), round_s=hst.floats(0.5, 40.0))
def test_property_parity_conservation_busy(seed, round_s):
    """Random co-located placements, levels and patterns, all started at t=0 and kept: finish
    times agree between round_s and iteration granularity (1e-6 relative), work is conserved
    (sum of per-round progress = iterations, 1e-9 relative), busy <= elapsed on every GPU,
    compute utilization <= allocated utilization <= 1."""
    rng = np.random.default_rng(seed)
    workers = np.zeros(4, int)
    jobs, dec = [], {}
    for jid in range(1, int(rng.integers(1, 6)) + 1):
        ng = int(rng.integers(1, 3))
        cand = np.flatnonzero(workers < 2)
        if len(cand) < ng:
            break
        gpus = tuple(int(g) for g in rng.choice(cand, ng, replace=False))
        workers[list(gpus)] += 1
        jobs.append(job(jid, ng, float(np.round(rng.uniform(1, 25), 3)), model=[TOY4, TOY3][int(rng.integers(2))]))
        dec[jid] = JobDecision(gpus, int(rng.integers(0, 4)), ["rotating", "static"][int(rng.integers(2))])
    fin = []
    for rs in (round_s, None):
        sim = run(Simulator(toy_cluster(), copy.deepcopy(jobs), SimConfig(round_s=rs)),
                  lambda s: Decision({j: dec[j] for j in s.state.active_ids}))
        fin.append(by_id(sim.jobs_frame())["finish_s"].to_numpy())
        prog = sim.rounds_frame().groupby("job_id")["progress"].sum()
        for j in jobs:
            assert prog[j.job_id] == pytest.approx(j.iterations, rel=1e-9)
        assert np.all(sim.busy_per_gpu() <= sim.state.time_s + 1e-9)
        m = sim.metrics()
        assert m["compute_utilization"] <= m["gpu_utilization"] + 1e-9 <= 1 + 2e-9
    np.testing.assert_allclose(fin[0], fin[1], rtol=1e-6)


@pytest.mark.parametrize("vector_min", [1, 1000])
def test_a_completion_mid_round_advances_only_its_component(vector_min, monkeypatch):
    # TOY4C level 0: 11 s per iteration alone, 22 s per lockstep step for two jobs on one GPU, no
    # communication. A (5 iterations) and B (200) share GPU 0, C (200) is alone on GPU 1; one round
    # of 1000 s. A finishes at 5 x 22 = 110 s; B goes on alone from then: 890 s / 11 s = 80 steps
    # (10 s into the 81st), so 85 iterations at the round's end; C, untouched by the completion,
    # does 90 steps (10 s into the 91st). Held GPU-seconds: A 110, B and C 1000. The round's busy
    # compute: 1000 s on GPU 0 (the pair's steps are compute only, then B's) and 1000 on GPU 1;
    # allocated GPU-seconds 110 (the pair, one GPU) + 890 (B alone) + 1000 (C). Both the
    # vectorised path (vector_min 1) and the scalar one (1000) give these numbers.
    from conftest import TOY4C

    jobs = [JobState(1, 0.0, 1, TOY4C, BS, 5), JobState(2, 0.0, 1, TOY4C, BS, 200),
            JobState(3, 0.0, 1, TOY4C, BS, 200)]
    sim = Simulator(toy_cluster(), jobs, SimConfig(round_s=1000.0, restart_s=0.0, sharing="timeslice"))
    sim.live.vector_min_components = vector_min
    d = Decision({1: JobDecision((0,), 0, Pattern.ROTATING), 2: JobDecision((0,), 0, Pattern.ROTATING),
                  3: JobDecision((1,), 0, Pattern.ROTATING)})
    r = sim.step(d)
    st = sim.state
    assert st.jobs[1].finish_s == pytest.approx(110.0, rel=1e-12)
    assert st.jobs[2].progress == pytest.approx(85.0, rel=1e-12) and st.jobs[2].iteration == 85
    assert st.jobs[3].progress == pytest.approx(90.0, rel=1e-12) and st.jobs[3].iteration == 90
    assert [st.jobs[i].attained_gpu_s for i in (1, 2, 3)] == pytest.approx([110.0, 1000.0, 1000.0], rel=1e-12)
    assert r.allocated_gpu_s == pytest.approx(2000.0, rel=1e-12)
    assert r.busy_gpu_s == pytest.approx(2000.0, rel=1e-12)
    # a second round continues every clock from the round's start: B and C 1000 s more each
    sim.step(None)
    assert st.jobs[2].iteration == 85 + 91 and st.jobs[3].iteration == 181


@pytest.mark.parametrize("status", list(JobStatus))
def test_a_job_is_active_exactly_when_arrived_and_unfinished(status):
    job = JobState(0, 0.0, 1, "resnet18", 64, 100.0, status=status)
    assert job.active is (status in {JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.PAUSED})
    assert JobState(0, 0.0, 1, "resnet18", 64, 100.0, status=status.value).active is job.active  # from its text
