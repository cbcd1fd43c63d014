"""Fault tolerance of the live executor (docs/executor.md, "Fault tolerance"): worker processes
really killed (SIGKILL of their pid) mid-run, a whole job killed, a co-located job killed, retries
exhausted, a checkpoint write interrupted, and the scheduler process itself killed and restarted.

Known answers: the job is a 2-rank tiny MLP at SPB level 2 (rotating start groups depend on the
iteration only; no dropout, no BatchNorm), so a run that recovers correctly ends with exactly the
weights and optimizer state of an uninterrupted run (the same sha256), whether it rolled back to
its checkpoint (full recovery: checkpoints hold the RNG state, batches are a function of the
iteration) or copied the state from a surviving peer (partial recovery: the failed step leaves no
trace and is run again).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytestmark = pytest.mark.slow

from jigsaw_env.spb import Pattern  # noqa: E402
from jigsaw_env.state import ClusterState, Decision, JobDecision  # noqa: E402
from jigsaw_executor.live import JobFailed, LiveConfig, LiveExecutor, LiveJob  # noqa: E402
from jigsaw_executor.models import build_executor_model  # noqa: E402
from jigsaw_executor.spb_worker import read_checkpoint_meta  # noqa: E402

SLOTS = 2
EVERY = 25          # checkpoint interval (iterations)
KILL_AFTER = 100    # kill once a checkpoint at >= this iteration exists
JOB = LiveJob(0, "tiny_mlp", 2, 300, seed=5, lr=0.02)


@pytest.fixture(scope="module")
def ray_pieces():
    from jigsaw_executor.cluster_ray import RaySession, SlotPool, get_or_create_hub, kill_actor

    session = RaySession(SLOTS, allow_oversubscribe=True).start()
    pool = SlotPool(SLOTS, 2, prefix="test-ft", pin=False)  # 2 hosts per slot: warm spares, co-location
    hub = get_or_create_hub("test-ft-hub")
    yield pool, hub
    pool.close()
    kill_actor(hub)
    session.stop()


def both_slots(state: ClusterState) -> Decision:
    """Job 0 on slots (0, 1) at SPB level 2, rotating, every round."""
    return Decision({0: JobDecision((0, 1), 2, Pattern.ROTATING)} if 0 in state.active_ids else {})


def _cfg(**kw) -> LiveConfig:
    base = dict(slots=SLOTS, steps_per_round=60, max_workers_per_gpu=2, pin=False, timeout_s=20.0,
                checkpoint_every=EVERY)
    base.update(kw)
    return LiveConfig(**base)


def _run(out, pool, hub, jobs=(JOB,), sched=both_slots, **kw):
    ex = LiveExecutor(list(jobs), sched, _cfg(**{k: v for k, v in kw.items() if k != "fail_at"}), out, pool=pool,
                      hub=hub, fail_at=kw.get("fail_at"))
    try:
        return ex, ex.run()
    finally:
        ex.close()


def _warm(pool) -> None:
    """Wait until every host has restarted after the previous test's kills."""
    for h in pool.hosts.values():
        assert h.owner is None
    pool.refresh(timeout_s=120.0)


class Killer(threading.Thread):
    """SIGKILLs the host processes of the given ranks of job 0 as soon as the job's checkpoint
    folder holds a checkpoint at iteration >= ``after`` (a real kill of the worker's pid, from
    outside, at whatever point the worker is)."""

    def __init__(self, pool, ckpt_dir: Path, after: int, ranks=(1,), job: int = 0):
        super().__init__(daemon=True)
        self.pool, self.ckpt, self.after, self.ranks, self.job = pool, ckpt_dir, after, set(ranks), job
        self.killed: list[int] = []
        self.checkpoint_at_kill: int | None = None

    def run(self) -> None:
        deadline = time.time() + 180
        while time.time() < deadline:
            meta = read_checkpoint_meta(self.ckpt)
            if meta is not None and meta["iteration"] >= self.after:
                hosts = [h for h in list(self.pool.hosts.values())
                         if h.owner is not None and h.owner[0] == self.job and h.owner[2] in self.ranks]
                if len(hosts) == len(self.ranks):
                    self.checkpoint_at_kill = int(meta["iteration"])
                    for h in hosts:
                        os.kill(int(h.pid), signal.SIGKILL)
                        self.killed.append(int(h.pid))
                    return
            time.sleep(0.001)


@pytest.fixture(scope="module")
def reference(ray_pieces, tmp_path_factory):
    """The uninterrupted run."""
    pool, hub = ray_pieces
    _, summary = _run(tmp_path_factory.mktemp("ref"), pool, hub)
    j = summary["jobs"][0]
    assert j["status"] == "done" and j["failures"] == 0 and len(set(j["rank_hashes"])) == 1
    return j


def _events(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "run_log.jsonl").read_text().splitlines()]


def test_killed_worker_restarts_from_its_last_checkpoint(ray_pieces, reference, tmp_path):
    """Full recovery: rank 1's process is SIGKILLed mid-run; the job restarts from its last
    checkpoint on free slot hosts, loses less than one checkpoint interval, and completes with the
    uninterrupted run's exact weights."""
    pool, hub = ray_pieces
    _warm(pool)
    killer = Killer(pool, tmp_path / "checkpoints" / "job0", KILL_AFTER, ranks=(1,))
    killer.start()
    _, summary = _run(tmp_path, pool, hub, recovery="full")
    killer.join(1)
    assert killer.killed, "the worker was not killed (the job ended first?)"
    j = summary["jobs"][0]
    assert j["status"] == "done"
    assert j["failures"] == 1 and j["restarts"] == 1 and j["partial_recoveries"] == 0
    rec = j["recoveries"][0]
    assert rec["mode"] == "full" and rec["dead_ranks"] == [1] and rec["relaunched"]
    # the newest complete checkpoint at the kill (one more may have completed in the same instant)
    assert rec["resume_iteration"] in (killer.checkpoint_at_kill, killer.checkpoint_at_kill + EVERY)
    assert rec["loaded_iteration"] == rec["resume_iteration"]      # the new incarnation loaded it
    assert rec["lost_exact"] and 0 <= rec["iterations_lost"] <= EVERY  # rank 0 said how far it got
    assert rec["fail_iteration"] - rec["resume_iteration"] == rec["iterations_lost"]
    assert j["final_iteration"] == reference["final_iteration"]
    assert j["final_hash"] == reference["final_hash"]                # weights bit-identical
    assert j["rank_hashes"] == reference["rank_hashes"]              # ... and optimizer state, every rank
    assert j["heldout_accuracy"] == reference["heldout_accuracy"]
    ev = [e for e in _events(tmp_path) if e["event"] in ("job_failed", "launch")]
    assert [e["event"] for e in ev] == ["launch", "job_failed", "launch"] and ev[-1]["resumed"]


def test_partial_recovery_keeps_replicas_identical_and_loses_nothing(ray_pieces, reference, tmp_path):
    """Partial recovery (CPR-style): rank 0 (the one that reads the decisions) is SIGKILLed; rank 1
    goes on without rolling back, a replacement rank 0 copies the weights and optimizer state from
    it; no iteration is lost and the replicas end bit-identical, equal to the uninterrupted run."""
    pool, hub = ray_pieces
    _warm(pool)
    killer = Killer(pool, tmp_path / "checkpoints" / "job0", KILL_AFTER, ranks=(0,))
    killer.start()
    _, summary = _run(tmp_path, pool, hub, recovery="partial")
    killer.join(1)
    assert killer.killed
    j = summary["jobs"][0]
    assert j["status"] == "done"
    assert j["failures"] == 1 and j["partial_recoveries"] == 1 and j["restarts"] == 0
    assert j["incarnations"] == 1                                    # nobody restarted from a checkpoint
    rec = j["recoveries"][0]
    assert rec["mode"] == "partial" and rec["dead_ranks"] == [0] and rec["src"] == 1
    assert rec["iterations_lost"] == 0 and rec["resume_iteration"] >= killer.checkpoint_at_kill
    # the copied state: the weights and SGD's momentum buffer of each, plus the file's framing
    params = sum(p.numel() * p.element_size() for p in build_executor_model("tiny_mlp").parameters())
    assert 2 * params <= rec["state_bytes"] <= 2 * params + 65536 and rec["recovery_s"] > 0
    assert j["iterations_lost"] == 0
    assert j["iterations"] == j["final_iteration"] == reference["final_iteration"]  # every iteration once
    assert len(set(j["rank_hashes"])) == 1                           # replicas bit-identical (optimizer too)
    assert j["rank_hashes"] == reference["rank_hashes"] and j["final_hash"] == reference["final_hash"]
    assert any(e["event"] == "recover" and e["mode"] == "partial" for e in _events(tmp_path))


def test_killing_a_whole_job_restarts_it_from_its_checkpoint(ray_pieces, reference, tmp_path):
    """Both ranks killed: no survivor to copy from, so even in partial mode the job restarts from
    its checkpoint (full recovery) and completes exactly."""
    pool, hub = ray_pieces
    _warm(pool)
    killer = Killer(pool, tmp_path / "checkpoints" / "job0", KILL_AFTER, ranks=(0, 1))
    killer.start()
    _, summary = _run(tmp_path, pool, hub, recovery="partial")
    killer.join(1)
    assert len(killer.killed) == 2
    j = summary["jobs"][0]
    assert j["status"] == "done" and j["restarts"] == 1 and j["partial_recoveries"] == 0
    rec = j["recoveries"][0]
    assert rec["mode"] == "full" and rec["resume_iteration"] in (killer.checkpoint_at_kill,
                                                                 killer.checkpoint_at_kill + EVERY)
    assert rec["iterations_lost"] <= EVERY
    assert j["final_hash"] == reference["final_hash"] and j["rank_hashes"] == reference["rank_hashes"]


def test_killed_idle_slot_hosts_restart_and_the_next_job_runs_exactly(ray_pieces, reference, tmp_path):
    """Every host process of slot 1 SIGKILLed while idle (no worker on it): Ray restarts them, the
    next launch waits for a restarted one, and the job completes with no failure counted and the
    uninterrupted run's exact weights."""
    pool, hub = ray_pieces
    _warm(pool)
    victims = [h for h in pool.hosts.values() if h.slot == 1]
    old = {h.name: int(h.pid) for h in victims}
    for h in victims:
        os.kill(int(h.pid), signal.SIGKILL)
    _, summary = _run(tmp_path, pool, hub)
    j = summary["jobs"][0]
    assert j["status"] == "done" and j["failures"] == 0 and j["recoveries"] == []
    assert j["final_hash"] == reference["final_hash"] and j["rank_hashes"] == reference["rank_hashes"]
    launch = next(e for e in _events(tmp_path) if e["event"] == "launch")
    ran_on = pool.hosts[(1, int(launch["hosts"][1].rsplit("h", 1)[1]))]
    assert ran_on.name in old and ran_on.pid != old[ran_on.name]  # a restarted process


def test_a_killed_colocated_job_restarts_and_its_partner_goes_on(ray_pieces, tmp_path):
    """Two one-slot jobs share slot 0 in lockstep; job 1's worker kills itself (SIGKILL) at
    iteration 70. Its partner is released from the lockstep barrier (it holds until the next round,
    it does not fail), job 1 restarts from its checkpoint, and both complete all their work."""
    pool, hub = ray_pieces
    _warm(pool)
    jobs = [LiveJob(0, "tiny_mlp", 1, 240, seed=1, lr=0.02), LiveJob(1, "tiny_mlp", 1, 200, seed=2, lr=0.02)]

    def shared(state: ClusterState) -> Decision:
        return Decision({j: JobDecision((0,), 0, Pattern.ROTATING) for j in (0, 1) if j in state.active_ids})

    _, summary = _run(tmp_path, pool, hub, jobs=jobs, sched=shared, fail_at={1: (0, 70, "kill")}, timeout_s=15.0)
    a, b = summary["jobs"][0], summary["jobs"][1]
    assert a["status"] == b["status"] == "done"
    assert a["failures"] == 0 and b["failures"] == 1 and b["restarts"] == 1
    rec = b["recoveries"][0]
    # a one-rank job killed by a signal tells nobody how far it got: the count is a lower bound
    # (its last report was at iteration 60, the end of round 0; it really lost 20)
    assert rec["resume_iteration"] == 50 and rec["iterations_lost"] == 10 and not rec["lost_exact"]
    # level 0: progress is one iteration each, so the final iteration is the work asked for
    assert a["final_iteration"] == 240 and b["final_iteration"] == 200
    its = [json.loads(line) for line in (tmp_path / "iterations.jsonl").read_text().splitlines()]
    per_job = {0: [it["t"] for it in its if it["job"] == 0], 1: [it["t"] for it in its if it["job"] == 1]}
    assert per_job[0] == list(range(240))                 # the partner neither repeated nor skipped
    assert sorted(set(per_job[1])) == list(range(200))    # job 1 re-ran 50..69 after its restart


@pytest.mark.timeout(180)  # a hang guard, not a speed target
def test_retries_exhausted_fail_the_run_clearly(ray_pieces, tmp_path):
    """A worker that dies at iteration 5 in every incarnation: one restart (max_restarts=1), then a
    JobFailed naming the job, the count and the cause."""
    pool, hub = ray_pieces
    _warm(pool)
    one = LiveJob(0, "tiny_mlp", 1, 100, seed=0, lr=0.02)

    def slot0(state):
        return Decision({0: JobDecision((0,), 0, Pattern.ROTATING)} if 0 in state.active_ids else {})

    with pytest.raises(JobFailed) as ei:
        _run(tmp_path, pool, hub, jobs=[one], sched=slot0, fail_at={0: (0, 5, "kill", True)}, max_restarts=1)
    msg = str(ei.value)
    assert ei.value.job_id == 0
    assert msg.startswith("job 0 (tiny_mlp) failed 2 times, more than max_restarts=1: giving up.")
    assert "died without a Python error" in msg
    assert not pool.owned_by(0)  # nothing left holding a host


def test_rollback_credits_progress_per_iteration(tmp_path):
    """The progress ledger (no Ray): iterations 0-39 at eta 1 and 40-79 at eta 0.75; a rollback to
    a checkpoint at 60 leaves 40 + 20 x 0.75 = 55 iterations of progress; one to a checkpoint at 90,
    beyond the last report (80), credits 80-89 at the round's eta and loses nothing known."""
    ex = LiveExecutor([LiveJob(0, "tiny_mlp", 1, 100)], both_slots, _cfg(), tmp_path)
    j = ex.state.jobs[0]
    ex.ledger.credit(0, 0, 40, 1.0)
    ex.ledger.credit(0, 40, 80, 0.75)
    j.iteration, j.progress = 80, 70.0
    ex.totals[0]["iterations"] = 80
    lost, exact = ex.ledger.rollback(0, 60, 83)
    assert (j.iteration, j.progress, lost, exact) == (60, 55.0, 23, True)
    assert ex.totals[0]["eta_segments"] == [[0, 40, 1.0], [40, 60, 0.75]]
    j.iteration, j.progress = 80, 70.0
    ex.ledger.credit(0, 60, 80, 0.75)
    lost, exact = ex.ledger.rollback(0, 90, None)   # no decision in force: the last eta
    assert (j.iteration, j.progress, lost, exact) == (90, 77.5, 0, False)
    assert ex.totals[0]["iterations"] == 90


def test_a_checkpoint_interrupted_mid_write_leaves_the_previous_one_loadable(tmp_path, monkeypatch):
    """A save that dies after writing the new weights but before meta.json (a process killed
    mid-save) leaves meta.json naming the previous, complete checkpoint; a completed save keeps
    the last two complete checkpoints and removes the rest (the unfinished one included)."""
    import torch

    from jigsaw_executor import spb_checkpoint
    from jigsaw_executor.models import build_executor_model
    from jigsaw_executor.spb_worker import SPBTrainer

    torch.manual_seed(0)
    model = build_executor_model("tiny_mlp")
    tr = SPBTrainer(model, model.make_optimizer())
    ck = tmp_path / "ck"
    tr.save_checkpoint(ck, 10)
    h10 = tr.state_hash()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    real = spb_checkpoint._atomic_torch_save

    def dies_on_rng(obj, path):
        if path.name.startswith("rng-rank"):
            raise KeyboardInterrupt("killed mid-save")
        real(obj, path)

    monkeypatch.setattr(spb_checkpoint, "_atomic_torch_save", dies_on_rng)
    with pytest.raises(KeyboardInterrupt):
        tr.save_checkpoint(ck, 20)
    monkeypatch.setattr(spb_checkpoint, "_atomic_torch_save", real)
    assert read_checkpoint_meta(ck)["iteration"] == 10
    assert tr.load_checkpoint(ck) == 10 and tr.state_hash() == h10
    tr.save_checkpoint(ck, 30)
    assert sorted(f.name for f in ck.iterdir()) == ["meta.json", "rng-rank0-000000010.pt", "rng-rank0-000000030.pt",
                                                    "state-000000010.pt", "state-000000030.pt"]
    assert tr.load_checkpoint(ck) == 30


def _two_checkpoints(ck):
    import torch

    from jigsaw_executor.models import build_executor_model
    from jigsaw_executor.spb_worker import SPBTrainer

    torch.manual_seed(0)
    model = build_executor_model("tiny_mlp")
    tr = SPBTrainer(model, model.make_optimizer())
    tr.save_checkpoint(ck, 10)
    tr.save_checkpoint(ck, 20)
    return tr


def test_the_executor_rolls_back_past_a_truncated_newest_checkpoint(tmp_path):
    """No Ray: the executor's rollback target skips a truncated newest checkpoint for the previous
    one, logs one warning line, and the trainer then loads that one."""
    ex = LiveExecutor([LiveJob(0, "tiny_mlp", 1, 100)], both_slots, _cfg(), tmp_path, echo=(said := []).append)
    ex.folder.open_logs()
    ck = ex.checkpoint_dir(0)
    tr = _two_checkpoints(ck)
    newest = ck / read_checkpoint_meta(ck)["state_file"]
    newest.write_bytes(newest.read_bytes()[:64])
    assert ex.recovery.checkpoint_iteration(0) == 10
    warnings = [json.loads(x) for x in (tmp_path / "run_log.jsonl").read_text().splitlines()]
    assert [w["event"] for w in warnings] == ["warning"] and "iteration 10" in warnings[0]["message"]
    assert len(said) == 1 and "unreadable" in said[0]
    assert tr.load_checkpoint(ck) == 10


def test_no_loadable_checkpoint_fails_the_job_in_one_line(tmp_path):
    ex = LiveExecutor([LiveJob(0, "tiny_mlp", 1, 100)], both_slots, _cfg(), tmp_path)
    ex.folder.open_logs()
    ck = ex.checkpoint_dir(0)
    _two_checkpoints(ck)
    for f in ck.glob("state-*.pt"):
        f.write_bytes(f.read_bytes()[:10])
    with pytest.raises(JobFailed) as e:
        ex.recovery.checkpoint_iteration(0)
    assert str(e.value).startswith("job 0 (tiny_mlp) cannot go on: no checkpoint in ") and "\n" not in str(e.value)


# ------------------------------------------------------------------------------------ damaged checkpoints, live
def _pause_then_resume(state: ClusterState) -> Decision:
    """Job 0 on slot 0 and job 1 on slot 1; in round 1 job 0 is paused (checkpointed), from round
    2 on both run again."""
    keep = [j for j in (0, 1) if j in state.active_ids and not (j == 0 and state.round == 1)]
    return Decision({j: JobDecision((j,), 0, Pattern.ROTATING) for j in keep})


PAUSED_JOBS = [LiveJob(0, "tiny_mlp", 1, 200, seed=1, lr=0.02), LiveJob(1, "tiny_mlp", 1, 180, seed=2, lr=0.02)]


def _damage(ck: Path, which: str) -> None:
    """Truncate the newest checkpoint's weights (``newest``) or every kept one's (``all``)."""
    meta = read_checkpoint_meta(ck)
    files = [meta["state_file"]] + ([meta["previous"]["state_file"]] if which == "all" else [])
    for name in files:
        f = ck / name
        f.write_bytes(f.read_bytes()[:64])


@pytest.mark.parametrize("which", ["newest", "all"])
def test_a_paused_job_with_damaged_checkpoints(ray_pieces, tmp_path, which):
    """Job 0 is paused at iteration 60 (checkpoints kept: 60 and 50) and its checkpoint files are
    truncated while it waits. ``newest``: it resumes from iteration 50 (10 iterations lost, one
    warning line) and completes. ``all``: it is given up in one line (status ``failed`` in
    summary.json) while job 1 runs on to the end; the simulator replays the log without waiting
    for job 0."""
    from jigsaw_executor.decision_log import read_decision_log, simulate_log

    pool, hub = ray_pieces
    _warm(pool)
    said: list[str] = []
    ex = LiveExecutor(PAUSED_JOBS, _pause_then_resume, _cfg(checkpoint_every=25), tmp_path, pool=pool, hub=hub,
                      echo=said.append)
    try:
        assert ex.run(max_rounds=2) is None
        ck = ex.checkpoint_dir(0)
        assert ex.state.jobs[0].status.value == "paused" and ex.state.jobs[0].iteration == 60
        assert [e["iteration"] for e in (read_checkpoint_meta(ck), read_checkpoint_meta(ck)["previous"])] == [60, 50]
        _damage(ck, which)
        summary = ex.run()
    finally:
        ex.close()
    a, b = summary["jobs"][0], summary["jobs"][1]
    assert b["status"] == "done" and b["final_iteration"] == 180 and b["failures"] == 0
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    ev = _events(tmp_path)
    if which == "newest":
        assert a["status"] == "done" and a["final_iteration"] == 200 and a["iterations_lost"] == 10
        assert summary["failed_jobs"] == [] and a["failures"] == 0 and a["error"] is None
        fb = [e for e in ev if e["event"] == "checkpoint_fallback"]
        assert [(e["iteration"], e["resume_iteration"]) for e in fb] == [(60, 50)]
        assert len(said) == 1 and "unreadable" in said[0] and "iteration 50" in said[0]
    else:
        assert a["status"] == "failed" and summary["failed_jobs"] == [0] and on_disk["failed_jobs"] == [0]
        assert on_disk["jobs"]["0"]["status"] == "failed" and on_disk["jobs"]["1"]["status"] == "done"
        assert a["error"].startswith("job 0 (tiny_mlp) cannot go on: no checkpoint in ") and "\n" not in a["error"]
        assert a["final_iteration"] == 60 and a["finish_s"] is None and summary["makespan_s"] == b["finish_s"]
        final = [e for e in ev if e["event"] == "job_failed" and e.get("final")]
        assert [e["job"] for e in final] == [0]
        assert len(said) == 1 and said[0].startswith("job 0 (tiny_mlp) given up, the other jobs go on: ")
        # the scheduler never saw job 0 again: it is in no decision after round 1
        rounds = [json.loads(x) for x in (tmp_path / "decision_log.jsonl").read_text().splitlines()]
        assert [r["round"] for r in rounds if r.get("kind") == "round" and "0" in r["decision"]] == [0, 2]
    assert not pool.owned_by(0) and not pool.owned_by(1)
    # the simulator part of the replay (a callable scheduler cannot be rebuilt for the decision part)
    header, rounds, end = read_decision_log(tmp_path / "decision_log.jsonl")
    failed = {int(k) for k, v in end["jobs"].items() if v["status"] == "failed"}
    assert failed == ({0} if which == "all" else set())
    sim_jobs, _, notes, _ = simulate_log(header, rounds, failed=failed)
    sim = {j["job_id"]: j for j in sim_jobs}
    assert sim[1]["sim_jct_s"] is not None
    assert any("failed live" in n for n in notes) is (which == "all")


def test_a_running_job_whose_checkpoints_are_all_corrupt_when_it_fails_is_given_up(ray_pieces, tmp_path,
                                                                                    monkeypatch):
    """Job 1's worker kills itself at iteration 70, mid-round; at that moment both of its kept
    checkpoints (50 and 25) are truncated (done inside the executor's checkpoint lookup, so the
    timing is exact). The job is given up within the round; job 0, on the other slot, runs to the
    end untouched."""
    from jigsaw_executor import spb_checkpoint

    pool, hub = ray_pieces
    _warm(pool)
    real = spb_checkpoint.select_checkpoint
    damaged = []

    def damage_then_select(path, log=None):
        if Path(path).name == "job1" and not damaged:
            assert read_checkpoint_meta(path)["iteration"] == 50
            _damage(Path(path), "all")
            damaged.append(path)
        return real(path, log=log)

    monkeypatch.setattr(spb_checkpoint, "select_checkpoint", damage_then_select)
    jobs = [LiveJob(0, "tiny_mlp", 1, 150, seed=1, lr=0.02), LiveJob(1, "tiny_mlp", 1, 150, seed=2, lr=0.02)]

    def own_slots(state: ClusterState) -> Decision:
        return Decision({j: JobDecision((j,), 0, Pattern.ROTATING) for j in (0, 1) if j in state.active_ids})

    _, summary = _run(tmp_path, pool, hub, jobs=jobs, sched=own_slots, fail_at={1: (0, 70, "kill")})
    a, b = summary["jobs"][0], summary["jobs"][1]
    assert damaged and summary["failed_jobs"] == [1]
    assert a["status"] == "done" and a["final_iteration"] == 150 and a["failures"] == 0
    assert b["status"] == "failed" and b["failures"] == 1 and b["restarts"] == 0
    assert b["error"].startswith("job 1 (tiny_mlp) cannot go on: no checkpoint in ")
    assert not pool.owned_by(1)


def test_deploy_resume_with_no_loadable_checkpoint_is_one_line_and_exit_1(ray_pieces, tmp_path):
    """A run folder (fifo: job 1 done, job 0 running at iteration 60 with checkpoints at 50 and 25)
    whose scheduler stopped, with job 0's checkpoints truncated: `jigsaw deploy --resume OUT`
    (a new process, a cold restore) gives job 0 up and ends the run: exit status 1, one line on
    stderr naming the job, no traceback, and summary.json saying which job failed."""
    from jigsaw_executor.policies import build_scheduler, scheduler_spec

    pool, hub = ray_pieces
    _warm(pool)
    out = tmp_path / "out"
    spec = scheduler_spec("fifo")
    cfg = _cfg(checkpoint_every=25, max_workers_per_gpu=1)  # the resumed run starts 1 host per slot
    sched, _ = build_scheduler(spec, cfg.spb)
    jobs = [LiveJob(0, "tiny_mlp", 1, 300, seed=1, lr=0.02), LiveJob(1, "tiny_mlp", 1, 60, seed=2, lr=0.02)]
    ex = LiveExecutor(jobs, sched, cfg, out, scheduler_spec=spec, pool=pool, hub=hub)
    try:
        assert ex.run(max_rounds=1) is None
        assert [ex.state.jobs[j].status.value for j in (0, 1)] == ["running", "done"]
    finally:
        ex.close()
    ck = out / "checkpoints" / "job0"
    assert read_checkpoint_meta(ck)["iteration"] == 50
    _damage(ck, "all")
    jigsaw = str(Path(sys.executable).parent / "jigsaw")
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    r = subprocess.run([jigsaw, "deploy", "--resume", str(out), "--json"], capture_output=True, text=True, env=env,
                       timeout=300, start_new_session=True)
    assert r.returncode == 1, r.stderr[-3000:]
    lines = [x for x in r.stderr.splitlines() if x.startswith("jigsaw deploy")]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert lines[0].startswith("jigsaw deploy: 1 job(s) failed (0); the others ran to the end; job 0 (tiny_mlp) "
                               "cannot go on: no checkpoint in ") and lines[0].endswith(f"see {out}/summary.json")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failed_jobs"] == [0]
    assert summary["jobs"]["0"]["status"] == "failed" and summary["jobs"]["1"]["status"] == "done"
    assert summary["jobs"]["1"]["final_iteration"] == 60
    assert json.loads(r.stdout.strip().splitlines()[-1])["replay"]["decisions_match"]


# ------------------------------------------------------------------------------------ scheduler restart
def _session_pids(sid: int) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if os.getsid(int(d.name)) == sid:
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids


def _kill_session(sid: int) -> None:
    """Kill what is left of a process session this test started (Ray agents outlive a killed driver)."""
    for pid in _session_pids(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _round_reached(state_file: Path, rnd: int) -> bool:
    """Whether the scheduler's persisted state (being written, or not yet there: False) is at
    round ``rnd`` or later."""
    try:
        return json.loads(state_file.read_text())["round"] >= rnd
    except (FileNotFoundError, ValueError):
        return False


@pytest.mark.timeout(600)  # a hang guard (both deploy runs), not a speed target
def test_scheduler_process_killed_and_restarted_recovers_running_jobs(tmp_path):
    """`jigsaw deploy` (its own embedded Ray) is SIGKILLed while a 2-slot job runs; Ray goes down with
    it. `jigsaw deploy --resume OUT` starts a new Ray session, restores the scheduler's persisted
    state, puts the running job back at its last checkpoint (which may be newer than the persisted
    state: its iterations are credited), and completes every job: final iterations equal the work
    asked for (level 0), and the decision log replays with the same decisions."""
    if not sys.platform.startswith("linux"):
        pytest.skip("uses /proc and process sessions")
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("job_id,model,num_gpus,iterations,arrival_s\n0,tiny_mlp,2,600,0\n1,tiny_cnn,1,200,0\n")
    out = tmp_path / "out"
    jigsaw = str(Path(sys.executable).parent / "jigsaw")
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [jigsaw, "deploy", "--policy", "fifo", "--jobs", str(jobs), "--slots", "2", "--steps-per-round", "100",
           "--checkpoint-every", "40", "--max-workers-per-gpu", "1", "--out", str(out), "--no-pin",
           "--allow-oversubscribe", "--timeout-s", "20"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        while not _round_reached(out / "scheduler_state.json", 3):
            assert p.poll() is None, "deploy ended before it could be killed"
            time.sleep(0.05)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
    finally:
        _kill_session(p.pid)
    snap = json.loads((out / "scheduler_state.json").read_text())
    before = {j["job_id"]: j for j in snap["state"]["jobs"]}
    persisted = before[0]["iteration"]
    assert before[0]["status"] == "running" and persisted == 100 * snap["round"]  # fifo: job 0 alone
    ckpt = read_checkpoint_meta(out / "checkpoints" / "job0")["iteration"]
    assert ckpt >= persisted - 40  # at most one interval behind the persisted state (or ahead of it)
    r = subprocess.run([jigsaw, "deploy", "--resume", str(out), "--json"], capture_output=True, text=True, env=env,
                       timeout=300, start_new_session=True)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    summary, replay = res["summary"], res["replay"]
    jobs_out = summary["jobs"]
    assert all(j["status"] == "done" for j in jobs_out.values())
    assert jobs_out["0"]["final_iteration"] == 600 and jobs_out["1"]["final_iteration"] == 200
    rec = jobs_out["0"]["recoveries"]
    assert [x["mode"] for x in rec] == ["scheduler_restart"] and rec[0]["resume_iteration"] == ckpt
    assert rec[0]["last_reported_iteration"] == persisted
    assert replay["decisions_match"] and replay["rounds_checked"] > snap["round"]
    ev = _events(out)
    assert any(e["event"] == "restore" and e["cold"] for e in ev)
