"""The simulator's incremental step changes no result.

``Simulator.step`` validates and applies only the jobs whose JobDecision differs from the
allocation in force, keeps the per-round counts (levels, allocated and shared GPUs) as the ledger
changes, rebuilds only the co-location components that a change touches, fills the component and
job arrays lazily, and (in ``run``) brings the job objects up to date only before the policy reads
them. Here random decision sequences (starts, stops, moves, level and pattern changes, co-located
pairs, equal decisions made of new objects, ``None``, rejected decisions) drive two simulators at
once: the incremental one and tests/reference/simulator.py's ReferenceSimulator (the whole decision
validated and applied every round, every count recomputed, fresh component tables, arrays filled
eagerly). After
every round both must agree exactly: the round result, every job's counters, times and status, the
components' step counters, the ledger in force and the per-GPU busy seconds. The incremental one is
also checked against structures recomputed from scratch from the job states: its components are
the connected groups of the running jobs (keys, job and GPU maps included), its ledger equals a
fresh validation of the allocation in force, and its level and GPU counts equal a recount.

Nothing is read from a stored file, so regenerating one cannot hide a change.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from agents import make_scheduler
from jigsaw_env.cluster import ClusterSpec
from jigsaw_env.placement import GpuLedger, InfeasibleDecision, connected_groups, validate_decision
from jigsaw_env.simulator import SimConfig, Simulator
from jigsaw_env.spb import Pattern
from jigsaw_env.state import Decision, JobDecision, JobStatus
from reference.simulator import ReferenceSimulator
from traces import load_trace


# ---------------------------------------------------------------- random decisions
def random_decision(sim: Simulator, cur: dict, rng: np.random.Generator) -> dict:
    """``cur`` with random feasible changes: starts (a third co-located with a running job),
    stops, moves, level/pattern changes and equal JobDecisions made anew."""
    st = sim.state
    G = sim.cluster.num_gpus
    maxl = st.spb.max_level
    d = dict(cur)
    led = GpuLedger(st, Decision(d), checked=True)

    def pattern():
        return Pattern.STATIC if rng.random() < 0.4 else Pattern.ROTATING

    for jid in list(st.active_ids):
        u = rng.random()
        j = st.jobs[jid]
        new = "keep"
        if jid in d:
            old = d[jid]
            if u < 0.06:
                new = None
            elif u < 0.12:
                new = JobDecision(tuple(int(x) for x in rng.choice(G, j.num_gpus, replace=False)), old.level, old.pattern)
            elif u < 0.18:
                new = JobDecision(old.gpus, int(rng.integers(0, maxl + 1)), pattern())
            elif u < 0.22:
                new = JobDecision(old.gpus, old.level, old.pattern)  # equal, a new object
        elif u < 0.35:
            if d and rng.random() < 0.5:  # on the GPUs of a running job
                other = d[list(d)[int(rng.integers(len(d)))]]
                pool = list(other.gpus) + [int(g) for g in rng.permutation(G) if g not in other.gpus]
                gpus = tuple(pool[: j.num_gpus])
            else:
                gpus = tuple(int(x) for x in rng.choice(G, j.num_gpus, replace=False))
            new = JobDecision(gpus, int(rng.integers(0, maxl + 1)), pattern())
        if new == "keep":
            continue
        if jid in d:
            led.remove(jid)
        if new is not None and not led.fits(jid, new) and new.level < maxl:
            new = JobDecision(new.gpus, maxl, Pattern.STATIC)  # the least memory: may share a GPU
        if new is None:
            del d[jid]
        elif led.fits(jid, new):
            led.add(jid, new, checked=True)
            d[jid] = new
        elif jid in d:
            led.add(jid, d[jid], checked=True)
    return d


# ---------------------------------------------------------------- observations
def job_fields(sim: Simulator) -> tuple:
    def norm(v):
        if isinstance(v, float) and math.isnan(v):
            return "nan"
        return v.value if isinstance(v, (JobStatus, Pattern)) else v
    return tuple(tuple(norm(getattr(j, f)) for f in j.__dataclass_fields__)
                 for j in sorted(sim.state.jobs.values(), key=lambda j: j.job_id))


def observe(sim: Simulator) -> tuple:
    st = sim.state
    led = sim.in_force_ledger()
    comps = tuple((k, c.k, c.partial, c.ready_s, c.finish) for k, c in sim.live.components.items())
    return (job_fields(sim), st.time_s, st.round, tuple(st.active_ids), sim.num_finished, sim.next_arrival_s(),
            comps, tuple(led.decision.items()), tuple(led.mem.tolist()), tuple(led.workers.tolist()),
            tuple(sim.busy_per_gpu().tolist()), sim.truncated, sim.useful_at_window_end,
            len(sim.log.round_rows), tuple(sim.log.cluster_rows[-1]) if sim.log.cluster_rows else ())


def result_tuple(r) -> tuple:
    return (r.round, r.start_s, r.end_s, r.job_seconds, tuple(r.finished), r.useful_gpu_s, r.busy_gpu_s,
            r.allocated_gpu_s, r.done, r.truncated)


def check_from_scratch(sim: Simulator) -> None:
    """The incremental structures against ones recomputed from the job states."""
    st = sim.state
    running = {j.job_id: j for j in st.jobs.values() if j.status is JobStatus.RUNNING}
    # components: the connected groups of the running jobs, keyed by their configuration (under
    # the free pace a group of several jobs is a component per job, formed together)
    free = sim.config.pace == "free"
    want, groups = set(), {}
    for g in connected_groups({jid: j.placement for jid, j in running.items()}):
        key = tuple((jid, running[jid].placement, running[jid].level, running[jid].pattern.value) for jid in g)
        if free and len(key) > 1:
            want.update((entry,) for entry in key)
            groups[key] = tuple(g)
        else:
            want.add(key)
            if len(key) > 1:
                groups[key] = tuple(g)
    assert set(sim.live.components) == want
    assert sim.live.shared == groups
    for key, comp in sim.live.components.items():
        assert comp.key == key and comp.slot >= 0
        assert [m.job_id for m in comp.members] == [k[0] for k in key]
        assert comp.gpus.tolist() == sorted({g for m in comp.members for g in m.gpus})
        for m in comp.members:
            j = running[m.job_id]
            assert sim.live.of_job[m.job_id] is comp
            alone = sim.costs.profile(j, j.level, j.pattern, j.placement)
            if comp.group is None:
                assert m.profile is alone
            else:  # its times beside the others: never shorter than alone
                assert comp in comp.group and len(comp.members) == 1
                assert np.all(m.profile.compute_s >= alone.compute_s) and np.all(m.profile.comm_s >= alone.comm_s)
        for g in comp.gpus.tolist():
            assert sim.live.of_gpu[g] is comp or (comp.group is not None and sim.live.of_gpu[g] in comp.group)
    assert set(sim.live.of_job) == set(running)
    assert len(sim.live.of_gpu) == sim.live.num_gpus_held == len({g for c in sim.live.components.values() for g in c.gpu_list})
    # the ledger in force: a fresh validation of the running jobs' configurations
    cur = st.current_decision()
    led = sim._in_force
    assert dict(led.decision) == dict(cur)
    full = validate_decision(st, Decision(led.decision))
    np.testing.assert_allclose(led.mem, full.mem, rtol=1e-12, atol=1.0)
    np.testing.assert_array_equal(led.workers, full.workers)
    assert led.mem.tolist() == led._ml and led.workers.tolist() == led._wl
    # the per-round counts
    levels = [0] * 8
    for jd in cur.values():
        levels[min(jd.level, 7)] += 1
    assert sim._levels == levels
    assert led.num_with_workers(0) == led._wl.count(0)
    assert led.num_with_workers(1) == led._wl.count(1)
    # at a round's end the objects are current and the filled arrays hold the same numbers
    if sim.live.current == "both":
        rj = sim.live.rjobs
        for row, j in rj.jobs.items():
            if row not in rj._pending:
                assert (float(rj.progress[row]), int(rj.iteration[row]), float(rj.run_s[row]),
                        float(rj.attained[row])) == (j.progress, j.iteration, j.run_s, j.attained_gpu_s)
        cs = sim.live.cset
        for slot, c in cs.comps.items():
            if slot not in cs._pending:
                assert (int(cs.k[slot]), float(cs.partial[slot])) == (c.k, c.partial)


def assert_frames_equal(a: Simulator, b: Simulator) -> None:
    for fa, fb in ((a.jobs_frame(), b.jobs_frame()), (a.rounds_frame(), b.rounds_frame()),
                   (a.cluster_frame(), b.cluster_frame())):
        pd.testing.assert_frame_equal(fa, fb, check_exact=True)
    np.testing.assert_array_equal(a.busy_per_gpu(), b.busy_per_gpu())
    ma, mb = a.metrics(), b.metrics()
    ma.pop("wall_s", None)
    mb.pop("wall_s", None)
    assert ma.keys() == mb.keys()
    for k in ma:
        va, vb = ma[k], mb[k]
        assert va == vb or (isinstance(va, float) and math.isnan(va) and math.isnan(vb)), k


def pair(gpus: int, jobs: int, seed: int, round_s, load: float = 2.0, **kw) -> tuple[Simulator, Simulator]:
    tr = load_trace(f"synthetic:jobs={jobs},load={load},seed={seed}", cluster_gpus=gpus).jobs
    cluster = ClusterSpec.from_gpus(gpus, gpus_per_node=4)
    cfg = SimConfig(round_s=round_s, **kw)
    return Simulator(cluster, tr, cfg), ReferenceSimulator(cluster, tr, cfg)


# ---------------------------------------------------------------- tests
@pytest.mark.parametrize("round_s", [300.0, None, 45.0])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_incremental_step_equals_the_reference_step_every_round(seed, round_s):
    gpus = (8, 16)[seed % 2]
    inc, ref = pair(gpus, 24, seed, round_s, pace="free" if seed < 2 else "lockstep")
    if seed % 2:
        inc.live.vector_min_components = 1  # the vectorised round on one side, the scalar one on the other
        inc.live.vector_min_finish = 1
    rng = np.random.default_rng(seed)
    cur: dict = {}
    n = changes = colocated = 0
    while not inc.done and n < 400:
        d = random_decision(inc, cur, rng)
        changes += d != cur
        u = rng.random()
        if u < 0.15 and d == cur:
            args = (None, None)
        elif u < 0.25:  # the allocation in force, in new dicts (the same JobDecision objects)
            args = (Decision(inc.in_force_ledger().decision), Decision(ref.in_force_ledger().decision))
        else:
            args = (Decision(d), Decision(d))
        if rng.random() < 0.05 and inc.state.active_ids:  # a rejected decision changes nothing
            jid = inc.state.active_ids[int(rng.integers(len(inc.state.active_ids)))]
            bad = {**d, jid: JobDecision((0,) * (inc.state.jobs[jid].num_gpus + 1), 0)}
            before = observe(inc)
            errs = []
            for sim in (inc, ref):
                with pytest.raises(InfeasibleDecision) as e:
                    sim.step(Decision(bad))
                errs.append(str(e.value))
            assert errs[0] == errs[1]
            assert observe(inc) == before
        ra, rb = inc.step(args[0]), ref.step(args[1])
        assert result_tuple(ra) == result_tuple(rb)
        assert observe(inc) == observe(ref)
        check_from_scratch(inc)
        colocated += bool(inc.live.shared)
        cur = dict(inc.in_force_ledger().decision)
        n += 1
    assert n > 20 and changes > 10 and (colocated > 0 or round_s is None)
    assert_frames_equal(inc, ref)


def test_incremental_step_on_a_larger_cluster_with_many_components():
    # 64 GPUs, many live components: the vectorised round, lazily filled arrays and the
    # vectorised scan for the next completion, against the reference
    inc, ref = pair(64, 120, 7, 300.0)
    inc.live.vector_min_components = inc.live.vector_min_finish = 4
    rng = np.random.default_rng(7)
    cur: dict = {}
    most = 0
    for _ in range(150):
        if inc.done:
            break
        d = random_decision(inc, cur, rng)
        ra, rb = inc.step(Decision(d)), ref.step(Decision(d))
        assert result_tuple(ra) == result_tuple(rb)
        assert observe(inc) == observe(ref)
        check_from_scratch(inc)
        most = max(most, len(inc.live.components))
        cur = dict(inc.in_force_ledger().decision)
    assert most >= 8
    assert_frames_equal(inc, ref)


@pytest.mark.parametrize("agent,round_s", [("jigsaw", 300.0), ("tiresias", 300.0), ("gandiva+spb", 300.0),
                                            ("fifo", 300.0), ("jigsaw", None)])
@pytest.mark.slow
def test_run_with_quiet_rounds_equals_the_reference(agent, round_s):
    # run(): quiet rounds keep the allocation with step(None) and defer the write-back of the
    # job counters to the next policy call; the reference writes back every round
    jobs = 12 if round_s is None else 40
    tr = load_trace(f"synthetic:jobs={jobs},load=1.2,seed=21", cluster_gpus=16).jobs
    if round_s is None:
        # iteration granularity: one round per iteration. A tenth of the iterations keeps the 35
        # scheduler calls and cuts the rounds from 297k to 32k (90 s to 8 s on the 2-core VM)
        tr = tr.assign(iterations=(tr["iterations"] // 10).clip(lower=1), duration_s=tr["duration_s"] / 10)
    sims = []
    for reference in (False, True):
        sim = (ReferenceSimulator if reference else Simulator)(ClusterSpec.from_gpus(16), tr, SimConfig(round_s=round_s))
        if not reference:  # the vectorised round: the arrays are the truth between policy calls
            sim.live.vector_min_components = 1
        calls = []
        sched = make_scheduler(agent)
        orig = sched.schedule

        def schedule(state, orig=orig, calls=calls, sim=sim, reference=reference):
            if not reference:
                check_from_scratch(sim)
            calls.append(job_fields(sim))  # what the policy sees: current job objects
            return orig(state)

        sched.schedule = schedule
        sim.run(sched)
        sims.append((sim, calls))
    (inc, calls_inc), (ref, calls_ref) = sims
    assert inc.quiet_rounds == ref.quiet_rounds
    assert calls_inc == calls_ref
    assert_frames_equal(inc, ref)
    assert job_fields(inc) == job_fields(ref)


@pytest.mark.parametrize("vector", [True, False])
def test_simultaneous_completions_come_in_the_components_order_whatever_their_slots(vector):
    # two identical jobs started together finish at the same instant; their components took the
    # slots two dissolved ones freed, in the other order. The scan for the next completion (the
    # vectorised one over every slot, or the scalar one) reports them in the components' order
    from jigsaw_env.state import JobState

    probe = JobState(9, 0.0, 1, "resnet50", 32, 1.0)
    sim = Simulator(ClusterSpec.from_gpus(8), [probe], SimConfig())
    n = math.ceil(450.0 / sim.costs.isolated_iteration_s(probe))  # they finish in their second round
    jobs = [JobState(0, 0.0, 1, "resnet50", 32, 1e7), JobState(1, 0.0, 1, "resnet50", 32, 1e7),
            JobState(2, 0.0, 1, "resnet50", 32, float(n)), JobState(3, 0.0, 1, "resnet50", 32, float(n))]
    sim = Simulator(ClusterSpec.from_gpus(8), jobs, SimConfig())
    sim.live.vector_min_finish = 1 if vector else 10**9
    sim.step(Decision({0: JobDecision((0,)), 1: JobDecision((1,))}))
    sim.step(Decision({2: JobDecision((2,)), 3: JobDecision((3,))}))
    a, b = sim.live.of_job[2], sim.live.of_job[3]
    assert list(sim.live.components.values()) == [a, b] and a.slot > b.slot  # the case this test is about
    r = sim.step(None)
    assert r.finished == [2, 3] and r.end_s > sim.state.jobs[2].finish_s == sim.state.jobs[3].finish_s
