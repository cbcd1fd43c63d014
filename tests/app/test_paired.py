"""evaluate --baseline: per-seed paired differences with 95% CIs (known answers), n/a with one
seed, and the command line's --json summary."""
from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from jigsaw_env.cli import main
from jigsaw_env.report import _fmt, paired_differences


def frame(rows):
    return pd.DataFrame(rows, columns=["agent", "seed", "load", "eta", "avg_jct_s", "saturated_efficiency",
                                       "cluster_efficiency"])


def test_paired_differences_by_hand():
    df = frame([("base", 0, 1.0, "table", 100.0, 1.0, 0.5), ("base", 1, 1.0, "table", 200.0, 1.2, 0.6),
                ("new", 0, 1.0, "table", 90.0, 1.1, 0.5), ("new", 1, 1.0, "table", 170.0, 1.4, 0.7)])
    p = paired_differences(df, "base").set_index("metric")
    # JCT differences -10 and -30: mean -20, sd 14.142, half-width t(0.975, 1) x sd / sqrt(2) = 12.706 x 10
    assert p.loc["avg_jct_s", "mean_diff"] == pytest.approx(-20.0)
    assert p.loc["avg_jct_s", "ci95"] == pytest.approx(12.7062047 * 10.0, rel=1e-6)
    assert p.loc["saturated_efficiency", "mean_diff"] == pytest.approx(0.15)
    assert p.loc["cluster_efficiency", "seeds"] == 2
    assert set(p["agent"]) == {"new"} and set(p["baseline"]) == {"base"}


def test_one_seed_has_no_interval():
    df = frame([("base", 0, None, "table", 100.0, 1.0, 0.5), ("new", 0, None, "table", 90.0, 1.1, 0.5)])
    p = paired_differences(df, "base").set_index("metric")
    assert p.loc["avg_jct_s", "mean_diff"] == -10.0
    assert math.isnan(p.loc["avg_jct_s", "ci95"]) and p.loc["avg_jct_s", "seeds"] == 1
    assert _fmt(1.5, 1.0, float("nan")) == "1.500 ± n/a"


def test_pairs_match_seed_load_and_eta():
    # seed 1 of "new" has no baseline run at load 2.0: only the matching seed counts
    df = frame([("base", 0, 2.0, "table", 100.0, 1.0, 0.5), ("new", 0, 2.0, "table", 50.0, 1.0, 0.5),
                ("new", 1, 2.0, "table", 0.0, 1.0, 0.5), ("base", 1, 1.0, "table", 10.0, 1.0, 0.5)])
    p = paired_differences(df, "base")
    jct = p[p["metric"] == "avg_jct_s"].iloc[0]
    assert (jct["mean_diff"], jct["seeds"], jct["load"]) == (-50.0, 1, 2.0)


def test_evaluate_baseline_json(tmp_path, capsys):
    out = tmp_path / "ev"
    assert main(["evaluate", "--agents", "fifo,tiresias", "--trace", "synthetic:jobs=20,load=1.5", "--gpus", "8",
                 "--seeds", "2", "--workers", "1", "--no-progress", "--baseline", "fifo", "--json",
                 "--out", str(out)]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["seeds"] == [0, 1] and d["paired"]["baseline"] == "fifo"
    m = pd.read_csv(out / "metrics.csv").set_index(["agent", "seed"])
    want = (m.loc[("tiresias", 0), "avg_jct_s"] + m.loc[("tiresias", 1), "avg_jct_s"]
            - m.loc[("fifo", 0), "avg_jct_s"] - m.loc[("fifo", 1), "avg_jct_s"]) / 2
    row = next(r for r in d["paired"]["rows"] if r["metric"] == "avg_jct_s")
    assert row["agent"] == "tiresias" and row["mean_diff"] == pytest.approx(want, rel=1e-9)
    assert (out / "paired.csv").exists() and "Paired differences from fifo" in (out / "report.html").read_text()


def test_baseline_must_be_an_agent(tmp_path, capsys):
    assert main(["evaluate", "--agents", "fifo,tiresias", "--baseline", "jigsaw", "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.strip() == ("jigsaw evaluate: error: --baseline 'jigsaw' is not one of --agents "
                                               "(fifo, tiresias)")
