"""`jigsaw deploy` end to end on 2 CPU slots (one Ray session for the module): the demo completes
every job with a preemption and an SPB level change, its decision log replays through the
simulator with the same decisions, and bad input fails clearly before any job starts (a policy
whose layout does not fit, a job larger than the cluster) or fails the job with the worker's error
(a worker that raises), never a hang. docs/deploy.md."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray")

from jigsaw_executor.deploy import demo_jobs, deploy  # noqa: E402
from jigsaw_executor.live import JobFailed, LiveJob  # noqa: E402
from net_helpers import free_port  # noqa: E402

SLOTS = 2
MWPG = 1  # one worker host per slot keeps the module's start-up short on 2 cores


@pytest.fixture(scope="module")
def ray_pieces():
    """One Ray session, one pool of slot hosts and one control hub for the whole module."""
    from jigsaw_executor.cluster_ray import RaySession, SlotPool, get_or_create_hub, kill_actor

    session = RaySession(SLOTS, allow_oversubscribe=True).start()
    pool = SlotPool(SLOTS, MWPG, prefix="test-deploy", pin=False)
    hub = get_or_create_hub("test-deploy-hub")
    yield pool, hub
    pool.close()
    kill_actor(hub)
    session.stop()


@pytest.fixture(scope="module")
def demo(ray_pieces, tmp_path_factory):
    """The demo at 40 % of its iterations, 1.5-second rounds (about 25 s on 2 idle cores; the
    timeout of the first test that asks for it is its hang guard)."""
    import shutil

    from jigsaw_env.cost_table import TABLES_DIR, table_filename

    pool, hub = ray_pieces
    out = tmp_path_factory.mktemp("demo") / "run"  # a folder deploy makes
    tables = tmp_path_factory.mktemp("tables")  # the shipped tiny tables, as a calibration folder
    for m in ("tiny_cnn", "tiny_mlp", "tiny_transformer"):
        shutil.copy(TABLES_DIR / table_filename(m, 32, "cpu"), tables)
    summary, replay = deploy("jigsaw", demo_jobs(SLOTS, 0.4), slots=SLOTS, out=out, demo=True, round_s=1.5,
                             max_workers_per_gpu=MWPG, pool=pool, hub=hub, pin=False, allow_oversubscribe=True,
                             tables=tables)
    assert json.loads((out / "tables.json").read_text()) == {"tables": str(tables.resolve())}  # for --resume
    return out, summary, replay


def _rounds(out):
    return [json.loads(line) for line in (out / "decision_log.jsonl").read_text().splitlines()
            if json.loads(line).get("kind") == "round"]


@pytest.mark.slow
@pytest.mark.timeout(300)  # a hang guard (the demo fixture's run included), not a speed target
def test_demo_completes_every_job_and_resumes_the_preempted_ones(demo):
    out, summary, _ = demo
    jobs = summary["jobs"]
    assert len(jobs) >= 3
    for j in jobs.values():
        assert j["status"] == "done", j
        assert j["iterations"] > 0 and j["progress"] >= j["work_iterations"] - 1e-6
        assert j["jct_s"] is not None and j["jct_s"] > 0
        assert np.isfinite(j["final_loss"])
        assert 0.0 <= j["heldout_accuracy"] <= 1.0
    # every model learned something (10 classes: chance is 0.1)
    assert all(j["heldout_accuracy"] > 0.5 for j in jobs.values()), {k: j["heldout_accuracy"] for k, j in jobs.items()}
    assert any(j["bytes_sent"] > 0 for j in jobs.values())  # the 2-slot job communicates
    # the preemption resumed from its checkpoint: a second incarnation of the preempted job
    pre = [j for j in jobs.values() if j["preemptions"]]
    assert all(j["incarnations"] >= 2 for j in pre)
    # every job ran under the control plane, and jobs competed for the slots (>= 2 active at once)
    rounds = _rounds(out)
    assert {int(k) for r in rounds for k in r["decision"]} == {0, 1, 2}
    # (an idle round, waiting for the next arrival after every arrived job finished, has no state)
    assert max(len(r["state"]["active_ids"]) for r in rounds if not r.get("idle")) >= 2
    for name in ("run_log.jsonl", "iterations.jsonl", "decision_log.jsonl", "summary.json",
                 "scheduler_state.json", "replay.json"):
        assert (out / name).is_file(), name


def test_demo_counts_the_preemptions_and_level_changes_its_log_shows(demo):
    """The live run did what each round's logged decision says: every job that stepped ran on the
    logged slots at the logged level, a job left out ran nothing, and a forced event is in the
    applied decision. Each job's preemptions (running, not finished, left out of the next decision)
    and level changes (running on at another level or pattern) counted from the log are the
    summary's, whether the policy made them or the demo scenario forced them where the policy made
    none by its round (docs/deploy.md)."""
    out, summary, _ = demo
    prev: dict = {}
    finished: set[int] = set()
    preemptions: dict[int, int] = {}
    level_changes: dict[int, int] = {}
    forced = {"preempt": 0, "level": 0}
    for r in _rounds(out):
        dec = {int(k): v for k, v in r["decision"].items()}
        for jid, jd in prev.items():
            if jid in finished:
                continue
            if jid not in dec:
                preemptions[jid] = preemptions.get(jid, 0) + 1
            elif (dec[jid]["level"], dec[jid]["pattern"]) != (jd["level"], jd["pattern"]):
                level_changes[jid] = level_changes.get(jid, 0) + 1
        for o in r.get("outcome", {}).values():
            jid = o["job_id"]
            assert jid in dec, (r["round"], jid)
            assert (o["gpus"], o["level"]) == (dec[jid]["gpus"], dec[jid]["level"]), (r["round"], o)
            if o["finished"]:
                finished.add(jid)
        for f in r.get("forced", []):
            if f["kind"] not in forced:
                continue  # the idle guard's starts
            forced[f["kind"]] += 1
            if f["kind"] == "preempt":
                assert f["job"] not in dec and str(f["job"]) not in r.get("outcome", {}), (r["round"], f)
            else:
                assert dec[f["job"]]["level"] == f["to"] and r["outcome"][str(f["job"])]["level"] == f["to"], f
        prev = dec
    jobs = {int(k): j for k, j in summary["jobs"].items()}
    assert {jid: j["preemptions"] for jid, j in jobs.items()} == {jid: preemptions.get(jid, 0) for jid in jobs}
    assert {jid: j["level_changes"] for jid, j in jobs.items()} == {jid: level_changes.get(jid, 0) for jid in jobs}
    # the demo shows both events, the scenario forcing at most one of each
    assert sum(preemptions.values()) >= 1 and sum(level_changes.values()) >= 1
    assert forced["preempt"] <= 1 and forced["level"] <= 1


def test_demo_replay_gives_the_same_decisions(demo):
    from jigsaw_executor.decision_log import replay_decision_log

    out, _, replay = demo
    assert replay["decisions_match"], replay["mismatches"][:3]
    # every round that decided something is checked; idle rounds (no job arrived yet) decide nothing
    assert replay["rounds_checked"] == len([r for r in _rounds(out) if not r.get("idle")])
    # a job the simulator runs in a round is one the live run decided, or one it had finished
    # (kept until the simulator finishes it too); a job preempted live is paused in the replay
    done_live = {r["round"]: {j["job_id"] for j in r["state"]["jobs"] if j["status"] == "done"}
                 for r in _rounds(out) if r["state"] is not None}  # an idle round has no state
    decided = {r["round"]: {int(k) for k in r["decision"]} for r in _rounds(out)}
    for row in replay["rounds"]:
        if row["sim_steps"] and row["round"] in done_live:
            assert row["job_id"] in decided[row["round"]] | done_live[row["round"]], row
    again = replay_decision_log(out / "decision_log.jsonl").to_dict()
    assert again["decisions_match"] and again["rounds_checked"] == replay["rounds_checked"]
    assert {j["job_id"] for j in again["jobs"]} == {0, 1, 2}
    assert all(j["sim_jct_s"] is not None for j in again["jobs"])


def test_replay_detects_a_tampered_log(demo, tmp_path):
    """The replay really compares: change one logged decision's level and it reports a mismatch."""
    from jigsaw_executor.decision_log import replay_decision_log
    from jigsaw_executor.deploy import DemoScenario

    out = demo[0]
    lines = (out / "decision_log.jsonl").read_text().splitlines()
    for i, line in enumerate(lines):
        rec = json.loads(line)
        if rec.get("kind") == "round" and rec["decision"]:
            k = next(iter(rec["decision"]))
            rec["decision"][k]["level"] = (rec["decision"][k]["level"] + 1) % 4
            lines[i] = json.dumps(rec)
            break
    bad = tmp_path / "decision_log.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    r = replay_decision_log(bad, scenario=DemoScenario())
    assert not r.decisions_match and r.mismatches


# ---------------------------------------------------------------------------------------------- bad input
def _random_policy(tmp_path, spb_levels: int):
    """A randomly initialised PPO saved as a RUN_DIR and exported to ONNX (no training)."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    from agents.rl import RUN_FORMAT, spaces_signature
    from agents.rl_env import make_env_fn
    from jigsaw_env.cli import main

    env_kw = dict(gpus=4, gpus_per_node=4, trace="synthetic:models=tiny_mlp+tiny_cnn", max_jobs=4, window_k=4,
                  spb_levels=spb_levels)
    venv = DummyVecEnv([make_env_fn(env_kw, split="train", rank=0, seed=0)])
    model = PPO("MlpPolicy", venv, seed=0, device="cpu", policy_kwargs=dict(net_arch=[16]))
    run = tmp_path / f"ppo-l{spb_levels}"
    run.mkdir()
    model.save(str(run / "model.zip"))
    venv.close()
    (run / "config.json").write_text(json.dumps({"format": RUN_FORMAT, "algo": "ppo", "env": env_kw,
                                                  "spaces": spaces_signature(4, spb_levels, 4),
                                                  "normalize_obs": False}))
    assert main(["export", str(run)]) == 0
    return run / "policy.onnx"


def test_mismatched_onnx_policy_fails_before_any_job_starts(tmp_path, monkeypatch):
    import jigsaw_executor.live as live

    onnx = _random_policy(tmp_path, spb_levels=2)  # the deployment uses 3 SPB levels
    started = []
    monkeypatch.setattr(live.LiveExecutor, "start", lambda self: started.append(1))
    with pytest.raises(ValueError) as e:
        deploy(str(onnx), demo_jobs(SLOTS), slots=SLOTS, out=tmp_path / "out", demo=True)
    msg = str(e.value)
    assert "\n" not in msg and "does not fit" in msg and "expected" in msg, msg
    assert not started and not (tmp_path / "out" / "decision_log.jsonl").exists()
    junk = tmp_path / "junk.onnx"  # a file that is no policy at all
    junk.write_bytes(b"not an onnx model")
    with pytest.raises(ValueError, match=r"junk\.onnx: not a valid ONNX model") as e2:
        deploy(str(junk), demo_jobs(SLOTS), slots=SLOTS, out=tmp_path / "out2", demo=True)
    assert "\n" not in str(e2.value) and not started


def test_matching_onnx_policy_is_accepted(tmp_path):
    from jigsaw_env.spb import SPBConfig
    from jigsaw_executor.deploy import _scheduler_for

    onnx = _random_policy(tmp_path, spb_levels=3)
    sched, rec, spec = _scheduler_for(str(onnx), True, None, SPBConfig())
    assert spec["kind"] == "policy" and rec is not None


def test_job_larger_than_the_slots_is_refused_before_it_starts(tmp_path):
    jobs = [LiveJob(0, "tiny_mlp", 1, 50), LiveJob(1, "tiny_cnn", 3, 50)]
    with pytest.raises(ValueError, match=r"job 1 \(tiny_cnn\) needs 3 slots but the live cluster has 2"):
        deploy("fifo", jobs, slots=SLOTS, out=tmp_path / "out")
    assert not (tmp_path / "out" / "decision_log.jsonl").exists()



@pytest.mark.timeout(300)  # a hang guard, not a speed target
@pytest.mark.slow
def test_failing_worker_fails_the_job_with_its_error(ray_pieces, tmp_path):
    """A worker that fails at iteration 30 in every incarnation (``repeat``): the job is restarted
    from its checkpoint once (max_restarts=1), fails again, and the run fails with the count and the
    worker's own error."""
    pool, hub = ray_pieces
    jobs = [LiveJob(0, "tiny_mlp", 2, 400, seed=0), LiveJob(1, "tiny_mlp", 1, 200, arrival_s=0.0, seed=1)]
    with pytest.raises(JobFailed) as e:
        deploy("fifo", jobs, slots=SLOTS, out=tmp_path / "out", round_s=1.0, pool=pool, hub=hub, pin=False,
               max_workers_per_gpu=MWPG, allow_oversubscribe=True, fail_at={0: (1, 30, "raise", True)},
               timeout_s=20.0, replay=False, max_restarts=1)
    # a guard against waiting for ever, not a speed target: it took 66 s once on 2 busy cores
    assert e.value.job_id == 0 and e.value.rank == 1
    assert "failed 2 times, more than max_restarts=1: giving up" in str(e.value)
    assert "RuntimeError: injected failure on rank 1 at iteration 30" in str(e.value)
    log = [json.loads(line) for line in (tmp_path / "out" / "run_log.jsonl").read_text().splitlines()]
    failed = [ev for ev in log if ev.get("event") == "job_failed" and ev.get("job") == 0]
    assert len(failed) == 2 and failed[0]["recovery"] == "full" and failed[-1]["final"]
    # nothing of the failed job is left holding a slot host
    assert not pool.owned_by(0)


@pytest.mark.slow
def test_count_loopback_reports_the_kernels_bytes_beside_the_formulas(ray_pieces, demo, tmp_path):
    """With count_loopback a two-slot job's summary holds the loopback interface's count over its
    gradient syncs (docs/executor.md 4.1) beside the formula's bytes_sent, and the deploy summary
    shows it (*MB lo*); without it (the demo) the count is None and the column is left out."""
    import io

    from jigsaw_executor.deploy import print_summary

    if not Path("/proc/net/dev").is_file():
        pytest.skip("no loopback counters (/proc/net/dev) on this system")
    pool, hub = ray_pieces
    out = tmp_path / "out"
    summary, _ = deploy("fifo", [LiveJob(0, "tiny_mlp", 2, 60, seed=0)], slots=SLOTS, out=out, round_s=1.0,
                        pool=pool, hub=hub, pin=False, max_workers_per_gpu=MWPG, allow_oversubscribe=True,
                        replay=False, count_loopback=True)
    j = summary["jobs"][0]
    assert j["status"] == "done" and j["iterations"] == 60 and j["bytes_sent"] > 0
    # the kernel counts every byte of the job's syncs (and whatever else crossed loopback meanwhile)
    assert isinstance(j["loopback_bytes"], int) and j["loopback_bytes"] >= j["bytes_sent"]
    text = io.StringIO()
    print_summary(summary, None, out, file=text)
    assert "MB lo" in text.getvalue() and "MB sent" in text.getvalue()
    _, demo_summary, _ = demo
    assert all(d["loopback_bytes"] is None for d in demo_summary["jobs"].values())
    text = io.StringIO()
    print_summary(demo_summary, None, out, file=text)
    assert "MB lo" not in text.getvalue()


# ---------------------------------------------------------------------------------- a trained policy, --address
@pytest.mark.slow
def test_a_policy_trained_on_a_larger_cluster_deploys_unchanged(ray_pieces, tmp_path):
    """A MaskablePPO run on a 16-GPU simulated cluster (K = 4, 256 steps), exported to ONNX, drives
    the 2-slot live cluster through the same encoder; every logged observation and mask gives the
    same action again."""
    pytest.importorskip("sb3_contrib")
    from jigsaw_env.cli import main
    from jigsaw_executor.deploy import DemoScenario
    from jigsaw_executor.onnx_policy import OnnxPolicy

    run = tmp_path / "mppo16"
    assert main(["train", "--trace", "synthetic:models=tiny_cnn+tiny_mlp+tiny_transformer", "--gpus", "16",
                 "--window-k", "4", "--max-jobs", "8", "--n-steps", "128", "--batch-size", "64", "--n-epochs", "2",
                 "--eval-episodes", "1", "--no-progress", "--run-dir", str(run), "--vec", "dummy", "--n-envs", "1",
                 "--timesteps", "256", "--no-tensorboard", "--seed", "1"]) == 0
    onnx = run / "policy.onnx"
    assert main(["export", str(run), "--out", str(onnx)]) == 0
    assert OnnxPolicy(onnx).config["env"]["gpus"] == 16
    pool, hub = ray_pieces
    out = tmp_path / "live"
    summary, replay = deploy(str(onnx), demo_jobs(SLOTS, 0.15), slots=SLOTS, out=out, demo=True, round_s=1.0,
                             max_workers_per_gpu=MWPG, pool=pool, hub=hub, pin=False, allow_oversubscribe=True,
                             scenario=DemoScenario(preempt_by_round=2, level_by_round=3))
    assert all(j["status"] == "done" for j in summary["jobs"].values())
    steps = [s for r in _rounds(out) for s in r.get("steps", [])]
    assert steps and replay["steps_checked"] == len(steps) and replay["decisions_match"]


def _head_command(ray_exe: Path, temp_dir: str, port: int) -> list[str]:
    """`ray start --head` on loopback with every port named (fresh free ports), 2 CPUs and the
    resources slot_0 and slot_1."""
    cmd = [str(ray_exe), "start", "--head", "--block", "--port", str(port), "--node-ip-address", "127.0.0.1",
           "--num-cpus", "2", "--resources", json.dumps({"slot_0": 1, "slot_1": 1}), "--include-dashboard=false",
           "--temp-dir", temp_dir, "--disable-usage-stats", "--min-worker-port", "0", "--max-worker-port", "0"]
    for flag in ("--ray-client-server-port", "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
                 "--metrics-export-port", "--runtime-env-agent-port", "--node-manager-port", "--object-manager-port"):
        cmd += [flag, str(free_port())]
    return cmd


def _stop_process_group(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):  # SIGKILL skips Ray's 30 s drain
        try:
            os.killpg(proc.pid, sig)
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            return


@contextlib.contextmanager
def _ray_head(ray_exe: Path, env: dict, log_dir: Path, attempts: int = 3, up_within_s: float = 90.0):
    """A running Ray head; yields its address. A free port can be taken by another process between
    choosing it and the head binding it, so a head that exits before its GCS port answers is started
    again on fresh ports (at most `attempts` times); the failure names each attempt's log tail."""
    tails = []
    for attempt in range(attempts):
        temp_dir = tempfile.mkdtemp(prefix="rjd", dir="/tmp")  # short: Ray's socket paths live under it
        port = free_port()
        log = log_dir / f"ray_head_{attempt}.log"
        with open(log, "wb") as sink:
            head = subprocess.Popen(_head_command(ray_exe, temp_dir, port), stdout=sink, stderr=subprocess.STDOUT,
                                    start_new_session=True, env=env)
        try:
            deadline = time.monotonic() + up_within_s
            while head.poll() is None and time.monotonic() < deadline:
                with socket.socket() as probe:
                    probe.settimeout(1.0)
                    if probe.connect_ex(("127.0.0.1", port)) == 0:
                        break
                time.sleep(0.5)
            else:
                tails.append(f"attempt {attempt} (exit {head.poll()}): {log.read_text()[-800:]}")
                continue
            yield f"127.0.0.1:{port}"
            return
        finally:
            _stop_process_group(head)
            shutil.rmtree(temp_dir, ignore_errors=True)
    pytest.fail("ray start --head never came up:\n" + "\n".join(tails))


@pytest.mark.slow
def test_address_connects_to_a_running_ray_cluster(tmp_path):
    """`ray start --head` (loopback, its own ports and temp folder, 2 CPUs, slot_0 and slot_1) in a
    subprocess; `jigsaw deploy --address` runs jobs on it (in a subprocess: its own Ray driver,
    apart from this module's session); a cluster without enough slot resources is a one-line
    error. The head is stopped by its process group."""
    ray_exe = Path(sys.executable).with_name("ray")
    jig = Path(sys.executable).with_name("jigsaw")
    if not ray_exe.exists() or not jig.exists():
        pytest.skip("no ray / jigsaw executable next to the interpreter")
    env = dict(os.environ, RAY_AUTH_MODE="disabled", OMP_NUM_THREADS="1")
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("job_id,model,num_gpus,iterations,arrival_s\n0,tiny_mlp,1,40,0\n1,tiny_cnn,2,20,0\n")
    out = tmp_path / "out"
    with _ray_head(ray_exe, env, tmp_path) as address:
        base = [str(jig), "deploy", "--address", address, "--slots", "2", "--max-workers-per-gpu", "1", "--no-pin"]
        p = None
        for _ in range(10):  # the GCS answers before the raylet has registered the node's resources
            p = subprocess.run(base + ["--policy", "fifo", "--jobs", str(jobs), "--steps-per-round", "20",
                                       "--out", str(out), "--json"], env=env, capture_output=True, text=True,
                               timeout=300)
            if p.returncode == 0 or "has no resource" in p.stderr:
                break
            time.sleep(2)
        assert p.returncode == 0, p.stderr[-2000:]
        summary = json.loads((out / "summary.json").read_text())
        assert all(j["status"] == "done" for j in summary["jobs"].values())
        p = subprocess.run(base[:4] + ["--slots", "3", "--policy", "fifo", "--jobs", str(jobs), "--out",
                                       str(tmp_path / "o3")], env=env, capture_output=True, text=True, timeout=120)
        err = [line for line in p.stderr.strip().splitlines() if line.startswith("jigsaw deploy")]
        assert p.returncode == 2 and err and "has no resource slot_2" in err[-1]


@pytest.mark.slow
def test_the_shipped_learned_policy_deploys_by_name(ray_pieces, tmp_path):
    """`jigsaw deploy --policy learned`: the ONNX graph shipped in the package (agents.shipped)
    drives the live cluster; every logged observation and mask gives the same action again."""
    from agents.shipped import shipped_onnx
    from jigsaw_executor.deploy import DemoScenario

    pool, hub = ray_pieces
    out = tmp_path / "live"
    summary, replay = deploy("learned", demo_jobs(SLOTS, 0.15), slots=SLOTS, out=out, demo=True, round_s=1.0,
                             max_workers_per_gpu=MWPG, pool=pool, hub=hub, pin=False, allow_oversubscribe=True,
                             scenario=DemoScenario(preempt_by_round=2, level_by_round=3))
    assert summary["scheduler"]["path"] == str(shipped_onnx("learned"))
    assert all(j["status"] == "done" for j in summary["jobs"].values())
    steps = [s for r in _rounds(out) for s in r.get("steps", [])]
    assert steps and replay["steps_checked"] == len(steps) and replay["decisions_match"]
