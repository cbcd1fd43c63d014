"""Evaluation sweeps and training envs on Ray against one machine's process pool (docs/scale.md).

    nice -n 10 python -m bench.ray_scale [--gpus 32] [--max-jobs 400] [--train-gpus 64] [--steps 300]
        [--out bench/results/ray_scale]

Two parts, on local Ray nodes (``ray.cluster_utils.Cluster``: each node one CPU, all on this
machine, so they share its cores):

* **sweep**: one ``jigsaw evaluate`` of 24 runs (fifo, srtf, tiresias x 4 seeds x loads 0.8, 1.5,
  synthetic trace, ``--gpus`` GPUs, ``--max-jobs`` jobs) locally (``--workers 1``: in this
  process; ``--workers 2``: the process pool, started by each evaluation) and with ``--ray`` on a
  cluster of 1 and of 2 nodes. Each configuration runs twice in a
  row: ``cold`` (Ray starts the node's worker processes, which import jigsaw) and ``warm``. The
  time measured is that of running the runs (``_run_tasks`` or ``run_on_ray``: shipping, tasks,
  writing each run's logs), not the job sets or the report. Per-run overhead = (wall x parallel slots -
  sum of the runs' own ``wall_s``) / runs. The metrics of every configuration are checked equal.
* **train**: env steps per second of the training envs (``--train-gpus``-GPU cluster, 50-job episodes,
  K = 16, the ``jigsaw train`` defaults) through a VecEnv as MaskablePPO drives it: each step
  ``env_method("action_masks")`` then ``step`` with a random feasible action per env, ``--steps``
  steps after 20 warm-up ones; SubprocVecEnv and RayVecEnv (embedded Ray, one CPU per env) with 2
  and 4 envs.

Writes OUT/results.json and OUT/results.md (the tables, the command, the commit).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
AGENTS = "fifo,srtf,tiresias"


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _sweep(out: Path, gpus: int, max_jobs: int, workers: int, ray_address: str | None) -> dict:
    """One 24-run evaluation; the time spent running the runs and their summed own wall time."""
    import pandas as pd

    import jigsaw_env.evaluate as ev
    import jigsaw_env.ray_sweep as rs
    from jigsaw_env.cli import main

    timed: dict[str, float] = {}

    def wrap(fn, key):
        def inner(*a, **k):
            t = time.perf_counter()
            r = fn(*a, **k)
            timed[key] = time.perf_counter() - t
            return r
        return inner

    orig_local, orig_ray = ev._run_tasks, rs.run_on_ray
    ev._run_tasks, rs.run_on_ray = wrap(orig_local, "run"), wrap(orig_ray, "run")
    try:
        argv = ["evaluate", "--agents", AGENTS, "--trace", "synthetic", "--gpus", str(gpus), "--max-jobs",
                str(max_jobs), "--seeds", "4", "--load", "0.8,1.5", "--workers", str(workers), "--no-progress",
                "--out", str(out)]
        if ray_address is not None:
            argv += ["--ray", ray_address]
        with open(os.devnull, "w") as null:
            saved = sys.stdout
            sys.stdout = null
            try:
                rc = main(argv)
            finally:
                sys.stdout = saved
        if rc != 0:
            raise RuntimeError(f"jigsaw {' '.join(argv)} exited {rc}")
    finally:
        ev._run_tasks, rs.run_on_ray = orig_local, orig_ray
    df = pd.read_csv(out / "metrics.csv")
    return {"wall_s": timed["run"], "runs": len(df), "task_s": float(df["wall_s"].sum()),
            "metrics": df.drop(columns=["wall_s"]).to_csv(index=False)}


def part_sweep(gpus: int, max_jobs: int, work: Path) -> dict:
    import ray
    from ray.cluster_utils import Cluster

    rows = []
    reference = None

    def record(name: str, slots: int, r: dict, phase: str) -> None:
        nonlocal reference
        if reference is None:
            reference = r["metrics"]
        same = r["metrics"] == reference
        rows.append({"config": name, "phase": phase, "slots": slots, "runs": r["runs"], "wall_s": r["wall_s"],
                     "task_s": r["task_s"], "overhead_per_run_s": (r["wall_s"] * slots - r["task_s"]) / r["runs"],
                     "metrics_equal": same})
        print(f"  {name:18s} {phase:4s} wall {r['wall_s']:7.2f} s  runs' own {r['task_s']:7.2f} s  "
              f"metrics equal: {same}", file=sys.stderr)

    for workers in (1, 2):
        for phase in ("cold", "warm"):
            record("in process (--workers 1)" if workers == 1 else f"process pool x{workers}", workers,
                   _sweep(work / f"pool{workers}-{phase}", gpus, max_jobs, workers, None), phase)
    for nodes in (1, 2):
        c = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": 1, "include_dashboard": False})
        for _ in range(nodes - 1):
            c.add_node(num_cpus=1)
        c.wait_for_nodes()
        ray.init(address=c.address, logging_level="WARNING", log_to_driver=False)
        try:
            for phase in ("cold", "warm"):
                record(f"ray {nodes} node{'s' if nodes > 1 else ''}", nodes,
                       _sweep(work / f"ray{nodes}-{phase}", gpus, max_jobs, 1, c.address), phase)
        finally:
            ray.shutdown()
            c.shutdown()
    warm = {r["config"]: r for r in rows if r["phase"] == "warm"}
    return {"rows": rows, "ratio_1_to_2_nodes": warm["ray 1 node"]["wall_s"] / warm["ray 2 nodes"]["wall_s"],
            "ratio_pool_1_to_2": warm["in process (--workers 1)"]["wall_s"] / warm["process pool x2"]["wall_s"]}


def _env_steps(venv, steps: int, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    venv.reset()

    def one():
        masks = venv.env_method("action_masks")
        venv.step(np.array([rng.choice(np.flatnonzero(m)) for m in masks]))

    for _ in range(20):
        one()
    t = time.perf_counter()
    for _ in range(steps):
        one()
    return steps * venv.num_envs / (time.perf_counter() - t)


def part_train(gpus: int, steps: int) -> dict:
    import ray
    from stable_baselines3.common.vec_env import SubprocVecEnv

    from agents.ray_vec_env import RayVecEnv
    from agents.rl_env import make_env_fn
    from jigsaw_executor.cluster_ray import connect

    kw = dict(gpus=gpus, trace="synthetic", max_jobs=50, window_k=16)
    rows = []
    for n in (2, 4):
        fns = [make_env_fn(kw, split="train", rank=i, seed=0) for i in range(n)]
        v = SubprocVecEnv(fns)
        try:
            rows.append({"vec_env": "SubprocVecEnv", "envs": n, "steps_per_s": _env_steps(v, steps)})
        finally:
            v.close()
        connect("local", num_cpus=n)
        try:
            v = RayVecEnv(fns)
            try:
                rows.append({"vec_env": "RayVecEnv", "envs": n, "steps_per_s": _env_steps(v, steps)})
            finally:
                v.close()
        finally:
            ray.shutdown()
        for r in rows[-2:]:
            print(f"  {r['vec_env']:14s} {n} envs: {r['steps_per_s']:8.1f} env steps/s", file=sys.stderr)
    return {"rows": rows}


def write_md(res: dict, out: Path) -> str:
    s = res["sweep"]
    lines = [f"# Evaluation sweeps and training envs on Ray ({res['date']})", "",
             f"Command: `{res['command']}` (defaults: --gpus 32 --max-jobs 400 --train-gpus 64 --steps 300)  ",
             f"Commit: `{res['commit']}`; machine: {res['machine']}; load average (1, 5, 15 min) "
             f"{res['load_average_at_start']} at the start, {res['load_average_at_end']} at the end: other work "
             f"shares these cores, so the runs' own time varies between configurations.", "",
             "## Sweep: 24 runs (fifo, srtf, tiresias x 4 seeds x 2 loads)", "",
             f"{res['settings']['gpus']} GPUs, {res['settings']['max_jobs']} jobs per run. Ray nodes are local "
             f"(`ray.cluster_utils.Cluster`), one CPU each, on this machine's {os.cpu_count()} cores. Time: running "
             f"the runs (shipping, tasks, writing each run's logs); overhead per run = (time x slots - the runs' own "
             f"time) / runs.", "",
             "| configuration | phase | slots | time (s) | runs' own time (s) | overhead per run (s) | metrics equal |",
             "|---|---|---:|---:|---:|---:|---|"]
    for r in s["rows"]:
        lines.append(f"| {r['config']} | {r['phase']} | {r['slots']} | {r['wall_s']:.2f} | {r['task_s']:.2f} | "
                     f"{r['overhead_per_run_s']:.3f} | {'yes' if r['metrics_equal'] else 'NO'} |")
    lines += ["", f"Warm time on 1 node / on 2 nodes: **{s['ratio_1_to_2_nodes']:.2f}x** "
              f"(process pool 1 / 2 workers: {s['ratio_pool_1_to_2']:.2f}x).", "",
              "## Training envs: env steps per second (masks fetched every step)", "",
              f"{res['settings']['train_gpus']} GPUs, 50-job synthetic episodes, K = 16; {res['settings']['steps']} steps "
              "of every env after 20 warm-up steps; RayVecEnv on an embedded Ray with one CPU per env.", "",
              "| VecEnv | envs | env steps/s |", "|---|---:|---:|"]
    for r in res["train"]["rows"]:
        lines.append(f"| {r['vec_env']} | {r['envs']} | {r['steps_per_s']:.1f} |")
    text = "\n".join(lines) + "\n"
    (out / "results.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ray_scale", description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", type=int, default=32)
    p.add_argument("--max-jobs", type=int, default=400)
    p.add_argument("--train-gpus", type=int, default=64)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--only", choices=("sweep", "train"), default=None)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "ray_scale"))
    a = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {"date": time.strftime("%Y-%m-%d"), "commit": _commit(),
           "command": "python -m bench.ray_scale " + " ".join(argv if argv is not None else sys.argv[1:]),
           "machine": f"{platform.machine()}, {os.cpu_count()} logical CPUs (shared)",
           "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
           "settings": {"gpus": a.gpus, "max_jobs": a.max_jobs, "train_gpus": a.train_gpus, "steps": a.steps}}
    with tempfile.TemporaryDirectory(prefix="jigsaw-bench-ray-") as tmp:
        if a.only in (None, "sweep"):
            res["sweep"] = part_sweep(a.gpus, a.max_jobs, Path(tmp))
    if a.only in (None, "train"):
        res["train"] = part_train(a.train_gpus, a.steps)
    res["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    (out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    if "sweep" in res and "train" in res:
        print(write_md(res, out))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
