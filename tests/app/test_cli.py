"""`jigsaw simulate` end to end, and bad input answered with one line and a non-zero exit."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from jigsaw_env.cli import main


def _run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_simulate_json_has_every_metric(capsys, tmp_path):
    rc, out, err = _run(capsys, "simulate", "--trace", "synthetic", "--agent", "fifo", "--gpus", "16",
                        "--max-jobs", "30", "--seed", "0", "--json", "--out", str(tmp_path))
    assert rc == 0, err
    m = json.loads(out)
    for key in ("jobs_completed", "avg_jct_s", "p50_jct_s", "p95_jct_s", "p99_jct_s", "makespan_s",
                "gpu_utilization", "compute_utilization", "cluster_efficiency", "avg_queue_s", "wall_s"):
        assert key in m, key
    assert m["jobs_completed"] == 30
    assert m["efficiency_form"] == "trace-window"
    jobs = pd.read_csv(tmp_path / "jobs.csv")
    assert list(jobs.columns[:7]) == ["job_id", "arrival_s", "start_s", "finish_s", "jct_s", "num_gpus", "model"]
    assert jobs["jct_s"].mean() == pytest.approx(m["avg_jct_s"])
    assert (tmp_path / "rounds.csv").exists() and (tmp_path / "cluster.csv").exists()


def test_simulate_backlogged_reports_backlogged_form(capsys):
    rc, out, err = _run(capsys, "simulate", "--agent", "fifo", "--gpus", "16", "--max-jobs", "20", "--json",
                        "--backlogged")
    assert rc == 0, err
    m = json.loads(out)
    assert m["efficiency_form"] == "backlogged"
    assert 0 < m["cluster_efficiency"] <= 1.0 + 1e-9  # FIFO without SPB or packing cannot exceed 1


def test_same_seed_same_output(capsys):
    runs = []
    for _ in range(2):
        rc, out, _ = _run(capsys, "simulate", "--agent", "fifo", "--gpus", "16", "--max-jobs", "25", "--seed", "3", "--json")
        m = json.loads(out)
        m.pop("wall_s")
        runs.append(m)
    assert runs[0] == runs[1]
