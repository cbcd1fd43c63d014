"""The policy shipped in the package (`learned`, agents/policies/learned; agents.shipped): its files
and metadata, its size, `jigsaw export learned` giving the same graph as the shipped ONNX,
`jigsaw evaluate --agents learned --heldout` keeping to the split its metadata records (by the
trace file's content), and the trace-file identity that --heldout relies on. The live deploy of it
is in tests/executor/test_deploy.py."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from agents.rl import LearnedAgent
from agents.rl_env import same_trace_file
from agents.shipped import SHIPPED_NAMES, shipped_onnx, shipped_policy
from data_helpers import require_data
from jigsaw_env.digest import file_sha256 as file_digest

LEARNED = shipped_policy("learned")


def test_learned_is_shipped_with_its_recipe_and_split():
    assert SHIPPED_NAMES == ("learned",) and LEARNED is not None and shipped_onnx("learned") is not None
    names = sorted(f.name for f in LEARNED.iterdir())
    assert names == ["config.json", "model.zip", "policy.onnx", "vecnormalize.npz"]
    assert sum(f.stat().st_size for f in LEARNED.iterdir()) <= 5_000_000
    cfg = json.loads((LEARNED / "config.json").read_text())
    assert cfg["preset"] == "learned" and "--preset learned" in cfg["command"]
    assert cfg["env"]["trace"] == "philly" and cfg["sampling"]["holdout"] == 0.2
    assert (cfg["env"]["window_order"], cfg["env"]["work_conserving"]) == ("remaining", True)
    assert cfg["env"]["proposer"] == cfg["warm_start"]["expert"] == "jigsaw-srtf"
    assert cfg["env"]["pause"] == LearnedAgent(LEARNED).pause == "leave"  # trained where a pause leaves the round
    assert cfg["sampling"]["train_gpus"] == cfg["sampling"]["val_gpus"] == [16, 32, 64]
    shipped = cfg["shipped"]
    assert shipped["name"] == "learned" and shipped["model"] in ("best", "last")
    assert len(shipped["trace_sha256"]) == 64 and shipped["heldout_split"] == "last 20% of the jobs"
    # the ONNX graph is the model's (its metadata names the model file's digest)
    import onnx

    meta = {p.key: p.value for p in onnx.load(str(LEARNED / "policy.onnx")).metadata_props}
    assert file_digest(LEARNED / "model.zip") in json.dumps(meta)
    assert shipped_policy("nope") is None and shipped_onnx("nope") is None


def test_the_learned_preset_records_the_options_the_shipped_policy_was_trained_with():
    """`jigsaw train --preset learned` reproduces the shipped run: every option its config records
    (hyperparameters, env, sampling, warm start, budgets) is the preset's."""
    import train_agent
    from jigsaw_env.cli import build_parser

    args = build_parser().parse_args(["train", "--preset", "learned"])
    train_agent.apply_option_files(args)
    preset = train_agent.config_from_args(args)
    shipped = json.loads((LEARNED / "config.json").read_text())
    # the warm start's options are the preset's; the run adds what it recorded (steps, accuracy, ...)
    shipped["warm_start"] = {k: shipped["warm_start"][k] for k in preset["warm_start"]}
    # an env option the run's config lacks plays as its documented absent value
    shipped["env"] = {**train_agent.RESUME_ABSENT_MEANS, **shipped["env"]}
    for part in ("hyperparameters", "env", "sampling", "warm_start", "spaces", "eval"):
        assert shipped[part] == preset[part], part
    for option in ("algo", "policy", "n_envs", "seed", "timesteps", "max_wall_s", "checkpoint_freq", "preset"):
        assert shipped[option] == preset[option], option


def test_the_shipped_trace_digest_is_the_reference_philly():
    data = require_data("philly/philly.csv")
    cfg = json.loads((LEARNED / "config.json").read_text())
    assert file_digest(data) == cfg["shipped"]["trace_sha256"]


def test_same_trace_file_by_default_path_and_by_content(tmp_path):
    data = require_data("philly/philly.csv")
    assert same_trace_file("philly", f"philly:{data}")
    copy = tmp_path / "philly.csv"
    shutil.copy(data, copy)
    assert same_trace_file("philly", f"philly:{copy}")  # the same bytes elsewhere
    other = tmp_path / "other.csv"
    other.write_bytes(Path(data).read_bytes()[:-10] + b"0123456789")  # same size, other bytes
    assert not same_trace_file(f"philly:{copy}", f"philly:{other}")
    assert not same_trace_file("synthetic", "synthetic")
    assert not same_trace_file("philly", f"philly:{tmp_path / 'missing.csv'}")
    assert not same_trace_file("nonsense:", "philly")


def test_export_learned_by_name_writes_the_shipped_graph(tmp_path, monkeypatch):
    pytest.importorskip("sb3_contrib")
    from jigsaw_env.cli import main

    monkeypatch.chdir(tmp_path)
    before = file_digest(LEARNED / "policy.onnx")
    assert main(["export", "learned", "--check", "64"]) == 0
    assert (tmp_path / "learned.onnx").is_file()  # the default --out: never over the shipped file
    assert file_digest(LEARNED / "policy.onnx") == before
    assert main(["export", "learned", "--out", str(tmp_path / "p.onnx"), "--check", "0"]) == 0
    # the same graph: operators in order, weights and metadata but the export time (the TorchScript
    # exporter numbers intermediate values with process-wide counters, so the bytes may differ)
    assert graph_content(tmp_path / "p.onnx") == graph_content(tmp_path / "learned.onnx")


def graph_content(path) -> tuple:
    """What an exported policy computes, without the names of its intermediate values."""
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(path))
    weights = sorted((tuple(t.dims), numpy_helper.to_array(t).tobytes()) for t in m.graph.initializer)
    ops = [(n.op_type, tuple((a.name, onnx.helper.get_attribute_value(a).__repr__()) for a in n.attribute
                             if a.name != "value")) for n in m.graph.node]
    meta = sorted((p.key, p.value) for p in m.metadata_props if p.key != "exported_at")
    return ops, weights, meta, [i.name for i in m.graph.input], [o.name for o in m.graph.output]


@pytest.mark.slow
def test_evaluate_learned_heldout_uses_its_recorded_split(tmp_path):
    data = require_data("philly/philly.csv")
    from jigsaw_env.cli import main

    out = tmp_path / "e"
    assert main(["evaluate", "--agents", "jigsaw,learned", "--trace", f"philly:{data}", "--heldout", "--gpus", "16",
                 "--max-jobs", "12", "--seeds", "1", "--out", str(out), "--no-progress"]) == 0
    meta = json.loads((out / "metadata.json").read_text())
    cfg = json.loads((LEARNED / "config.json").read_text())
    # the jobs before the held-out 20 % (its training and validation splits) are left out: the
    # first floor(0.8 n) of the trace's n jobs
    from traces.api import load_trace

    n_jobs = len(load_trace(f"philly:{data}"))
    assert meta["heldout"]["on"] and meta["heldout"]["excluded_training_jobs"] == math.floor(0.8 * n_jobs)
    assert cfg["sampling"]["eval_split"] == "last 20% of the jobs"
    import pandas as pd

    m = pd.read_csv(out / "metrics.csv")
    assert set(m["agent"]) == {"jigsaw", "learned"} and (m["jobs_completed"] == 12).all()
