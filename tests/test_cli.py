"""`jigsaw simulate` end to end, and bad input answered with one line and a non-zero exit."""
from __future__ import annotations

import json
import subprocess
import sys

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


@pytest.mark.parametrize("argv, needle", [
    (["simulate", "--gpus", "0"], "--gpus must be >= 1"),
    (["simulate", "--gpus", "-4"], "--gpus must be >= 1"),
    (["simulate", "--agent", "nope", "--max-jobs", "5"], "unknown agent 'nope'; allowed:"),
    (["simulate", "--gpus", "12", "--gpus-per-node", "8", "--max-jobs", "5"], "multiple of gpus_per_node"),
    (["simulate", "--gpu-type", "a100", "--max-jobs", "5"], "gpu type 'a100' is unknown; allowed"),
    (["simulate", "--gpu-memory-gib", "0.01", "--max-jobs", "5"], "GiB per worker"),
    (["simulate", "--round-s", "-3"], "--round-s must be > 0"),
    (["simulate", "--trace", "philly:/no/such/file.csv"], "/no/such/file.csv"),
])
def test_bad_input_one_line_nonzero(capsys, argv, needle):
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse usage errors exit from inside the parser
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2
    lines = [x for x in err.strip().splitlines() if x]
    assert len(lines) == 1, err
    assert needle in lines[0], err
    assert "Traceback" not in err


def test_unknown_model_in_trace_names_allowed(capsys, tmp_path):
    p = tmp_path / "jobs.csv"
    pd.DataFrame({"job_id": [1], "arrival_s": [0.0], "num_gpus": [1], "duration_s": [100.0],
                  "model": ["gpt5"], "batch_size": [8]}).to_csv(p, index=False)
    rc, out, err = _run(capsys, "simulate", "--trace", f"csv:{p}", "--gpus", "8")
    assert rc == 2
    assert "gpt5" in err and "allowed" in err and "Traceback" not in err


def test_console_script_no_traceback():
    r = subprocess.run([sys.executable, "-m", "jigsaw_env.cli", "simulate", "--agent", "nope", "--max-jobs", "3"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr
