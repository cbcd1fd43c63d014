"""Known-answer tests of spilling waiting jobs onto shared GPUs (jigsaw_env/spill.py) and of the
heuristics that apply it (``jigsaw-spill``, ``jigsaw-srtf-spill``), on the toy world of
tests/conftest.py (TOY4: a full-depth process peaks at 5 GiB; toy GPUs hold 16 GiB)."""
from __future__ import annotations

import pytest

from conftest import BS, TOY4, toy_cluster
from agents import make_scheduler
from agents.jigsaw import Jigsaw, JigsawSRTFSpill
from jigsaw_env.actions import ActionCodec, RoundBuilder, priority_rank
from jigsaw_env.placement import GpuLedger
from jigsaw_env.simulator import SimConfig, Simulator
from jigsaw_env.spb import Pattern
from jigsaw_env.spill import spill_waiting
from jigsaw_env.state import Decision, JobDecision, JobState


def _running_three(num_gpus: int = 4, gpus_per_node: int = 2, *, gib: float | None = None, **config) -> Simulator:
    """Jobs 1, 2, 3 (1 GPU each) running on GPUs 0, 1, 2 after one round; job 4 (2 GPUs) and job 5
    (1 GPU) arrived and wait. GPU 3 is free."""
    jobs = [JobState(1, 0.0, 1, TOY4, BS, 500.0), JobState(2, 0.0, 1, TOY4, BS, 500.0),
            JobState(3, 0.0, 1, TOY4, BS, 500.0), JobState(4, 0.0, 2, TOY4, BS, 500.0),
            JobState(5, 0.0, 1, TOY4, BS, 500.0)]
    kw = {} if gib is None else {"gpu_memory_gib": gib}
    sim = Simulator(toy_cluster(num_gpus, gpus_per_node, **kw), jobs, SimConfig(round_s=60.0, restart_s=0.0, **config))
    sim.step(Decision({j: JobDecision((j - 1,), 0, Pattern.ROTATING) for j in (1, 2, 3)}))
    return sim


def _spill(sim: Simulator, order: list[int]):
    st = sim.state
    ledger = GpuLedger(st, st.current_decision(), checked=True)
    rank = {j: i for i, j in enumerate(order)}
    added = spill_waiting(st, ledger, [st.jobs[j] for j in order], rank)
    return added, ledger.decision


def test_a_job_the_free_gpus_cannot_hold_takes_them_and_the_lowest_priority_jobs_gpus():
    sim = _running_three()
    # priority 4, 5, 2, 1, 3: job 4 needs 2 GPUs, one is free (3); of the GPUs with room it takes
    # job 3's, the lowest priority (GPU 2). Then no GPU is free: job 5 shares too, on GPU 0 (job 1,
    # rank 3; GPU 2 holds two workers, GPU 1 job 2 of rank 2, GPU 3 job 4 of rank 0)
    added, dec = _spill(sim, [4, 5, 2, 1, 3])
    assert added == [4, 5]
    assert dec[4].gpus == (2, 3) and dec[4].level == 0
    assert dec[5].gpus == (0,)
    assert {j: dec[j].gpus for j in (1, 2, 3)} == {1: (0,), 2: (1,), 3: (2,)}  # the running jobs stay


def test_a_job_the_free_gpus_hold_runs_on_them_on_the_fewest_nodes():
    # 6 GPUs in 3 nodes of 2: GPUs 3 (node 1), 4 and 5 (node 2) free; job 4 takes node 2 whole,
    # then job 5 takes GPU 3, the last free one
    sim = _running_three(num_gpus=6, gpus_per_node=2)
    added, dec = _spill(sim, [4, 5, 1, 2, 3])
    assert added == [4, 5] and dec[4].gpus == (4, 5) and dec[5].gpus == (3,)


def test_with_one_worker_per_gpu_or_short_memory_only_free_gpus_are_taken():
    # job 4 (2 GPUs) cannot share, so it waits; job 5 (1 GPU) takes the free GPU 3
    sim = _running_three(max_workers_per_gpu=1)
    added, dec = _spill(sim, [4, 5, 1, 2, 3])
    assert added == [5] and dec[5].gpus == (3,)
    # 8 GiB GPUs: a second 5 GiB process does not fit beside the first
    sim = _running_three(gib=8.0)
    added, dec = _spill(sim, [4, 5, 1, 2, 3])
    assert added == [5] and dec[5].gpus == (3,)


def test_the_round_builder_spills_in_its_window_order_when_the_agent_ends_the_round():
    sim = _running_three()
    st = sim.state
    rank = priority_rank(st)  # least attained first: the waiting jobs 4, 5 (none), then 1, 2, 3
    assert [j for j, _ in sorted(rank.items(), key=lambda kv: kv[1])] == [4, 5, 1, 2, 3]
    codec = ActionCodec(4, st.spb)
    plain = RoundBuilder(st, codec, sim.in_force_ledger().copy())
    assert set(plain.finish()) == {1, 2, 3}
    spilling = RoundBuilder(st, codec, sim.in_force_ledger().copy(), spill=True)
    assert spilling.finish() == _spill(sim, [4, 5, 1, 2, 3])[1]
    # job 3's GPU (the lowest priority) for job 4; then job 2's for job 5
    assert spilling.finish()[4].gpus == (2, 3) and spilling.finish()[5].gpus == (1,)


def test_jigsaw_srtf_spill_is_jigsaw_srtf_then_the_spill():
    assert make_scheduler("jigsaw-srtf-spill").spill and make_scheduler("jigsaw-spill").spill
    assert not make_scheduler("jigsaw-srtf").spill and not Jigsaw().spill
    base, spilling = make_scheduler("jigsaw-srtf"), JigsawSRTFSpill()
    sim_a, sim_b = _running_three(), _running_three()
    plain = base.schedule(sim_a.state)
    spilled = spilling.schedule(sim_b.state)
    ledger = GpuLedger(sim_a.state, plain, checked=True)
    order = spilling.priority.order_active(sim_a.state)
    spill_waiting(sim_a.state, ledger, order, {j.job_id: i for i, j in enumerate(order)})
    assert spilled == ledger.decision
    assert set(spilled) - set(plain)  # this state has a job to spill


@pytest.mark.parametrize("name", ["jigsaw", "jigsaw-srtf"])
def test_spilling_heuristics_leave_no_gpu_free_while_a_job_waits(name):
    """Narrow jobs arrive beside a wide one on a 2-node toy cluster: without the spill some round
    leaves a GPU free while a job waits; with it none does, and GPUs are shared (each GPU holds
    5 GiB of 16: memory never refuses a spill here)."""
    def run(scheduler):
        jobs = [JobState(i, 10.0 * i, 1, TOY4, BS, 200.0 + 50 * i) for i in range(1, 4)]
        jobs.append(JobState(9, 5.0, 4, TOY4, BS, 300.0))
        sim = Simulator(toy_cluster(4, 2), jobs, SimConfig(round_s=60.0, restart_s=0.0))
        sim.run(make_scheduler(scheduler))
        assert sim.num_finished == len(jobs)
        cf = sim.cluster_frame()
        return cf, int(((cf["queued"] > 0) & (cf["allocated_gpus"] < 4)).sum())

    plain, idle_waits = run(name)
    assert idle_waits > 0
    spilled, idle_waits = run(f"{name}-spill")
    assert idle_waits == 0 and (spilled["shared_gpus"] > 0).any()
