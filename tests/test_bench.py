"""The benchmark runner works end to end in its quick mode (sizes tiny; the numbers are not checked:
speed targets live in bench/results.md, measured side by side, never in timed unit tests)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_bench_quick_mode_writes_every_part(tmp_path):
    r = subprocess.run([sys.executable, "-m", "bench", "--quick", "--out", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["errors"] == {}
    for part in ("env", "train", "onnx", "replay", "scaling"):
        assert part in res, part
    assert all(row["steps_per_s"] > 0 and row["steps"] > 0 for row in res["env"])
    assert {row["agent"] for row in res["replay"]} == {"fifo", "tiresias", "jigsaw"}
    assert all(row["jobs_completed"] == row["jobs"] for row in res["replay"])
    assert res["onnx"]["median_ms"] > 0
    assert len(res["scaling"]["rows"]) == 3 and res["scaling"]["exponent"] == res["scaling"]["exponent"]
    md = (tmp_path / "results.md").read_text()
    for heading in ("Env steps per second", "MaskablePPO training throughput", "Exported-policy decision latency",
                    "Whole-trace replay", "Replay time against job count"):
        assert heading in md
    assert "python -m bench.replay" in md  # every number comes with its command


def test_bench_rejects_an_unknown_part(tmp_path):
    r = subprocess.run([sys.executable, "-m", "bench", "--only", "env,warp", "--out", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "unknown part(s) ['warp']" in r.stderr and "Traceback" not in r.stderr
