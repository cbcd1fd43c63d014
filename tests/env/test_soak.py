"""Soak tests (slow; CI runs them: ``make test`` runs the whole suite, slow tests included).

1. A long random episode of the environment under masked random actions (16 GPUs, 160 jobs at
   load 1.5: about 17,000 decisions and 5,000 rounds): every step keeps the simulator's
   invariants (finite observation in its box, finite reward, advance always allowed, memory and
   workers per GPU within bounds at every applied decision, time never goes back, progress never
   goes back nor past the work, a finished job stays finished) and every job completes.
2. A multi-job live deploy on 2 CPU slots (six jobs arriving over time, Gandiva packing jobs on
   shared slots, which then step in lockstep, and migrating them; a worker of a 2-slot job
   SIGKILLed mid-run, recovered partially): every job completes, nothing is lost (every iteration
   from 0 to the last is there, the final iteration is the work asked for, the progress is the
   work, the replicas are identical), and the decision log replays through the simulator with the
   same decisions. (Full restarts from checkpoints, also of a co-located job, are in
   tests/executor/test_fault_tolerance.py.) About 45 s on 2 quiet cores, 30 s of it starting Ray and 4
   warm hosts.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

pytestmark = pytest.mark.slow


def test_long_random_masked_episode_keeps_invariants_and_finishes_every_job():
    import gymnasium as gym

    import jigsaw_env  # noqa: F401 - registers the env
    from jigsaw_env.state import JobStatus

    env = gym.make("jigsaw_env:JigsawCluster-v0", gpus=16, gpus_per_node=8, max_jobs=160, load=1.5,
                   window_k=8).unwrapped
    rng = np.random.default_rng(2024)
    obs, _ = env.reset(seed=11)
    low, high = env.observation_space.low, env.observation_space.high
    n_jobs = len(env.sim.state.jobs)
    assert n_jobs == 160
    progress = {jid: 0.0 for jid in env.sim.state.jobs}
    done: set[int] = set()
    t_prev, steps, advances, ret = env.sim.state.time_s, 0, 0, 0.0
    while True:
        mask = env.action_masks()
        assert mask.dtype == bool and mask[env.codec.advance]
        a = int(rng.choice(np.flatnonzero(mask)))
        if a == env.codec.advance:
            led = env.builder.ledger
            assert np.all(led.mem <= led.capacity + 1e-6), "GPU memory exceeded"
            assert np.all(led.workers <= env.sim.state.max_workers_per_gpu)
            advances += 1
        obs, reward, term, trunc, info = env.step(a)
        steps += 1
        assert "invalid_action" not in info
        assert np.all(np.isfinite(obs)) and np.all(obs >= low) and np.all(obs <= high)
        assert math.isfinite(reward)
        ret += reward
        st = env.sim.state
        assert st.time_s >= t_prev
        t_prev = st.time_s
        for jid in st.active_ids:  # the jobs a round can touch (finished ones are checked below)
            j = st.jobs[jid]
            assert progress[jid] - 1e-9 <= j.progress <= j.iterations + 1e-6
            progress[jid] = j.progress
            if j.status is JobStatus.RUNNING:
                assert len(j.placement) == j.num_gpus and all(0 <= g < env.cluster.num_gpus for g in j.placement)
        for jid in done:
            assert st.jobs[jid].status is JobStatus.DONE
        if steps % 500 == 0 or term or trunc:
            done |= {jid for jid, j in st.jobs.items() if j.status is JobStatus.DONE}
        if term or trunc:
            break
    assert term and not trunc, "random play must finish the episode, not truncate it"
    assert steps > 10_000 and advances > 2_000  # a long episode
    jf = env.sim.jobs_frame()
    assert (jf["status"] == JobStatus.DONE.value).all() and len(jf) == n_jobs
    assert np.allclose(jf["progress"], jf["iterations"])
    assert (jf["finish_s"] >= jf["arrival_s"]).all()
    m = info["episode_metrics"]
    assert all(math.isfinite(v) for v in m.values() if isinstance(v, float))
    # the return is minus the total JCT (reward_scale 3600)
    assert ret == pytest.approx(-float((jf["finish_s"] - jf["arrival_s"]).sum()) / 3600.0, rel=1e-6)


def test_multi_job_deploy_with_failures_loses_nothing(tmp_path):
    pytest.importorskip("ray")
    from jigsaw_executor.deploy import deploy
    from jigsaw_executor.live import LiveJob

    jobs = [LiveJob(0, "tiny_cnn", 2, 240, arrival_s=0.0, seed=0),
            LiveJob(1, "tiny_mlp", 1, 200, arrival_s=0.0, seed=1, lr=0.02),
            LiveJob(2, "tiny_transformer", 1, 80, arrival_s=0.5, seed=2),
            LiveJob(3, "tiny_mlp", 2, 160, arrival_s=1.0, seed=3, lr=0.02),
            LiveJob(4, "tiny_cnn", 1, 140, arrival_s=1.5, seed=4),
            LiveJob(5, "tiny_mlp", 1, 120, arrival_s=2.0, seed=5, lr=0.02)]
    fail_at = {0: (1, 100, "kill")}  # job 0 (2 slots): rank 1 SIGKILLs itself at iteration 100
    out = tmp_path / "dep"
    summary, replay = deploy("gandiva", jobs, slots=2, out=out, steps_per_round=40, max_workers_per_gpu=2,
                             pin=False, allow_oversubscribe=True, timeout_s=20.0, checkpoint_every=40,
                             recovery="partial", fail_at=fail_at)
    js = summary["jobs"]
    assert len(js) == 6
    its = [json.loads(line) for line in (out / "iterations.jsonl").read_text().splitlines()]
    for jid, j in js.items():
        jid = int(jid)
        assert j["status"] == "done", j
        assert j["progress"] == pytest.approx(j["work_iterations"])
        # gandiva runs every job at SPB level 0: the final iteration is exactly the work asked for
        assert set(j["levels_used"]) == {"0/rotating"}
        assert j["final_iteration"] == j["work_iterations"]
        seen = sorted({it["t"] for it in its if it["job"] == jid})
        assert seen == list(range(j["final_iteration"])), f"job {jid}: an iteration is missing"
        assert j["heldout_accuracy"] is not None and len(set(j["rank_hashes"])) == 1
    assert js[0]["partial_recoveries"] == 1 and js[0]["iterations_lost"] == 0 and js[0]["restarts"] == 0
    assert js[0]["recoveries"][0]["resume_iteration"] == 100
    assert sum(j["failures"] for j in js.values()) == 1
    events = [json.loads(line) for line in (out / "run_log.jsonl").read_text().splitlines()]
    assert [e["job"] for e in events if e["event"] == "recover"] == [0]
    # jobs shared slots (lockstep components) in some rounds
    rounds = [json.loads(line) for line in (out / "decision_log.jsonl").read_text().splitlines()]
    rounds = [r for r in rounds if r.get("kind") == "round" and not r.get("idle")]
    assert any(len({g for d in r["decision"].values() for g in d["gpus"]}) < sum(len(d["gpus"]) for d in
                                                                                 r["decision"].values())
               for r in rounds)
    assert replay["decisions_match"] and replay["rounds_checked"] == len(rounds)

