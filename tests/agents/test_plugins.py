"""Plug-in schedulers: a class outside ``agents`` used by simulate and evaluate through its import
path (``module:ClassName``) or an entry point of the ``jigsaw.schedulers`` group."""
from __future__ import annotations

import json
from importlib.metadata import EntryPoint

import pandas as pd
import pytest

import agents.base as base
from agents import available_schedulers, make_scheduler
from jigsaw_env.cli import main
from jigsaw_env.cluster import ClusterSpec
from jigsaw_env.simulator import Simulator
from plugin_scheduler import SmallestFirst
from traces import load_trace

TRACE = "synthetic:jobs=30,load=1.5,seed=4"


def direct_metrics() -> dict:
    trace = load_trace(TRACE, cluster_gpus=8)
    return Simulator(ClusterSpec.from_gpus(8), trace.jobs).run(SmallestFirst())


def test_simulate_runs_a_plugin_by_import_path(capsys):
    assert main(["simulate", "--trace", TRACE, "--gpus", "8", "--agent", "plugin_scheduler:SmallestFirst",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    want = direct_metrics()
    assert out["agent"] == "plugin_scheduler:SmallestFirst"
    assert out["avg_jct_s"] == pytest.approx(want["avg_jct_s"], rel=1e-12)
    assert out["jobs_completed"] == want["jobs_completed"] == 30


def test_evaluate_runs_a_plugin_beside_a_registered_scheduler(tmp_path):
    out = tmp_path / "ev"
    assert main(["evaluate", "--agents", "fifo,plugin_scheduler:SmallestFirst", "--trace", TRACE, "--gpus", "8",
                 "--seeds", "1", "--workers", "1", "--no-progress", "--out", str(out)]) == 0
    df = pd.read_csv(out / "metrics.csv")
    row = df[df["agent"] == "plugin_scheduler:SmallestFirst"].iloc[0]
    assert row["avg_jct_s"] == pytest.approx(direct_metrics()["avg_jct_s"], rel=1e-12)


def test_an_entry_point_names_a_scheduler(monkeypatch):
    ep = EntryPoint(name="smallest-first", value="plugin_scheduler:SmallestFirst", group=base.ENTRY_POINT_GROUP)
    monkeypatch.setattr(base, "_entry_points", lambda: {ep.name: ep})
    assert "smallest-first" in available_schedulers()
    sched = make_scheduler("smallest-first")
    assert isinstance(sched, SmallestFirst) and sched.name == "smallest-first"


@pytest.mark.parametrize("name,message", [
    ("no_such_module:X", "agent 'no_such_module:X': cannot load 'no_such_module:X' (ModuleNotFoundError: No module "
                         "named 'no_such_module')"),
    ("plugin_scheduler:Missing", "agent 'plugin_scheduler:Missing': cannot load 'plugin_scheduler:Missing' "
                                 "(AttributeError: module 'plugin_scheduler' has no attribute 'Missing')"),
    ("plugin_scheduler:NotAScheduler", "agent 'plugin_scheduler:NotAScheduler': 'plugin_scheduler:NotAScheduler' is "
                                       "not a subclass of agents.base.Scheduler"),
])
def test_a_plugin_that_does_not_load_is_one_line(name, message, capsys):
    assert main(["simulate", "--trace", TRACE, "--gpus", "8", "--agent", name]) == 2
    assert capsys.readouterr().err.strip() == f"jigsaw simulate: error: {message}"
    with pytest.raises(ValueError, match="cannot load|not a subclass"):
        make_scheduler(name)


def test_an_unknown_name_lists_the_allowed_ones():
    with pytest.raises(ValueError, match=r"unknown agent 'nope'; allowed: \[.*'jigsaw'.*\] or a plug-in "
                                         r"module.path:ClassName"):
        make_scheduler("nope")
