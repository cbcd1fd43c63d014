"""The live executor's control plane (jigsaw_executor.control, live, cluster_ray): versioned
decisions in the hub, pause with checkpoint and resume on another slot bit-identical to an
uninterrupted run, SPB level changes between iterations, a restarted scheduler that continues from
the persisted state, and live state kept in the simulator's own ClusterState. One Ray session for
the module; fixed steps per round (deterministic). docs/deploy.md.

The second half drives the control plane by hand (records published to the hub, ranks launched on
the slot hosts, reports read back from the store): a paused 2-rank job resumed on swapped slots
ends bit-identical to ``run_job_local``; a new record is applied at the next iteration (also
mid-round) and the reports show it (level, start groups, bytes per collective and subgroup, peak
activations, loss); co-located jobs step in lockstep and a finished one leaves without stalling
its partner; held workers continue in the same incarnation after a scheduler restart; a failing,
dying or stalling worker fails its job with the worker's error, not a hang."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest

pytest.importorskip("ray")
pytestmark = pytest.mark.slow

from jigsaw_env.spb import Pattern  # noqa: E402
from jigsaw_env.state import ClusterState, Decision, JobDecision  # noqa: E402
from jigsaw_executor.live import LiveConfig, LiveExecutor, LiveJob, components_of  # noqa: E402

SLOTS = 2
STEPS = 15


@pytest.fixture(scope="module")
def ray_pieces():
    from jigsaw_executor.cluster_ray import RaySession, SlotPool, get_or_create_hub, kill_actor

    session = RaySession(SLOTS, allow_oversubscribe=True).start()
    pool = SlotPool(SLOTS, 2, prefix="test-control", pin=False)  # 2 hosts per slot: co-location tests
    hub = get_or_create_hub("test-control-hub")
    yield pool, hub
    pool.close()
    kill_actor(hub)
    session.stop()


def _cfg() -> LiveConfig:
    return LiveConfig(slots=SLOTS, steps_per_round=STEPS, max_workers_per_gpu=1, pin=False, timeout_s=30.0)


def _level(state: ClusterState) -> int:
    """SPB level 2 for the job's first 2 rounds' worth of iterations, then 0 (full backprop): a
    function of the job's own iteration, so a paused run gets the same per-iteration levels."""
    return 2 if state.jobs[0].iteration < 2 * STEPS else 0


def straight(state: ClusterState) -> Decision:
    """Job 0 on slot 0 every round."""
    return Decision({0: JobDecision((0,), _level(state), Pattern.ROTATING)} if 0 in state.active_ids else {})


def pause_and_move(state: ClusterState) -> Decision:
    """Job 0 on slot 0 in round 0, paused in round 1, resumed on slot 1 from round 2 on."""
    if 0 not in state.active_ids or state.round == 1:
        return Decision()
    return Decision({0: JobDecision((0,) if state.round == 0 else (1,), _level(state), Pattern.ROTATING)})


JOB = LiveJob(0, "tiny_mlp", 1, 60, seed=3, lr=0.02)


def _run(sched, out, pool, hub, max_rounds=None):
    ex = LiveExecutor([JOB], sched, _cfg(), out, pool=pool, hub=hub, allow_oversubscribe=True)
    try:
        summary = ex.run(max_rounds=max_rounds)
    finally:
        ex.close(keep=max_rounds is not None)
    return ex, summary


@pytest.fixture(scope="module")
def reference(ray_pieces, tmp_path_factory):
    pool, hub = ray_pieces
    return _run(straight, tmp_path_factory.mktemp("straight"), pool, hub)[1]


def test_pause_resume_on_another_slot_is_identical(ray_pieces, reference, tmp_path):
    pool, hub = ray_pieces
    _, moved = _run(pause_and_move, tmp_path, pool, hub)
    a, b = reference["jobs"][0], moved["jobs"][0]
    assert a["status"] == b["status"] == "done"
    assert b["preemptions"] == 1 and b["incarnations"] == 2 and a["incarnations"] == 1
    assert a["iterations"] == b["iterations"]
    assert a["final_hash"] == b["final_hash"]  # weights (and optimizer state) bit-identical
    assert a["final_loss"] == b["final_loss"] and a["heldout_accuracy"] == b["heldout_accuracy"]
    # both ran SPB level 2, then level 0: the change took effect at a round boundary
    assert a["level_changes"] == b["level_changes"] == 1
    assert set(a["levels_used"]) == {"2/rotating", "0/rotating"}
    # the run log shows the pause (checkpoint) and the resumed launch on slot 1
    log = [json.loads(line) for line in (tmp_path / "run_log.jsonl").read_text().splitlines()]
    assert any(e["event"] == "pause" and e["job"] == 0 for e in log)
    assert any(e["event"] == "launch" and e["resumed"] and e["gpus"] == [1] for e in log)
    its = [json.loads(line) for line in (tmp_path / "iterations.jsonl").read_text().splitlines()]
    assert {it["ranks"][0]["slot"] for it in its} == {0, 1}
    # every round but the paused one ran exactly STEPS iterations (lockstep steps mode) until done
    per_round: dict[int, int] = {}
    for it in its:
        per_round[it["round"]] = per_round.get(it["round"], 0) + 1
    assert 1 not in per_round and all(n == STEPS for r, n in per_round.items() if r < max(per_round))


def test_level_change_applies_from_the_next_iteration(reference, ray_pieces, tmp_path):
    pool, hub = ray_pieces
    _run(straight, tmp_path, pool, hub)
    its = [json.loads(line) for line in (tmp_path / "iterations.jsonl").read_text().splitlines()]
    levels = [(it["round"], it["level"]) for it in its]
    assert all(lv == (2 if r < 2 else 0) for r, lv in levels)
    # at level 0 every iteration is full backprop (start group 0); at level 2 some are not
    assert all(it["ranks"][0]["start_group"] == 0 for it in its if it["level"] == 0)
    assert any(it["ranks"][0]["start_group"] > 0 for it in its if it["level"] == 2)


def test_restarted_scheduler_continues_from_persisted_state(ray_pieces, reference, tmp_path):
    """Two rounds, then the scheduler 'crashes' (the executor object is dropped; workers stay held),
    a new one restores from scheduler_state.json and finishes: same result as uninterrupted."""
    pool, hub = ray_pieces
    ex, partial = _run(straight, tmp_path, pool, hub, max_rounds=2)
    assert partial is None
    snap = json.loads((tmp_path / "scheduler_state.json").read_text())
    assert snap["round"] == 2 and snap["run_id"] == ex.run_id
    assert ray_get(hub.get_snapshot.remote(ex.run_id))["round"] == 2  # the hub keeps it too
    # a live state is the simulator's own type: any heuristic schedules it unchanged
    assert isinstance(ex.state, ClusterState)
    from agents import make_scheduler

    for name in ("fifo", "tiresias", "jigsaw"):
        dec = make_scheduler(name)(ex.state)
        assert set(dec) == {0} and dec[0].gpus == (0,), (name, dec)  # job 0 keeps its slot
    ex2 = LiveExecutor.restore(tmp_path, scheduler=straight, pool=pool, hub=hub)
    try:
        assert ex2.run_id == ex.run_id and ex2.state.round == 2
        summary = ex2.run()
    finally:
        ex2.close()
    j, ref = summary["jobs"][0], reference["jobs"][0]
    assert j["status"] == "done" and j["final_hash"] == ref["final_hash"] and j["iterations"] == ref["iterations"]
    from jigsaw_executor.decision_log import read_decision_log

    header, rounds, _ = read_decision_log(tmp_path / "decision_log.jsonl")
    assert [r["round"] for r in rounds] == list(range(len(rounds)))


def ray_get(ref):
    import ray

    return ray.get(ref, timeout=30)


def test_hub_publishes_versioned_decisions(ray_pieces):
    _, hub = ray_pieces
    run = "test-hub-versions"
    from jigsaw_executor.store_seal import RecordSeal, new_token

    token = new_token()
    with pytest.raises(Exception, match="no secret token"):
        ray_get(hub.publish.remote(run, {0: {"action": "run"}}))
    assert ray_get(hub.open_run.remote(run, token)) == token
    assert ray_get(hub.open_run.remote(run, new_token())) == token  # the first token stays
    v1 = ray_get(hub.publish.remote(run, {0: {"action": "run", "gpus": [0], "level": 2, "pattern": "rotating"}}))
    v2 = ray_get(hub.publish.remote(run, {0: {"action": "pause"}, 1: {"action": "run", "gpus": [1], "level": 0}}))
    assert v2 == v1 + 1 == ray_get(hub.version.remote(run))
    d0 = ray_get(hub.decision.remote(run, 0))
    assert d0["action"] == "pause" and d0["v"] == v2 and d0["seq"] == 2
    assert ray_get(hub.decision.remote(run, 1))["seq"] == 1
    with pytest.raises(Exception, match="unknown action"):
        ray_get(hub.publish.remote(run, {0: {"action": "explode"}}))
    # the workers' view: the same record through the TCPStore
    from jigsaw_executor.control import Keys, connect_store, read_record

    host, port = ray_get(hub.address.remote())
    st = connect_store(host, port, run, 10.0)
    assert read_record(st, Keys.ctl(0), RecordSeal(token)) == d0
    ray_get(hub.put_snapshot.remote(run, {"round": 7}))
    assert ray_get(hub.get_snapshot.remote(run)) == {"round": 7}
    ray_get(hub.forget.remote(run))


def test_a_client_without_the_token_can_neither_read_nor_forge_a_record(ray_pieces):
    """The store listens on loopback under an embedded Ray; a client that reaches it without the
    run's token sees only sealed bytes, and a record it writes, or moves from another job, or
    alters, is refused by the workers' reader."""
    from jigsaw_executor.control import Keys, connect_store, read_record
    from jigsaw_executor.store_seal import ForgedRecord, RecordSeal, new_token

    _, hub = ray_pieces
    host, port = ray_get(hub.address.remote())
    assert host == "127.0.0.1"
    run, token = "test-hub-token", new_token()
    ray_get(hub.open_run.remote(run, token))
    rec = {"action": "run", "gpus": [0], "level": 2, "pattern": "rotating", "round": 3}
    ray_get(hub.publish.remote(run, {0: rec, 1: dict(rec, gpus=[1])}))
    intruder = connect_store(host, port, run, 10.0)
    raw = intruder.get(Keys.ctl(0))
    assert b"rotating" not in raw and b"gpus" not in raw and b'"action"' not in raw
    with pytest.raises(ForgedRecord):
        read_record(intruder, Keys.ctl(0), RecordSeal(new_token()))  # a guessed token opens nothing
    worker_view = connect_store(host, port, run, 10.0)
    seal = RecordSeal(token)
    for forged in (json.dumps(dict(rec, action="stop", seq=99, v=99, job=0)),  # plain JSON
                   intruder.get(Keys.ctl(1)).decode(),                          # job 1's record under job 0
                   raw.decode()[:-4] + ("AAAA" if not raw.decode().endswith("AAAA") else "BBBB")):  # altered
        intruder.set(Keys.ctl(0), forged)
        with pytest.raises(ForgedRecord, match="not a record sealed with this run's token"):
            read_record(worker_view, Keys.ctl(0), seal)
    assert ray_get(hub.decision.remote(run, 0))["action"] == "run"
    ray_get(hub.forget.remote(run))


def test_the_store_listens_on_its_address_only(ray_pieces):
    """Not 0.0.0.0: the listening socket of the hub's store is bound to the advertised host."""
    import subprocess

    _, hub = ray_pieces
    host, port = ray_get(hub.address.remote())
    out = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("ss is not available")
    local = {line.split()[3] for line in out.stdout.splitlines() if line.strip()}
    assert local == {f"{host}:{port}"}, local


def test_a_worker_spec_never_shows_its_token():
    from jigsaw_executor.control import WorkerSpec
    from jigsaw_executor.store_seal import RecordSeal, new_token

    token = new_token()
    spec = WorkerSpec(run_id="r", job_id=0, incarnation=0, rank=0, world=1, slot=0, model="tiny_mlp", batch_size=8,
                      store_host="127.0.0.1", store_port=1, checkpoint_dir="/tmp", store_token=token)
    assert token not in repr(spec) and token not in repr(RecordSeal(token))
    with pytest.raises(ValueError, match="store token: expected the run's secret"):
        RecordSeal("")


def test_components_of_shared_slots():
    dec = {0: JobDecision((0, 1)), 1: JobDecision((1,)), 2: JobDecision((2,)), 3: JobDecision((2, 3)),
           4: JobDecision((4,))}
    assert components_of(dec) == [[0, 1], [2, 3], [4]]
    assert components_of({}) == []


# ----------------------------------------------------------------------------------------------- by hand
BS = 32
_run_counter = iter(range(1000))


@pytest.fixture(scope="module")
def ray_env(ray_pieces):
    pool, hub = ray_pieces
    return {"pool": pool, "hub": hub, "addr": tuple(ray_get(hub.address.remote()))}


class Ctl:
    """Hand-driven control plane: publish records, launch ranks, read reports."""

    def __init__(self, env):
        import ray

        from jigsaw_executor.control import connect_store

        self.ray = ray
        self.env = env
        from jigsaw_executor.store_seal import new_token

        self.run_id = f"ctl{next(_run_counter)}-{time.time_ns() % 10**8}"
        self.store = connect_store(*env["addr"], self.run_id, 30)
        self.token = ray.get(env["hub"].open_run.remote(self.run_id, new_token()))
        self.refs: dict[tuple[int, int], list] = {}

    def publish(self, job_id: int, **rec) -> None:
        base = dict(round=0, inc=0, action="run", gpus=[], level=0, pattern="rotating", comp=0, comp_size=1,
                    steps=-1, finish_at=10 ** 9)
        base.update(rec)
        self.ray.get(self.env["hub"].publish.remote(self.run_id, {job_id: base}))

    def launch(self, job_id: int, inc: int, gpus, ckpt, model="tiny_mlp", seed=0, **kw) -> None:
        from jigsaw_executor.control import WorkerSpec

        pool = self.env["pool"]
        refs = []
        for w, g in enumerate(gpus):
            h = pool.free_host(g)
            h.owner = (job_id, inc, w)
            spec = WorkerSpec(run_id=self.run_id, job_id=job_id, incarnation=inc, rank=w, world=len(gpus), slot=g,
                              model=model, batch_size=BS, store_host=self.env["addr"][0],
                              store_port=self.env["addr"][1], store_token=self.token, checkpoint_dir=str(ckpt),
                              seed=seed, timeout_s=30, **kw)
            refs.append(h.handle.run_worker.remote(spec))
        self.refs[(job_id, inc)] = refs

    def wait_keys(self, keys) -> None:
        """Poll the store until every key is there; a worker that failed raises its error (a hang
        is the calling test's timeout)."""
        while not all(self.store.check([k]) for k in keys):
            for refs in self.refs.values():
                done, _ = self.ray.wait(refs, num_returns=len(refs), timeout=0)
                for d in done:
                    self.ray.get(d)  # raises a worker's failure
            time.sleep(0.005)

    def reports(self, job_id, inc, rnd, world):
        from jigsaw_executor.control import Keys, read_json

        self.wait_keys([Keys.rep(job_id, inc, rnd, w) for w in range(world)])
        return [read_json(self.store, Keys.rep(job_id, inc, rnd, w))["iterations"] for w in range(world)]

    def finish(self, job_id, inc):
        out = self.ray.get(self.refs.pop((job_id, inc)), timeout=60)
        self.env["pool"].release(job_id, inc)
        return out


def _starts(level, pattern, world, t, B):
    from jigsaw_env.spb import SPBConfig, worker_starts

    slots = SPBConfig().start_slots(level, B)
    return [int(s) for s in worker_starts(slots, Pattern.parse(pattern), world, t)]


def test_fast_digits_is_the_data_module_bit_for_bit():
    from jigsaw_executor.control import FastDigits
    from jigsaw_executor.data import DigitsData

    for seed, world, bs in ((0, 2, 32), (3, 1, 32), (1, 3, 16)):
        fast, ref = FastDigits(seed, world, bs), DigitsData(seed=seed)
        ipe = ref.iterations_per_epoch(world, bs)
        for t in (0, 1, ipe - 1, ipe, 3 * ipe + 2):
            for r in range(world):
                a, b = fast(t, r), ref.batch(t, r, world, bs)
                assert np.array_equal(a[0].numpy(), b[0].numpy()) and np.array_equal(a[1].numpy(), b[1].numpy())


@pytest.mark.timeout(180)  # a hang guard (the Ray session's start included), not a speed target
def test_two_rank_job_paused_and_resumed_on_swapped_slots_equals_run_job_local(ray_env, tmp_path):
    """3 iterations on slots (0, 1), paused (checkpoint), resumed on (1, 0) for 3 more: the loaded
    weights are the paused ones, and the end state equals an uninterrupted 6-iteration run."""
    from jigsaw_executor.control import Keys, read_json
    from jigsaw_executor.launcher import run_job_local
    from jigsaw_executor.spb_worker import read_checkpoint_meta

    c = Ctl(ray_env)
    ck = tmp_path / "ck"
    c.publish(1, round=0, inc=0, gpus=[0, 1], level=2, steps=3)
    c.launch(1, 0, [0, 1], ck)
    reps = c.reports(1, 0, 0, 2)
    assert [it["t"] for it in reps[0]] == [0, 1, 2]
    c.publish(1, round=1, inc=0, action="pause")
    paused = c.finish(1, 0)
    assert {p["status"] for p in paused} == {"paused"} and len({p["hash"] for p in paused}) == 1
    meta = read_checkpoint_meta(ck)
    assert meta["iteration"] == 3 and meta["model_sha256"] == paused[0]["hash"]
    c.publish(1, round=2, inc=1, gpus=[1, 0], level=2, steps=3, finish_at=6)
    c.launch(1, 1, [1, 0], ck)
    c.wait_keys([Keys.ready(1, 1)])
    ready = read_json(c.store, Keys.ready(1, 1))
    assert ready["t"] == 3 and ready["loaded_hash"] == paused[0]["hash"]
    reps = c.reports(1, 1, 2, 2)
    assert [it["t"] for it in reps[0]] == [3, 4, 5]
    done = c.finish(1, 1)
    assert {d["status"] for d in done} == {"done"}
    fin = read_json(c.store, Keys.fin(1, 1))
    assert fin["status"] == "done" and fin["t"] == 6 and fin["accuracy"] is not None
    straight_run = run_job_local("tiny_mlp", 2, 6, [(2, "rotating")] * 6, batch_size=BS, seed=0, hash_optimizer=False)
    assert straight_run.state_hashes[0] == done[0]["hash"] == done[1]["hash"]


@pytest.mark.timeout(180)  # a hang guard (the Ray session's start included), not a speed target
def test_new_records_apply_at_the_next_iteration_and_show_in_worker_reports(ray_env, tmp_path):
    from jigsaw_env.network import INTRA_NODE
    from jigsaw_env.spb import iteration_cost
    from jigsaw_executor.models import build_executor_model, exact_bytes_table

    c = Ctl(ray_env)
    B = 5
    table = exact_bytes_table(build_executor_model("tiny_mlp"), BS)
    # round 0: level 0 for 3 steps; round 1: level 3 static for 3 steps (applied from its first iteration)
    c.publish(2, round=0, gpus=[0, 1], level=0, steps=3)
    c.launch(2, 0, [0, 1], tmp_path / "ck")
    r0 = c.reports(2, 0, 0, 2)
    c.publish(2, round=1, gpus=[0, 1], level=3, pattern="static", steps=3)
    r1 = c.reports(2, 0, 1, 2)
    for t, (a, b) in enumerate(zip(r0[0] + r1[0], r0[1] + r1[1])):
        level, pattern = (0, "rotating") if t < 3 else (3, "static")
        starts = _starts(level, pattern, 2, t, B)
        assert (a["lvl"], a["pat"], a["t"]) == (level, pattern, t) and b["lvl"] == level
        assert [a["sg"], b["sg"]] == starts
        cost = iteration_cost(table, np.array(starts), INTRA_NODE)
        assert a["bytes"] + b["bytes"] == a["wire"] == cost.bytes   # counted at each collective call
        assert sum(a["by"].values()) == a["bytes"]                  # ... per collective and subgroup
        assert a["act"] == table.activation_peak_bytes(starts[0]) and b["act"] == table.activation_peak_bytes(starts[1])
        assert np.isfinite(a["loss"]) and a["iter_s"] > 0
    assert any(k.startswith("broadcast@") for k in r1[0][0]["by"])  # reduce + broadcast under SPB
    # mid-round: a new version while the job runs is picked up at the next iteration boundary
    c.publish(2, round=2, gpus=[0, 1], level=0, steps=-1)
    time.sleep(0.3)
    t_pub = time.time()
    c.publish(2, round=2, gpus=[0, 1], level=2, pattern="rotating", steps=-1)
    time.sleep(0.3)
    c.publish(2, round=2, gpus=[0, 1], level=2, action="hold")
    its = c.reports(2, 0, 2, 2)[0]
    levels = [it["lvl"] for it in its]
    k = levels.index(2)
    assert set(levels[:k]) == {0} and set(levels[k:]) == {2}
    assert its[k]["wall"] >= t_pub - 0.05
    assert its[k - 1]["wall"] <= t_pub + 0.05  # the switch came at the first boundary after the publish
    c.publish(2, round=3, action="stop")
    assert {d["status"] for d in c.finish(2, 0)} == {"stopped"}


@pytest.mark.timeout(180)  # a hang guard (the Ray session's start included), not a speed target
def test_colocated_jobs_step_in_lockstep_and_a_finished_one_leaves(ray_env, tmp_path):
    from jigsaw_executor.control import Keys, read_json

    c = Ctl(ray_env)
    # jobs 3 and 4 share slot 0 (one component of 2); job 3's work ends after 4 iterations
    c.publish(3, round=0, gpus=[0], comp=0, comp_size=2, steps=8, finish_at=4)
    c.publish(4, round=0, gpus=[0], comp=0, comp_size=2, steps=8)
    c.launch(3, 0, [0], tmp_path / "a", model="tiny_cnn")
    c.launch(4, 0, [0], tmp_path / "b", model="tiny_mlp")
    a = c.reports(3, 0, 0, 1)[0]
    b = c.reports(4, 0, 0, 1)[0]
    assert len(a) == 4 and len(b) == 8
    for k in range(4):  # iteration k of both starts after both finished iteration k-1
        assert abs(a[k]["wall"] - b[k]["wall"]) < 0.5 * max(a[k]["iter_s"], b[k]["iter_s"]) + 0.01
        if k:
            assert a[k]["wall"] >= b[k - 1]["wall"] + b[k - 1]["step_s"] - 1e-3
            assert b[k]["wall"] >= a[k - 1]["wall"] + a[k - 1]["step_s"] - 1e-3
    assert read_json(c.store, Keys.fin(3, 0))["status"] == "done"
    c.publish(4, round=1, action="stop")
    c.finish(3, 0)
    c.finish(4, 0)


def test_held_workers_continue_in_the_same_incarnation_after_a_restart(ray_env, tmp_path):
    from agents import make_scheduler
    from jigsaw_executor.decision_log import replay_decision_log

    jobs = [LiveJob(0, "tiny_mlp", 2, 30, seed=0), LiveJob(1, "tiny_cnn", 1, 24, seed=1)]
    cfg = LiveConfig(slots=2, steps_per_round=4, timeout_s=30)
    out = tmp_path / "run"
    ex = LiveExecutor(jobs, make_scheduler("fifo"), cfg, out, pool=ray_env["pool"], hub=ray_env["hub"],
                      scheduler_spec={"kind": "heuristic", "name": "fifo", "kwargs": {}})
    assert ex.run(max_rounds=2) is None                        # jobs held, waiting for round 2
    held = dict(ex.inc)
    it_before = {jid: j.iteration for jid, j in ex.state.jobs.items()}
    ex.close(keep=True)
    del ex
    ex2 = LiveExecutor.restore(out, pool=ray_env["pool"], hub=ray_env["hub"])  # fifo from its spec and state
    assert {jid: j.iteration for jid, j in ex2.state.jobs.items()} == it_before
    summary = ex2.run()
    ex2.close()
    assert all(j["status"] == "done" for j in summary["jobs"].values())
    log = [json.loads(line) for line in (out / "decision_log.jsonl").read_text().splitlines()]
    nums = [r["round"] for r in log if r["kind"] == "round"]
    assert nums == list(range(len(nums))) and log[-1]["kind"] == "end"
    # round 2, the first after the restart: every held worker continues in it
    (rec,) = [r for r in log if r["kind"] == "round" and r["round"] == 2]
    first_after = {int(k): v for k, v in rec["outcome"].items()}
    assert held and set(held) <= set(first_after), (held, first_after)
    for jid, inc in held.items():
        assert first_after[jid]["inc"] == inc and not first_after[jid]["started"]
        assert first_after[jid]["first_iteration"] == it_before[jid]
    events = [json.loads(line)["event"] for line in (out / "run_log.jsonl").read_text().splitlines()]
    assert "restore" in events
    rep = replay_decision_log(out / "decision_log.jsonl")
    assert rep.decisions_match and rep.rounds_checked == len(nums)


@pytest.mark.parametrize("mode,world", [("raise", 2), ("exit", 1), ("hang", 2)])
def test_a_failing_worker_fails_its_job_with_the_workers_error(ray_env, tmp_path, mode, world):
    from agents import make_scheduler
    from jigsaw_executor.live import JobFailed

    cfg = LiveConfig(slots=2, steps_per_round=50, timeout_s=4.0, max_restarts=0)  # no recovery: fail at once
    rank = world - 1
    ex = LiveExecutor([LiveJob(0, "tiny_mlp", world, 200)], make_scheduler("fifo"), cfg, tmp_path / mode,
                      pool=ray_env["pool"], hub=ray_env["hub"], fail_at={0: (rank, 3, mode)})
    t0 = time.time()
    with pytest.raises(JobFailed) as ei:
        ex.run()
    took = time.time() - t0
    ex.close()
    msg = str(ei.value)
    assert ei.value.job_id == 0 and took < 60
    if mode == "raise":
        assert ei.value.rank == 1 and "injected failure on rank 1 at iteration 3" in msg and "RuntimeError" in msg
    elif mode == "exit":
        assert ei.value.rank == 0 and "died without a Python error" in msg
    else:  # a stalled rank 1: rank 0's collective times out, rank 1 is named as still running
        assert "still running" in msg and "rank 0" in msg
