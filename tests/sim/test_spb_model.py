"""Known-answer tests of the SPB cost model (jigsaw_env.spb, cost_table, network).

Every expected number is computed by hand in the comments from docs/design.md section 2 and the
equations of docs/spb_model.md (labels S1-S4, C1, M1, N1-N3, E1, G1, T1).
"""
from __future__ import annotations

import numpy as np
import pytest

from conftest import BS, DEV, TOY3, TOY4, TOY_INTRA, make_toy4
from jigsaw_env import network
from jigsaw_env.cluster import GiB
from jigsaw_env.cost_table import CostTable, LayerGroup, get_table, register_table, unregister_table
from jigsaw_env.network import Link, group_sync
from jigsaw_env.spb import (Pattern, SPBConfig, cycle_length, eta_for, isolated_throughput, iteration_cost,
                            job_profile, spb_compute_bound, start_slots, worker_starts)

REL = 1e-12


# ---------------------------------------------------------------- S1/S2: levels and start slots
# Rule (docs/design.md s.2): f_l = l/(L+1); deepest = floor(f_l * B); n slots evenly spaced from 0 to
# deepest, rounded down: slot_i = floor(i * deepest / (n-1)), i = 0..n-1; duplicates removed.
@pytest.mark.parametrize("level,B,expected", [
    # B=4, L=3, n=4
    (0, 4, (0,)),           # deepest = floor(0*4/4) = 0
    (1, 4, (0, 1)),         # deepest = floor(1*4/4) = 1; floor(i/3) for i=0..3 = 0,0,0,1
    (2, 4, (0, 1, 2)),      # deepest = 2; floor(2i/3) = 0,0,1,2
    (3, 4, (0, 1, 2, 3)),   # deepest = 3; floor(3i/3) = 0,1,2,3
    # B=12
    (0, 12, (0,)),          # deepest 0
    (1, 12, (0, 1, 2, 3)),  # deepest = floor(12/4) = 3; floor(3i/3) = 0,1,2,3
    (2, 12, (0, 2, 4, 6)),  # deepest = floor(24/4) = 6; floor(6i/3) = 0,2,4,6
    (3, 12, (0, 3, 6, 9)),  # deepest = floor(36/4) = 9; floor(9i/3) = 0,3,6,9
    # B=2: level 1 deepest = floor(2/4) = 0 -> full backprop only; level 3 deepest = floor(6/4) = 1
    (1, 2, (0,)),
    (3, 2, (0, 1)),         # floor(i/3) = 0,0,0,1
    # B=1: nothing can be skipped
    (3, 1, (0,)),
    # B=7, level 3: deepest = floor(21/4) = 5; floor(5i/3) = 0,1,3,5
    (3, 7, (0, 1, 3, 5)),
])
def test_start_slots_known(level, B, expected):
    assert start_slots(level, B) == expected
    assert SPBConfig().start_slots(level, B) == expected


def test_skip_fraction():
    spb = SPBConfig()
    # f_l = l / (L+1) = l/4
    assert [spb.skip_fraction(l) for l in spb.levels] == [0.0, 0.25, 0.5, 0.75]


def test_start_slots_other_L_and_n():
    # L=1, n=2, B=10, level 1: f = 1/2, deepest = 5; slots floor(5i/1), i=0,1 -> (0, 5)
    assert start_slots(1, 10, max_level=1, num_slots=2) == (0, 5)
    # n=1: the single slot is 0
    assert start_slots(3, 12, max_level=3, num_slots=1) == (0,)
    # n=3, L=3, B=12, level 3: deepest 9; floor(9i/2) = 0,4,9
    assert start_slots(3, 12, max_level=3, num_slots=3) == (0, 4, 9)


@pytest.mark.parametrize("B", range(1, 40))
def test_slot_zero_always_present_and_bounded(B):
    spb = SPBConfig()
    for level in spb.levels:
        s = spb.start_slots(level, B)
        assert s[0] == 0
        assert list(s) == sorted(set(s))
        # the deepest slot is floor(l*B/(L+1)) <= B-1
        assert s[-1] == (level * B) // 4 <= B - 1
        assert len(s) <= spb.num_slots


@pytest.mark.parametrize("bad", [-1, 4, 7])
def test_invalid_level_raises_naming_range(bad):
    with pytest.raises(ValueError, match=r"0\.\.3"):
        SPBConfig().start_slots(bad, 12)
    with pytest.raises(ValueError, match=r"0\.\.3"):
        start_slots(bad, 12)
    with pytest.raises(ValueError, match=r"0\.\.3"):
        job_profile(get_table(TOY4, BS, DEV), bad, "rotating", 2, TOY_INTRA)


def test_invalid_level_other_L():
    with pytest.raises(ValueError, match=r"0\.\.5"):
        SPBConfig(max_level=5).start_slots(6, 12)


def test_pattern_parse():
    assert Pattern.parse("STATIC") is Pattern.STATIC
    with pytest.raises(ValueError, match="rotating"):
        Pattern.parse("random")


# ---------------------------------------------------------------- S3/S4: worker starts
SLOTS4 = (0, 1, 2, 3)
SLOTS12 = (0, 3, 6, 9)


def test_worker_starts_rotating_w_less_than_n():
    # S3: worker w at iteration t takes slot (w + t) mod n; W=2, n=4
    assert worker_starts(SLOTS4, Pattern.ROTATING, 2, 0).tolist() == [0, 1]
    assert worker_starts(SLOTS4, Pattern.ROTATING, 2, 1).tolist() == [1, 2]
    assert worker_starts(SLOTS4, Pattern.ROTATING, 2, 3).tolist() == [3, 0]   # (1+3) mod 4 = 0
    assert worker_starts(SLOTS4, Pattern.ROTATING, 2, 5).tolist() == [1, 2]   # t=5 == t=1
    assert worker_starts(SLOTS12, Pattern.ROTATING, 2, 2).tolist() == [6, 9]  # slots[2], slots[3]
    # single worker: goes through every slot, full depth once every n iterations
    assert [int(worker_starts(SLOTS12, Pattern.ROTATING, 1, t)[0]) for t in range(5)] == [0, 3, 6, 9, 0]


def test_worker_starts_rotating_w_more_than_n():
    # W=6, n=4, t=1: slots[(w+1) mod 4] = slots[1,2,3,0,1,2]
    assert worker_starts(SLOTS4, Pattern.ROTATING, 6, 1).tolist() == [1, 2, 3, 0, 1, 2]
    assert worker_starts(SLOTS12, Pattern.ROTATING, 6, 1).tolist() == [3, 6, 9, 0, 3, 6]


def test_worker_starts_static():
    # S4: worker w keeps slot w mod n at every iteration
    for t in range(6):
        assert worker_starts(SLOTS4, Pattern.STATIC, 2, t).tolist() == [0, 1]
        assert worker_starts(SLOTS12, Pattern.STATIC, 6, t).tolist() == [0, 3, 6, 9, 0, 3]


def test_rotating_with_deduplicated_slots_uses_their_count():
    # B=4, level 1: slots (0, 1) after removing duplicates; n in S3 is len(slots) = 2
    slots = start_slots(1, 4)
    assert slots == (0, 1)
    assert worker_starts(slots, Pattern.ROTATING, 1, 1).tolist() == [1]
    assert worker_starts(slots, Pattern.ROTATING, 1, 2).tolist() == [0]


def test_cycle_length():
    assert cycle_length(SLOTS4, Pattern.ROTATING) == 4
    assert cycle_length((0, 1, 2), Pattern.ROTATING) == 3
    assert cycle_length(SLOTS4, Pattern.STATIC) == 1
    assert cycle_length((0,), Pattern.ROTATING) == 1


# ---------------------------------------------------------------- C1: per-worker compute
# TOY3 groups (forward, weight-grad, input-grad), optimizer 0.05:
#   g0 (0.1, 0.2, 0.4)  g1 (0.2, 0.3, 0.5)  g2 (0.3, 0.6, 0.7)
# C1: compute(s) = sum fwd + sum_{b>=s} w_b + sum_{b>s} i_b + opt
#   compute(0) = 0.6 + (0.2+0.3+0.6) + (0.5+0.7) + 0.05 = 0.6 + 1.1 + 1.2 + 0.05 = 2.95
#   compute(1) = 0.6 + (0.3+0.6) + 0.7 + 0.05 = 2.25
#   compute(2) = 0.6 + 0.6 + 0 + 0.05 = 1.25
# (If the start group's input gradient were wrongly counted, compute(0) would be 3.35.)
TOY3_COMPUTE = [2.95, 2.25, 1.25]


def test_compute_by_start_toy3():
    t = get_table(TOY3, BS, DEV)
    assert t.compute_by_start() == pytest.approx(TOY3_COMPUTE, rel=REL)
    assert t.iteration_time_s() == pytest.approx(2.95, rel=REL)


def test_compute_by_start_toy4():
    # TOY4: compute(s) = 4 + (4-s) + (3-s) = 11 - 2s
    assert get_table(TOY4, BS, DEV).compute_by_start() == pytest.approx([11, 9, 7, 5], rel=REL)


def test_per_worker_compute_rotating_and_static():
    t = get_table(TOY3, BS, DEV)
    # TOY3 level 3: deepest = floor(3*3/4) = 2; slots floor(2i/3) = 0,0,1,2 -> (0, 1, 2); period 3
    prof = job_profile(t, 3, "rotating", 3, TOY_INTRA)
    assert prof.slots == (0, 1, 2) and prof.period == 3
    # phase 0 starts (0,1,2), phase 1 (1,2,0), phase 2 (2,0,1)
    c = TOY3_COMPUTE
    np.testing.assert_allclose(prof.compute_s, [[c[0], c[1], c[2]], [c[1], c[2], c[0]], [c[2], c[0], c[1]]], rtol=REL)
    st = job_profile(t, 3, "static", 2, TOY_INTRA)
    assert st.period == 1
    np.testing.assert_allclose(st.compute_s, [[2.95, 2.25]], rtol=REL)
    # level 0: everyone full depth
    np.testing.assert_allclose(job_profile(t, 0, "rotating", 2, TOY_INTRA).compute_s, [[2.95, 2.95]], rtol=REL)


def test_dedicated_iteration_time_T1():
    t = get_table(TOY3, BS, DEV)
    link = Link(0.5, 100.0)
    prof = job_profile(t, 3, "rotating", 3, link)
    # T1: slowest worker + sync, per phase; every phase has a full-depth worker (2.95 s). Sync on
    # the link (alpha 0.5 s, 100 B/s), workers starting at groups 0, 1, 2 (N4: the faster of N1, N2):
    # g0 (1000 B) has one contributor: reduce+broadcast (1 - 1 + 3 - 1) x (0.5 + 10) = 21 s against
    # ring 2 x 2 x (0.5 + 1000 / 300) = 15.33 s -> ring; g1 (100 B) two: (2 - 1 + 2) x (0.5 + 1) = 4.5 s
    # against 4 x (0.5 + 100 / 300) = 3.33 s -> ring; g2 (10 B) all three, ring 4 x (0.5 + 10 / 300) s
    sync = 4 * (0.5 + 1000 / 300) + 4 * (0.5 + 100 / 300) + 4 * (0.5 + 10 / 300)
    assert prof.comm_s == pytest.approx([sync] * 3, rel=REL)
    assert prof.dedicated_iteration_s() == pytest.approx([2.95 + sync] * 3, rel=REL)


# ---------------------------------------------------------------- M1: memory
def test_activation_and_process_peaks():
    t = get_table(TOY3, BS, DEV)
    # activations (4000, 2000, 1000): kept for groups >= s
    assert [t.activation_peak_bytes(s) for s in range(3)] == [7000, 3000, 1000]
    # + fixed 100000
    assert [t.process_peak_bytes(s) for s in range(3)] == [107000, 103000, 101000]


def test_peak_rotating_is_full_depth_static_light_is_lower():
    t = get_table(TOY3, BS, DEV)
    rot = job_profile(t, 3, "rotating", 3, TOY_INTRA)
    # every rotating worker visits slot 0 in the cycle -> full-depth peak 107000
    assert rot.peak_bytes.tolist() == [107000, 107000, 107000]
    st = job_profile(t, 3, "static", 3, TOY_INTRA)
    # static worker w keeps slot w: peaks 100000 + (7000, 3000, 1000)
    assert st.peak_bytes.tolist() == [107000, 103000, 101000]
    # W=4 > n=3: worker 3 wraps to slot 0
    assert job_profile(t, 3, "static", 4, TOY_INTRA).peak_bytes.tolist() == [107000, 103000, 101000, 107000]
    # TOY4, level 3 static, 4 workers: fixed 1 GiB + (4,3,2,1) GiB of activations
    t4 = get_table(TOY4, BS, DEV)
    assert job_profile(t4, 3, "static", 4, TOY_INTRA).peak_bytes.tolist() == [5 * GiB, 4 * GiB, 3 * GiB, 2 * GiB]


# ---------------------------------------------------------------- N1-N3: bytes and time
def test_collective_formulas():
    link = Link(0.5, 100.0)
    # N1 ring: time 2(W-1)(alpha + M/(W beta)) = 2*3*(0.5 + 400/(4*100)) = 6 * 1.5 = 9; bytes 2(W-1)M = 2400
    assert network.ring_allreduce_s(4, 400, link) == pytest.approx(9.0)
    assert network.ring_allreduce_bytes(4, 400) == 2400
    # N2 reduce+broadcast, C=2, W=4: ((C-1)+(W-1)) (alpha + M/beta) = 4 * (0.5 + 4) = 18; bytes 4*400
    assert network.reduce_broadcast_s(2, 4, 400, link) == pytest.approx(18.0)
    assert network.reduce_broadcast_bytes(2, 4, 400) == 1600
    # N4: the faster of the two, ties to fewer bytes. Everyone contributes -> ring (9 s < 6 x 4.5 s)
    assert group_sync(4, 4, 400, link) == (pytest.approx(9.0), 2400, network.RING)
    # C=2 of W=4: ring over all four (zeros from two) 9 s < reduce+broadcast 18 s -> ring, 2400 B
    assert group_sync(2, 4, 400, link) == (pytest.approx(9.0), 2400, network.RING)
    # C=1 of W=4, 10 B: r+b (0+3) x (0.5 + 0.1) = 1.8 s, 30 B; ring 6 x (0.5 + 10/400) = 3.15 s -> r+b
    assert group_sync(1, 4, 10, link) == (pytest.approx(1.8), 30, network.REDUCE_BROADCAST)
    # C=1 of W=4: ring < r+b iff 6 (alpha + M/(4 beta)) < 3 (alpha + M/beta) iff M > 2 alpha beta = 100 B;
    # at M = 100 both take 4.5 s (6 x 0.75, 3 x 1.5): the tie goes to fewer bytes, r+b 300 < ring 600
    assert group_sync(1, 4, 100, link) == (pytest.approx(4.5), 300, network.REDUCE_BROADCAST)
    assert group_sync(1, 4, 101, link)[2] == network.RING
    # W=2, C=1: r+b alpha + M/beta is always alpha faster than the ring 2 alpha + M/beta
    assert group_sync(1, 2, 400, link) == (pytest.approx(4.5), 400, network.REDUCE_BROADCAST)
    # a forced method (the executor's tests): ring 3.15 s / 60 B; r+b with everyone (3+3) x 4.5 = 27 s
    assert group_sync(1, 4, 10, link, method="ring") == (pytest.approx(3.15), 60, network.RING)
    assert group_sync(4, 4, 400, link, method="reduce_broadcast") == (pytest.approx(27.0), 2400,
                                                                        network.REDUCE_BROADCAST)
    with pytest.raises(ValueError, match=r"sync method must be one of \['fastest', 'ring', 'reduce_broadcast'\]"):
        group_sync(2, 4, 400, link, method="tree")
    # nobody -> nothing
    assert group_sync(0, 4, 400, link) == (0.0, 0.0, network.NONE)
    assert group_sync(1, 1, 400, link) == (0.0, 0.0, network.NONE)  # W=1: no communication
    assert group_sync(4, 4, 0, link) == (0.0, 0.0, network.NONE)    # no parameters


def test_link_validation():
    with pytest.raises(ValueError, match="alpha_s"):
        Link(-1.0, 1.0)
    with pytest.raises(ValueError, match="bandwidth_Bps"):
        Link(0.0, 0.0)


def test_iteration_bytes_and_time_toy3():
    t = get_table(TOY3, BS, DEV)  # param bytes (1000, 100, 10)
    link = Link(0.5, 100.0)
    # W=3, starts (0,1,2): |C_b| = #{w: s_w <= b} = (1, 2, 3)
    c = iteration_cost(t, np.array([0, 1, 2]), link)
    assert c.contributors.tolist() == [1, 2, 3]
    # N4 per group, ring 2*2*(0.5 + M/300) against r+b (C-1+2)*(0.5 + M/100):
    #   g0 M=1000, C=1: ring 4*3.833333 = 15.333333 < r+b 2*10.5 = 21  -> ring, 4*1000 = 4000 B
    #   g1 M=100,  C=2: ring 4*0.833333 = 3.333333  < r+b 3*1.5 = 4.5  -> ring, 4*100 = 400 B
    #   g2 M=10,   C=3: ring 4*0.533333 = 2.133333  < r+b 4*0.6 = 2.4  -> ring, 4*10 = 40 B
    # so this SPB iteration syncs exactly as the level-0 one below: 4440 B in 20.8 s
    assert c.algorithms == (network.RING, network.RING, network.RING)
    assert c.bytes == pytest.approx(4440)
    assert c.comm_s == pytest.approx(4 * (1.5 + 1110 / 300), rel=REL)
    assert c.compute_s.tolist() == pytest.approx(TOY3_COMPUTE)

    # a slower start-up (alpha 2 s) mixes the two: ring 4*(2 + M/300) against r+b (C+1)*(2 + M/100)
    #   g0 C=1: ring 4*5.333333 = 21.333333 < r+b 2*12 = 24        -> ring 4000 B
    #   g1 C=2: ring 4*2.333333 = 9.333333  > r+b 3*3 = 9           -> r+b (1+2)*100 = 300 B
    #   g2 C=3: ring 4*2.033333 = 8.133333  < r+b 4*2.1 = 8.4       -> ring 40 B
    slow = iteration_cost(t, np.array([0, 1, 2]), Link(2.0, 100.0))
    assert slow.algorithms == (network.RING, network.REDUCE_BROADCAST, network.RING)
    assert slow.bytes == pytest.approx(4340)
    assert slow.comm_s == pytest.approx(4 * (2 + 1000 / 300) + 9 + 4 * (2 + 10 / 300), rel=REL)

    # level 0, W=3: every group ring; bytes 2*2*(1000+100+10) = 4440;
    # time 4*(0.5 + 1000/300) + 4*(0.5 + 100/300) + 4*(0.5 + 10/300) = 4*(1.5 + 1110/300) = 20.8
    full = iteration_cost(t, np.array([0, 0, 0]), link)
    assert full.contributors.tolist() == [3, 3, 3]
    assert full.bytes == pytest.approx(4440)
    assert full.comm_s == pytest.approx(20.8, rel=REL)


def test_no_contributor_group_gets_no_bytes():
    t = get_table(TOY3, BS, DEV)
    # W=2, starts (1,2): |C| = (0, 1, 2); g0 nobody -> no bytes;
    # g1 r+b (0+1)*100 = 100; g2 ring 2*1*10 = 20 -> 120 bytes
    c = iteration_cost(t, np.array([1, 2]), TOY_INTRA)
    assert c.contributors.tolist() == [0, 1, 2]
    assert c.algorithms == (network.NONE, network.REDUCE_BROADCAST, network.RING)
    assert c.bytes == pytest.approx(120)
    # time at alpha 0, 1000 B/s: g1 1*100/1000 = 0.1; g2 2*1*(10/(2*1000)) = 0.01
    assert c.comm_s == pytest.approx(0.11, rel=REL)


def test_single_worker_has_no_comm():
    t = get_table(TOY3, BS, DEV)
    for level in (0, 3):
        prof = job_profile(t, level, "rotating", 1, Link(1.0, 1.0))
        assert prof.comm_s.tolist() == [0.0] * prof.period
        assert prof.bytes.tolist() == [0.0] * prof.period


def test_profile_bytes_toy4_rotating_cycle():
    t = get_table(TOY4, BS, DEV)  # 1000 bytes per group, link alpha 0, 1000 B/s
    prof = job_profile(t, 3, "rotating", 2, TOY_INTRA)
    # phase starts and |C_b|:  t0 (0,1) C=(1,2,2,2); t1 (1,2) C=(0,1,2,2);
    #                          t2 (2,3) C=(0,0,1,2); t3 (3,0) C=(1,1,1,2)
    # bytes: |C|=1 -> r+b (0+1)*1000 = 1000; |C|=2=W -> ring 2*1*1000 = 2000; |C|=0 -> 0
    assert prof.bytes.tolist() == [7000, 5000, 3000, 5000]
    # time: r+b 1*(1000/1000) = 1 s; ring 2*1*(1000/2/1000) = 1 s -> 1 s per group that syncs
    assert prof.comm_s.tolist() == pytest.approx([4, 3, 2, 4])
    # level 0: four rings -> 8000 bytes, 4 s
    p0 = job_profile(t, 0, "rotating", 2, TOY_INTRA)
    assert p0.bytes.tolist() == [8000] and p0.comm_s.tolist() == pytest.approx([4])


# ---------------------------------------------------------------- E1: eta prior
def test_eta_prior_toy():
    t = get_table(TOY3, BS, DEV)  # B = 3, slots at level 3 (0, 1, 2)
    spb = SPBConfig()
    # rotating W=2: starts over the 3 phases (0,1),(1,2),(2,0): mean start 6/6 = 1;
    # skipped fraction 1/3; eta = 1 - 0.5 * 1/3 = 0.833333
    assert job_profile(t, 3, "rotating", 2, TOY_INTRA).eta == pytest.approx(1 - 0.5 / 3, rel=REL)
    # static W=2: starts (0,1), mean 0.5, fraction 1/6: eta = 1 - 0.5/6 = 0.916667
    assert job_profile(t, 3, "static", 2, TOY_INTRA).eta == pytest.approx(1 - 0.5 / 6, rel=REL)
    # TOY4 rotating level 3: mean start (0+1+2+3)/4 = 1.5 -> 1.5/4 = 0.375 -> eta = 0.8125
    assert job_profile(get_table(TOY4, BS, DEV), 3, "rotating", 2, TOY_INTRA).eta == pytest.approx(0.8125, rel=REL)
    # slope 0.2: 1 - 0.2 * 0.375 = 0.925
    assert eta_for(get_table(TOY4, BS, DEV), 3, Pattern.ROTATING, SPBConfig(eta_prior_slope=0.2),
                   SLOTS4, 1) == pytest.approx(0.925, rel=REL)


def test_eta_is_one_at_level_zero():
    for name in (TOY3, TOY4):
        for W in (1, 2, 5):
            assert job_profile(get_table(name, BS, DEV), 0, "rotating", W, TOY_INTRA).eta == 1.0
            assert job_profile(get_table(name, BS, DEV), 0, "static", W, TOY_INTRA).eta == 1.0


def test_measured_eta_wins_over_prior():
    base = make_toy4("_t_eta")
    t = CostTable(base.model, base.batch_size, base.device, base.groups, base.optimizer_s,
                  base.fixed_memory_bytes, meta={"eta": {"3/rotating": 0.7}})
    assert job_profile(t, 3, "rotating", 2, TOY_INTRA).eta == 0.7
    # not measured -> the prior 1 - c x mean skipped share: static level 3, two workers starting at
    # groups 0 and 1 of TOY4's 4 (mean 0.5 / 4 skipped), c = 0.5
    assert job_profile(t, 3, "static", 2, TOY_INTRA).eta == pytest.approx(1 - 0.5 * 0.5 / 4, rel=REL)


# ---------------------------------------------------------------- G1: gain bound
def test_gain_bound_design_example():
    # docs/design.md s.2 example: equal backward per group, backward = 2x forward, no separate
    # input-gradient cost. B=4, forward 0.25 each (F = 1), weight-grad 0.5 each:
    # compute(s) = 1 + 0.5*(4-s) = 3, 2.5, 2, 1.5 -> mean over the rotating cycle 2.25 (= 2.25F vs 3F)
    # eta (W=1 rotating, level 3) = 1 - 0.5 * 1.5/4 = 0.8125; bound = 3/2.25 * 0.8125 = 1.083333
    groups = tuple(LayerGroup(f"g{i}", 1, 1, 0.25, 0.5, 0.0) for i in range(4))
    t = CostTable("_t_g1", BS, DEV, groups, 0.0, 1)
    register_table(t)
    try:
        assert spb_compute_bound(t, 3, "rotating", 1) == pytest.approx(3 / 2.25 * 0.8125, rel=REL)
        assert spb_compute_bound(t, 0, "rotating", 1) == pytest.approx(1.0, rel=REL)
    finally:
        unregister_table("_t_g1", BS, DEV)


def test_isolated_throughput_toy4():
    # T1 at level 0 with the default links: 1 GPU -> 1/11 it/s (no sync)
    assert isolated_throughput(TOY4, BS, 1, DEV) == pytest.approx(1 / 11, rel=REL)
    # 2 GPUs intra-node (7.67e9 B/s, alpha 10 us): 4 rings of 1000 bytes,
    # each 2*1*(10e-6 + 1000/(2*7.67e9)) s
    ring = 2 * (10e-6 + 500 / 7.67e9)
    assert isolated_throughput(TOY4, BS, 2, DEV) == pytest.approx(1 / (11 + 4 * ring), rel=1e-9)


def test_cost_table_validation_and_roundtrip(tmp_path):
    with pytest.raises(ValueError, match="forward_s"):
        CostTable("_bad", BS, DEV, (LayerGroup("g", 1, 1, -1.0, 0, 0),), 0.0, 1)
    with pytest.raises(ValueError, match="layer group"):
        CostTable("_bad", BS, DEV, (), 0.0, 1)
    t = get_table(TOY3, BS, DEV)
    p = tmp_path / "t.json"
    t.save(p)
    assert CostTable.load(p) == t
    with pytest.raises(ValueError, match="unknown model"):
        get_table("_no_such_model", BS, DEV)


def test_largest_peak_is_the_peak_of_the_widest_worker_on_the_main_gpu_type():
    from jigsaw_env.cluster import ClusterSpec
    from jigsaw_env.state import CostModel, JobState

    cluster = ClusterSpec(num_nodes=3, gpus_per_node=8, gpu_types=("k80", "v100", "v100"))
    costs = CostModel(cluster, SPBConfig())
    job = JobState(1, 0.0, 4, "resnet50", 32, 100.0)
    twin = JobState(2, 50.0, 4, "resnet50", 32, 900.0)  # the same model, batch and width
    # the main type is v100 (two nodes of three): the first v100 node's first four GPUs stand for any four
    assert costs.reference_gpus(4, "v100") == (8, 9, 10, 11)
    for level in (0, 2):
        want = float(costs.profile(job, level, Pattern.ROTATING, (8, 9, 10, 11)).peak_bytes.max())
        assert costs.largest_peak(job, level, Pattern.ROTATING) == want
        assert costs.largest_peak(twin, level, Pattern.ROTATING) == want
    # (the same numbers as the peak list the ledger's check reads)
    assert costs.largest_peak(job, 0, Pattern.ROTATING) == max(costs.peak_list(job, 0, Pattern.ROTATING, (8, 9, 10, 11)))
