"""Known-answer tests of the lockstep co-location engine (jigsaw_env.engine, eqs. K1-K2).

TOY4C (conftest): compute_s by start group c = [11, 9, 7, 5] s, no parameters (no sync).
"""
from __future__ import annotations

import numpy as np
import pytest

from conftest import BS, DEV, TOY4C, TOY_INTRA
from jigsaw_env.cost_table import get_table
from jigsaw_env.engine import Component, Member
from jigsaw_env.spb import JobProfile, Pattern, job_profile

REL = 1e-12


def prof(level: int, workers: int, pattern: str = "rotating") -> JobProfile:
    return job_profile(get_table(TOY4C, BS, DEV), level, pattern, workers, TOY_INTRA)


def hand_profile(compute, comm, period=None) -> JobProfile:
    compute = np.asarray(compute, dtype=float)
    period = period or compute.shape[0]
    return JobProfile(level=0, pattern=Pattern.ROTATING, slots=(0,), period=period, compute_s=compute,
                      comm_s=np.asarray(comm, float), bytes=np.zeros(period),
                      peak_bytes=np.zeros(compute.shape[1]), eta=1.0)


def test_two_single_gpu_jobs_share_a_gpu():
    # X: level 0, 1 GPU -> 11 s every iteration. Y: level 3 rotating, 1 GPU -> 11, 9, 7, 5 (period 4).
    # Both on GPU 0, time-sliced: K1 load = 11 + c_Y[k]; no sync (W=1):
    # step = [22, 20, 18, 16], hyper-period H = lcm(1, 4) = 4, cycle 76 s
    comp = Component([Member(1, prof(0, 1), (0,), 0), Member(2, prof(3, 1), (0,), 0)], ready_s=0.0)
    assert comp.H == 4
    np.testing.assert_allclose(comp.step, [22, 20, 18, 16], rtol=REL)
    assert comp.cycle == pytest.approx(76.0, rel=REL)
    # iteration0 shifts the phase: Y starting at iteration 2 -> [18, 16, 22, 20]
    comp2 = Component([Member(1, prof(0, 1), (0,), 5), Member(2, prof(3, 1), (0,), 2)], ready_s=0.0)
    np.testing.assert_allclose(comp2.step, [18, 16, 22, 20], rtol=REL)


def test_step_is_max_gpu_load_plus_max_comm():
    # P on GPUs (0,1): compute (3, 4), sync 2 s. Q on GPUs (1,2): compute (5, 1), sync 6 s.
    # K1 loads: GPU0 3, GPU1 4+5 = 9, GPU2 1; K2 step = max load 9 + max sync max(2, 6) = 15
    P = hand_profile([[3.0, 4.0]], [2.0])
    Q = hand_profile([[5.0, 1.0]], [6.0])
    comp = Component([Member(1, P, (0, 1), 0), Member(2, Q, (1, 2), 0)], ready_s=0.0)
    assert comp.gpus.tolist() == [0, 1, 2]
    np.testing.assert_allclose(comp.loads, [[3, 9, 1]], rtol=REL)
    np.testing.assert_allclose(comp.step, [15.0], rtol=REL)


def test_hyper_period_lcm():
    # level 3 rotating (period 4) with level 2 rotating (slots (0,1,2), period 3): H = 12
    comp = Component([Member(1, prof(3, 1), (0,), 0), Member(2, prof(2, 1), (0,), 0)], ready_s=0.0)
    assert comp.H == 12
    # step k = c[k mod 4] + c[k mod 3]; sum over 12 steps = 3*(11+9+7+5) + 4*(11+9+7) = 96 + 108 = 204
    assert comp.cycle == pytest.approx(204.0, rel=REL)


def test_anti_phased_rotation_beats_in_phase():
    # Two 2-GPU level-3 rotating jobs on the same GPUs (0, 1). Worker w at phase t has start
    # slot (w+t) mod 4, compute c = [11, 9, 7, 5].
    # In phase (both iteration0 = 0): GPU0 = 2 c[t], GPU1 = 2 c[t+1]
    #   t0 max(22,18)=22, t1 max(18,14)=18, t2 max(14,10)=14, t3 max(10,22)=22 -> mean 76/4 = 19
    # Anti-phased (iteration0 0 and 2): GPU0 = c[t] + c[t+2], GPU1 = c[t+1] + c[t+3]
    #   every phase max(18, 14) = 18 -> mean 18
    P = prof(3, 2)
    in_phase = Component([Member(1, P, (0, 1), 0), Member(2, P, (0, 1), 0)], ready_s=0.0)
    anti = Component([Member(1, P, (0, 1), 0), Member(2, P, (0, 1), 2)], ready_s=0.0)
    np.testing.assert_allclose(in_phase.step, [22, 18, 14, 22], rtol=REL)
    np.testing.assert_allclose(anti.step, [18, 18, 18, 18], rtol=REL)
    assert anti.step.mean() < in_phase.step.mean()
    assert in_phase.step.mean() == pytest.approx(19.0) and anti.step.mean() == pytest.approx(18.0)


def test_T_and_steps_within():
    comp = Component([Member(1, prof(0, 1), (0,), 0), Member(2, prof(3, 1), (0,), 0)], ready_s=0.0)
    # steps 22, 20, 18, 16: cumulative 22, 42, 60, 76; T(5) = 76 + 22 = 98
    assert [comp.T(x) for x in range(6)] == pytest.approx([0, 22, 42, 60, 76, 98])
    assert comp.steps_within(21.9) == 0
    assert comp.steps_within(22.0) == 1
    assert comp.steps_within(75.0) == 3
    assert comp.steps_within(76.0) == 4
    assert comp.steps_within(76.0 * 1000 + 42.0) == 4002


@pytest.mark.parametrize("ready", [0.0, 7.5])
def test_time_to_steps_and_advance_agree(ready):
    P = prof(3, 2)
    comp = Component([Member(1, P, (0, 1), 0), Member(2, P, (0, 1), 1),
                      Member(3, prof(2, 1), (1,), 0)], ready_s=ready)
    # H = lcm(4, 4, 3) = 12
    assert comp.H == 12
    now = 0.0
    done = 0
    for m in [1, 2, 3, 5, 7, 11, 12, 13, 1000, 1, 4]:
        dt = comp.time_to_steps(m, now)
        adv = comp.advance(now, dt)
        assert adv.steps == m, (m, now)
        done += m
        now += dt
        assert comp.k == done
        assert comp.partial == pytest.approx(0.0, abs=1e-6)
        # after an odd-sized advance (a partial step), time_to_steps still lands on a boundary
        adv = comp.advance(now, 0.37 * comp.step[comp.k % comp.H])
        assert adv.steps == 0
        now += 0.37 * comp.step[(comp.k) % comp.H]
    # total time = restart wait + T(total steps)
    assert now == pytest.approx(ready + comp.T(done) + 0.37 * comp.step[done % 12], rel=1e-9)


def test_restart_wait_counts_as_time_not_steps():
    comp = Component([Member(1, prof(0, 1), (0,), 0)], ready_s=30.0)
    # step 11 s; from t=0: 30 s wait + 11 s
    assert comp.time_to_next_step(0.0) == pytest.approx(41.0)
    adv = comp.advance(0.0, 20.0)
    assert adv.steps == 0 and adv.run_s == 0.0 and adv.busy.tolist() == [0.0]
    adv = comp.advance(20.0, 21.0)  # 10 s wait left, then 11 s = one step
    assert adv.steps == 1 and adv.run_s == pytest.approx(11.0) and adv.busy[0] == pytest.approx(11.0)


def test_busy_never_exceeds_elapsed_and_matches_loads():
    # X (2 GPUs, level 3 rotating) on (0,1) shares GPU 1 with Y (1 GPU, level 0); GPU 0 has slack.
    comp = Component([Member(1, prof(3, 2), (0, 1), 0), Member(2, prof(0, 1), (1,), 0)], ready_s=3.0)
    rng = np.random.default_rng(0)
    now, busy = 0.0, np.zeros(2)
    for _ in range(400):
        dt = float(rng.exponential(7.0))
        adv = comp.advance(now, dt)
        now += dt
        busy += adv.busy
        assert np.all(adv.busy >= -1e-12)
        # per GPU, compute seconds <= elapsed seconds (minus the restart wait)
        assert np.all(busy <= max(0.0, now - 3.0) + 1e-9)
    # over the completed steps plus the partial one, busy = sum of K1 loads
    k = comp.k
    full = np.array([comp.loads[i % comp.H] for i in range(k)]).sum(axis=0)
    partial = np.minimum(comp.loads[k % comp.H], comp.partial)
    np.testing.assert_allclose(busy, full + partial, rtol=1e-9)


def test_bytes_per_member():
    from conftest import TOY4
    P = job_profile(get_table(TOY4, BS, DEV), 3, "rotating", 2, TOY_INTRA)
    # bytes per phase (tests/sim/test_spb_model.py): [7000, 5000, 3000, 5000] -> 20000 per cycle
    comp = Component([Member(1, P, (0, 1), 0)], ready_s=0.0)
    # steps: compute max + sync: (11+4, 9+3, 7+2, 11+4) = 15, 12, 9, 15 -> cycle 51 s
    np.testing.assert_allclose(comp.step, [15, 12, 9, 15], rtol=REL)
    adv = comp.advance(0.0, comp.time_to_steps(6, 0.0))
    # 6 steps: one cycle (20000) + phases 0,1 (7000 + 5000) = 32000
    assert adv.bytes == [pytest.approx(32000)]


@pytest.mark.parametrize("members", [
    [(0, 1, (0,), 0)],                                   # H = 1, one GPU
    [(0, 2, (0, 1), 3)],                                 # H = 1, two GPUs
    [(3, 1, (0,), 1)],                                   # H = 4, one job
    [(0, 1, (0,), 0), (3, 1, (0,), 2)],                  # H = 4, time-sliced pair
    [(3, 2, (0, 1), 0), (0, 1, (1,), 0)],                # H = 4 over two GPUs
])
def test_scalar_advance_equals_the_vector_advance(members):
    # the simulator's hot path (advance_totals, busy_vector) against advance(), step by step over
    # random round lengths including restart waits, exact steps and sub-step slivers
    rng = np.random.default_rng(len(members))
    mk = lambda: Component([Member(i, prof(lv, w), g, it0) for i, (lv, w, g, it0) in enumerate(members)], ready_s=7.5)
    a, b = mk(), mk()
    now, busy_sum = 0.0, np.zeros(len(a.gpus))
    for i in range(400):
        dt = float(rng.choice([rng.uniform(0, 3), rng.uniform(0, 300), a.cycle / a.H, 1e-7]))
        adv = a.advance(now, dt)
        steps, run, busy, by = b.advance_totals(now, dt)
        assert steps == adv.steps and run == adv.run_s
        assert (b.k, b.partial) == (a.k, a.partial)
        assert busy == pytest.approx(float(adv.busy.sum()), rel=1e-12, abs=1e-9)
        np.testing.assert_allclose(by, adv.bytes, rtol=1e-12, atol=1e-6)
        busy_sum += adv.busy
        now += dt
    np.testing.assert_allclose(b.busy_vector(), busy_sum, rtol=1e-9, atol=1e-6)
