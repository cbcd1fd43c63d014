"""Known-answer tests of the heuristic schedulers (agents/), on hand-built toy worlds.

Toy world (tests/conftest.py): TOY4 has compute by start group c = [11, 9, 7, 5] s, 1000 parameter
bytes per group, activations 1 GiB per group and 1 GiB fixed memory (a full-depth worker peaks at
5 GiB, one starting at group s at 5 - s GiB). TOY4C is TOY4 without parameters (no sync). One
node's link moves 1000 B/s with no latency, so a 2-worker TOY4 job syncs 4 x 1 s per iteration:
its dedicated level-0 step is 11 + 4 = 15 s.
"""
from __future__ import annotations

import types

import numpy as np
import pandas as pd
import pytest

from conftest import BS, TOY3, TOY4, TOY4C, toy_cluster
from agents import available_schedulers, make_scheduler
from agents.common import LASQueues, best_pairing, best_solo, guest_orders, select_by_budget
from agents.jigsaw import guest_keeps_its_order
from jigsaw_env.placement import GpuLedger, validate_decision
from jigsaw_env.simulator import SimConfig, Simulator
from jigsaw_env.spb import Pattern, SPBConfig
from jigsaw_env.state import ClusterState, CostModel, JobState, JobStatus

ALL = ["fifo", "srtf", "tiresias", "gandiva", "jigsaw", "jigsaw-srtf", "jigsaw-spill", "jigsaw-srtf-spill", "random",
       "fifo+spb", "srtf+spb", "tiresias+spb", "gandiva+spb"]


def job(jid, gpus, iters, arrival=0.0, model=TOY4):
    return JobState(jid, arrival, gpus, model, BS, float(iters))


def step_until(sim, agent, t, decisions=None):
    """Run ``agent`` until simulated time ``t`` (the next decision is then taken at ``t``)."""
    while sim.state.time_s < t - 1e-9 and not sim.done:
        d = agent.schedule(sim.state)
        if decisions is not None:
            decisions.append((sim.state.time_s, d))
        sim.step(d)


def run_to_end(sim, agent, max_rounds=20_000, check=None):
    agent.reset()
    for _ in range(max_rounds):
        if sim.done:
            return sim
        d = agent.schedule(sim.state)
        validate_decision(sim.state, d)  # the simulator validates too; this names the agent's round
        if check is not None:
            check(sim.state, d)
        sim.step(d)
    raise AssertionError(f"{agent.name} did not finish in {max_rounds} rounds")


# ------------------------------------------------------------------------------------------------
def test_registry_names_every_heuristic():
    names = available_schedulers()
    for n in ALL:
        assert n in names
        assert make_scheduler(n).name == n
    with pytest.raises(ValueError, match="allowed"):
        make_scheduler("no-such-agent")


# ------------------------------------------------------------------------------------------------ SRTF
def test_srtf_runs_the_shorter_job_first_and_preempts_for_a_shorter_arrival():
    # one node of 2 GPUs; every job wants both. A: 100 iterations x 15 s = 1500 s; B: 10 x 15 = 150 s;
    # D arrives at 200 s with 3 iterations (45 s) while A (about 1450 s left) runs.
    sim = Simulator(toy_cluster(2, 2), [job(1, 2, 100), job(2, 2, 10), job(3, 2, 3, arrival=200.0)],
                    SimConfig(round_s=60.0, restart_s=0.0))
    srtf = make_scheduler("srtf")
    d0 = srtf.schedule(sim.state)
    assert list(d0) == [2]                      # the shorter job goes first
    run_to_end(sim, srtf)
    jf = sim.jobs_frame().set_index("job_id")
    assert jf.loc[2, "finish_s"] < jf.loc[3, "finish_s"] < jf.loc[1, "finish_s"]
    assert jf.loc[1, "preemptions"] == 1        # D preempted A at the first round boundary after 200 s
    assert jf.loc[3, "start_s"] == pytest.approx(240.0)


# ------------------------------------------------------------------------------------------------ Tiresias
def test_tiresias_demotes_past_its_threshold_and_a_new_job_preempts_the_demoted_one():
    # threshold 600 GPU-s: a 2-GPU job passes it after 300 s of running
    sim = Simulator(toy_cluster(2, 2), [job(1, 2, 100), job(2, 2, 100, arrival=400.0)],
                    SimConfig(round_s=100.0, restart_s=0.0))
    tir = make_scheduler("tiresias", thresholds=[600.0])
    tir.reset()
    A = sim.state.jobs[1]
    step_until(sim, tir, 200.0)
    assert tir.las.queue_of(A) == 0 and A.attained_gpu_s == pytest.approx(400.0)
    step_until(sim, tir, 300.0)
    assert A.attained_gpu_s == pytest.approx(600.0) and tir.las.queue_of(A) == 1   # demoted
    assert list(tir.schedule(sim.state)) == [1]   # alone, the demoted job keeps running
    step_until(sim, tir, 400.0)
    B = sim.state.jobs[2]
    assert B.status is JobStatus.QUEUED and tir.las.queue_of(B) == 0
    d = tir.schedule(sim.state)
    assert list(d) == [2]                         # the new (queue 0) job preempts the demoted one
    sim.step(d)
    step_until(sim, tir, 700.0)
    assert tir.las.queue_of(B) == 1               # B passed 600 GPU-s too: FIFO inside queue 1
    assert list(tir.schedule(sim.state)) == [1]   # A arrived first
    run_to_end(sim, tir)
    assert sim.state.jobs[1].preemptions >= 1


def test_las_starvation_guard_promotes_a_job_that_waited_too_long():
    las = LASQueues(thresholds=(100.0,), starve_factor=2.0)
    j = JobState(7, 0.0, 1, TOY4, BS, 10.0)
    st = types.SimpleNamespace(time_s=0.0, active_ids=[7], active=lambda: [j])
    j.status, j.attained_gpu_s = JobStatus.RUNNING, 0.0
    las.observe(st)
    st.time_s, j.status, j.attained_gpu_s = 300.0, JobStatus.PAUSED, 300.0   # ran 300 s, preempted
    las.observe(st)
    assert las.queue_of(j) == 1
    st.time_s = 800.0                              # waited 500 s < 2 x 300 s
    las.observe(st)
    assert las.queue_of(j) == 1
    st.time_s = 900.0                              # waited 600 s = 2 x its last run: promoted
    las.observe(st)
    assert las.queue_of(j) == 0 and las.promotions == 1
    off = LASQueues(thresholds=(100.0,), starve_factor=None)
    off.observe(types.SimpleNamespace(time_s=10_000.0, active_ids=[7], active=lambda: [j]))
    assert off.queue_of(j) == 1


def test_the_observation_shows_the_queue_tiresias_and_jigsaw_serve():
    """Parity: features 19-21 of the observation are the queue of the ``tiresias`` scheduler
    asked every round of the same run, and feature 24 its run set, starvation promotions included (3 long 2-GPU jobs on 4
    GPUs, 300-s rounds: jobs pass the 3600 GPU-s threshold, wait, and get promoted)."""
    import math

    from jigsaw_env.encoder import JOB_FEATURES, ObservationEncoder

    sim = Simulator(toy_cluster(), [job(i, 2, 1e7, arrival=100.0 * i) for i in range(3)], SimConfig(round_s=300.0))
    tir = make_scheduler("tiresias")
    enc = ObservationEncoder(4)
    checked = took = 0
    for _ in range(400):
        st = sim.state
        d = tir.schedule(st)
        ids = list(st.active_ids)
        obs = enc.encode(st, ids, sim.in_force_ledger(), set())
        run_set = {j.job_id for j in select_by_budget(tir.las.order(st.active()), st.cluster.num_gpus)[0]}
        took += len(run_set) < len(ids)
        for slot, jid in enumerate(ids):
            j = st.jobs[jid]
            q, service, starve = tir.las.job_features(j, st.time_s)
            assert q == tir.las.queue_of(j)
            got = obs[slot * JOB_FEATURES + 19: slot * JOB_FEATURES + 22]
            assert got == pytest.approx((q, math.log1p(service) / 20, starve), abs=1e-6)
            # feature 24: in the run set tiresias picks by its queue (select_by_budget)
            assert obs[slot * JOB_FEATURES + 24] == (jid in run_set)
            checked += 1
        sim.step(d)
    assert tir.las.promotions >= 3 and enc._las.promotions == tir.las.promotions
    assert checked > 1000 and took > 100  # rounds where the run set leaves a job out


# ------------------------------------------------------------------------------------------------ Gandiva
def test_gandiva_packs_when_no_exclusive_gpu_is_free_and_unpacks_when_one_frees():
    # 4 GPUs, time-sliced. A (long) and C (10 iterations, 150 s) take both halves; B has no
    # exclusive GPUs. Packing B on A: lockstep step = 11 + 11 of compute + 4 + 4 of sync (both sync
    # over the node's fabric, eq. L1) = 30 s against 15 s alone, so the pair does 2 x (2 x 15/30)
    # = 2 dedicated-GPU equivalents where A alone did 2: ratio 1, which Gandiva accepts.
    # B arrives at 1 s, so A and C start first (round at 0 s); B is decided at 60 s
    sim = Simulator(toy_cluster(4, 4), [job(1, 2, 1000), job(3, 2, 10), job(2, 2, 50, arrival=1.0)],
                    SimConfig(round_s=60.0, restart_s=10.0, sharing="timeslice"))
    gan = make_scheduler("gandiva")
    gan.reset()
    fifo = make_scheduler("fifo")
    step_until(sim, gan, 60.0)
    d = gan.schedule(sim.state)
    assert set(d) == {1, 2, 3}
    assert set(d[2].gpus) == set(d[1].gpus)       # B packed onto A (the earliest host)
    assert d[2].level == 0 and d[1].level == 0    # Gandiva never uses SPB
    assert 2 not in fifo.schedule(sim.state)      # FIFO would leave B waiting
    sim.step(d)
    step_until(sim, gan, 180.0)                   # C finished at 150 s
    d = gan.schedule(sim.state)
    assert set(d[2].gpus) == {2, 3}               # B unpacked onto the GPUs C freed
    sim.step(d)
    assert sim.state.jobs[2].migrations == 1
    run_to_end(sim, gan)


def test_gandiva_does_not_pack_past_memory():
    # 8 GiB GPUs: two full-depth TOY4 workers need 10 GiB; Gandiva has no SPB to shrink them
    sim = Simulator(toy_cluster(4, 4, gpu_memory_gib=8), [job(1, 4, 100), job(2, 4, 100, arrival=1.0)],
                    SimConfig(round_s=60.0))
    gan = make_scheduler("gandiva")
    step_until(sim, gan, 60.0)
    assert list(gan.schedule(sim.state)) == [1]


# ------------------------------------------------------------------------------------------------ Jigsaw
def test_jigsaw_colocates_two_spb_jobs_that_do_not_fit_without_spb():
    # 4 GPUs of 8 GiB, two 4-GPU TOY4C jobs. Full depth a worker peaks at 5 GiB: two on one GPU need
    # 10 GiB > 8, so FIFO/Tiresias/Gandiva run one job at a time. Level 3 static keeps worker w at
    # start group w: peaks 5, 4, 3, 2 GiB; with the second job's workers in reverse order every GPU
    # holds 5 + 2 = 4 + 3 = 7 GiB. Compute per GPU: 11 + 5 = 9 + 7 = 16 s every step, against 11 s
    # alone; eta 0.8125, so each job does 0.8125 x 11/16 = 0.56 of its dedicated speed: 1.12 together.
    jobs = [job(1, 4, 100, model=TOY4C), job(2, 4, 100, model=TOY4C)]
    cl = toy_cluster(4, 4, gpu_memory_gib=8)
    sim = Simulator(cl, jobs, SimConfig(round_s=60.0, sharing="timeslice", pace="lockstep"))
    for name in ("fifo", "tiresias", "gandiva"):
        assert list(make_scheduler(name).schedule(sim.state)) == [1]
    jig = make_scheduler("jigsaw")
    d = jig.schedule(sim.state)
    validate_decision(sim.state, d)
    assert set(d) == {1, 2}
    assert set(d[1].gpus) == set(d[2].gpus) == {0, 1, 2, 3}
    assert d[1].level > 0 and d[2].level > 0
    assert d[1].pattern is Pattern.STATIC and d[2].pattern is Pattern.STATIC
    assert d[2].gpus == tuple(reversed(d[1].gpus))   # full-depth worker beside the lightest one
    # and it pays: both finish after ceil(100 / 0.8125) = 124 steps x 16 s = 1984 s; FIFO runs them
    # one after the other: 1100 s, then the next round boundary (1140 s) + 1100 s
    run_to_end(sim, jig)
    fifo = Simulator(cl, jobs, SimConfig(round_s=60.0, sharing="timeslice", pace="lockstep"))
    run_to_end(fifo, make_scheduler("fifo"))
    assert sim.metrics()["makespan_s"] == pytest.approx(1984.0)
    assert fifo.metrics()["makespan_s"] == pytest.approx(2240.0)


def test_jigsaw_level_rule_single_gpu_gains_dedicated_multi_gpu_rotating_does_not():
    # one worker at level 3 rotating cycles through starts 0..3: mean compute (11+9+7+5)/4 = 8 s,
    # eta = 1 - 0.5 x 1.5/4 = 0.8125 -> 0.8125 x 11/8 = 1.117 of full backprop's progress per second.
    # Four workers, rotating: some worker is at full depth every iteration, step stays 11 s, so SPB
    # only loses eta: level 0.
    sim = Simulator(toy_cluster(8, 4), [job(1, 1, 100, model=TOY4C), job(2, 4, 100, model=TOY4C)],
                    SimConfig(round_s=60.0))
    st = sim.state
    cfg, x = best_solo(st, st.jobs[1], (0,))
    assert cfg == (3, Pattern.ROTATING) and x == pytest.approx(0.8125 * 11 / 8)
    cfg, x = best_solo(st, st.jobs[2], (4, 5, 6, 7))
    assert cfg == (0, Pattern.ROTATING) and x == pytest.approx(1.0)
    d = make_scheduler("jigsaw").schedule(st)
    assert (d[1].level, d[1].pattern) == (3, Pattern.ROTATING) and d[2].level == 0


def _fitting_candidates(st, host, guest, hg: tuple):
    """Every (guest order, guest GPUs, host profile, guest profile) of an exhaustive pairing search
    of ``guest`` on ``host``'s GPUs ``hg`` that the simulator's GpuLedger lets fit in memory."""
    from jigsaw_env.placement import GpuLedger
    from jigsaw_env.state import JobDecision
    from agents.common import spb_configs

    for hc in spb_configs(st, host):
        for gc in spb_configs(st, guest):
            for o in guest_orders(len(hg), guest.num_gpus):
                gg = tuple(hg[i] for i in o)
                led = GpuLedger(st)
                led.add(host.job_id, JobDecision(hg, *hc))
                if led.fits(guest.job_id, JobDecision(gg, *gc)):
                    yield o, gg, st.costs.profile(host, *hc, hg), st.costs.profile(guest, *gc, gg)


@pytest.mark.parametrize("sharing", ["fitted", "timeslice"])
@pytest.mark.parametrize("guest_model,guest_gpus,mem_gib", [(TOY3, 2, 16), (TOY4, 4, 8), (TOY4C, 1, 16)])
def test_best_pairing_is_the_exhaustive_optimum_as_the_engine_times_it(guest_model, guest_gpus, mem_gib, sharing):
    # the pruned search returns the best (host config, guest config, worker order) of an exhaustive
    # search in which every candidate is timed by the engine's own Component (with the simulator's
    # sharing of GPUs and links) and memory-checked by the simulator's GpuLedger
    from jigsaw_env.engine import Component, Member

    sim = Simulator(toy_cluster(4, 4, gpu_memory_gib=mem_gib),
                    [job(1, 4, 100), job(2, guest_gpus, 100, model=guest_model)],
                    SimConfig(sharing=sharing, pace="lockstep"))
    st = sim.state
    host, guest = st.jobs[1], st.jobs[2]
    host.iteration, guest.iteration = 5, 2
    hg = (0, 1, 2, 3)
    iso = st.costs.isolated_iteration_s
    best = -1.0
    for o, gg, ph, pg in _fitting_candidates(st, host, guest, hg):
        comp = Component([Member(1, ph, hg, 5), Member(2, pg, gg, 2)], 0.0, sharing=st.sharing)
        step = comp.cycle / comp.H
        best = max(best, 4 * ph.eta * iso(host) / step + guest_gpus * pg.eta * iso(guest) / step)
    plan = best_pairing(st, host, hg, guest)
    assert plan is not None and plan.value == pytest.approx(best, rel=1e-12)
    comp = Component([Member(1, st.costs.profile(host, *plan.host_cfg, hg), hg, 5),
                      Member(2, st.costs.profile(guest, *plan.guest_cfg, plan.guest_gpus), plan.guest_gpus, 2)], 0.0,
                     sharing=st.sharing)
    assert plan.step_s == pytest.approx(comp.cycle / comp.H, rel=1e-12)


@pytest.mark.parametrize("sharing", ["fitted", "timeslice"])
@pytest.mark.parametrize("guest_model,guest_gpus,mem_gib", [(TOY3, 2, 16), (TOY4, 4, 8), (TOY4C, 1, 16)])
def test_best_pairing_is_the_exhaustive_optimum_of_the_free_pace_estimate(guest_model, guest_gpus, mem_gib, sharing):
    # under the free pace the pruned search (its bound, jigsaw_env.pairing.free_value_bound) returns
    # the best candidate of an exhaustive search scoring every order alone with the one-step estimate,
    # memory-checked by the simulator's GpuLedger; the phases do not enter
    from jigsaw_env.pairing import _free_candidate_values

    sim = Simulator(toy_cluster(4, 4, gpu_memory_gib=mem_gib),
                    [job(1, 4, 100), job(2, guest_gpus, 100, model=guest_model)], SimConfig(sharing=sharing))
    st = sim.state
    host, guest = st.jobs[1], st.jobs[2]
    hg = (0, 1, 2, 3)
    iso = st.costs.isolated_iteration_s
    cap = np.full(4, np.inf)
    best = -1.0
    for o, gg, ph, pg in _fitting_candidates(st, host, guest, hg):
        values, _, _ = _free_candidate_values(st, hg, np.array([o]), cap, ph, pg, 4 * ph.eta * iso(host),
                                              guest_gpus * pg.eta * iso(guest))
        best = max(best, float(values[0]))
    plan = best_pairing(st, host, hg, guest)
    assert plan is not None and plan.value == pytest.approx(best, rel=1e-12)
    host.iteration, guest.iteration = 5, 2
    assert best_pairing(st, host, hg, guest) == plan


# ------------------------------------------------------------------------------------------------ all
def _toy_trace(n=20, seed=3) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "job_id": np.arange(n),
        "arrival_s": np.sort(rng.uniform(0, 1500, n)).round(1),
        "num_gpus": rng.choice([1, 1, 1, 2, 4], n),
        "model": rng.choice([TOY4, TOY4C, TOY3], n),
        "batch_size": BS,
        "iterations": rng.integers(20, 150, n).astype(float),
    })


@pytest.fixture(scope="module")
def toy_trace():
    return _toy_trace()


@pytest.mark.parametrize("name", ALL)
def test_every_heuristic_completes_every_job_with_valid_decisions(name, toy_trace):
    cl = toy_cluster(8, 4, gpu_memory_gib=8)
    sim = Simulator(cl, toy_trace, SimConfig(round_s=60.0, restart_s=10.0))
    agent = make_scheduler(name)
    seen = {"spb": 0, "shared": 0}

    def check(state, d):
        if name.endswith("+spb"):
            base = agent.last_base_decision
            assert {j: jd.gpus for j, jd in d.items()} == {j: jd.gpus for j, jd in base.items()}
        seen["spb"] += sum(jd.level > 0 for jd in d.values())
        gpus = [g for jd in d.values() for g in jd.gpus]
        seen["shared"] += len(gpus) - len(set(gpus))

    run_to_end(sim, agent, check=check)
    jf = sim.jobs_frame()
    assert (jf["status"] == "done").all()
    if name in ("fifo", "srtf", "tiresias", "gandiva"):
        assert seen["spb"] == 0
    if name.endswith("+spb") or name == "jigsaw":
        assert seen["spb"] > 0          # single-GPU TOY4/TOY4C jobs gain from SPB alone
    if name in ("fifo", "srtf", "tiresias", "fifo+spb", "srtf+spb", "tiresias+spb"):
        assert seen["shared"] == 0      # exclusive GPUs only


def test_random_is_seeded(toy_trace):
    def run(seed):
        sim = Simulator(toy_cluster(8, 4), toy_trace.head(8), SimConfig(round_s=60.0))
        run_to_end(sim, make_scheduler("random", seed=seed))
        return sim.jobs_frame()["finish_s"].tolist()

    assert run(1) == run(1)
    assert run(1) != run(2)  # the seed drives its choices


def test_a_running_guest_keeps_its_worker_order_when_the_pair_can_be_mirrored_onto_it():
    """Two 4-GPU jobs on 8 GPUs (nodes of 4): a new host takes GPUs 0-3, where the guest runs in
    natural order, and the pairing puts the guest on them reversed. The same worker pairs go on
    the guest's order (host worker i beside guest worker 3 - i): host (3, 2, 1, 0), guest
    (0, 1, 2, 3), so the guest does not migrate. Nothing moves when the host keeps its own
    placement, when a pair would change node, or when the guest runs on other GPUs."""
    cluster = toy_cluster(8, gpus_per_node=4)
    host = JobState(job_id=1, arrival_s=0.0, num_gpus=4, model="resnet18", batch_size=BS, iterations=10.0)
    guest = JobState(job_id=2, arrival_s=0.0, num_gpus=4, model="resnet50", batch_size=BS, iterations=10.0,
                     status=JobStatus.RUNNING, placement=(0, 1, 2, 3))
    st = ClusterState(cluster=cluster, costs=CostModel(cluster, SPBConfig()), jobs={1: host, 2: guest}, active_ids=[1, 2])
    led = GpuLedger(st)
    assert guest_keeps_its_order(st, led, host, (0, 1, 2, 3), guest, (3, 2, 1, 0)) == ((3, 2, 1, 0), (0, 1, 2, 3))
    # a partial permutation: only the GPUs under the guest's moved workers trade places
    assert guest_keeps_its_order(st, led, host, (0, 1, 2, 3), guest, (1, 0, 2, 3)) == ((1, 0, 2, 3), (0, 1, 2, 3))
    host.status, host.placement = JobStatus.RUNNING, (0, 1, 2, 3)  # the host keeps its order: it would migrate instead
    assert guest_keeps_its_order(st, led, host, (0, 1, 2, 3), guest, (3, 2, 1, 0)) == ((0, 1, 2, 3), (3, 2, 1, 0))
    host.status, host.placement = JobStatus.QUEUED, ()
    guest.placement = (0, 1, 4, 5)  # guest worker 0 would go from node 0 to node 1
    assert guest_keeps_its_order(st, led, host, (4, 5, 0, 1), guest, (4, 5, 0, 1)) == ((4, 5, 0, 1), (4, 5, 0, 1))
    assert guest_keeps_its_order(st, led, host, (0, 1, 4, 5), guest, (5, 4, 1, 0)) == ((0, 1, 4, 5), (5, 4, 1, 0))
    guest.placement = (4, 5, 6, 7)  # other GPUs: a migration whatever the order
    assert guest_keeps_its_order(st, led, host, (0, 1, 2, 3), guest, (3, 2, 1, 0)) == ((0, 1, 2, 3), (3, 2, 1, 0))


class _AdvancingPolicy:
    """What LearnedScheduler reads of a learned policy, with the choice that stalls a cluster:
    advance whenever the mask allows it, else the first feasible action."""

    window_k = 4
    config = {"env": {"observe_remaining": True}}
    features = None

    def check_compatible(self, spaces) -> None:
        pass

    def act(self, obs, mask) -> int:
        advance = len(mask) - 1
        return advance if mask[advance] else int(np.flatnonzero(mask)[0])


class _PauseOneThenFillPolicy(_AdvancingPolicy):
    """Each round: pause the first window slot that can be paused (a running job), then take the
    first feasible action (the first undecided slot's first option) until only advance is left; so
    it preempts a job a round and starts jobs in the window's order."""

    def __init__(self, window_order: str):
        self.window_order = window_order
        self._paused = False

    def act(self, obs, mask) -> int:
        per_job = (len(mask) - 1) // self.window_k
        if not self._paused:
            pauses = np.flatnonzero(mask[per_job - 1:-1:per_job])
            if pauses.size:
                self._paused = True
                return int(pauses[0]) * per_job + per_job - 1
        a = int(np.flatnonzero(mask)[0])
        if a == len(mask) - 1:
            self._paused = False
        return a


def _scheduler_and_env_runs(jobs, order: str, work_conserving: bool, spill: bool = False):
    """The simulator run of LearnedScheduler with :class:`_PauseOneThenFillPolicy` in ``order``,
    and the env episode the same policy plays on the scheduler's very cluster and config."""
    from agents.rl import LearnedScheduler
    from jigsaw_env.env import JigsawClusterEnv

    policy = _PauseOneThenFillPolicy(order)
    policy.spill = spill
    sim = Simulator(toy_cluster(8, 4), jobs, SimConfig(round_s=60.0))
    sim.run(LearnedScheduler(agent=policy, work_conserving=work_conserving).schedule)
    env = JigsawClusterEnv(gpus=8, gpus_per_node=4, trace=jobs, max_jobs=len(jobs), window_k=4,
                           invalid_action="raise", window_order=order, work_conserving=work_conserving, spill=spill)
    env.cluster, env.sim_config = sim.cluster, SimConfig(round_s=60.0)
    obs, _ = env.reset(seed=0, options={"jobs": jobs})
    policy = _PauseOneThenFillPolicy(order)
    while True:
        obs, _, term, trunc, _ = env.step(policy.act(obs, env.action_masks()))
        if term or trunc:
            break
    assert term and sim.num_finished == len(jobs)
    return sim, env.sim


def test_a_learned_scheduler_plays_the_env_in_the_policys_window_order(toy_trace):
    """The scheduler builds each round exactly as the env steps, in the window order the policy
    was trained with; the orders give different schedules on this trace."""
    jobs = toy_trace.head(12)
    frames = {}
    for order in ("attained", "las", "remaining"):
        sim, env_sim = _scheduler_and_env_runs(jobs, order, work_conserving=False)
        pd.testing.assert_frame_equal(env_sim.jobs_frame(), sim.jobs_frame())
        frames[order] = sim.jobs_frame()
    assert not frames["attained"]["start_s"].equals(frames["las"]["start_s"])
    assert not frames["remaining"]["start_s"].equals(frames["las"]["start_s"])


def test_a_learned_scheduler_spills_as_the_env_does_when_its_policy_was_trained_so(toy_trace):
    """With ``spill`` (the policy's env.spill) the scheduler ends each round as the env's advance
    does (RoundBuilder.finish): the same schedule, and not the one without spilling."""
    jobs = toy_trace.head(12)
    frames = {}
    for spill in (False, True):
        sim, env_sim = _scheduler_and_env_runs(jobs, "attained", work_conserving=True, spill=spill)
        pd.testing.assert_frame_equal(env_sim.jobs_frame(), sim.jobs_frame())
        pd.testing.assert_frame_equal(env_sim.cluster_frame(), sim.cluster_frame())
        frames[spill] = sim.cluster_frame()
    assert (frames[True]["shared_gpus"] > 0).any() and not frames[False].equals(frames[True])


def test_a_learned_scheduler_is_work_conserving_so_an_advancing_policy_still_finishes(toy_trace):
    from agents.rl import LearnedScheduler
    from jigsaw_env.simulator import PolicyStalled

    jobs = toy_trace.head(8)

    def run(**kw):
        sim = Simulator(toy_cluster(8, 4), jobs, SimConfig(round_s=60.0))
        sched = LearnedScheduler(agent=_AdvancingPolicy(), **kw)
        sim.run(sched.schedule, max_stalled_rounds=5)
        return sim

    with pytest.raises(PolicyStalled, match="ran nothing for 5 rounds"):
        run(work_conserving=False)
    sim = run()
    assert sim.num_finished == len(jobs)
    # no round runs nothing while a job waits at its start
    cf = sim.cluster_frame()
    assert not ((cf["allocated_gpu_s"] == 0) & (cf["active"] > 0)).any()
