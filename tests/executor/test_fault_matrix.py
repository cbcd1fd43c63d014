"""Rows of the fault matrix (docs/deploy.md section 1, "Faults and what the executor does") not covered
elsewhere: an unreachable ``--address`` is one line within a bounded wait, and the quick mode of
``bench.recovery`` (1 seed, 1 worker killed) gives its known answers: full recovery loses the
iterations since the last checkpoint, partial recovery none, and both end with the weights of the
run without a failure.
"""
from __future__ import annotations

import json

import pytest

from net_helpers import free_port

pytest.importorskip("ray")


@pytest.mark.timeout(60)  # the bounded wait: a hang fails the test
def test_an_unreachable_address_is_one_line_within_a_bounded_wait(tmp_path, capsys):
    """Nothing listens at --address: `jigsaw deploy` refuses at once (a silent host: after
    CONNECT_TIMEOUT_S, 5 s) with one line and exit status 2, before Ray starts (Ray's own connect
    would retry without end)."""
    import ray

    from jigsaw_env.cli import main
    from jigsaw_executor.cluster_ray import CONNECT_TIMEOUT_S

    assert not ray.is_initialized()
    port = free_port()
    address = f"127.0.0.1:{port}"
    rc = main(["deploy", "--address", address, "--policy", "fifo", "--demo", "--slots", "2",
               "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0] == (f"jigsaw deploy: error: cannot reach a Ray cluster at {address} within {CONNECT_TIMEOUT_S:g} s "
                      f"(Connection refused); start one there (`ray start --head --port {port}`) or give the "
                      f"address `ray start` printed")
    assert not ray.is_initialized()


@pytest.mark.slow
def test_bench_recovery_quick_mode_known_answers(tmp_path):
    """`python -m bench.recovery --quick`: one seed, rank 1 of a 2-rank tiny MLP killed at
    iteration 87 (checkpoint every 60). Full recovery resumes from iteration 60 and loses the
    27 iterations since; partial recovery loses none; both runs end with the
    no-failure run's exact weights, so the held-out accuracy does not change."""
    from bench.recovery import failure_schedule, main

    assert failure_schedule(0, 1, 300, 60) == [(1, 87)]
    assert main(["--quick", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "recovery.json").read_text())
    runs = {r["mode"]: r for r in res["runs"]}
    assert sorted(runs) == ["full", "none", "partial"]
    assert all(r["status"] == "done" for r in runs.values())
    # SPB level 2 needs more than 300 iterations for 300 of work, the same number in every mode
    assert len({r["final_iteration"] for r in runs.values()}) == 1 and runs["none"]["final_iteration"] > 300
    assert runs["none"]["failures"] == 0
    full, part = runs["full"], runs["partial"]
    assert full["failures"] == full["restarts"] == 1 and full["partial_recoveries"] == 0
    assert part["failures"] == part["partial_recoveries"] == 1 and part["restarts"] == 0
    assert [f["resume_iteration"] for f in full["recoveries"]] == [60]
    # the kill fires at the start of iteration 87: 87 iterations done, 27 of them since the checkpoint
    (rec,) = full["recoveries"]
    assert rec["fail_iteration"] == 87 and rec["resume_iteration"] == 60
    assert full["iterations_lost"] == 87 - 60 and part["iterations_lost"] == 0
    agg = res["aggregate"]
    assert agg["partial"]["lost_its"]["mean"] == 0 and agg["full"]["lost_its"]["mean"] == full["iterations_lost"]
    assert agg["full"]["identical_final_weights"] == agg["partial"]["identical_final_weights"] == "1/1"
    assert agg["full"]["d_acc"]["mean"] == agg["partial"]["d_acc"]["mean"] == 0
    assert (tmp_path / "recovery.md").read_text().startswith("# Full vs partial recovery")
