"""The speed work changes no result: quiet-round skipping, incremental validation, the scalar
component advance, the vectorised round (ComponentSet), shared component tables, Jigsaw's memos and
the mask caches give the same jobs, rounds and cluster logs (and masks) as the plain paths."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from agents import make_scheduler
from agents.base import Scheduler
from jigsaw_env.cluster import ClusterSpec
from jigsaw_env.placement import GpuLedger, validate_decision
from jigsaw_env.sim_validation import validate_diff
from jigsaw_env.simulator import SimConfig, Simulator
from traces import load_trace

AGENTS = ["fifo", "srtf", "tiresias", "jigsaw", "tiresias+spb", "fifo+spb"]


@pytest.fixture(scope="module")
def synth():
    return load_trace("synthetic:jobs=80,load=1.2,seed=21", cluster_gpus=16).jobs


@pytest.mark.parametrize("agent", AGENTS)
def test_quiet_round_skipping_changes_nothing(synth, agent):
    cluster = ClusterSpec.from_gpus(16)
    frames = []
    quiet = []
    for skip in (False, True):
        sim = Simulator(cluster, synth, SimConfig())
        sim.run(make_scheduler(agent), skip_quiet=skip)
        frames.append((sim.jobs_frame(), sim.rounds_frame(), sim.cluster_frame()))
        quiet.append(sim.quiet_rounds)
    for a, b in zip(frames[0], frames[1]):
        pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert quiet[0] == 0
    # every one of these schedulers has quiet stretches in a trace with a long tail
    assert quiet[1] > 0, agent


def test_a_scheduler_without_quiet_until_is_asked_every_round(synth):
    calls = []
    base = make_scheduler("fifo")

    def policy(state):  # a plain function: no quiet_until, so no skipping
        calls.append(state.round)
        return base.schedule(state)

    sim = Simulator(ClusterSpec.from_gpus(16), synth, SimConfig())
    sim.run(policy)
    assert sim.quiet_rounds == 0
    assert len(calls) == len(sim.cluster_frame())


def test_incremental_validation_equals_full_validation(synth):
    # every round's decision of a preempting, migrating, SPB-changing scheduler: the simulator's
    # incremental ledger holds the same memory and workers per GPU as a ledger built from scratch
    cluster = ClusterSpec.from_gpus(16)
    sim = Simulator(cluster, synth, SimConfig())
    sched = make_scheduler("jigsaw")
    n = 0
    while not sim.done and n < 300:
        d = sched.schedule(sim.state)
        full = validate_decision(sim.state, d)
        inc = validate_diff(sim._in_force, d)[0]
        np.testing.assert_allclose(inc.mem, full.mem, rtol=1e-12, atol=1.0)
        np.testing.assert_array_equal(inc.workers, full.workers)
        assert inc.mem.tolist() == inc._ml and inc.workers.tolist() == inc._wl
        sim.step(d)
        n += 1
    assert n > 50


def test_lazy_per_gpu_busy_equals_the_sum_of_round_busy(synth):
    sim = Simulator(ClusterSpec.from_gpus(16), synth, SimConfig())
    sim.run(make_scheduler("jigsaw"))
    per_gpu = sim.busy_per_gpu()
    assert per_gpu.sum() == pytest.approx(sim.cluster_frame()["busy_gpu_s"].sum(), rel=1e-9)
    assert np.all(per_gpu <= sim.state.time_s - sim.first_arrival_s + 1e-6)


def _random_episodes(env, seeds, rng, before_step) -> list[dict]:
    """Whole episodes of ``env`` (one per seed) under random masked actions, calling
    ``before_step(env)`` before every step; returns the steps' info dicts."""
    infos = []
    for seed in seeds:
        env.reset(seed=seed)
        while True:
            before_step(env)
            _, _, term, trunc, info = env.step(int(rng.choice(np.flatnonzero(env.action_masks()))))
            infos.append(info)
            if term or trunc:
                break
    return infos


def test_long_lived_caches_leave_the_garbage_collector_little_to_walk():
    # the step tables a cost model keeps across an env's episodes are tuples of floats, which the
    # collector stops tracking after a collection (lists it walked at every full collection: tens
    # of thousands of tables made each take 0.5 s); only an entry and its tuple of profiles stay
    # tracked. Env placements do not go into the JobDecision memo, which would fill with them.
    import gc

    from jigsaw_env import state as state_mod
    from jigsaw_env.env import JigsawClusterEnv

    env = JigsawClusterEnv(gpus=16, max_jobs=30, window_k=4)
    memo_before = len(state_mod._JD_MEMO)
    _random_episodes(env, [0, 1], np.random.default_rng(0), lambda env: None)
    for _ in range(3):  # a tuple is untracked once its items are: one level of nesting per pass at worst
        gc.collect()
    tables = env.sim.costs.step_tables
    assert len(tables) > 20
    tracked = [name for entry in tables.values()
               for name, x in [("tables", entry[0]), *((f"field {i}", f) for i, f in enumerate(entry[0]))]
               if gc.is_tracked(x)]
    assert tracked == []
    assert len(state_mod._JD_MEMO) == memo_before


@pytest.mark.slow
def test_cached_encoder_equals_a_fresh_encoder_at_every_step():
    # the per-round cache of the encoder gives the same vector as an encoder with no cache, over
    # whole episodes with random masked actions (and across resets that reuse job ids); the fresh
    # encoder is given the env encoder's LAS queue (history, not cache: features 19-21)
    import copy
    from jigsaw_env.encoder import ObservationEncoder
    from jigsaw_env.env import JigsawClusterEnv

    def check(env):
        b = env.builder
        fresh = ObservationEncoder(env.encoder.window_k, env.encoder.observe_remaining)
        fresh._las, fresh._las_t = copy.deepcopy(env.encoder._las), env.encoder._las_t
        want = fresh.encode(env.sim.state, b.window, b.ledger, b.acted, env._steps_in_round)
        got = env.encoder.encode(env.sim.state, b.window, b.ledger, b.acted, env._steps_in_round)
        np.testing.assert_array_equal(got, want)

    env = JigsawClusterEnv(gpus=16, window_k=8, max_jobs=25, load=1.5)
    assert len(_random_episodes(env, range(3), np.random.default_rng(0), check)) > 100


def test_a_policy_that_never_starts_a_job_is_stopped_with_a_clear_error(synth):
    from jigsaw_env.simulator import PolicyStalled
    from jigsaw_env.state import Decision

    sim = Simulator(ClusterSpec.from_gpus(16), synth, SimConfig())
    with pytest.raises(PolicyStalled, match=r"ran nothing for 50 rounds in a row while \d+ jobs waited"):
        sim.run(lambda state: Decision(), max_stalled_rounds=50)
    assert sim.state.round == 50
    # heuristics never trip it: every golden-style run above completes with the default check on
    sim = Simulator(ClusterSpec.from_gpus(16), synth, SimConfig())
    assert sim.run(make_scheduler("fifo"), max_stalled_rounds=1)["jobs_completed"] == len(synth)


# ---------------------------------------------------------------- vectorised rounds
def _engine_components(seed: int):
    """Random lockstep components (1-3 members, H up to 12, shared GPUs, restart waits) built
    from real cost-table profiles."""
    from jigsaw_env.cost_table import default_batch_size
    from jigsaw_env.engine import Member
    from jigsaw_env.spb import Pattern, SPBConfig
    from jigsaw_env.state import CostModel, JobState

    cluster = ClusterSpec.from_gpus(16)
    costs = CostModel(cluster, SPBConfig())
    rng = np.random.default_rng(seed)
    out = []
    for i in range(12):
        members = []
        for m in range(int(rng.integers(1, 4))):
            w = int(rng.choice([1, 2, 4]))
            gpus = tuple(int(g) for g in rng.choice(8, w, replace=False))
            model = str(rng.choice(["resnet18", "lstm_lm"]))
            job = JobState(job_id=100 * i + m, arrival_s=0.0, num_gpus=w, model=model,
                           batch_size=default_batch_size(model), iterations=1.0)
            level = int(rng.integers(0, 4))
            prof = costs.profile(job, level, Pattern.STATIC if rng.random() < 0.3 and level else Pattern.ROTATING, gpus)
            members.append(Member(job.job_id, prof, gpus, int(rng.integers(0, 50))))
        out.append((members, float(rng.choice([0.0, 7.5, 40.0]))))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_component_set_advance_equals_the_scalar_advance_exactly(seed):
    # the simulator's vectorised round (ComponentSet.advance over all live components) against
    # each component's scalar advance_totals: the same steps, run seconds, busy GPU-seconds,
    # step counters and partial steps, to the bit, over random round lengths
    from jigsaw_env.engine import Component, ComponentSet

    specs = _engine_components(seed)
    scalar = [Component(m, r) for m, r in specs]
    vector = [Component(m, r) for m, r in specs]
    cset = ComponentSet(capacity=4, width=2)  # small: the set grows and widens on the way
    slots = np.array([cset.add(c) for c in vector])
    rng = np.random.default_rng(seed)
    now = 0.0
    for _ in range(300):
        dt = float(rng.choice([rng.uniform(0, 3), rng.uniform(0, 300), scalar[0].cycle / scalar[0].H, 1e-7, 0.0]))
        steps, run, busy = cset.advance(cset.gather(slots), now, dt)
        for i, c in enumerate(scalar):
            s, r, b, _ = c.advance_totals(now, dt)
            assert (int(steps[i]), float(run[i]), float(busy[i])) == (s, r, b)
        cset.sync()
        assert [(c.k, c.partial) for c in vector] == [(c.k, c.partial) for c in scalar]
        now += dt


def test_shared_component_tables_equal_fresh_ones():
    # components with the same profiles, phases and layout share their step tables: every table
    # equals the one a fresh component computes
    from jigsaw_env.engine import Component

    cache: dict = {}
    for members, ready in _engine_components(5) * 2:
        shared, fresh = Component(members, ready, cache), Component(members, ready)
        for name in Component._SHARED:
            a, b = getattr(shared, name), getattr(fresh, name)
            if isinstance(a, np.ndarray):
                np.testing.assert_array_equal(a, b)
            elif isinstance(a, list) and a and isinstance(a[0], np.ndarray):
                for x, y in zip(a, b):
                    np.testing.assert_array_equal(x, y)
            else:
                assert a == b, name
    assert len(cache) == 12


def _numpy_step_tables(members, col, barrier_s):
    """The step tables by eqs. K1-K3 in numpy (the formulas as first written), for the test below."""
    import math
    H = 1
    for m in members:
        H = H * m.profile.period // math.gcd(H, m.profile.period)
    loads = np.zeros((H, len(col)))
    comm = np.zeros(H)
    ks = np.arange(H)
    phase_bytes = []
    for m in members:
        ph = (m.iteration0 + ks) % m.profile.period
        c = m.profile.compute_s[ph]
        for w, g in enumerate(m.gpus):
            loads[:, col[g]] += c[:, w]
        comm = np.maximum(comm, m.profile.comm_s[ph])
        phase_bytes.append(m.profile.bytes[ph])
    step = loads.max(axis=1) + comm
    if barrier_s and len(members) > 1:
        step = step + barrier_s
    cum = np.concatenate([[0.0], np.cumsum(step)])
    cum_loads = np.vstack([np.zeros(len(col)), np.cumsum(loads, axis=0)])
    cum_bytes = [np.concatenate([[0.0], np.cumsum(b)]) for b in phase_bytes]
    return {"H": H, "loads": loads, "step": step, "cum": cum, "cycle": float(cum[-1]), "cum_loads": cum_loads,
            "phase_bytes": phase_bytes, "cum_bytes": cum_bytes, "_cum_l": tuple(cum.tolist()),
            "_loads_l": tuple(map(tuple, loads.tolist())),
            "_cum_tot": tuple(np.concatenate([[0.0], np.cumsum(loads.sum(axis=1))]).tolist()),
            "_cum_bytes_l": tuple(tuple(cb.tolist()) for cb in cum_bytes), "_cum_loads_l": tuple(map(tuple, cum_loads.tolist()))}


@pytest.mark.parametrize("barrier_s", [0.0, 0.37])
def test_step_tables_equal_the_numpy_formulas_bit_for_bit(barrier_s):
    # engine._step_tables builds the tables in Python lists: every table, array or list, holds the
    # very floats of the numpy formulas (K1 sums in member and worker order, K2 max + max, cumsums
    # in step order, the per-step total load as numpy's row sum), over components of one to three
    # jobs with shared GPUs, 8-GPU rows (numpy's pairwise row sum) and hyper-periods up to 12
    from jigsaw_env.engine import Component, Member
    from jigsaw_env.spb import JobProfile, Pattern

    rng = np.random.default_rng(3)
    for case in range(300):
        members = []
        for i in range(int(rng.integers(1, 4))):
            period = int(rng.choice([1, 2, 3, 4]))
            w = int(rng.integers(1, 9))
            prof = JobProfile(level=1, pattern=Pattern.ROTATING, slots=(), period=period,
                              compute_s=rng.uniform(0.01, 3.0, (period, w)) * rng.choice([1e-3, 1.0, 1e3]),
                              comm_s=rng.uniform(0.0, 2.0, period), bytes=rng.uniform(0, 1e9, period),
                              peak_bytes=np.ones(w), eta=1.0)
            gpus = tuple(int(g) for g in rng.choice(9, w, replace=False))
            members.append(Member(i, prof, gpus, int(rng.integers(0, 50))))
        comp = Component(members, 0.0, barrier_s=barrier_s)
        col = {g: c for c, g in enumerate(sorted({g for m in members for g in m.gpus}))}
        want = _numpy_step_tables(members, col, barrier_s)
        for name, ref in want.items():
            got = getattr(comp, name)
            if isinstance(ref, np.ndarray):
                assert got.dtype == ref.dtype and got.shape == ref.shape and got.tobytes() == ref.tobytes(), (case, name)
                assert not got.flags.writeable
            elif isinstance(ref, list) and isinstance(ref[0], np.ndarray):
                assert [g.tobytes() for g in got] == [r.tobytes() for r in ref], (case, name)
            else:
                assert got == ref and type(got) is type(ref), (case, name)


@pytest.mark.parametrize("trace,gpus", [(None, 16), ("synthetic:jobs=200,load=4.0,seed=2", 32)])
@pytest.mark.slow
def test_jigsaw_memos_change_no_decision(synth, trace, gpus):
    # Jigsaw's memos (its spread-test, pairing-bound and rule-2 memos, the shared per-cost-model
    # caches of agents.common: default pairings, pairing plans and their preparation, best_solo,
    # configs, layouts, placement signatures; the JobDecision memo) and its bound-pruned host
    # search, against a Jigsaw that forgets them all before every call and
    # searches every host: the same logs, exactly. The second scenario pairs jobs hundreds of
    # times and runs them at SPB levels above 0, some changed under hysteresis
    from agents import common
    from agents.jigsaw import Jigsaw
    from jigsaw_env import state as state_mod

    class Forgetful(Jigsaw):
        def schedule(self, state):
            self._memo_costs = None
            common.caches_of(state.costs).clear()  # every named cache of this cost model
            state_mod._JD_MEMO.clear()
            self.forgot += 1
            return super().schedule(state)

    jobs = synth if trace is None else load_trace(trace, cluster_gpus=gpus).jobs
    plain = Forgetful()
    plain.forgot = 0
    plain.prune = False  # and searches every host
    frames = []
    for sched in (Jigsaw(), plain):
        sim = Simulator(ClusterSpec.from_gpus(gpus), jobs, SimConfig())
        sim.run(sched)
        frames.append((sim.jobs_frame(), sim.rounds_frame(), sim.cluster_frame()))
    assert plain.forgot > 10
    for a, b in zip(*frames):
        pd.testing.assert_frame_equal(a, b, check_exact=True)


@pytest.mark.slow
def test_cached_masks_equal_fresh_masks_at_every_step():
    # the round builder's mask cache (per-job constants and their rows) against a builder with empty caches
    from jigsaw_env.env import JigsawClusterEnv

    env = JigsawClusterEnv(gpus=16, window_k=8, max_jobs=25, load=1.5)
    rng = np.random.default_rng(3)
    n = 0
    for ep in range(2):
        env.reset(seed=ep)
        while True:
            b = env.builder
            got = env.action_masks()
            saved = b._need_cache
            b._need_cache = {}
            np.testing.assert_array_equal(got, b.masks())
            b._need_cache = saved
            _, _, term, trunc, _ = env.step(int(rng.choice(np.flatnonzero(got))))
            n += 1
            if term or trunc:
                break
    assert n > 50


@pytest.mark.parametrize("agent", ["jigsaw", "gandiva+spb", "fifo"])
def test_vectorised_rounds_equal_scalar_rounds(synth, agent, monkeypatch):
    # the simulator advances few components one by one and many with ComponentSet; always
    # vectorised, always scalar and the mix (threshold 3) give the same logs, exactly
    frames = []
    for threshold in (1, 3, 10**9):
        sim = Simulator(ClusterSpec.from_gpus(16), synth, SimConfig())
        sim.live.vector_min_components = threshold
        sim.run(make_scheduler(agent))
        frames.append((sim.jobs_frame(), sim.rounds_frame(), sim.cluster_frame(), sim.busy_per_gpu()))
    for other in frames[1:]:
        for a, b in zip(frames[0][:3], other[:3]):
            pd.testing.assert_frame_equal(a, b, check_exact=True)
        np.testing.assert_array_equal(frames[0][3], other[3])


def test_load_pool_rewrites_change_nothing(synth, monkeypatch):
    # ComponentSet keeps every live component's loads in one flat pool and rewrites it (live
    # components only) when it fills; the slack it leaves sets how often. A pool rewritten at
    # nearly every new component and one rewritten rarely give the same logs, exactly
    import jigsaw_env.sim_components as sim_components
    from jigsaw_env.engine import ComponentSet
    rewrites = []

    def counted(self, extra):
        rewrites[-1] += 1
        return ComponentSet._compact(self, extra)

    frames = []
    for slack in (1, ComponentSet.POOL_SLACK):
        # a subclass in the live components' module (a compiled ComponentSet's class is immutable)
        small = type("SmallPool", (ComponentSet,), {"_compact": counted, "POOL_MIN": 16, "POOL_SLACK": slack})
        monkeypatch.setattr(sim_components, "ComponentSet", small)
        rewrites.append(0)
        sim = Simulator(ClusterSpec.from_gpus(16), synth, SimConfig())
        sim.live.vector_min_components = 1  # every round through the pool
        assert type(sim.live.cset) is small
        sim.run(make_scheduler("jigsaw"))
        frames.append((sim.jobs_frame(), sim.rounds_frame(), sim.cluster_frame(), sim.busy_per_gpu()))
    assert rewrites[0] > 5 * max(rewrites[1], 1), rewrites
    for a, b in zip(frames[0][:3], frames[1][:3]):
        pd.testing.assert_frame_equal(a, b, check_exact=True)
    np.testing.assert_array_equal(frames[0][3], frames[1][3])


def _running_by_scan(state):
    """ClusterState.running() without the simulator's index: every active job's status read."""
    from jigsaw_env.state import JobStatus
    return [state.jobs[x] for x in state.active_ids if state.jobs[x].status is JobStatus.RUNNING]


@pytest.mark.parametrize("agent", ["fifo", "tiresias", "jigsaw", "gandiva", "random"])
def test_running_index_equals_a_scan_at_every_call(synth, agent):
    # the simulator's running index (the in-force decision's keys, sorted by arrival) gives the
    # same jobs in the same order as reading every active job's status, at every policy call of
    # preempting, migrating and co-locating schedulers, and in a deep copy of the simulator
    sim = Simulator(ClusterSpec.from_gpus(16), synth, SimConfig())
    sched = make_scheduler(agent)
    seen = {"calls": 0, "running": 0, "sorted": 0, "scanned": 0}

    def policy(state):
        want = _running_by_scan(state)
        assert state.in_force is not None and state.running_ref is state.in_force.decision
        seen["sorted" if 5 * len(state.running_ref) < len(state.active_ids) else "scanned"] += 1
        assert state.running() == want
        assert list(state.current_decision()) == [j.job_id for j in want]
        # Scheduler.ledger: a reordered copy of the simulator's ledger equals one built by adding
        # every running job again
        fast = Scheduler.ledger(state)
        fresh = GpuLedger(state, state.current_decision(), checked=True)
        assert fast is not state.in_force and fast.decision is not state.in_force.decision
        assert list(fast.decision.items()) == list(fresh.decision.items())
        assert fast._ml == fresh._ml and fast._wl == fresh._wl
        np.testing.assert_array_equal(fast.mem, fresh.mem)
        np.testing.assert_array_equal(fast.workers, fresh.workers)
        assert [fast.num_with_workers(w) for w in range(4)] == [fresh.num_with_workers(w) for w in range(4)]
        seen["calls"] += 1
        seen["running"] += len(want)
        if seen["calls"] == 40:
            twin = sim.copy()
            assert twin.state.running() == _running_by_scan(twin.state)
            assert twin.state.in_force is twin._in_force and twin.state.running_ref is twin._in_force.decision
        return sched(state)

    sim.run(policy)
    assert seen["calls"] > 50 and seen["running"] > 100
    assert seen["sorted"] > 10 and seen["scanned"] > 10, seen  # both ways of ClusterState.running()
    assert sim.state.running() == _running_by_scan(sim.state) == []


@pytest.mark.parametrize("agent", ["jigsaw", "gandiva", "gandiva+spb"])
def test_kept_sharing_groups_give_the_pairs_of_a_scan_at_every_call(agent):
    # current_pairs reads the simulator's co-location groups (ClusterState.shared_ref) instead of
    # every running job's GPUs: at every call of co-locating schedulers the same guest -> host
    # pairs in the same order (Gandiva walks them in order), with and without the scheduler's
    # own record of hosts; the groups are exactly the connected components of two or more
    from agents.common import current_pairs
    from jigsaw_env.placement import connected_groups

    jobs = load_trace("synthetic:jobs=200,load=4.0,seed=2", cluster_gpus=32).jobs  # pairs form
    sim = Simulator(ClusterSpec.from_gpus(32), jobs, SimConfig())
    sched = make_scheduler(agent)
    seen = {"calls": 0, "pairs": 0, "several": 0}

    def policy(state):
        groups = state.shared_ref
        assert groups is sim.live.shared
        running = state.running()
        want = [g for g in connected_groups({j.job_id: j.placement for j in running}) if len(g) > 1]
        assert sorted(sorted(g) for g in groups.values()) == want
        memory = getattr(getattr(sched, "base", sched), "_host_of", None)
        for host_memory in (memory, None):
            fast = current_pairs(state, host_memory)
            state.shared_ref = None
            try:
                slow = current_pairs(state, host_memory)
            finally:
                state.shared_ref = groups
            assert list(fast.items()) == list(slow.items())
        seen["calls"] += 1
        seen["pairs"] += len(fast)
        seen["several"] += len(fast) > 1
        return sched(state)

    sim.run(policy)
    assert seen["calls"] > 500 and seen["pairs"] > 300 and seen["several"] > 100, seen


@pytest.mark.slow
def test_running_index_in_env_episodes_and_hand_built_states():
    # the env steps the simulator with its builder's ledger (adopted as the allocation in force):
    # the index follows; a state built by hand (no simulator) reads statuses as before
    from jigsaw_env.env import JigsawClusterEnv
    from jigsaw_env.state import ClusterState, CostModel, JobState, JobStatus
    from jigsaw_env.spb import SPBConfig

    checked = [0]

    def check(env):
        st = env.sim.state
        assert st.running() == _running_by_scan(st)
        assert st.in_force is None  # the ledger is on the state only while Simulator.run asks
        if 5 * len(st.running_ref) < len(st.active_ids):  # the index's sorted way
            checked[0] += len(st.running()) + 1

    env = JigsawClusterEnv(gpus=16, window_k=8, max_jobs=25, load=1.5)
    _random_episodes(env, range(2), np.random.default_rng(1), check)
    assert checked[0] > 50
    cluster = ClusterSpec.from_gpus(8)
    jobs = [JobState(i, 0.0, 1, "tiny_mlp", 32, 10.0) for i in range(3)]
    jobs[0].status, jobs[1].status, jobs[2].status = JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.RUNNING
    jobs[1].placement, jobs[2].placement = (0,), (1,)
    st = ClusterState(cluster=cluster, costs=CostModel(cluster, SPBConfig()), jobs={j.job_id: j for j in jobs},
                      active_ids=[2, 0, 1])
    assert st.running_ref is None and st.in_force is None
    assert [j.job_id for j in st.running()] == [2, 1]


@pytest.mark.parametrize("agent", ["tiresias", "jigsaw"])
def test_kept_las_queues_equal_a_fresh_sort_at_every_call(agent):
    # LASQueues.order_active keeps the queues between calls and looks again only at the jobs that
    # arrived, left, run or were promoted: at every call it equals order(state.active()), a sort
    # of every active job, in a trace where jobs cross the threshold and starved jobs are promoted
    jobs = load_trace("synthetic:jobs=120,load=1.6,seed=5", cluster_gpus=16).jobs
    sched = make_scheduler(agent, thresholds="600", starve_factor=2.0)
    las = sched.priority if agent == "jigsaw" else sched.las
    seen = {"calls": 0, "crossed": 0}
    first_queue: dict[int, int] = {}

    def policy(state):
        las.observe(state)
        got = [j.job_id for j in las.order_active(state)]
        assert got == [j.job_id for j in las.order(state.active())]
        for j in state.active():
            q = las.queue_of(j)
            if first_queue.setdefault(j.job_id, q) != q:
                seen["crossed"] += 1
                first_queue[j.job_id] = q
        seen["calls"] += 1
        if seen["calls"] % 25 == 0:  # a copy builds its queues anew and gives the same order
            import copy
            twin = copy.deepcopy(las)
            assert twin._kept is None
            assert [j.job_id for j in twin.order_active(state)] == got
        return sched(state)

    sim = Simulator(ClusterSpec.from_gpus(16), jobs, SimConfig())
    sim.run(policy, skip_quiet=False)
    assert seen["calls"] > 100
    assert las.promotions > 5 and seen["crossed"] > 20, (las.promotions, seen)


def test_kept_las_queues_follow_env_episodes_and_resets():
    # the env's encoder keeps its own queues (features 22-25): the same as a fresh sort at every
    # round of several episodes, whose states are new objects with job ids used again
    from jigsaw_env.env import JigsawClusterEnv

    def check(env):
        las, st = env.encoder._las, env.sim.state
        assert [j.job_id for j in las.order_active(st)] == [j.job_id for j in las.order(st.active())]

    env = JigsawClusterEnv(gpus=16, window_k=8, max_jobs=30, load=1.5)
    infos = _random_episodes(env, range(3), np.random.default_rng(2), check)
    assert sum("round" in info for info in infos) > 30


@pytest.mark.parametrize("starve_factor", [2.0, 0.5, None])
def test_observe_of_changes_equals_observe_of_every_job(starve_factor):
    # LASQueues.observe under a simulator visits only the jobs that started or stopped and the
    # waiting jobs whose starvation time has come (a heap): its records, promotions and queues
    # equal those of the same queues visiting every active job, at every round of a replay
    from jigsaw_env.las import LASQueues

    jobs = load_trace("synthetic:jobs=150,load=1.8,seed=8", cluster_gpus=16).jobs
    sched = make_scheduler("tiresias", thresholds="600", starve_factor=starve_factor)
    fast, slow = LASQueues((600.0,), starve_factor), LASQueues((600.0,), starve_factor)
    seen = {"calls": 0}

    def policy(state):
        fast.observe(state)
        kept, state.running_ref = state.running_ref, None  # the same state, without the simulator's index
        try:
            slow.observe(state)
            want = [j.job_id for j in slow.order_active(state)]
        finally:
            state.running_ref = kept
        assert fast._changes is not None and slow._changes is None
        for name in ("_run_since", "_last_run", "_wait_since", "_base"):
            assert getattr(fast, name) == getattr(slow, name), name
        assert fast.promotions == slow.promotions
        assert [j.job_id for j in fast.order_active(state)] == want
        seen["calls"] += 1
        return sched(state)

    sim = Simulator(ClusterSpec.from_gpus(16), jobs, SimConfig())
    sim.run(policy, skip_quiet=False)
    assert seen["calls"] > 100
    if starve_factor is not None:
        assert fast.promotions > 10, fast.promotions
    else:
        assert fast.promotions == 0
