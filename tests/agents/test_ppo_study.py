"""bench/ppo_study.py: the paired statistics on hand-made numbers, the window list, and the whole
script in a tiny mode (1 seed, 256 timesteps, 2 windows of 8 jobs).

The tiny run uses the Philly trace when the data folder has it (CI=true requires it) and otherwise a
synthetic trace written as canonical CSV, so it runs everywhere.
"""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from bench import ppo_study as ps

T_975_3 = 3.182446305284263   # t_{0.975, 3}
T_975_5 = 2.570581835636314   # t_{0.975, 5}
T_975_2 = 4.302652729911275   # t_{0.975, 2}


def test_paired_hand_example():
    p = ps.paired([1.0, 2.0, 3.0, 4.0], [2.0, 2.0, 2.0, 2.0])
    assert p["diffs"] == [-1.0, 0.0, 1.0, 2.0]
    assert p["n"] == 4 and p["mean"] == pytest.approx(0.5)
    sd = math.sqrt(5.0 / 3.0)                      # deviations -1.5, -0.5, 0.5, 1.5 -> 5 / (4 - 1)
    assert p["sd"] == pytest.approx(sd)
    assert p["half_width"] == pytest.approx(T_975_3 * sd / 2.0)
    assert p["lo"] == pytest.approx(0.5 - T_975_3 * sd / 2.0) and p["hi"] == pytest.approx(0.5 + T_975_3 * sd / 2.0)
    assert (p["wins"], p["losses"], p["ties"]) == (1, 2, 1)
    assert p["rel_diff"] == pytest.approx(0.5 / 2.0)
    assert ps.verdict(p) == "higher mean, 95% CI includes 0"
    assert ps.verdict(ps.paired([1.0, 1.1, 0.9], [2.0, 2.0, 2.0])).startswith("beats")
    assert ps.verdict(ps.paired([3.0, 3.1, 2.9], [2.0, 2.0, 2.0])).startswith("loses")
    one = ps.paired([1.0], [2.0])
    assert one["mean"] == -1.0 and math.isnan(one["hi"])
    with pytest.raises(ValueError):
        ps.paired([1.0, 2.0], [1.0])


def test_study_stats_pooled_and_window_level():
    jct = {"tiresias": [2.0, 4.0, 6.0], "srtf": [1.0, 3.0, 5.0], "jigsaw": [2.0, 3.0, 6.0],
           "ppo-s0": [1.0, 4.0, 5.0], "ppo-s1": [3.0, 2.0, 5.0]}
    st = ps.study_stats(jct, ["ppo-s0", "ppo-s1"])
    assert st["per_seed"]["ppo-s0"]["tiresias"]["diffs"] == [-1.0, 0.0, -1.0]
    assert st["per_seed"]["ppo-s1"]["tiresias"]["diffs"] == [1.0, -2.0, -1.0]
    pooled = st["pooled"]["tiresias"]
    d = np.array([-1.0, 0.0, -1.0, 1.0, -2.0, -1.0])
    assert pooled["n"] == 6 and pooled["mean"] == pytest.approx(d.mean())
    assert pooled["half_width"] == pytest.approx(T_975_5 * d.std(ddof=1) / math.sqrt(6))
    wl = st["window_level"]["tiresias"]                 # seed means per window: 2, 3, 5
    assert wl["n"] == 3 and wl["diffs"] == pytest.approx([0.0, -1.0, -1.0])
    assert wl["half_width"] == pytest.approx(T_975_2 * np.std([0.0, -1.0, -1.0], ddof=1) / math.sqrt(3))
    assert st["window_level"]["srtf"]["diffs"] == pytest.approx([1.0, 0.0, 0.0])


def test_window_starts():
    assert ps.window_starts(100, 10, 4) == [0, 30, 60, 90]
    assert ps.window_starts(10, 10, 3) == [0, 0, 0]
    with pytest.raises(ValueError):
        ps.window_starts(5, 10, 2)


def _trace_spec(tmp_path) -> tuple[str, bool]:
    from traces import data_dir, load_trace
    from traces.schema import to_canonical_csv

    p = data_dir() / "philly" / "philly.csv"
    if p.is_file():
        return f"philly:{p}", True
    if os.environ.get("CI", "").strip().lower() == "true":
        pytest.fail(f"reference data philly/philly.csv not found in {data_dir()}; CI=true requires it", pytrace=False)
    jobs = load_trace("synthetic:jobs=120,load=1.0,seed=3", cluster_gpus=16).jobs
    return f"csv:{to_canonical_csv(jobs, tmp_path / 'syn.csv')}", False


@pytest.mark.slow
def test_tiny_study_end_to_end(tmp_path):
    trace, _ = _trace_spec(tmp_path)
    out = tmp_path / "study"
    res = ps.main(["--trace", trace, "--seeds", "0", "--timesteps", "256", "--train-args",
                   "--warm-start tiresias --warm-start-s 2 --bc-epochs 4 --dagger-rounds 1 --dagger-s 0.5 --dagger-epochs 1",
                   "--n-envs", "1", "--gpus", "16",
                   "--max-jobs", "8", "--windows", "2", "--window-jobs", "8", "--workers", "1",
                   "--eval-episodes", "1", "--out", str(out)])
    for f in ("results.json", "results.md", "per_window_jct.png"):
        assert (out / f).is_file() and (out / f).stat().st_size > 0, f
    disk = json.loads((out / "results.json").read_text())
    assert disk["setup"]["disjoint"] is True
    su = disk["setup"]
    assert su["val"] == 0.1 and su["val_jobs"] > 0
    assert su["train_jobs"] + su["val_jobs"] + su["heldout_jobs"] == su["trace_jobs"]
    assert su["train_job_ids"][1] + su["val_jobs"] + 1 == su["heldout_job_ids"][0]  # train | val | held-out
    held_ids = disk["setup"]["heldout_job_ids"]
    assert len(disk["windows"]) == 2
    for w in disk["windows"]:
        assert w["jobs"] == 8 and held_ids[0] <= w["first_job_id"] <= held_ids[1]
    # the warm-started run's cloned policy (RUN_DIR/warm_start) is evaluated beside its final model
    # and the agent under test, ppo-s0, is best/ (selected on the validation split), the final model as last-s0
    assert disk["agent_order"] == ["tiresias", "srtf", "jigsaw", "jigsaw-srtf", "fifo", "imit-s0", "last-s0", "ppo-s0"]
    assert disk["final_labels"] == ["last-s0"] and disk["training"][0]["selected_timesteps"] in (1, 256)
    assert [t["trained_timesteps"] for t in disk["training"]] == [256]
    ws = disk["training"][0]["warm_start"]
    assert ws["expert"] == "tiresias" and ws["dagger_rounds"] == 1 and ws["total_steps"] > ws["steps"] > 0
    assert disk["ppo_labels"] == ["ppo-s0"] and disk["imitation_labels"] == ["imit-s0"]
    assert disk["training"][0]["rc"] == 0
    jct = disk["per_window_jct_h"]
    for lab in disk["agent_order"]:
        # a tiny learned policy may stall on a window (NaN, listed in stalled_windows); heuristics never do
        stalled = set(disk["stalled_windows"].get(lab, []))
        assert len(jct[lab]) == 2 and all((np.isfinite(x) and x > 0) or (np.isnan(x) and i in stalled)
                                          for i, x in enumerate(jct[lab])), lab
        if lab in ("tiresias", "srtf", "jigsaw", "jigsaw-srtf", "fifo"):
            assert not stalled
    for ref in ("tiresias", "srtf", "jigsaw", "jigsaw-srtf"):
        p = disk["stats"]["per_seed"]["ppo-s0"][ref]
        kept = [a - b for a, b in zip(jct["ppo-s0"], jct[ref]) if np.isfinite(a)]
        assert p["diffs"] == pytest.approx(kept)
        assert disk["stats"]["window_level"][ref]["diffs"] == pytest.approx(p["diffs"])
    p = disk["stats"]["per_seed"]["imit-s0"]["tiresias"]
    assert p["diffs"] == pytest.approx([a - b for a, b in zip(jct["imit-s0"], jct["tiresias"]) if np.isfinite(a)])
    md = (out / "results.md").read_text()
    assert "jigsaw train" in md and "Paired differences" in md and "| imit-s0 | tiresias |" in md
    p = res["stats"]["per_seed"]["ppo-s0"]["tiresias"]
    assert p["n"] + p["missing"] == 2 and p["missing"] == len(disk["stalled_windows"]["ppo-s0"])
