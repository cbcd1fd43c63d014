"""Golden metrics of seeded scenarios.

Scheduling results must not change when the simulator is made faster. Regenerate deliberately,
after a change that is meant to alter results, with:

    JIGSAW_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/sim/test_golden.py
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agents import make_scheduler
from jigsaw_env.cluster import ClusterSpec
from jigsaw_env.simulator import SimConfig, Simulator
from traces import load_trace

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "golden_metrics.json"

# name: (trace spec, gpus, agent, SimConfig kwargs). Scenarios under time-slicing and under the
# fitted co-location model (the default sharing, "-fitted"), in lockstep, and under the defaults
# (the fitted sharing, each co-located job at its own pace: "-free").
LOCK = {"pace": "lockstep"}
TS = {"sharing": "timeslice", **LOCK}
SCENARIOS = {
    "fifo-synth60": ("synthetic:jobs=60,load=1.5,seed=11", 16, "fifo", TS),
    "tiresias-synth60": ("synthetic:jobs=60,load=1.5,seed=11", 16, "tiresias", TS),
    "gandiva+spb-synth60": ("synthetic:jobs=60,load=1.5,seed=11", 16, "gandiva+spb", TS),
    "jigsaw-synth60": ("synthetic:jobs=60,load=1.5,seed=11", 16, "jigsaw", TS),
    "jigsaw-backlogged40": ("synthetic:jobs=40,load=1.0,seed=5", 16, "jigsaw", {"backlogged": True, **TS}),
    # iteration granularity needs short jobs: 12 tiny jobs given by iteration counts
    "srtf-iteration12": ("tiny", 8, "srtf", {"round_s": None, **TS}),
    "gandiva+spb-synth60-fitted": ("synthetic:jobs=60,load=1.5,seed=11", 16, "gandiva+spb", LOCK),
    "jigsaw-synth60-fitted": ("synthetic:jobs=60,load=1.5,seed=11", 16, "jigsaw", LOCK),
    "jigsaw-backlogged40-fitted": ("synthetic:jobs=40,load=1.0,seed=5", 16, "jigsaw", {"backlogged": True, **LOCK}),
    "gandiva+spb-synth60-free": ("synthetic:jobs=60,load=1.5,seed=11", 16, "gandiva+spb", {}),
    "jigsaw-synth60-free": ("synthetic:jobs=60,load=1.5,seed=11", 16, "jigsaw", {}),
    "jigsaw-backlogged40-free": ("synthetic:jobs=40,load=1.0,seed=5", 16, "jigsaw", {"backlogged": True}),
    "jigsaw-synth60-timeslice-free": ("synthetic:jobs=60,load=1.5,seed=11", 16, "jigsaw", {"sharing": "timeslice"}),
}


def _tiny_jobs():
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(4)
    n = 12
    return pd.DataFrame({"job_id": np.arange(n), "arrival_s": np.sort(rng.uniform(0, 30, n)),
                         "num_gpus": rng.choice([1, 2, 4], n), "model": rng.choice(["resnet18", "lstm_lm"], n),
                         "iterations": rng.integers(50, 400, n).astype(float)})
KEYS = ("jobs_completed", "avg_jct_s", "p50_jct_s", "p95_jct_s", "p99_jct_s", "makespan_s", "avg_queue_s",
        "gpu_utilization", "compute_utilization", "cluster_efficiency", "useful_gpu_s", "ftf_mean",
        "preemptions", "migrations", "level_changes")


def run_scenario(spec: str, gpus: int, agent: str, cfg: dict) -> dict:
    cluster = ClusterSpec.from_gpus(gpus)
    jobs = _tiny_jobs() if spec == "tiny" else load_trace(spec, cluster_gpus=gpus).jobs
    m = Simulator(cluster, jobs, SimConfig(**cfg)).run(make_scheduler(agent))
    return {k: m[k] for k in KEYS}


def test_golden_metrics_unchanged():
    results = {name: run_scenario(*args) for name, args in SCENARIOS.items()}
    if os.environ.get("JIGSAW_REGEN_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
        pytest.skip("golden metrics regenerated")
    golden = json.loads(GOLDEN.read_text())
    assert set(golden) == set(results)
    for name, want in golden.items():
        for k, v in want.items():
            got = results[name][k]
            if v is None:
                assert got is None, (name, k)
            else:
                assert got == pytest.approx(v, rel=1e-9, abs=1e-9), (name, k, got, v)
