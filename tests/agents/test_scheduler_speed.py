"""The heuristics' fast paths against plain from-scratch references (tests/reference/heuristics.py).

Every structure that makes ``tiresias`` / ``jigsaw`` faster must give exactly what the plain
computation gives: the LAS order and quiet time, the pairs in force, the pairing search (phase-free
candidates prepared once, per-phase step means gathered in one array) and the cached keys.
"""
from __future__ import annotations

import dataclasses
import random
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as hst

from agents import make_scheduler
from agents.common import (LASQueues, best_pairing, best_solo, consolidated_gpus, current_pairs, guest_orders,
                           host_layout, job_decision, order_signatures, placement_sig, spb_configs)
from agents.jigsaw import Jigsaw, pairing_bound
from jigsaw_env.cluster import ClusterSpec
from jigsaw_env.placement import GpuLedger, consolidated_from_counts
from jigsaw_env.simulator import SimConfig, Simulator
from jigsaw_env.spb import Pattern
from jigsaw_env.state import ClusterState, CostModel, JobDecision, JobState, JobStatus, trusted_decision
from traces import load_trace

from reference.heuristics import MaskJigsaw, plain_observe, plain_order, plain_pairs, plain_quiet, plain_search

MODELS = ["resnet18", "resnet50", "vgg16", "lstm_lm", "bert_base", "transformer_small"]
BATCH = {"resnet18": 64, "resnet50": 32, "vgg16": 32, "lstm_lm": 20, "bert_base": 8, "transformer_small": 64}



def _state(cluster: ClusterSpec, jobs: list[JobState], t: float = 0.0) -> ClusterState:
    from jigsaw_env.spb import SPBConfig
    st = ClusterState(cluster=cluster, costs=CostModel(cluster, SPBConfig()), time_s=t,
                      jobs={j.job_id: j for j in jobs}, active_ids=[j.job_id for j in jobs])
    return st


# ------------------------------------------------------------------------------------------------
# LAS: order, observe, quiet_until against the plain per-job definitions
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("thresholds", [(3600.0,), (100.0, 1000.0, 5000.0)])
@pytest.mark.parametrize("seed", range(4))
def test_las_order_observe_and_quiet_equal_the_plain_definitions(thresholds, seed):
    rng = random.Random(seed)
    cluster = ClusterSpec.from_gpus(64)
    jobs = []
    for i in range(120):
        # ties in arrival (sorted by id), shuffled active order, services around the thresholds
        jobs.append(JobState(job_id=rng.randrange(10_000) * 200 + i, arrival_s=float(rng.randrange(40)), num_gpus=rng.choice([1, 2, 4, 8]),
                             model="resnet18", batch_size=64, iterations=100.0,
                             attained_gpu_s=rng.choice([0.0, thresholds[0], rng.uniform(0, 2 * thresholds[-1])]),
                             status=JobStatus.QUEUED))
    rng.shuffle(jobs)
    st = _state(cluster, jobs)
    fast, plain = LASQueues(thresholds, 2.0), LASQueues(thresholds, 2.0)
    for step in range(40):
        st.time_s = 50.0 * step
        for j in jobs:  # random runs, preemptions and service
            r = rng.random()
            if r < 0.3:
                j.status = JobStatus.RUNNING
                j.attained_gpu_s += 50.0 * j.num_gpus * rng.random()
            elif r < 0.5 and j.status is JobStatus.RUNNING:
                j.status = JobStatus.PAUSED
        if step % 7 == 3:  # jobs leave and arrive
            st.active_ids = [x for x in st.active_ids if rng.random() < 0.9]
        fast.observe(st)
        plain_observe(plain, st)
        for name in ("_run_since", "_last_run", "_wait_since", "_base", "promotions"):
            assert getattr(fast, name) == getattr(plain, name), name
        act = st.active()
        assert [j.job_id for j in fast.order(act)] == [j.job_id for j in plain_order(plain, act)]
        assert [j.job_id for j in fast.order(iter(act))] == [j.job_id for j in plain_order(plain, act)]
        assert fast.quiet_until(st) == plain_quiet(plain, st)
    assert plain.promotions > 0


# ------------------------------------------------------------------------------------------------
# pairs in force
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(20))
def test_current_pairs_equals_the_plain_map_of_every_gpu(seed):
    rng = random.Random(seed)
    cluster = ClusterSpec.from_gpus(32)
    jobs = []
    for i in range(30):
        n = rng.choice([1, 2, 4])
        gpus = tuple(rng.sample(range(32), n)) if rng.random() < 0.7 else ()
        jobs.append(JobState(job_id=i, arrival_s=0.0, num_gpus=n, model="resnet18", batch_size=64, iterations=1.0,
                             status=JobStatus.RUNNING if gpus else JobStatus.QUEUED, placement=gpus,
                             first_start_s=float(rng.randrange(3))))
    st = _state(cluster, jobs)
    memory = {rng.randrange(30): rng.randrange(30) for _ in range(5)}
    assert current_pairs(st) == plain_pairs(st)
    assert list(current_pairs(st, memory).items()) == list(plain_pairs(st, memory).items())


# ------------------------------------------------------------------------------------------------
# the pairing search
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mixed", [False, True])
@pytest.mark.slow
def test_pairing_search_equals_the_plain_search_bit_for_bit(mixed, monkeypatch):
    from agents import common

    def counted(fn, calls):
        def wrapper(*a, **k):
            calls[0] += 1
            return fn(*a, **k)
        return wrapper

    joint, searches = [0], [0]
    monkeypatch.setattr(common, "search_pairing_phases", counted(common.search_pairing_phases, joint))
    monkeypatch.setattr(common, "search_pairing_at", counted(common.search_pairing_at, searches))
    rng = random.Random(7 + mixed)
    if mixed:
        cluster = ClusterSpec(num_nodes=4, gpus_per_node=4, gpu_types=("v100", "p100", "v100", "k80"))
    else:
        cluster = ClusterSpec.from_gpus(32)
    G = cluster.num_gpus
    checked = 0
    for trial in range(60):
        wa = rng.choice([1, 2, 4, 8])
        wb = rng.choice([w for w in (1, 2, 4, 8) if w <= wa])
        mh, mg = rng.choice(MODELS), rng.choice(MODELS)
        host = JobState(job_id=1, arrival_s=0.0, num_gpus=wa, model=mh, batch_size=BATCH[mh], iterations=1e6,
                        status=JobStatus.RUNNING, iteration=rng.randrange(100))
        guest = JobState(job_id=2, arrival_s=0.0, num_gpus=wb, model=mg, batch_size=BATCH[mg], iterations=1e6,
                         status=JobStatus.QUEUED, iteration=rng.randrange(100))
        gpus = tuple(rng.sample(range(G), wa)) if rng.random() < 0.5 else tuple(range(wa))
        st = _state(cluster, [host, guest])
        cap = np.array([cluster.memory_of(g) for g in gpus], dtype=np.float64)
        want = plain_search(st, host, gpus, guest, spb_configs(st, host), spb_configs(st, guest), guest_orders(wa, wb),
                             cap, 0, (guest.iteration - host.iteration) % 12 if wa > 1 else 0)
        got = best_pairing(st, host, gpus, guest)
        if want is None:
            assert got is None
            continue
        hc, gc, oi, value, xh, xg, step = want
        assert got is not None
        assert (got.host_cfg, got.guest_cfg, got.value, got.x_host, got.x_guest, got.step_s) == (hc, gc, value, xh, xg, step)
        assert got.guest_gpus == tuple(gpus[i] for i in guest_orders(wa, wb)[oi])
        again = best_pairing(st, host, gpus, guest)  # asked again: the cached plan
        assert again == got
        if not mixed:
            # a host with the same layout on other GPUs (shifted by whole nodes on the homogeneous
            # cluster) gets the cached plan mapped onto its own GPUs
            shift = {g: (g + cluster.gpus_per_node) % G for g in range(G)}
            moved = tuple(shift[g] for g in gpus)
            n_searches, n_joint = searches[0], joint[0]
            other = best_pairing(st, host, moved, guest)
            assert (searches[0], joint[0]) == (n_searches, n_joint)  # no new search
            assert other is not None
            assert (other.host_cfg, other.guest_cfg, other.value, other.x_host, other.x_guest, other.step_s) == (
                got.host_cfg, got.guest_cfg, got.value, got.x_host, got.x_guest, got.step_s)
            assert other.guest_gpus == tuple(shift[g] for g in got.guest_gpus)
        # every other phase difference of the same pair: the second one asked searches all of them
        # at once (search_pairing_phases), each as the plain search of its own phase
        for d in range(12) if wa > 1 else ():
            guest.iteration = host.iteration + d
            want_d = plain_search(st, host, gpus, guest, spb_configs(st, host), spb_configs(st, guest),
                                   guest_orders(wa, wb), cap, 0, d)
            got_d = best_pairing(st, host, gpus, guest)
            if want_d is None:
                assert got_d is None
                continue
            assert (got_d.host_cfg, got_d.guest_cfg, got_d.value, got_d.x_host, got_d.x_guest, got_d.step_s) == (
                want_d[0], want_d[1], *want_d[3:])
            assert got_d.guest_gpus == tuple(gpus[i] for i in guest_orders(wa, wb)[want_d[2]])
        # explicit candidate sets (the non-default path) and a non-zero host phase
        order = [guest_orders(wa, wb)[0]]
        for ih in (0, 3):
            a = common.search_pairing_at(st, host, gpus, guest, spb_configs(st, host), [(0, Pattern.ROTATING)], order, cap, ih, 5)
            b = plain_search(st, host, gpus, guest, spb_configs(st, host), [(0, Pattern.ROTATING)], order, cap, ih, 5)
            # a PairingHit (a named tuple) against the reference's plain tuple: the same values
            assert repr(a if a is None else tuple(a)) == repr(b if b is None else tuple(b))
        # explicit candidate sets at every phase difference (the second one asked searches all of
        # them at once, as a pair that stays is asked round after round): each the plain search
        explicit = (spb_configs(st, host), [(0, Pattern.ROTATING), (2, Pattern.STATIC)], order)
        for d in (3, 7, 0, 11, 5) if wa > 1 else ():
            guest.iteration = host.iteration + d
            b = plain_search(st, host, gpus, guest, *explicit, cap, 0, d)
            a = best_pairing(st, host, gpus, guest, *explicit)
            assert (a is None) == (b is None)
            if b is not None:
                assert (a.host_cfg, a.guest_cfg, a.value, a.x_host, a.x_guest, a.step_s) == (b[0], b[1], *b[3:])
                assert a.guest_gpus == tuple(gpus[i] for i in order[b[2]])
        checked += 1
    assert checked > 20 and joint[0] > 10


@pytest.mark.parametrize("mixed", [False, True])
def test_pairings_shared_across_host_gpus_that_read_the_same_equal_their_own_search(mixed, monkeypatch):
    # common.pairing_layout gives host GPU tuples the same id when the default search reads the
    # same in them (the host's placement signature, each guest order's, the memories): hosts on
    # other nodes, or spread over nodes in other patterns, reuse one search. On one state (shared
    # caches), every host placement's cached plan equals the plain search on its own GPUs
    from agents import common

    searches = [0]
    search = common.search_pairing_at

    def counted(*a, **k):
        searches[0] += 1
        return search(*a, **k)

    monkeypatch.setattr(common, "search_pairing_at", counted)
    rng = random.Random(11 + mixed)
    if mixed:
        cluster = ClusterSpec(num_nodes=4, gpus_per_node=4, gpu_types=("v100", "p100", "v100", "v100"))
    else:
        cluster = ClusterSpec.from_gpus(32)
    # (the guest of two workers syncs more than the host: whether its GPUs span nodes shows)
    host = JobState(job_id=1, arrival_s=0.0, num_gpus=4, model="resnet18", batch_size=BATCH["resnet18"],
                    iterations=1e6, status=JobStatus.RUNNING, iteration=3)
    guests = [JobState(job_id=2 + w, arrival_s=0.0, num_gpus=w, model=m, batch_size=BATCH[m], iterations=1e6,
                       status=JobStatus.QUEUED, iteration=0) for w, m in ((1, "resnet50"), (2, "vgg16"))]
    st = _state(cluster, [host, *guests])
    gpn = cluster.gpus_per_node
    layouts, asked = set(), 0
    for trial in range(80):
        # each worker on one of one or two nodes: one node, halves, alternating, three and one
        nodes = rng.sample(range(cluster.num_nodes), rng.choice([1, 2, 2]))
        free = {k: rng.sample(range(k * gpn, (k + 1) * gpn), gpn) for k in nodes}
        gpus = tuple(free[rng.choice(nodes)].pop() for _ in range(4))
        layouts.add(common.host_layout(st, gpus)[0])
        cap = np.array([cluster.memory_of(g) for g in gpus], dtype=np.float64)
        for guest in guests:
            want = plain_search(st, host, gpus, guest, spb_configs(st, host), spb_configs(st, guest),
                                 guest_orders(4, guest.num_gpus), cap, 0, (guest.iteration - host.iteration) % 12)
            got = best_pairing(st, host, gpus, guest)
            asked += 1
            if want is None:
                assert got is None
                continue
            assert (got.host_cfg, got.guest_cfg, got.value, got.x_host, got.x_guest, got.step_s) == (
                want[0], want[1], *want[3:])
            assert got.guest_gpus == tuple(gpus[i] for i in guest_orders(4, guest.num_gpus)[want[2]])
    # fewer searches than node layouts x guests: the ids shared them
    assert len(layouts) >= 6 and searches[0] < 0.9 * 2 * len(layouts) and asked == 160


def test_jigsaw_pairing_bounds_shared_by_host_gpus_that_read_the_same_are_equal():
    # Jigsaw memoises its pairing bound per host kind, guest width and common.pairing_layout id:
    # every host placement that lands on one memo has the same bound for every guest (the bound
    # reads nothing else in the GPUs), and placements spread over nodes in other patterns share
    rng = random.Random(4)
    cluster = ClusterSpec.from_gpus(32)
    gpn = cluster.gpus_per_node
    host = JobState(job_id=1, arrival_s=0.0, num_gpus=4, model="resnet18", batch_size=BATCH["resnet18"],
                    iterations=1e6, status=JobStatus.RUNNING)
    guests = [JobState(job_id=2 + i, arrival_s=0.0, num_gpus=w, model=m, batch_size=BATCH[m], iterations=1e6)
              for i, (w, m) in enumerate(((1, "resnet50"), (2, "vgg16"), (2, "bert_base"), (4, "lstm_lm")))]
    st = _state(cluster, [host, *guests])
    sched = Jigsaw()
    seen: dict[int, dict] = {}
    layouts = set()
    for trial in range(60):
        nodes = rng.sample(range(cluster.num_nodes), rng.choice([1, 2, 2, 3]))
        free = {k: rng.sample(range(k * gpn, (k + 1) * gpn), gpn) for k in nodes}
        gpus = tuple(free[rng.choice(nodes)].pop() for _ in range(4))
        layouts.add(node_layout(gpus, gpn))
        for guest in guests:
            memo = sched._bounds_of(st, host, gpus, guest.num_gpus)
            bound = pairing_bound(st, host, gpus, guest)
            got = seen.setdefault(id(memo), {}).setdefault((guest.model, guest.batch_size), bound)
            assert got == bound, (gpus, guest.model)
    assert len(seen) < len(layouts) * len(guests) / 2 and len(layouts) > 10


def node_layout(gpus, gpn):
    """Each GPU's node, numbered in order of first appearance."""
    first: dict[int, int] = {}
    return tuple(first.setdefault(g // gpn, len(first)) for g in gpus)


def test_job_decision_memo_returns_equal_immutable_decisions():
    a = job_decision((3, 1), 2, Pattern.STATIC)
    assert a == JobDecision((3, 1), 2, Pattern.STATIC) and job_decision((3, 1), 2, Pattern.STATIC) is a
    assert job_decision((3, 1), 0, Pattern.STATIC) == JobDecision((3, 1), 0)


@settings(max_examples=200, deadline=None)
@given(gpus=hst.lists(hst.integers(0, 63), min_size=1, max_size=8, unique=True),
       level=hst.one_of(hst.integers(0, 4), hst.sampled_from([np.int64(2), np.int32(0), 1.0, True, "2"])),
       pattern=hst.sampled_from([Pattern.ROTATING, Pattern.STATIC, "static", "rotating"]))
def test_trusted_decision_equals_the_checked_constructor(gpus, level, pattern):
    """The ledger's placements build JobDecisions without conversions; for any arguments the
    result is JobDecision's (fields of the same types, equal, same hash), or the same error."""
    try:
        want = JobDecision(tuple(gpus), level, pattern)
    except ValueError as e:
        with pytest.raises(ValueError, match=re.escape(str(e))):
            trusted_decision(tuple(gpus), level, pattern)
        return
    got = trusted_decision(tuple(gpus), level, pattern)
    assert type(got) is JobDecision and got == want and hash(got) == hash(want)
    assert [type(x) for x in (got.level, got.pattern, *got.gpus)] == [type(x) for x in (want.level, want.pattern, *want.gpus)]
    assert (got.gpus, got.level, got.pattern) == (want.gpus, want.level, want.pattern)
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.level = 3


# ------------------------------------------------------------------------------------------------
# whole replays: quiet skipping still changes nothing, on a trace with sharing and preemption
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("agent", ["jigsaw", "tiresias"])
def test_replay_with_and_without_quiet_skipping_is_identical(agent):
    import pandas as pd
    jobs = load_trace("synthetic:jobs=80,load=2.0,seed=3", cluster_gpus=16).jobs
    frames = []
    quiet = []
    for skip in (True, False):
        sim = Simulator(ClusterSpec.from_gpus(16), jobs, SimConfig())
        sim.run(make_scheduler(agent), skip_quiet=skip)
        frames.append((sim.jobs_frame(), sim.rounds_frame(), sim.cluster_frame()))
        quiet.append(sim.quiet_rounds)
    assert quiet[0] > 0 and quiet[1] == 0  # rounds were skipped, and only with skipping on
    for a, b in zip(*frames):
        pd.testing.assert_frame_equal(a, b, check_exact=True)


# ------------------------------------------------------------------------------------------------
# Jigsaw's exclusive pass: per-node free counts against the masks of every GPU it used before
# ------------------------------------------------------------------------------------------------
@given(hst.lists(hst.integers(1, 8), max_size=40), hst.integers(1, 64))
@settings(max_examples=300, deadline=None)
def test_select_by_budget_stops_at_an_empty_budget_as_the_plain_walk_would(widths, gpus):
    from agents.common import select_by_budget

    jobs = [JobState(i, 0.0, n, "resnet50", 32, 1.0) for i, n in enumerate(widths)]
    chosen, rest, budget = [], [], gpus
    for j in jobs:  # the definition: every job whose GPUs still fit, in order
        if j.num_gpus <= budget:
            chosen.append(j)
            budget -= j.num_gpus
        else:
            rest.append(j)
    assert select_by_budget(jobs, gpus) == (chosen, rest)
    assert select_by_budget(iter(jobs), gpus) == (chosen, rest)


@pytest.mark.parametrize("gpn", [1, 2, 4, 8])
def test_consolidated_from_counts_equals_the_mask_rule(gpn):
    rng = random.Random(gpn)
    for _ in range(400):
        nodes = rng.randint(1, 9)
        free = np.array([rng.random() < rng.choice([0.2, 0.5, 0.9]) for _ in range(nodes * gpn)])
        counts = free.reshape(-1, gpn).sum(axis=1).tolist()

        def free_on(k):
            return [g for g in range(k * gpn, k * gpn + gpn) if free[g]]

        for n in range(1, nodes * gpn + 2):
            assert consolidated_from_counts(counts, free_on, n) == consolidated_gpus(free, gpn, n), (free, n)


def _decision_log(sched, jobs, gpus: int) -> list[list]:
    """Every decision ``sched`` returns over a whole replay of ``jobs`` on ``gpus`` GPUs."""
    log = []

    def policy(st):
        d = sched.schedule(st)
        log.append(list(d.items()))
        return d

    Simulator(ClusterSpec.from_gpus(gpus), jobs, SimConfig()).run(policy)
    return log


@pytest.mark.parametrize("gpus,load,seed", [(16, 2.0, 3), (32, 3.0, 7), (64, 2.5, 1)])
def test_jigsaw_exclusive_pass_with_node_counts_decides_as_with_masks(gpus, load, seed):
    jobs = load_trace(f"synthetic:jobs=90,load={load},seed={seed}", cluster_gpus=gpus).jobs
    logs = [_decision_log(cls(), jobs, gpus) for cls in (Jigsaw, MaskJigsaw)]
    assert len(logs[0]) > 100 and logs[0] == logs[1]
    # and the decisions change from round to round (jobs are placed anew, not only kept)
    assert any(len(a) != len(b) or a != b for a, b in zip(logs[0], logs[0][1:]))


@pytest.mark.parametrize("seed", range(150))
def test_jigsaw_exclusive_pass_on_random_states_equals_the_mask_pass(seed):
    # hand-made states a replay rarely reaches: running jobs that share GPUs (in twos and more),
    # spread over nodes they do not need, in a random priority order, beside waiting jobs. The
    # exclusive pass (per-node counts, a running job that stays taking its GPUs in one pass)
    # places the same jobs on the same GPUs, in the same order, and leaves the same jobs, as the
    # pass on masks of every GPU
    from agents.common import select_by_budget

    rng = random.Random(seed)
    cluster = ClusterSpec.from_gpus(32)  # 4 nodes of 8
    jobs = []
    for i in range(rng.randrange(8, 30)):
        n = rng.choice([1, 1, 2, 4, 8])
        model = rng.choice(MODELS)
        gpus = tuple(rng.sample(range(32), n)) if rng.random() < 0.6 else ()
        jobs.append(JobState(job_id=i, arrival_s=0.0, num_gpus=n, model=model, batch_size=BATCH[model],
                             iterations=1e6, status=JobStatus.RUNNING if gpus else JobStatus.PAUSED,
                             placement=gpus))
    st = _state(cluster, jobs)
    order = jobs[:]
    rng.shuffle(order)
    rank = {j.job_id: i for i, j in enumerate(order)}
    out = []
    for cls in (Jigsaw, MaskJigsaw):
        chosen, rest = select_by_budget(order, cluster.num_gpus)
        ledger, left = cls()._exclusive(st, chosen, rest, {}, rank)
        out.append((list(ledger.decision.items()), [j.job_id for j in left]))
    assert out[0] == out[1]


@pytest.mark.parametrize("gpus,load,seed", [(16, 3.0, 1), (8, 2.0, 8)])
def test_host_search_pruned_with_the_restart_discount_decides_as_the_full_search(gpus, load, seed):
    # a paused guest's pairing work is at most the bound x (1 - restart_s / horizon_s): the
    # search that prunes with it decides every round as the one that searches every host (in
    # these scenarios paused guests are searched hundreds of times and some of them pair)
    jobs = load_trace(f"synthetic:jobs=150,load={load},seed={seed}", cluster_gpus=gpus).jobs
    logs, searched = [], []
    for prune in (True, False):
        sched, paused = Jigsaw(), [0]
        sched.prune = prune
        find_host = sched._find_host

        def counted(state, ledger, hosts, hostable, guest, find_host=find_host, paused=paused):
            paused[0] += guest.status is JobStatus.PAUSED
            return find_host(state, ledger, hosts, hostable, guest)

        sched._find_host = counted
        logs.append(_decision_log(sched, jobs, gpus))
        searched.append(paused[0])
    assert logs[0] == logs[1]
    assert searched[0] == searched[1] > 100  # paused guests were looked at, many times


def _every_ledger_is(cls, monkeypatch) -> None:
    """Make every GpuLedger (the simulator's, the schedulers', copies) a ``cls``: the name is
    replaced in each module that holds it (the class itself cannot be patched where the compiled
    build makes it an extension type; jigsaw_env/accel.py)."""
    import sys

    for mod in list(sys.modules.values()):
        if getattr(mod, "GpuLedger", None) is GpuLedger:
            monkeypatch.setattr(mod, "GpuLedger", cls)


@pytest.mark.parametrize("agent", ["tiresias", "srtf+spb", "tiresias+spb", "jigsaw"])
def test_every_add_that_skips_the_ledger_check_would_pass_it(agent, monkeypatch):
    """place_exclusive and Jigsaw's exclusive pass add a running job's own configuration on GPUs
    that hold no worker without the ledger's check (the simulator validated it in force with at
    least these workers on them). Over whole replays -- SPB levels chosen by the +spb wrappers
    and by Jigsaw, co-located pairs, preemptions -- that check returns None for every add made
    with ``checked=True`` or through ``add_alone`` (Jigsaw's pass, which adds every job there),
    wherever it comes from; and ``add_alone`` leaves the ledger ``add`` would."""
    orig, orig_alone = GpuLedger.add, GpuLedger.add_alone
    n = [0]

    def add(self, job_id, jd, checked=False):
        if checked:
            assert self.check(job_id, jd) is None, (agent, job_id, jd)
            n[0] += 1
        return orig(self, job_id, jd, checked)

    def add_alone(self, job_id, jd):
        assert self.check(job_id, jd) is None, (agent, job_id, jd)
        twin = self.copy()
        orig(twin, job_id, jd, True)
        orig_alone(self, job_id, jd)
        assert (self._ml, self._wl, self._wc, list(self.decision.items())) == \
            (twin._ml, twin._wl, twin._wc, list(twin.decision.items())), (agent, job_id, jd)
        n[0] += 1

    _every_ledger_is(type("CheckedLedger", (GpuLedger,), {"add": add, "add_alone": add_alone}), monkeypatch)
    levels = 0
    for gpus, load, seed in ((16, 2.5, 5), (32, 3.0, 2)):
        jobs = load_trace(f"synthetic:jobs=70,load={load},seed={seed}", cluster_gpus=gpus).jobs
        sim = Simulator(ClusterSpec.from_gpus(gpus), jobs, SimConfig())
        sched = make_scheduler(agent)

        def policy(st, sched=sched):
            nonlocal levels
            levels += sum(j.level > 0 for j in st.running())
            return sched.schedule(st)

        assert sim.run(policy)["jobs_completed"] == 70
        assert type(sim.in_force_ledger()).__name__ == "CheckedLedger"
    assert n[0] > 200
    assert (levels > 0) == (agent != "tiresias")  # kept configurations include SPB levels


@pytest.mark.parametrize("gpus,load,seed", [(8, 3.0, 2), (8, 2.0, 8)])
def test_jigsaw_exclusive_set_holds_its_gpus_alone(gpus, load, seed):
    """Every job the exclusive pass places holds each of its GPUs alone (so every one of them
    may host a guest: schedule() takes the whole set as hostable without looking at the GPUs)."""
    sched = Jigsaw()
    exclusive = sched._exclusive
    seen = [0, 0]

    def checked(state, chosen, rest, pairs, rank, settled=None):
        ledger, left = exclusive(state, chosen, rest, pairs, rank, settled)
        for jid, jd in ledger.decision.items():
            assert all(ledger._wl[g] == 1 for g in jd.gpus), (jid, jd)
        seen[0] += len(ledger.decision)
        seen[1] += bool(pairs)
        return ledger, left

    sched._exclusive = checked
    n = 90 if seed == 2 else 150
    jobs = load_trace(f"synthetic:jobs={n},load={load},seed={seed}", cluster_gpus=gpus).jobs
    Simulator(ClusterSpec.from_gpus(gpus), jobs, SimConfig()).run(sched.schedule)
    assert seen[0] > 300 and seen[1] >= 4  # pairs were running when some of the calls came


@pytest.mark.parametrize("width,hysteresis", [(1, 0.0), (2, 0.0), (4, 0.01)])
def test_jigsaw_staying_job_is_skipped_by_rule_2_only_when_rule_2_keeps_its_configuration(width, hysteresis):
    # the exclusive pass marks a running job that stays "settled" (rule 2 then skips it) only
    # when rule 2 keeps its configuration there: a job left at another one (a dissolved pair's,
    # say) gets rule 2's, in the round the configuration is first met and again from the memo;
    # a job at rule 2's keeps its decision object
    cluster = ClusterSpec.from_gpus(16)
    job = JobState(0, 0.0, width, "resnet50", BATCH["resnet50"], 1e6)
    st = _state(cluster, [job])
    gpus = tuple(range(width))
    sched = Jigsaw(hysteresis=hysteresis)
    changed = 0
    for cfg in spb_configs(st, job):
        want = best_solo(st, job, gpus, cfg, hysteresis)[0]
        changed += want != cfg
        job.status, job.placement, job.level, job.pattern = JobStatus.RUNNING, gpus, *cfg
        for _ in range(2):
            got = sched.schedule(st)[0]
            assert got.gpus == gpus and (got.level, got.pattern) == want, (cfg, want, got)
            if want == cfg:
                assert got is job_decision(gpus, *cfg)
    assert changed >= 2


def test_jigsaw_rule2_memo_answers_only_for_the_same_decision_job_and_running_state():
    # Jigsaw keeps rule 2's choice per job (its "solo" memo) for the JobDecision object, JobState and
    # "runs on these GPUs now" it was computed for: a running job that keeps its configuration keeps
    # it under hysteresis; the same decision object for a paused job, or another configuration,
    # asks best_solo again. Every answer equals best_solo's, computed fresh.
    cluster = ClusterSpec.from_gpus(16)
    job = JobState(0, 0.0, 1, "resnet50", BATCH["resnet50"], 1e6)
    st = _state(cluster, [job])
    sched = Jigsaw(hysteresis=10.0)  # a running job keeps any configuration
    solo = sched._job_memo(st, "solo")
    best = best_solo(st, job, (0,), None, 0.0)[0]
    others = [c for c in spb_configs(st, job) if c != best]
    assert len(others) >= 2

    def check(jd, want):
        keeps = job.status is JobStatus.RUNNING and jd.gpus == job.placement
        fresh = best_solo(st, job, jd.gpus, (jd.level, jd.pattern) if keeps else None, 10.0)[0]
        # the scheduler's own pass over its ledger (the memo looked up inline), then the memo's
        # function, each finding the memo as the last call left it
        ledger = GpuLedger(st)
        ledger.add(0, jd)
        sched._solo_levels(st, ledger, {0})  # a paired job is left as it is
        assert ledger.decision[0] is jd
        sched._solo_levels(st, ledger, set())
        got = ledger.decision[0]
        assert (got.level, got.pattern) == fresh == want and got.gpus == jd.gpus
        assert sched._solo_config(st, solo, jd, job) == fresh

    first = job_decision((0,), *others[0])
    job.status, job.placement, job.level, job.pattern = JobStatus.RUNNING, (0,), *others[0]
    check(first, others[0])  # kept under hysteresis
    check(first, others[0])  # from the memo
    job.status, job.placement = JobStatus.PAUSED, ()
    check(first, best)  # the same decision object, but the job no longer runs there
    job.status, job.placement, job.level, job.pattern = JobStatus.RUNNING, (0,), *others[1]
    check(job_decision((0,), *others[1]), others[1])  # another configuration, kept
    check(job_decision((1,), *others[1]), best)  # other GPUs: it would move
    check(first, others[0])  # the first decision again, the job running on its GPUs: kept
    check(job_decision((0,), *others[1]), others[1])  # another decision, same running state: its own
    # a new episode's job 0 (another model) under the very decision object, neither running
    job.status, job.placement = JobStatus.PAUSED, ()
    check(first, best)
    # (transformer_small: full backprop is its best alone, resnet50's is SPB level 3)
    job = dataclasses.replace(job, model="transformer_small", batch_size=BATCH["transformer_small"])
    st.jobs[0] = job
    best_other = best_solo(st, job, (0,), None, 0.0)[0]
    assert best_other != best
    check(first, best_other)


def test_jigsaw_kept_pair_memo_answers_only_for_the_same_pair_state():
    # Jigsaw keeps a running pair's plan per guest (_keep_pair's "keep" memo) for the host and guest
    # objects, GPUs, configurations and phase difference it was found for. A walk that changes one
    # of the guest's GPUs, the host's level, the guest's level or the guest's phase at each step:
    # every answer equals that of a Jigsaw with no memo
    cluster = ClusterSpec.from_gpus(16)
    host = JobState(0, 0.0, 4, "vgg16", BATCH["vgg16"], 1e6)
    guest = JobState(1, 0.0, 1, "resnet50", BATCH["resnet50"], 1e6)
    st = _state(cluster, [host, guest])
    for j in (host, guest):
        j.status = JobStatus.RUNNING
    host.placement, guest.placement = (0, 1, 2, 3), (1,)
    host.level, guest.level = 2, 2
    # keep every pair (the plan itself is compared) at its current configurations (hysteresis):
    # the levels and, at levels 2 and 3, the phases change its value
    knobs = dict(keep_margin=-1.0, hysteresis=10.0)
    sched = Jigsaw(**knobs)
    rng = random.Random(5)
    values, changed = set(), {"gpus": 0, "host level": 0, "guest level": 0, "phase": 0}
    for _ in range(240):
        what = rng.choice(sorted(changed))
        if what == "gpus":
            guest.placement = (rng.choice([g for g in host.placement if g != guest.placement[0]]),)
        elif what == "host level":
            host.level = rng.choice([lv for lv in (1, 2, 3) if lv != host.level])
        elif what == "guest level":
            guest.level = 3 - guest.level
        else:
            guest.iteration = rng.choice([i for i in range(12) if i != guest.iteration])
        changed[what] += 1
        ledger = GpuLedger(st)
        ledger.add(0, JobDecision(host.placement, host.level, host.pattern), checked=True)
        sched._hosts = {}
        got = sched._keep_pair(st, ledger, host, guest)
        fresh = Jigsaw(**knobs)._keep_pair(st, ledger, host, guest)
        assert got == fresh and got is not None, (what, host.level, guest.level, guest.iteration, guest.placement)
        values.add(got.value)
    assert min(changed.values()) > 40 and len(values) > 12, (changed, len(values))  # many distinct plans


def test_ledgers_sharing_a_peak_memo_equal_fresh_ledgers(monkeypatch):
    # GpuLedger(peak_memo=) keeps peak_list's memo across ledgers (Jigsaw keeps one across calls):
    # an entry answers only for the job and JobDecision objects it was made for, so another
    # decision of the same job, or a new episode's job object, gets its own peaks
    cluster = ClusterSpec.from_gpus(16)
    job = JobState(0, 0.0, 2, "vgg16", BATCH["vgg16"], 1e6, status=JobStatus.QUEUED)
    st = _state(cluster, [job])
    memo: dict = {}
    asked = [0]
    peak_list = st.costs.peak_list

    def counted(*a):
        asked[0] += 1
        return peak_list(*a)

    monkeypatch.setattr(st.costs, "peak_list", counted)
    decisions = [job_decision((0, 1), 0, Pattern.ROTATING), job_decision((0, 1), 3, Pattern.STATIC),
                 job_decision((2, 9), 3, Pattern.STATIC)]
    for jd in decisions + decisions:
        shared, fresh = GpuLedger(st, peak_memo=memo), GpuLedger(st)
        shared.add(0, jd)
        fresh.add(0, jd)
        assert shared._ml == fresh._ml and shared._wl == fresh._wl
        np.testing.assert_array_equal(shared.mem, fresh.mem)
    assert len({tuple(GpuLedger(st, {0: jd}).mem.tolist()) for jd in decisions}) == 3  # peaks differ
    twin = dataclasses.replace(job)  # a new episode's object for the same job
    st.jobs[0] = twin
    n = asked[0]
    GpuLedger(st, peak_memo=memo).add(0, decisions[-1])
    assert asked[0] > n  # asked afresh for the new object


def test_ledger_arrays_follow_every_update_once_read_and_are_made_only_when_read():
    # GpuLedger keeps its per-GPU values in lists; mem / workers are numpy arrays made on the
    # first read and written by every update after it. Whichever way it is read (never, early,
    # late, through a copy), the arrays equal the lists after each add, remove and restore, and
    # they are read-only to their readers
    cluster = ClusterSpec.from_gpus(16)
    jobs = [JobState(i, 0.0, w, m, BATCH[m], 1e6, status=JobStatus.QUEUED)
            for i, (w, m) in enumerate([(2, "vgg16"), (4, "resnet50"), (1, "bert_base"), (2, "lstm_lm")])]
    st = _state(cluster, jobs)
    st.max_workers_per_gpu = 2
    steps = [("add", 0, job_decision((0, 1), 0, Pattern.ROTATING)), ("add", 1, job_decision((1, 2, 3, 8), 2, Pattern.STATIC)),
             ("add", 2, job_decision((8,), 0, Pattern.ROTATING)), ("remove", 1, None),
             ("add", 3, job_decision((0, 15), 1, Pattern.ROTATING)), ("restore", 0, None), ("remove", 2, None)]

    def run(read_at: set[int], copy_at: int | None):
        led = GpuLedger(st)
        for i, (what, jid, jd) in enumerate(steps):
            if i == copy_at:
                led = led.copy()
            if what == "add":
                led.add(jid, jd)
            elif what == "remove":
                led.remove(jid)
            else:  # a remove undone
                snap = led.snapshot(jid)
                led.remove(jid)
                led.restore(jid, snap)
            if i in read_at:
                assert led.mem.tolist() == led._ml and led.workers.tolist() == led._wl, (read_at, copy_at, i)
        assert (led._mem is None) == (not read_at)  # arrays exist only once read
        return led._ml, led._wl, led.mem.tolist(), led.workers.tolist()

    plain = run(set(range(len(steps))), None)
    assert plain[0] == plain[2] and plain[1] == plain[3] and sum(plain[1]) == 2 + 2  # jobs 0 and 3 remain
    for read_at in (set(), {0}, {3}, {6}, {1, 5}):
        for copy_at in (None, 2, 4):
            assert run(read_at, copy_at) == plain, (read_at, copy_at)
    led = GpuLedger(st, {0: steps[0][2]})
    assert led.workers.tolist()[:2] == [1, 1]  # read before the copy: both then hold arrays
    twin = led.copy()
    twin.add(2, job_decision((0,), 0, Pattern.ROTATING))
    assert led.workers.tolist()[:2] == [1, 1] and twin.workers.tolist()[:2] == [2, 1]  # independent copies
    for arr in (led.mem, led.workers):
        with pytest.raises(ValueError):
            arr[0] = 5
    assert led._wl[0] == 1
    # deep copies and pickles (Simulator.copy, worker processes) follow their own updates too
    import copy
    import pickle
    for twin in (copy.deepcopy(led), pickle.loads(pickle.dumps(led))):
        twin.add(2, job_decision((5,), 0, Pattern.ROTATING))
        assert twin.workers.tolist() == twin._wl and twin.mem.tolist() == twin._ml and twin._wl[5] == 1
    assert led._wl[5] == 0 and led.workers.tolist() == led._wl


def test_add_alone_equals_a_checked_add_and_refuses_gpus_with_workers():
    cluster = ClusterSpec.from_gpus(16)
    jobs = [JobState(i, 0.0, w, m, BATCH[m], 1e6, status=JobStatus.QUEUED)
            for i, (w, m) in enumerate([(2, "vgg16"), (4, "resnet50"), (1, "bert_base")])]
    st = _state(cluster, jobs)
    st.max_workers_per_gpu = 2
    decisions = [job_decision((3, 1), 2, Pattern.STATIC), job_decision((8, 9, 10, 12), 0, Pattern.ROTATING),
                 job_decision((0,), 1, Pattern.ROTATING)]
    for read_arrays in (False, True):
        a, b = GpuLedger(st), GpuLedger(st)
        if read_arrays:  # arrays exist: both paths write them too
            a.mem, b.mem
        for jid, jd in enumerate(decisions):
            a.add(jid, jd, checked=True)
            b.add_alone(jid, jd)
            assert (a._ml, a._wl, a._wc, list(a.decision.items())) == (b._ml, b._wl, b._wc, list(b.decision.items()))
            assert a.mem.tolist() == b.mem.tolist() == b._ml and b.workers.tolist() == b._wl
    before = (b._ml.copy(), b._wl.copy(), b._wc.copy(), dict(b.decision))
    st.jobs[3] = JobState(3, 0.0, 2, "resnet18", BATCH["resnet18"], 1e6, status=JobStatus.QUEUED)
    st.active_ids.append(3)
    with pytest.raises(ValueError, match=r"job 3: add_alone needs GPUs without workers, \[1\] hold some"):
        b.add_alone(3, job_decision((1, 2), 0, Pattern.ROTATING))
    assert (b._ml, b._wl, b._wc, dict(b.decision)) == before


@pytest.mark.parametrize("mixed", [False, True])
def test_order_signatures_from_the_layout_equal_each_orders_own_signature(mixed):
    # pairing_layout reads each guest order's placement signature from the host's node layout
    # (common.order_signatures, cached per layout): on hosts over one to four nodes, in any worker
    # order, it must equal placement_sig of the order's own GPU tuple
    if mixed:
        cluster = ClusterSpec(num_nodes=4, gpus_per_node=4, gpu_types=("v100", "p100", "v100", "k80"))
    else:
        cluster = ClusterSpec.from_gpus(16, gpus_per_node=4)
    st = _state(cluster, [])
    rng = random.Random(11 + mixed)
    crossing = set()
    for _ in range(300):
        host = tuple(rng.sample(range(16), rng.choice([1, 2, 4, 6, 8])))
        wb = rng.randint(1, len(host))
        sig, _ = host_layout(st, host)
        got = order_signatures(st, sig[0], sig[1], wb)
        want = tuple(placement_sig(st, tuple(host[c] for c in o)) for o in guest_orders(len(host), wb))
        assert got == want, (host, wb)
        crossing.update(x[1] for x in got)
    assert crossing == {False, True}
