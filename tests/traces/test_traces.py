"""The trace layer: canonical schema, options, model mapping, synthetic generator, describe.

Per-format fixtures and bad rows: tests/traces/test_traces_formats.py.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import traces
from traces import (CANONICAL_COLUMNS, STATUSES, ZOO_MODELS, Trace, TraceFormatError, add_trace_arguments,
                    load_trace, parse_spec, parse_window, to_canonical_csv, trace_from_args, validate_jobs)
from traces.models import model_choices

try:
    from data_helpers import require_data
except ImportError:  # pragma: no cover - when tests/ is a package
    from tests.data_helpers import require_data

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "traces"
PHILLY_SMALL = f"philly:{FIX / 'philly_small.csv'}"


def tput(model: str, batch_size: int, num_gpus: int, gpu_type: str) -> float:
    """A simple stand-in throughput: 10 iterations/s per GPU, 2x on v100."""
    return 10.0 * num_gpus * (2.0 if gpu_type == "v100" else 1.0)


def bsz(model: str) -> int:
    return 32


def load(spec: str, **kw) -> Trace:
    kw.setdefault("throughput_fn", tput)
    kw.setdefault("batch_size_fn", bsz)
    return load_trace(spec, **kw)


def accounted(tr: Trace) -> bool:
    s = tr.summary
    return s["jobs_read"] == s["kept"] + sum(s["filtered"].values()) and s["kept"] == len(tr.jobs)


# ------------------------------------------------------------------------------------------------
# schema


def test_validate_jobs_normalizes_and_sorts():
    df = pd.DataFrame({"arrival_s": [5.0, 0.0, 5.0], "num_gpus": [1, 2, 4], "duration_s": [10.0, 20.0, 30.0]})
    out = validate_jobs(df, "hand")
    assert list(out.columns) == list(CANONICAL_COLUMNS)
    assert [str(out[c].dtype) for c in CANONICAL_COLUMNS] == list(CANONICAL_COLUMNS.values())
    assert out["arrival_s"].tolist() == [0.0, 5.0, 5.0]
    assert out["job_id"].tolist() == [1, 0, 2]          # stable sort keeps file order on ties
    assert out["iterations"].isna().all() and out["batch_size"].isna().all()
    assert (out["model"] == "").all() and (out["status"] == "").all()


@pytest.mark.parametrize("change, column", [
    ({"job_id": [1, 1]}, "job_id"),
    ({"num_gpus": [0, 1]}, "num_gpus"),
    ({"num_gpus": [1.5, 1]}, "num_gpus"),
    ({"arrival_s": [-1.0, 0.0]}, "arrival_s"),
    ({"duration_s": [np.nan, 1.0]}, "duration_s"),
    ({"duration_s": [0.0, 1.0]}, "duration_s"),
    ({"status": ["done", ""]}, "status"),
    ({"num_gpus": ["x", 1]}, "num_gpus"),
    ({"batch_size": [0, 8]}, "batch_size"),
])
def test_validate_jobs_rejects(change, column):
    df = pd.DataFrame({"job_id": [0, 1], "arrival_s": [0.0, 1.0], "num_gpus": [1, 1], "duration_s": [1.0, 2.0]})
    for k, v in change.items():
        df[k] = v
    with pytest.raises(ValueError, match=f"hand: column '{column}'"):
        validate_jobs(df, "hand")


def test_validate_jobs_columns():
    with pytest.raises(ValueError, match="missing required column"):
        validate_jobs(pd.DataFrame({"arrival_s": [0.0]}), "x")
    with pytest.raises(ValueError, match="duration_s' or an 'iterations"):
        validate_jobs(pd.DataFrame({"arrival_s": [0.0], "num_gpus": [1]}), "x")
    with pytest.raises(ValueError, match=r"unknown column\(s\) \['num_gpu'\]"):
        validate_jobs(pd.DataFrame({"arrival_s": [0.0], "num_gpus": [1], "duration_s": [1.0], "num_gpu": [1]}), "x")
    ok = validate_jobs(pd.DataFrame({"arrival_s": [0.0], "num_gpus": [1], "iterations": [7],
                                     "src_owner": ["me"]}), "x")
    assert ok["src_owner"].tolist() == ["me"] and ok["duration_s"].isna().all()


def test_canonical_csv_round_trip_is_exact(tmp_path):
    df = validate_jobs(pd.DataFrame({
        "job_id": [3, 9], "arrival_s": [0.1 + 0.2, 1e-9], "num_gpus": [1, 8], "duration_s": [1 / 3, np.nan],
        "iterations": [np.nan, 12345.0], "model": ["", "bert_base"], "batch_size": [pd.NA, 16],
        "status": ["failed", ""], "vc": ["a,b", ""], "gpu_type": ["k80", "v100"], "src_x": ['say "hi"', ""]}), "x")
    p = to_canonical_csv(df, tmp_path / "t.csv")
    back = load_trace(f"csv:{p}", map_models=False).jobs
    # arrival_s is re-based to the first arrival (1e-9) by the loader
    df2 = df.copy()
    df2["arrival_s"] = df2["arrival_s"] - df2["arrival_s"].min()
    pd.testing.assert_frame_equal(back, df2)


# ------------------------------------------------------------------------------------------------
# specs and options


def test_parse_spec_and_window():
    assert parse_spec("synthetic") == ("synthetic", "")
    assert parse_spec("synthetic:jobs=5") == ("synthetic", "jobs=5")
    assert parse_spec("helios:/a/b.csv") == ("helios", "/a/b.csv")
    assert parse_spec("philly:")[1].endswith("philly/philly.csv")
    for bad in ("", "nope:x", "/path/only.csv", "helios:"):
        with pytest.raises(ValueError):
            parse_spec(bad)
    assert parse_window("0:7d") == (0.0, 7 * 86400.0)
    assert parse_window("90m:") == (5400.0, math.inf)
    assert parse_window(":2h") == (0.0, 7200.0)
    for bad in ("5", "2h:1h", "x:1"):
        with pytest.raises(ValueError):
            parse_window(bad)


def test_philly_small_known_answers():
    tr = load(PHILLY_SMALL, map_models=False)
    j = tr.jobs
    # sorted by arrival (the file is not); ties keep file order
    assert j["arrival_s"].tolist() == [0.0, 129600.0, 259199.0, 376200.0, 713583.0, 713583.0, 713616.0, 716515.0]
    assert j["num_gpus"].tolist() == [8, 16, 1, 1, 1, 4, 2, 1]
    assert j["duration_s"].tolist() == [860662.0, 3600.0, 7200.0, 45.0, 2951.0, 120.0, 2759.0, 66.0]
    assert j["job_id"].tolist() == list(range(8))
    assert j["vc"].tolist()[:3] == ["6c71a0", "6c71a0", "11cb48"]
    assert (j["gpu_type"] == "v100").all() and (j["status"] == "").all()
    assert j["philly_timestamp"].iloc[0] == "2017-10-01 00:00:00"
    assert tr.summary["trace_start"] == "2017-10-01 00:00:00"
    assert accounted(tr) and tr.summary["filtered"] == {}


def test_window_vc_max_jobs_sample():
    tr = load(PHILLY_SMALL, map_models=False, window=(0, 200000))
    assert len(tr) == 2 and tr.summary["filtered"] == {"outside_window": 6} and accounted(tr)
    tr = load(PHILLY_SMALL, map_models=False, window=(259199, 713600))
    assert tr.jobs["arrival_s"].tolist() == [0.0, 117001.0, 454384.0, 454384.0]   # re-based to the first kept
    assert tr.summary["time_offset_s"] == 259199.0
    tr = load(PHILLY_SMALL, map_models=False, vc=["6214e9"])
    assert len(tr) == 3 and set(tr.jobs["vc"]) == {"6214e9"} and tr.summary["filtered"] == {"vc_not_selected": 5}
    with pytest.raises(ValueError, match="not in the trace"):
        load(PHILLY_SMALL, vc=["nope"])
    with pytest.raises(ValueError, match="no job status"):
        load(PHILLY_SMALL, status=["completed"])
    with pytest.raises(ValueError, match="unknown status"):
        load(PHILLY_SMALL, status=["done"])
    tr = load(PHILLY_SMALL, map_models=False, max_jobs=3)
    assert tr.jobs["duration_s"].tolist() == [860662.0, 3600.0, 7200.0]
    assert tr.summary["filtered"] == {"beyond_max_jobs": 5} and accounted(tr)
    a = load(PHILLY_SMALL, map_models=False, sample=4, seed=1)
    b = load(PHILLY_SMALL, map_models=False, sample=4, seed=1)
    assert a.digest() == b.digest() and len(a) == 4 and a.summary["filtered"] == {"not_sampled": 4}
    assert a.jobs["arrival_s"].is_monotonic_increasing
    picks = {tuple(load(PHILLY_SMALL, map_models=False, sample=4, seed=s).jobs["job_id"]) for s in range(6)}
    assert len(picks) > 1
    both = load(PHILLY_SMALL, map_models=False, sample=5, max_jobs=2, seed=3)
    assert len(both) == 2 and both.summary["filtered"] == {"not_sampled": 3, "beyond_max_jobs": 3}


def test_gpu_cap_and_gpu_type():
    tr = load(PHILLY_SMALL, map_models=False, max_gpus=4)
    assert tr.jobs["num_gpus"].max() == 4 and tr.summary["capped_gpus"] == 2 and tr.summary["gpu_cap"] == 4
    tr = load(PHILLY_SMALL, map_models=False, cluster_gpus=8)          # capped to the cluster
    assert tr.jobs["num_gpus"].tolist()[:2] == [8, 8] and tr.summary["capped_gpus"] == 1
    tr = load(PHILLY_SMALL, map_models=False, cluster_gpus=8, max_gpus=16)
    assert tr.summary["gpu_cap"] == 8
    tr = load(PHILLY_SMALL, map_models=False, cluster_gpus=8, cap_to_cluster=False)
    assert tr.jobs["num_gpus"].max() == 16
    assert set(load(PHILLY_SMALL, map_models=False, gpu_type="k80").jobs["gpu_type"]) == {"k80"}


def test_load_scaling_is_exact():
    base = load(PHILLY_SMALL, map_models=False, cluster_gpus=32)
    before = base.offered_load(32)
    tr = load(PHILLY_SMALL, map_models=False, cluster_gpus=32, load_scale=2.5)
    assert tr.offered_load(32) == pytest.approx(2.5, rel=1e-12)
    info = tr.summary["load"]
    assert info["before_scaling"] == pytest.approx(before) and info["arrival_scale"] == pytest.approx(before / 2.5)
    # the scaling compresses inter-arrival times proportionally
    np.testing.assert_allclose(tr.jobs["arrival_s"], base.jobs["arrival_s"] * before / 2.5)
    with pytest.raises(ValueError, match="cluster size"):
        load(PHILLY_SMALL, load_scale=1.0)
    with pytest.raises(ValueError, match="same time"):
        load(PHILLY_SMALL, cluster_gpus=32, load_scale=1.0, max_jobs=1)


def test_offered_load_definition():
    df = validate_jobs(pd.DataFrame({"arrival_s": [0.0, 100.0], "num_gpus": [2, 4], "duration_s": [50.0, 25.0]}), "x")
    assert traces.offered_load(df, 2) == pytest.approx((2 * 50 + 4 * 25) / (2 * 100))


# ------------------------------------------------------------------------------------------------
# model mapping


def test_model_mapping_and_iterations():
    tr = load(PHILLY_SMALL, seed=4)
    j = tr.jobs
    assert set(j["model"]) <= set(ZOO_MODELS) and (j["batch_size"] == 32).all()
    np.testing.assert_array_equal(j["iterations"], np.maximum(1, np.round(j["duration_s"] * 20.0 * j["num_gpus"])))
    assert tr.summary["models_mapped"] == 8 and tr.summary["iterations_computed"] == 8
    assert load(PHILLY_SMALL, seed=4).digest() == tr.digest()
    assert {load(PHILLY_SMALL, seed=s).digest() for s in range(4)} != {tr.digest()}
    # a job keeps its model when the trace is cut (the draw depends on its position in the file)
    head = load(PHILLY_SMALL, seed=4, max_jobs=3)
    assert head.jobs["model"].tolist() == j["model"].tolist()[:3]
    # duration_s stays the original one; the gpu type feeds the throughput
    k = load(PHILLY_SMALL, seed=4, gpu_type="k80").jobs
    np.testing.assert_array_equal(k["duration_s"], j["duration_s"])
    np.testing.assert_array_equal(k["iterations"], np.maximum(1, np.round(j["duration_s"] * 10.0 * j["num_gpus"])))


def test_model_draw_is_uniform_and_seeded():
    c = pd.Series(model_choices(70000, 0)).value_counts()
    assert set(c.index) == set(ZOO_MODELS)
    assert (abs(c / 70000 - 1 / 7) < 0.01).all()
    assert (model_choices(50, 1) == model_choices(50, 1)).all()
    assert not (model_choices(50, 1) == model_choices(50, 2)).all()


def test_mapping_errors_are_clear():
    def broken(m, b, g, t):
        raise KeyError("no table")
    with pytest.raises(ValueError, match="throughput of model"):
        load(PHILLY_SMALL, throughput_fn=broken)
    with pytest.raises(ValueError, match="must be > 0"):
        load(PHILLY_SMALL, throughput_fn=lambda *a: 0.0)


def test_integration_with_isolated_throughput():
    """Iterations come from the embedded cost tables' isolated throughput (any error fails)."""
    from jigsaw_env import spb
    from jigsaw_env.cost_table import default_batch_size
    for m in ZOO_MODELS:
        assert spb.isolated_throughput(m, default_batch_size(m), 8, "v100") > 0
    tr = load_trace(PHILLY_SMALL, seed=0, max_gpus=8)
    j = tr.jobs
    assert j["iterations"].notna().all() and (j["iterations"] >= 1).all()
    for _, r in j.iterrows():
        tp = spb.isolated_throughput(r["model"], int(r["batch_size"]), int(r["num_gpus"]), r["gpu_type"])
        assert r["iterations"] == max(1, round(r["duration_s"] * tp))


# ------------------------------------------------------------------------------------------------
# synthetic generator


def test_synthetic_needs_no_data_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("JIGSAW_DATA", str(tmp_path / "absent"))
    tr = load("synthetic")
    assert len(tr) == 500 and accounted(tr)
    assert tr.jobs["arrival_s"].iloc[0] == 0.0 and tr.jobs["arrival_s"].is_monotonic_increasing
    assert set(tr.jobs["model"]) <= set(ZOO_MODELS) and tr.jobs["iterations"].notna().all()
    assert (tr.jobs["duration_s"] == np.round(tr.jobs["duration_s"])).all()
    assert tr.summary["gpu_type"] == "v100"


def test_synthetic_is_seeded_and_hits_the_load():
    a = load("synthetic:jobs=300,load=0.7,gpus=32,seed=3")
    assert a.digest() == load("synthetic:jobs=300,load=0.7,gpus=32,seed=3").digest()
    assert a.digest() != load("synthetic:jobs=300,load=0.7,gpus=32,seed=4").digest()
    assert a.offered_load(32) == pytest.approx(0.7, rel=1e-9)
    assert a.jobs["num_gpus"].max() <= 32
    # options: --seed, --load, --max-jobs, the command's cluster size
    b = load("synthetic", seed=3, load_scale=0.7, max_jobs=300, cluster_gpus=32)
    assert b.digest() == a.digest()
    c = load("synthetic:jobs=100", cluster_gpus=16, load_scale=2.0)
    assert len(c) == 100 and c.offered_load(16) == pytest.approx(2.0) and c.jobs["num_gpus"].max() <= 16
    with pytest.raises(ValueError, match="conflicting loads"):
        load("synthetic:load=1.0", load_scale=2.0, cluster_gpus=8)
    one = load("synthetic:jobs=1")
    assert len(one) == 1 and one.jobs["arrival_s"].tolist() == [0.0]
    assert len(load("synthetic", max_jobs=1)) == 1
    # subsets are re-scaled to the target load too
    d = load("synthetic:jobs=400,gpus=32", sample=100)
    assert len(d) == 100 and d.offered_load(32) == pytest.approx(1.0)


@pytest.mark.parametrize("bad", ["synthetic:jobs=0", "synthetic:load=-1", "synthetic:foo=1", "synthetic:jobs",
                                 "synthetic:diurnal=maybe", "synthetic:jobs=x"])
def test_synthetic_bad_params(bad):
    with pytest.raises(ValueError, match="synthetic"):
        load(bad)


def test_synthetic_model_mix_and_diurnal():
    tr = load("synthetic:jobs=2000,models=resnet50+vgg16,seed=1")
    c = tr.jobs["model"].value_counts()
    assert set(c.index) == {"resnet50", "vgg16"} and abs(c["resnet50"] / 2000 - 0.5) < 0.05
    from traces import _philly_fit as FIT
    prof = np.asarray(FIT.HOURLY_SHARE)
    # seeds 4 and 5 draw jobs wider than the 64-GPU cluster: capped, with the load still exact, and
    # their arrivals still on Philly's hours (the span is drawn for the capped counts, not rescaled)
    for seed, capped in ((2, 0), (4, 2), (5, 1)):
        for diurnal, lo, hi in ((1, 0.95, 1.0), (0, -0.35, 0.35)):
            tr = load(f"synthetic:jobs=20000,seed={seed},diurnal={diurnal},start_hour=5,load=0.05", map_models=False)
            assert tr.summary["capped_gpus"] == capped and tr.summary["load"]["arrival_scale"] == 1.0
            assert tr.offered_load(64) == pytest.approx(0.05, rel=1e-12)
            hours = ((tr.jobs["arrival_s"].to_numpy() / 3600.0 + 5.0) % 24).astype(int)
            share = np.bincount(hours, minlength=24) / len(hours)
            r = np.corrcoef(share, prof)[0, 1]
            assert lo <= r <= hi, (seed, diurnal, r)


@pytest.mark.data
def test_synthetic_matches_philly():
    path = require_data("philly/philly.csv")
    ph = load_trace(f"philly:{path}", map_models=False).jobs
    sy = load_trace("synthetic:jobs=20000,seed=0", map_models=False, cap_to_cluster=False).jobs
    p_share = ph["num_gpus"].value_counts(normalize=True)
    s_share = sy["num_gpus"].value_counts(normalize=True).reindex(p_share.index, fill_value=0.0)
    assert (abs(p_share - s_share) * 100 <= 1.0).all(), (p_share - s_share)
    qs = [10, 50, 90, 99]
    lp = np.log(np.percentile(ph["duration_s"], qs))
    ls = np.log(np.percentile(sy["duration_s"], qs))
    assert (np.abs(ls / lp - 1) <= 0.10).all(), (lp, ls)
    from scipy.stats import ks_2samp
    ks = ks_2samp(np.log(ph["duration_s"]), np.log(sy["duration_s"]))
    assert ks.pvalue >= 0.01, ks


@pytest.mark.data
def test_fitted_numbers_match_the_trace():
    """The shipped fit (traces/_philly_fit.py) is what fit_philly computes from the data."""
    path = require_data("philly/philly.csv")
    from traces import _philly_fit as FIT
    from traces.fit_philly import fit
    f = fit(path)
    assert f["gpu_counts"] == FIT.GPU_COUNTS and f["n_jobs"] == FIT.N_JOBS
    for name, q in f["duration_quantiles"].items():
        assert tuple(q["values"]) == FIT.DURATION_QUANTILES[name]["values"]


# ------------------------------------------------------------------------------------------------
# the real Philly trace


PHILLY_HIST = {1: 76627, 2: 1818, 4: 1870, 8: 1643, 12: 7, 16: 199, 24: 7, 32: 67, 64: 6, 128: 3}


@pytest.mark.data
def test_philly_full_trace():
    path = require_data("philly/philly.csv")
    raw = pd.read_csv(path)
    assert not raw["timestamp"].is_monotonic_increasing          # the file is not sorted
    tr = load_trace(f"philly:{path}", map_models=False)
    j = tr.jobs
    assert len(j) == 82247 and accounted(tr)
    assert j["arrival_s"].is_monotonic_increasing and j["arrival_s"].iloc[0] == 0.0
    assert j["job_id"].tolist() == list(range(82247))
    assert j["num_gpus"].value_counts().to_dict() == PHILLY_HIST
    assert j["duration_s"].sum() == raw["duration"].sum()
    assert j["vc"].nunique() == 15


# ------------------------------------------------------------------------------------------------
# command line


def _parser() -> argparse.ArgumentParser:
    from traces.cli import register
    p = argparse.ArgumentParser(prog="jigsaw")
    register(p.add_subparsers(dest="command"))
    return p


def test_describe_text(capsys):
    args = _parser().parse_args(["traces", "describe", PHILLY_SMALL, "--gpus", "8"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "jobs      8" in out
    for line in ("      1          4   50.00%", "     16          1   12.50%"):
        assert line in out
    assert "p50" in out and "p99" in out and "span 716,515 s" in out
    total = 860662 * 8 + 3600 * 16 + 7200 + 45 + 2951 + 120 * 4 + 2759 * 2 + 66
    assert f"offered load vs 8 GPUs: {total / (8 * 716515):.3f}" in out
    assert "filtered  none" in out


def test_describe_json_with_filters(capsys, tmp_path):
    args = _parser().parse_args(["traces", "describe", PHILLY_SMALL, "--json", "--gpus", "4", "--vc", "6214e9",
                                 "--max-gpus-per-job", "1"])
    assert args.func(args) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["jobs"] == 3 and d["gpu_histogram"] == {"1": 3}
    assert d["summary"]["filtered"] == {"vc_not_selected": 5} and d["summary"]["capped_gpus"] == 1
    assert set(d["duration_s"]) >= {"p10", "p50", "p90", "p99"} and d["cluster_gpus"] == 4
    assert d["arrival_span_s"] == 713616.0 - 376200.0
    # through the main command wrapper: a user error is one line and exit status 2
    from jigsaw_env.cli import main
    assert main(["traces", "describe", f"philly:{tmp_path / 'missing.csv'}"]) == 2
    assert "trace file not found" in capsys.readouterr().err
    assert main(["traces", "describe", "synthetic:jobs=50", "--gpus", "16"]) == 0
    assert "offered load vs 16 GPUs: 1.000" in capsys.readouterr().out


def test_convert_writes_canonical_csv(tmp_path, capsys):
    out = tmp_path / "o.csv"
    args = _parser().parse_args(["traces", "convert", PHILLY_SMALL, str(out), "--no-models"])
    assert args.func(args) == 0
    back = load_trace(f"csv:{out}", map_models=False)
    assert back.digest() == load_trace(PHILLY_SMALL, map_models=False).digest()


def test_shared_arguments():
    p = argparse.ArgumentParser()
    add_trace_arguments(p)
    p.add_argument("--gpu-type", default="v100")        # a command's own cluster GPU type takes the flag over
    a = p.parse_args(["--trace", PHILLY_SMALL, "--max-jobs", "5", "--window", "0:30d", "--vc", "6214e9,11cb48",
                      "--max-gpus-per-job", "2", "--seed", "3", "--trace-gpu-type", "k80", "--gpu-type", "p100"])
    assert a.gpu_type == "p100" and a.trace_gpu_type == "k80" and a.window == (0.0, 30 * 86400.0)
    tr = trace_from_args(a, 16, throughput_fn=tput, batch_size_fn=bsz)
    assert len(tr) == 5 and set(tr.jobs["gpu_type"]) == {"k80"} and tr.jobs["num_gpus"].max() <= 2
    d = argparse.ArgumentParser()
    add_trace_arguments(d)
    a = d.parse_args(["--gpu-type", "v100", "--skip-bad-rows", "--status", "completed", "--load", "0.5"])
    assert a.trace_gpu_type == "v100" and a.skip_bad_rows and a.status == "completed" and a.load == 0.5
    assert d.parse_args([]).trace == "synthetic"
    with pytest.raises(SystemExit):
        d.parse_args(["--window", "bad"])


def test_require_data_skips_or_fails(monkeypatch, tmp_path):
    monkeypatch.setenv("JIGSAW_DATA", str(tmp_path))
    (tmp_path / "here.txt").write_text("x")
    assert require_data("here.txt") == tmp_path / "here.txt"
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="JIGSAW_DATA"):
        require_data("absent.csv")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        require_data("absent.csv")


def test_data_dir_default(monkeypatch):
    monkeypatch.delenv("JIGSAW_DATA", raising=False)
    assert traces.data_dir() == Path(traces.__file__).resolve().parent.parent.parent / "shared" / "data"
    monkeypatch.setenv("JIGSAW_DATA", "/x/y")
    assert traces.data_dir() == Path("/x/y")


def test_gavel_file_is_read_from_the_same_data_folder(monkeypatch):
    from jigsaw_env import gavel_data

    default = Path(traces.__file__).resolve().parent.parent.parent / "shared" / "data"
    monkeypatch.setenv("JIGSAW_DATA", "  ")  # blank counts as unset, for traces and Gavel's file alike
    assert traces.data_dir() == gavel_data.data_dir() == default
    monkeypatch.setenv("JIGSAW_DATA", "/x/y")
    with pytest.raises(FileNotFoundError, match="/x/y/gavel/simulation_throughputs.json"):
        gavel_data.gavel_throughputs()


def test_trace_format_error_is_a_value_error():
    e = TraceFormatError("f.csv", 7, "duration", "non-numeric duration", "abc")
    assert isinstance(e, ValueError) and str(e).startswith("f.csv: line 7: field 'duration': non-numeric duration")
    assert STATUSES == ("completed", "failed", "killed", "running", "pending")
