"""Property-based tests (hypothesis): the simulator's invariants under random clusters, random job
sets and random masked and unmasked actions, and rejected actions that leave the state untouched.

Random worlds: 1-3 nodes of 1, 2 or 4 GPUs, one GPU type or a different type per node, the
default memory or a small override (so that memory binds), 1-8 jobs of shipped zoo models (the
tiny ones included) with 1-30 iterations and random arrivals, random round lengths (iteration
granularity included), 1-3 workers per GPU, SPB levels 1-3 with 2-4 slots.

Invariants checked after every round (docs/design.md sections 2 and 5, docs/simulator.md):
  * no GPU holds more memory than it has, counted at each worker process's peak;
  * no GPU holds more workers than ``max_workers_per_gpu``; a job's workers sit on distinct GPUs;
  * no GPU has computed for longer than the time since the first arrival;
  * time never goes back; progress never goes back and never exceeds the job's iterations;
  * round results are finite and non-negative, busy GPU-seconds <= allocated GPU-seconds;
  * every job of a finite episode completes (status done, progress = iterations, the per-round
    progress log sums to the iterations) and every metric is finite.

Rejected input: a decision breaking a constraint raises ``InfeasibleDecision`` (a ValueError)
whose one-line message names the job and the broken constraint, exactly when an independent
oracle (written here, not the simulator's ``GpuLedger``) says the decision is infeasible; the
simulator's state is then compared field by field with a snapshot taken before: nothing changed.
An unmasked infeasible env action raises ``InvalidAction`` (``invalid_action="raise"``: nothing
changed) or is a counted no-op (``"noop"``: the decision under construction is unchanged); a
masked action always applies.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from jigsaw_env.actions import ActionCodec, InvalidAction, RoundBuilder
from jigsaw_env.cluster import DEFAULT_GPU_MEMORY, GiB, ClusterSpec
from jigsaw_env.cost_table import default_batch_size, get_table
from jigsaw_env.env import JigsawClusterEnv
from jigsaw_env.placement import InfeasibleDecision
from jigsaw_env.simulator import SimConfig, Simulator
from jigsaw_env.spb import Pattern, SPBConfig
from jigsaw_env.state import Decision, JobDecision, JobState, JobStatus

MODELS = ("tiny_mlp", "tiny_cnn", "tiny_transformer", "resnet18", "lstm_lm", "recommendation",
          "transformer_small", "resnet50")
GPU_TYPES = ("k80", "p100", "v100", "cpu")
MEMORY_GIB = (None, 0.75, 1.0, 1.5, 2.0, 4.0)  # None: the type's default (8-16 GiB)
ROUNDS = (None, 1.0, 10.0, 60.0, 600.0)         # None: iteration granularity
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
EPS = 1e-9
MAX_ROUNDS = 3000


def peak_gib(model: str, gpu_type: str) -> float:
    """Full-depth process peak of a model at its default batch size (what must fit on one GPU)."""
    return get_table(model, default_batch_size(model), gpu_type).process_peak_bytes(0) / GiB


# ----------------------------------------------------------------------------------------------- strategies
@st.composite
def clusters(draw, homogeneous: bool = False) -> ClusterSpec:
    gpn = draw(st.sampled_from([1, 2, 4]))
    nodes = draw(st.integers(1, 3))
    if homogeneous or nodes == 1 or draw(st.booleans()):
        types = (draw(st.sampled_from(GPU_TYPES)),) * nodes
    else:  # a different type on every node
        types = tuple(draw(st.permutations(GPU_TYPES))[:nodes])
    mem = dict(DEFAULT_GPU_MEMORY)
    gib = draw(st.sampled_from(MEMORY_GIB))
    if gib is not None:
        for t in set(types):
            mem[t] = int(gib * GiB)
    return ClusterSpec(num_nodes=nodes, gpus_per_node=gpn, gpu_types=types, gpu_memory_bytes=mem)


def fitting_models(cluster: ClusterSpec) -> list[str]:
    """Models whose full-depth worker fits on every GPU of the cluster and whose iteration takes at
    most a second on each of its GPU types (so that episodes stay short)."""
    def ok(m: str, t: str) -> bool:
        table = get_table(m, default_batch_size(m), t)
        return table.process_peak_bytes(0) <= cluster.gpu_memory_bytes[t] and table.compute_s(0) <= 1.0
    return [m for m in MODELS if all(ok(m, t) for t in set(cluster.gpu_types))]


@st.composite
def job_sets(draw, cluster: ClusterSpec, n_max: int = 8, iters_max: int = 30, work_s: float | None = None) -> list[JobState]:
    """1..n_max jobs that can all run on ``cluster`` (models that fit, GPUs <= cluster size).

    ``work_s=None``: 1..iters_max iterations (iteration-granularity rounds end at every iteration);
    else each job gets about 1..work_s seconds of isolated work (so tiny models last several rounds)."""
    n = draw(st.integers(1, n_max))
    ids = draw(st.lists(st.integers(0, 10_000), min_size=n, max_size=n, unique=True))
    models = fitting_models(cluster)
    burst = draw(st.booleans())  # everything at t = 0, or spread arrivals
    jobs = []
    for jid in ids:
        m = draw(st.sampled_from(models))
        arrival = 0.0 if burst else round(draw(st.floats(0.0, 900.0, allow_nan=False)), 3)
        if work_s is None:
            iters = draw(st.integers(1, iters_max))
        else:
            t_iter = get_table(m, default_batch_size(m), cluster.main_gpu_type).compute_s(0)
            iters = max(1, math.ceil(draw(st.floats(1.0, work_s)) / t_iter))
        jobs.append(JobState(job_id=jid, arrival_s=arrival, num_gpus=draw(st.integers(1, min(4, cluster.num_gpus))),
                             model=m, batch_size=default_batch_size(m), iterations=float(iters)))
    return jobs


# ----------------------------------------------------------------------------------------------- oracle
def peaks_of(sim: Simulator, jid: int, jd: JobDecision) -> np.ndarray:
    j = sim.state.jobs[jid]
    return np.asarray(sim.costs.profile(j, jd.level, jd.pattern, jd.gpus).peak_bytes, dtype=np.float64)


def oracle(sim: Simulator, decision):
    """None if ``decision`` is feasible, else a function telling whether an error message names a
    real problem of it. Written from the constraints, not from GpuLedger.

    Per-job problems (unknown or inactive job, wrong GPU count, a GPU twice, a GPU out of range, a
    level out of range, not a JobDecision) are each job's own; capacity problems (workers or
    memory over a GPU's cap) are summed over the jobs without per-job problems. The simulator may
    name any of them (it stops at the first it meets, in its own order), but only real ones: a
    capacity error must name a job that sits on an over-capacity GPU (and that GPU, for memory)."""
    st_ = sim.state
    if not isinstance(decision, dict):
        return lambda m: m.startswith("a decision must be a dict job_id -> JobDecision, got ")
    try:
        items = [(int(k), v) for k, v in decision.items()]
    except (TypeError, ValueError):
        return lambda m: m.startswith("decision keys must be integer job ids")
    G = sim.cluster.num_gpus
    cap = np.array([sim.cluster.memory_of(g) for g in range(G)], dtype=np.float64)
    mem = np.zeros(G)
    workers = np.zeros(G, dtype=int)
    phrases: list[str] = []
    placed: dict[int, list[int]] = {}
    for jid, jd in items:
        if not isinstance(jd, JobDecision):
            phrases.append(f"decision for job {jid} must be a JobDecision, got ")
            continue
        job = st_.jobs.get(jid)
        g = list(jd.gpus)
        if job is None or job.status not in (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.PAUSED):
            phrases.append(f"job {jid} is not an arrived, unfinished job")
        elif len(g) != job.num_gpus:
            phrases.append(f"job {jid} needs {job.num_gpus} GPUs, decision gives {len(g)}")
        elif len(set(g)) != len(g):
            phrases.append(f"job {jid}: workers of one job must be on distinct GPUs, got {g}")
        elif min(g) < 0 or max(g) >= G:
            phrases.append(f"job {jid}: GPU index out of range 0..{G - 1}: {g}")
        elif not 0 <= jd.level <= st_.spb.max_level:
            phrases.append(f"job {jid}: SPB level must be in 0..{st_.spb.max_level}, got {jd.level}")
        else:
            placed[jid] = g
            mem[g] += peaks_of(sim, jid, jd)
            workers[g] += 1
    over_w = {int(x) for x in np.flatnonzero(workers > st_.max_workers_per_gpu)}
    over_m = {int(x) for x in np.flatnonzero(mem > cap)}
    for jid, g in placed.items():
        if over_w & set(g):
            phrases.append(f"job {jid}: a GPU would hold more than {st_.max_workers_per_gpu} workers")
        for x in sorted(over_m & set(g)):
            phrases.append(f"job {jid}: GPU {x} memory exceeded (")
    if not phrases:
        return None
    return lambda m: any(m.startswith(p) for p in phrases)


def snapshot(sim: Simulator) -> tuple:
    """What a step could change, NaN-safe (NaN != NaN would defeat ==): every job's state, the
    clock, the round counter, the logs, the per-GPU busy time, the co-location components and
    the ledger of the allocation in force (where the simulator keeps one)."""
    def norm(v):
        if isinstance(v, float) and math.isnan(v):
            return "nan"
        return v.value if isinstance(v, (JobStatus, Pattern)) else v

    st_ = sim.state
    jobs = tuple(tuple(norm(getattr(j, f)) for f in j.__dataclass_fields__) for j in
                 sorted(st_.jobs.values(), key=lambda j: j.job_id))
    led = sim.in_force_ledger() if hasattr(sim, "in_force_ledger") else None
    ledger = () if led is None else (tuple(sorted(led.decision.items())), tuple(led.mem.tolist()),
                                     tuple(led.workers.tolist()))
    return (jobs, st_.time_s, st_.round, tuple(st_.active_ids), sim.num_finished, sim.next_arrival_s(),
            tuple(sim.busy_per_gpu().tolist()), len(sim.rounds_frame()), len(sim.cluster_frame()),
            tuple(sorted(map(str, getattr(sim, "_components", {})))), sim.truncated, sim.useful_at_window_end,
            ledger)


# ----------------------------------------------------------------------------------------------- invariants
class Tracker:
    """Checks the per-round invariants and remembers what must never go back."""

    def __init__(self, sim: Simulator):
        self.sim = sim
        self.t = sim.state.time_s
        self.progress = {j: 0.0 for j in sim.state.jobs}
        self.raw = {j: 0 for j in sim.state.jobs}

    def check_allocation(self) -> None:
        """Memory and worker caps of the allocation in force, recomputed from the job states."""
        sim = self.sim
        st_ = sim.state
        G = sim.cluster.num_gpus
        mem = np.zeros(G)
        workers = np.zeros(G, dtype=int)
        for j in st_.running():
            g = list(j.placement)
            assert len(g) == j.num_gpus and len(set(g)) == len(g) and 0 <= min(g) and max(g) < G, j
            assert 0 <= j.level <= st_.spb.max_level
            mem[g] += sim.costs.profile(j, j.level, j.pattern, j.placement).peak_bytes
            workers[g] += 1
        for j in st_.jobs.values():
            if j.status is not JobStatus.RUNNING:
                assert j.placement == (), j
        for g in range(G):
            assert mem[g] <= sim.cluster.memory_of(g), f"GPU {g} memory exceeded: {mem[g]} > {sim.cluster.memory_of(g)}"
        assert np.all(workers <= st_.max_workers_per_gpu), workers

    def after_step(self, r, t0: float) -> None:
        sim = self.sim
        st_ = sim.state
        assert r.start_s == pytest.approx(t0, abs=1e-9) and r.end_s == st_.time_s
        assert st_.time_s >= self.t - EPS, "time went back"
        self.t = st_.time_s
        for v in (r.job_seconds, r.useful_gpu_s, r.busy_gpu_s, r.allocated_gpu_s):
            assert math.isfinite(v) and v >= -EPS, r
        assert r.busy_gpu_s <= r.allocated_gpu_s * (1 + 1e-9) + 1e-6, r
        elapsed = st_.time_s - sim.first_arrival_s
        assert np.all(sim.busy_per_gpu() <= elapsed * (1 + 1e-9) + 1e-6), (sim.busy_per_gpu(), elapsed)
        for jid, j in st_.jobs.items():
            assert j.progress >= self.progress[jid] - EPS, f"job {jid} progress went back"
            assert j.iteration >= self.raw[jid]
            assert j.progress <= j.iterations * (1 + 1e-12), f"job {jid} progress {j.progress} > {j.iterations}"
            self.progress[jid], self.raw[jid] = j.progress, j.iteration
            if j.status is JobStatus.DONE:
                assert j.progress == j.iterations and math.isfinite(j.finish_s)
                assert j.arrival_s <= j.first_start_s <= j.finish_s <= st_.time_s + EPS
            elif j.status is JobStatus.PENDING:
                assert j.arrival_s > st_.time_s - 1e-9 and j.progress == 0
        assert sorted(st_.active_ids) == sorted(jid for jid, j in st_.jobs.items() if j.active)
        self.check_allocation()

    def finish(self, n_jobs: int) -> dict:
        sim = self.sim
        assert sim.done and not sim.truncated
        jf = sim.jobs_frame()
        assert len(jf) == n_jobs and (jf["status"] == "done").all()
        np.testing.assert_allclose(jf["progress"], jf["iterations"], rtol=0, atol=0)
        assert (jf["jct_s"] >= 0).all() and (jf["queue_s"] >= 0).all()
        # work conservation: the per-round log adds up to every job's iterations
        prog = sim.rounds_frame().groupby("job_id")["progress"].sum()
        for jid, it in zip(jf["job_id"], jf["iterations"]):
            assert prog.get(jid, 0.0) == pytest.approx(it, rel=1e-9)
        m = sim.metrics()
        for k, v in m.items():
            if isinstance(v, dict):
                assert all(math.isfinite(x) for x in v.values()), k
            elif isinstance(v, str):
                assert k == "efficiency_form" and v == "trace-window"
            elif k == "cluster_efficiency" and sim.window_end_s == sim.first_arrival_s:
                assert v is None  # trace-window form over a zero-length window: undefined, said so
            elif k == "saturated_efficiency":
                # undefined (None) exactly when no round starts with a job waiting
                waited = bool((sim.cluster_frame()["queued"] > 0).any())
                assert (v is not None) == waited and (v is None or math.isfinite(v)), (k, v)
                assert (m["saturated_s"] > 0) == waited
            else:
                assert v is not None and math.isfinite(v), (k, v)
        assert m["jobs_completed"] == n_jobs and m["compute_utilization"] <= m["gpu_utilization"] + 1e-9 <= 1 + 2e-9
        return m


# ----------------------------------------------------------------------------------------------- decisions
def random_decision(sim: Simulator, rng: np.random.Generator) -> Decision:
    """Random (often infeasible) placements, levels and patterns for a random subset of jobs."""
    st_ = sim.state
    G = sim.cluster.num_gpus
    d = Decision()
    for j in st_.active():
        if rng.random() < 0.3:
            continue
        if j.status is JobStatus.RUNNING and rng.random() < 0.5:
            gpus = j.placement
        else:
            # half the time pack onto GPUs already in use (where worker caps and memory bind)
            used = sorted({g for jd in d.values() for g in jd.gpus})
            pool = used if rng.random() < 0.5 and len(used) >= j.num_gpus else range(G)
            gpus = tuple(int(x) for x in rng.choice(list(pool), j.num_gpus, replace=False))
        d[j.job_id] = JobDecision(gpus, int(rng.integers(0, st_.spb.max_level + 1)),
                                  ["rotating", "static"][int(rng.integers(2))])
    return d


def corrupt(sim: Simulator, d: Decision, rng: np.random.Generator):
    """One kind of bad input added to an otherwise random decision."""
    st_ = sim.state
    G = sim.cluster.num_gpus
    kind = int(rng.integers(9))
    inactive = [j for j in st_.jobs.values() if not j.active]
    if kind == 0:
        return [tuple(d.items())]                                  # not a dict
    if kind == 1:
        return {**d, "x": JobDecision((0,))}                       # a key that is no job id
    if kind == 2:
        return Decision({**d, max(st_.jobs) + 1000: JobDecision((0,))})    # unknown job
    if kind == 3 and inactive:
        j = inactive[int(rng.integers(len(inactive)))]               # pending or done job
        return Decision({**d, j.job_id: JobDecision(tuple(range(j.num_gpus)))})
    active = st_.active()
    if not active:
        return [d]
    j = active[int(rng.integers(len(active)))]
    base = tuple(int(x) for x in rng.choice(G, j.num_gpus, replace=False))
    if kind == 4:
        bad = JobDecision(base[:-1])                                # too few GPUs
    elif kind == 5:
        bad = JobDecision(base + (base[0],))                        # one GPU twice (and too many)
        bad = JobDecision((base[0],) * j.num_gpus) if j.num_gpus > 1 else bad
    elif kind == 6:
        bad = JobDecision(base[:-1] + (G + int(rng.integers(3)),))  # GPU out of range
    elif kind == 7:
        bad = JobDecision(base, st_.spb.max_level + 1)              # level too deep
    else:
        return Decision({**d, j.job_id: (base, 0)})                 # not a JobDecision
    return Decision({**d, j.job_id: bad})


def feasible_subset(sim: Simulator, d: Decision) -> Decision:
    """The jobs of ``d`` that fit, added in order (oracle-checked), dropping the rest."""
    out = Decision()
    for jid, jd in d.items():
        trial = Decision({**out, jid: jd})
        if oracle(sim, trial) is None:
            out = trial
    return out


def masked_round(sim: Simulator, codec: ActionCodec, rng: np.random.Generator) -> Decision:
    """A decision built from random masked actions (heterogeneous clusters use exhaustive masks)."""
    b = RoundBuilder(sim.state, codec)
    for _ in range(2 * codec.window_k + 2):
        mask = b.masks()
        a = int(rng.choice(np.flatnonzero(mask)))
        if a == codec.advance:
            break
        b.apply(a)  # a masked action must apply
    return b.ledger.decision


def _category(msg: str) -> str:
    for key in ("must be a dict", "integer job ids", "must be a JobDecision", "not an arrived", "needs",
                "distinct", "out of range", "SPB level", "workers", "memory exceeded"):
        if key in msg:
            return key
    return msg


def step_checked(sim: Simulator, tracker: Tracker, decision) -> None:
    t0 = sim.state.time_s
    r = sim.step(decision)
    tracker.after_step(r, t0)


# ----------------------------------------------------------------------------------------------- tests
@settings(max_examples=50, **SETTINGS)
@given(data=st.data())
def test_simulator_invariants_under_random_decisions(data):
    cluster = data.draw(clusters(), label="cluster")
    round_s = data.draw(st.sampled_from(ROUNDS), label="round_s")
    jobs = data.draw(job_sets(cluster, work_s=None if round_s is None else 8 * round_s), label="jobs")
    spb = SPBConfig(max_level=data.draw(st.integers(1, 3)), num_slots=data.draw(st.integers(2, 4)))
    cfg = SimConfig(round_s=round_s, restart_s=data.draw(st.sampled_from([0.0, 30.0])),
                    max_workers_per_gpu=data.draw(st.integers(1, 3)), spb=spb)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1), label="seed"))
    sim = Simulator(cluster, jobs, cfg)
    tracker = Tracker(sim)
    codec = ActionCodec(int(rng.integers(1, 6)), spb)
    from agents import make_scheduler
    fifo = make_scheduler("fifo")
    for rnd in range(MAX_ROUNDS):
        if sim.done:
            break
        if rnd >= 40:                          # then a policy that finishes every job
            step_checked(sim, tracker, fifo.schedule(sim.state))
            continue
        u = rng.random()
        if u < 0.3:
            d = masked_round(sim, codec, rng)
            assert oracle(sim, d) is None, "a decision built from masked actions must be feasible"
            step_checked(sim, tracker, d)
            continue
        d = random_decision(sim, rng)
        if u > 0.8:
            d = corrupt(sim, d, rng)
        why = oracle(sim, d)
        if why is None:
            step_checked(sim, tracker, d)
            continue
        before = snapshot(sim)
        with pytest.raises(InfeasibleDecision) as e:
            sim.step(d)
        msg = str(e.value)
        assert "\n" not in msg and why(msg), msg
        event("rejected: " + _category(msg))
        assert snapshot(sim) == before, "a rejected decision changed the simulator's state"
        usable = Decision({k: v for k, v in d.items() if isinstance(k, int) and isinstance(v, JobDecision)}
                          if isinstance(d, dict) else {})
        step_checked(sim, tracker, feasible_subset(sim, usable))
    tracker.finish(len(jobs))
    assert sim.state.round < MAX_ROUNDS
    event(f"heterogeneous cluster: {len(set(cluster.gpu_types)) > 1}")
    event(f"some GPU shared: {bool((sim.cluster_frame()['shared_gpus'] > 0).any())}")


@settings(max_examples=40, **SETTINGS)
@given(data=st.data())
def test_jobs_that_can_never_run_are_refused_with_their_id(data):
    """A job asking for more GPUs than the cluster has, or whose full-depth worker fits on too few
    GPUs, is refused when the simulator is built (ValueError naming the job), and only then."""
    cluster = data.draw(clusters(), label="cluster")
    n = data.draw(st.integers(1, 6))
    jobs = [JobState(job_id=i, arrival_s=0.0, num_gpus=data.draw(st.integers(1, cluster.num_gpus + 2)),
                     model=(m := data.draw(st.sampled_from(MODELS))), batch_size=default_batch_size(m),
                     iterations=5.0) for i in range(n)]
    too_big = [j.job_id for j in jobs if j.num_gpus > cluster.num_gpus]
    no_memory = [j.job_id for j in jobs if j.num_gpus <= cluster.num_gpus and sum(
        peak_gib(j.model, cluster.gpu_type(g)) * GiB <= cluster.memory_of(g) for g in range(cluster.num_gpus))
        < j.num_gpus]
    if not too_big and not no_memory:
        sim = Simulator(cluster, jobs, SimConfig())
        assert len(sim.state.jobs) == n
        return
    with pytest.raises(ValueError) as e:
        Simulator(cluster, jobs, SimConfig())
    msg = str(e.value)
    assert "\n" not in msg
    if too_big:  # checked first, in job order
        assert msg == (f"job {too_big[0]} needs {jobs[too_big[0]].num_gpus} GPUs but the cluster has "
                       f"{cluster.num_gpus}")
    else:
        j = jobs[no_memory[0]]
        assert msg.startswith(f"job {j.job_id} ({j.model}, batch {j.batch_size}) needs ") and "GiB per worker" in msg


@settings(max_examples=40, **SETTINGS)
@given(level=st.one_of(st.floats(allow_nan=True), st.booleans(), st.text(max_size=3)),
       pattern=st.text(max_size=8).filter(lambda s: s.lower() not in ("rotating", "static")))
def test_job_decision_rejects_bad_fields_with_a_clear_error(level, pattern):
    with pytest.raises(ValueError, match="JobDecision.level must be an integer"):
        JobDecision((0,), level)
    with pytest.raises(ValueError, match="unknown SPB pattern"):
        JobDecision((0,), 1, pattern)


def _env_jobs(jobs: list[JobState]) -> pd.DataFrame:
    return pd.DataFrame({"job_id": [j.job_id for j in jobs], "arrival_s": [j.arrival_s for j in jobs],
                         "num_gpus": [j.num_gpus for j in jobs], "model": [j.model for j in jobs],
                         "batch_size": [j.batch_size for j in jobs], "iterations": [j.iterations for j in jobs]})


def env_snapshot(env: JigsawClusterEnv) -> tuple:
    b = env.builder
    return (snapshot(env.sim), tuple(sorted(b.ledger.decision.items())), tuple(b.ledger.mem.tolist()),
            tuple(b.ledger.workers.tolist()), tuple(map(tuple, b.ledger.owners)), tuple(sorted(b.acted)),
            tuple(b.window), env._steps_in_round)


@settings(max_examples=30, **SETTINGS)
@given(data=st.data())
@pytest.mark.slow
def test_env_invariants_under_masked_and_unmasked_actions(data):
    gpn = data.draw(st.sampled_from([1, 2, 4]))
    gpus = gpn * data.draw(st.integers(1, 3))
    gib = data.draw(st.sampled_from(MEMORY_GIB))
    gtype = data.draw(st.sampled_from(GPU_TYPES))
    cluster = ClusterSpec.from_gpus(gpus, gpus_per_node=gpn, gpu_type=gtype, gpu_memory_gib=gib)
    round_s = data.draw(st.sampled_from((None, 10.0, 60.0, 600.0)), label="round_s")
    jobs = data.draw(job_sets(cluster, iters_max=20, work_s=None if round_s is None else 4 * round_s), label="jobs")
    mode = data.draw(st.sampled_from(["raise", "noop"]))
    env = JigsawClusterEnv(gpus=gpus, gpus_per_node=gpn, gpu_type=gtype, gpu_memory_gib=gib, trace=_env_jobs(jobs),
                           max_jobs=len(jobs), window_k=data.draw(st.integers(1, 6)),
                           spb_levels=data.draw(st.integers(1, 3)), spb_slots=data.draw(st.integers(2, 4)),
                           max_workers_per_gpu=data.draw(st.integers(1, 3)),
                           round_s=round_s, invalid_action=mode,
                           log_rounds=True)  # finish() checks work conservation on the per-job round log
    seed = data.draw(st.integers(0, 2**31 - 1), label="seed")
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed, options={"jobs": _env_jobs(jobs)})
    tracker = Tracker(env.sim)
    n = env.action_space.n
    counts = {"masked": 0, "rejected": 0, "noop": 0}
    for step in range(20_000):
        assert env.observation_space.contains(obs) and np.all(np.isfinite(obs))
        mask = env.action_masks()
        assert mask.shape == (n,) and mask[env.codec.advance]
        u = rng.random()
        if step >= 150:  # then: start what fits, else advance (finishes every job)
            runs = [a for a in np.flatnonzero(mask) if env.codec.decode(a)[0] == "run"
                    and env.builder.window[env.codec.decode(a)[1]] not in env.builder.ledger.decision]
            a = int(runs[0]) if runs else env.codec.advance
        elif u < 0.55:
            a = int(rng.choice(np.flatnonzero(mask)))
        elif u < 0.95:
            a = int(rng.integers(n))
        else:
            a = int(rng.choice([-1, n, n + 7])) if mode == "noop" else env.codec.advance
        in_range = 0 <= a < n
        feasible = in_range and bool(mask[a])
        t0, round0 = env.sim.state.time_s, env.sim.state.round
        if not feasible and mode == "raise":
            before = env_snapshot(env)
            with pytest.raises(InvalidAction) as e:
                env.step(a)
            assert "\n" not in str(e.value) and str(e.value)
            assert env_snapshot(env) == before, "a rejected action changed the env's state"
            counts["rejected"] += 1
            event("env: rejected unmasked action")
            continue
        decision_before = dict(env.builder.ledger.decision)
        obs, reward, term, trunc, info = env.step(a)
        assert math.isfinite(reward)
        if feasible:
            counts["masked"] += 1
            assert "invalid_action" not in info
        else:
            counts["noop"] += 1
            event("env: unmasked action was a no-op")
            assert info["invalid_action"]
            if env.sim.state.round == round0:  # no (auto-)advance: the decision did not change
                assert dict(env.builder.ledger.decision) == decision_before
        if env.sim.state.round != round0:
            r = type("R", (), {})()
            last = env.sim.cluster_frame().iloc[-1]
            r.start_s, r.end_s = float(last["start_s"]), float(last["end_s"])
            r.job_seconds, r.useful_gpu_s = float(last["job_seconds"]), float(last["useful_gpu_s"])
            r.busy_gpu_s, r.allocated_gpu_s = float(last["busy_gpu_s"]), float(last["allocated_gpu_s"])
            tracker.after_step(r, t0)
            assert info["round"] == round0 and reward <= 0
        if term or trunc:
            assert term and not trunc
            m = tracker.finish(len(jobs))
            assert info["episode_metrics"]["jobs_completed"] == m["jobs_completed"] == len(jobs)
            break
    else:
        pytest.fail("the episode did not end")
    assert counts["masked"] > 0


def test_env_out_of_range_action_in_raise_mode_changes_nothing():
    cluster = ClusterSpec.from_gpus(4, gpus_per_node=4)
    jobs = [JobState(0, 0.0, 1, "tiny_mlp", 32, 5.0), JobState(1, 0.0, 2, "tiny_cnn", 32, 5.0)]
    env = JigsawClusterEnv(gpus=4, gpus_per_node=4, trace=_env_jobs(jobs), max_jobs=2, window_k=2,
                           invalid_action="raise")
    env.reset(seed=0, options={"jobs": _env_jobs(jobs)})
    before = env_snapshot(env)
    with pytest.raises(InvalidAction, match=r"outside 0\.\."):
        env.step(env.action_space.n)
    assert env_snapshot(env) == before
