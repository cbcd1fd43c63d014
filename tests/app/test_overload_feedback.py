"""Overload feedback of ``jigsaw simulate`` and ``jigsaw evaluate`` (jigsaw_env/overload.py): a
one-line warning on stderr before an overloaded replay, a progress bar on a terminal or with
``--progress``, and silence with ``--json`` piped (pytest's captured stdout is not a terminal)."""
from __future__ import annotations

import json

import pytest

from jigsaw_env.cli import main
from jigsaw_env.overload import WARN_AT_LOAD, overload_warning, queue_growth_per_hour

OVERLOADED = ["--trace", "synthetic:load=20", "--gpus", "8", "--max-jobs", "30"]


def test_queue_growth_arithmetic():
    # 36 jobs over 1 h at load 4: 36 arrive per hour, at most 9 finish, the queue grows by 27
    assert queue_growth_per_hour(4.0, 36, 3600.0) == pytest.approx(27.0)
    assert queue_growth_per_hour(0.8, 36, 3600.0) == 0.0
    line = overload_warning(4.0, 7, 36, 3600.0)
    assert line == ("warning: offered load 4 on 7 GPUs: the queue grows by about 27 jobs per hour (36 arrive per "
                    "hour, the cluster finishes at most 9); expect most jobs to wait (use --load or more --gpus for "
                    "a load near 1)")
    assert overload_warning(WARN_AT_LOAD * 0.99, 7, 36, 3600.0) is None
    assert overload_warning(float("inf"), 7, 36, 0.0) is None  # every job at t=0: the backlogged form


def test_simulate_warns_up_front_on_stderr(capsys):
    assert main(["simulate", *OVERLOADED]) == 0
    err = capsys.readouterr().err
    assert err.startswith("warning: offered load ") and " on 8 GPUs: the queue grows by about " in err
    assert err.count("\n") == 1  # one line, and no progress bar off a terminal


def test_simulate_json_piped_is_quiet(capsys):
    assert main(["simulate", *OVERLOADED, "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and json.loads(out)["gpus"] == 8


def test_simulate_progress_on_request(capsys):
    assert main(["simulate", *OVERLOADED, "--json", "--progress"]) == 0
    out, err = capsys.readouterr()
    # the bar, on request, even with --json: it counts the 30 jobs to the end, and stdout stays JSON
    assert "warning: offered load" not in err and "simulating:" in err and "30/30" in err
    assert json.loads(out)["gpus"] == 8


def test_simulate_at_a_normal_load_says_nothing(capsys):
    assert main(["simulate", "--trace", "synthetic:load=0.8", "--gpus", "8", "--max-jobs", "10"]) == 0
    assert capsys.readouterr().err == ""


def test_evaluate_warns_once_per_load_and_json_piped_is_quiet(tmp_path, capsys):
    base = ["evaluate", "--agents", "fifo", *OVERLOADED, "--seeds", "2", "--workers", "1"]
    assert main([*base, "--out", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    assert err.count("warning: offered load") == 1 and "evaluating" not in err
    assert main([*base, "--json", "--out", str(tmp_path / "b")]) == 0
    assert capsys.readouterr().err == ""
