"""The replay's simulator part on a hand-written decision log (no Ray): every simulated row is
labelled with the live round whose decision it ran, also when the simulator, faster than the live
run, jumped over live rounds to the next arrival. docs/deploy.md section 5."""
from __future__ import annotations

import pytest

from jigsaw_env.cluster import ClusterSpec
from jigsaw_env.spb import SPBConfig
from jigsaw_env.state import ClusterState, CostModel, JobState, JobStatus
from jigsaw_executor.decision_log import (FORMAT, cluster_from_dict, cluster_to_dict, simulate_log, spb_to_dict,
                                          state_to_dict)

MODEL = "tiny_mlp"  # a shipped CPU table: about 1 ms per iteration, so 100 iterations take << 1 s


def _header() -> dict:
    cluster = ClusterSpec(num_nodes=1, gpus_per_node=2, gpu_types=("cpu",))
    jobs = [{"job_id": 0, "model": MODEL, "num_gpus": 1, "iterations": 100, "arrival_s": 0.0, "batch_size": 32},
            {"job_id": 1, "model": MODEL, "num_gpus": 1, "iterations": 100, "arrival_s": 10.0, "batch_size": 32}]
    return {"kind": "header", "format": FORMAT, "cluster": cluster_to_dict(cluster), "spb": spb_to_dict(SPBConfig()),
            "sim": {"max_workers_per_gpu": 2, "round_s": 2.0, "restart_s": 0.0}, "jobs": jobs,
            "scheduler": {"kind": "heuristic", "name": "fifo", "kwargs": {}}}


def _state(header: dict, t: float, rnd: int, status: dict[int, JobStatus]) -> dict:
    """The logged state at ``t``: the jobs that have arrived, with the given statuses."""
    cluster = cluster_from_dict(header["cluster"])
    jobs = {}
    for spec in header["jobs"]:
        jid = spec["job_id"]
        if jid in status:
            jobs[jid] = JobState(jid, spec["arrival_s"], 1, MODEL, 32, spec["iterations"], status=status[jid])
    active = [j for j, s in status.items() if s is not JobStatus.DONE]
    st = ClusterState(cluster=cluster, costs=CostModel(cluster, SPBConfig()), time_s=t, round=rnd, jobs=jobs,
                      active_ids=active, max_workers_per_gpu=2)
    return state_to_dict(st)


def _round(rnd: int, t0: float, t1: float, state, decision: dict, outcome: dict) -> dict:
    return {"kind": "round", "round": rnd, "t_start": t0, "t_end": t1, "idle": state is None, "state": state,
            "policy_decision": decision, "decision": decision, "outcome": outcome}


def _outcome(jid: int, iterations: int, seconds: float, finished: bool) -> dict:
    return {str(jid): {"job_id": jid, "iterations": iterations, "stepping_s": seconds,
                       "mean_iter_s": seconds / iterations, "bytes": 0, "finished": finished,
                       "finish_s": seconds if finished else None, "resumed": False, "startup_s": 0.0}}


def test_rows_keep_the_live_round_numbers_when_the_simulator_jumps_ahead():
    """Live: job 0 runs in rounds 0 and 1 (slowly), round 2 is idle until job 1 arrives at 10 s,
    round 3 runs job 1. Simulated: job 0 is done within round 0; in round 1 the cluster is idle and
    the simulator jumps to the arrival at 10 s, past live round 2's end, so live round 2 has no
    simulated round and the simulator's own count (job 1 in its round 2) is one behind."""
    h = _header()
    run = {"0": {"gpus": [0], "level": 0, "pattern": "rotating"}}
    rounds = [
        _round(0, 0.0, 2.0, _state(h, 0.0, 0, {0: JobStatus.QUEUED}), run, _outcome(0, 60, 2.0, False)),
        _round(1, 2.0, 4.0, _state(h, 2.0, 1, {0: JobStatus.RUNNING}), run, _outcome(0, 40, 1.0, True)),
        _round(2, 4.0, 10.0, None, {}, {}),
        _round(3, 10.0, 12.0, _state(h, 10.0, 3, {0: JobStatus.DONE, 1: JobStatus.QUEUED}),
               {"1": {"gpus": [1], "level": 0, "pattern": "rotating"}}, _outcome(1, 100, 1.5, True)),
    ]
    jobs, rows, notes, _ = simulate_log(h, rounds)
    ran = sorted((r["round"], r["job_id"]) for r in rows if r["sim_steps"])
    assert ran == [(0, 0), (3, 1)]
    assert "round 1: job 0 already done in the simulator; left out" in notes
    # job 1's simulated steps sit beside its live ones (round 3), so both comparisons exist
    # the simulated iteration is job 1's alone on its CPU slot; the live one 1.5 s / 100
    alone_s = CostModel(cluster_from_dict(h["cluster"]), SPBConfig()).isolated_iteration_s(
        JobState(1, 10.0, 1, MODEL, 32, 100))
    live_s = 1.5 / 100
    row = next(r for r in rows if r["job_id"] == 1)
    assert row["live_steps"] == 100 and row["sim_steps"] == 100
    assert row["sim_iter_s"] == pytest.approx(alone_s, rel=1e-9)
    assert row["live_iter_s"] == pytest.approx(live_s)
    assert row["iter_rel_err"] == pytest.approx((alone_s - live_s) / live_s, rel=1e-9)
    j1 = next(j for j in jobs if j["job_id"] == 1)
    assert j1["sim_iterations"] == 100 and j1["live_iterations"] == 100
    assert j1["sim_iter_s"] == pytest.approx(alone_s, rel=1e-9)
    assert j1["iter_rel_err"] == pytest.approx((alone_s - live_s) / live_s, rel=1e-9)


def test_rounds_after_the_live_ones_are_numbered_after_the_last_live_round():
    """The simulator is slower than live: job 0 (100 iterations) gets 0.01 s of live rounds, so it
    finishes in rounds the replay adds, numbered on from the last live round."""
    h = _header()
    h["jobs"] = h["jobs"][:1]
    run = {"0": {"gpus": [0], "level": 0, "pattern": "rotating"}}
    rounds = [_round(0, 0.0, 0.005, _state(h, 0.0, 0, {0: JobStatus.QUEUED}), run, _outcome(0, 50, 0.005, False)),
              _round(1, 0.005, 0.01, _state(h, 0.005, 1, {0: JobStatus.RUNNING}), run, _outcome(0, 50, 0.005, True))]
    jobs, rows, notes, _ = simulate_log(h, rounds)
    labels = [r["round"] for r in rows]
    assert labels[:2] == [0, 1] and len(labels) > 2 and labels[2:] == list(range(2, len(labels)))
    assert all(r["live_steps"] is None for r in rows[2:])
    assert any(n.startswith(f"the simulator needed {len(labels) - 2} round(s) after the last live one") for n in notes)
    assert jobs[0]["sim_iterations"] == 100
