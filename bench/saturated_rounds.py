"""What an agent's saturated rounds hold, on the study's held-out windows: why its saturated
efficiency is what it is.

    python -m bench.saturated_rounds --agents jigsaw,jigsaw-srtf --windows 48 --window-jobs 200 --out DIR

A *saturated round* is one that starts with a job waiting (``queued`` > 0 in the cluster log);
the *saturated efficiency* ``jigsaw evaluate`` reports is the useful GPU-seconds of those rounds
over GPUs x their seconds (``jigsaw_env.metrics.saturated_work``). Two agents' saturated rounds
are different rounds, so this bench says what is in them. Per agent and load, pooled over the
windows (``bench.ppo_study``'s held-out windows, on ``jigsaw evaluate``'s cluster):

- ``saturated_h``: hours of saturated rounds, summed over the windows;
- ``efficiency``: useful GPU-seconds / (GPUs x seconds) over all of them together;
- ``mean_window_efficiency``: the mean over windows of each window's own saturated efficiency
  (windows without a saturated round left out), the number ``jigsaw evaluate`` averages;
- ``allocated_share``: allocated GPU-seconds / (GPUs x seconds) in those rounds (below 1: GPUs
  stood free while a job waited);
- ``useful_per_allocated``: useful / allocated GPU-seconds in those rounds (above 1: pairs on
  shared GPUs did more work than the GPUs alone would);
- ``mean_queued``: the mean number of waiting jobs, time-weighted over those rounds;
- ``free_share``: the share of saturated seconds in rounds that left at least one GPU free.

Writes ``OUT/results.json`` and ``OUT/results.md``.
"""
from __future__ import annotations

import argparse
import os
import time
from typing import Sequence

from bench.results_folder import portable_text, run_line, write_and_show

#: the pooled quantities of :func:`saturated_summary`, in table order, with their headings
COLUMNS = (("saturated_h", "saturated h"), ("efficiency", "efficiency (pooled)"),
           ("mean_window_efficiency", "efficiency (mean of windows)"), ("allocated_share", "allocated share"),
           ("useful_per_allocated", "useful / allocated"), ("mean_queued", "mean waiting jobs"),
           ("free_share", "share with a free GPU"))


def saturated_totals(cluster_rounds, num_gpus: int) -> dict:
    """Sums over the saturated rounds of one cluster log (``Simulator.cluster_frame()``): seconds,
    GPU-seconds (GPUs x seconds), useful and allocated GPU-seconds, waiting-job-seconds and the
    seconds of rounds with a free GPU."""
    sat = cluster_rounds[cluster_rounds["queued"].to_numpy() > 0]
    seconds = (sat["end_s"] - sat["start_s"]).to_numpy(float)
    free = sat["allocated_gpus"].to_numpy() < num_gpus
    return {"seconds": float(seconds.sum()), "gpu_s": float(num_gpus * seconds.sum()),
            "useful_gpu_s": float(sat["useful_gpu_s"].sum()), "allocated_gpu_s": float(sat["allocated_gpu_s"].sum()),
            "queued_s": float((sat["queued"].to_numpy(float) * seconds).sum()),
            "free_s": float(seconds[free].sum())}


def saturated_summary(totals: Sequence[dict]) -> dict:
    """The pooled quantities (module docstring) of the :func:`saturated_totals` of several windows."""
    keys = ("seconds", "gpu_s", "useful_gpu_s", "allocated_gpu_s", "queued_s", "free_s")
    s = {k: sum(t[k] for t in totals) for k in keys}
    per_window = [t["useful_gpu_s"] / t["gpu_s"] for t in totals if t["gpu_s"] > 0]
    nan = float("nan")
    return {
        "saturated_h": s["seconds"] / 3600.0,
        "efficiency": s["useful_gpu_s"] / s["gpu_s"] if s["gpu_s"] else nan,
        "mean_window_efficiency": sum(per_window) / len(per_window) if per_window else nan,
        "allocated_share": s["allocated_gpu_s"] / s["gpu_s"] if s["gpu_s"] else nan,
        "useful_per_allocated": s["useful_gpu_s"] / s["allocated_gpu_s"] if s["allocated_gpu_s"] else nan,
        "mean_queued": s["queued_s"] / s["seconds"] if s["seconds"] else nan,
        "free_share": s["free_s"] / s["seconds"] if s["seconds"] else nan,
        "windows_saturated": len(per_window),
    }


def measure(trace: str, gpus: int, holdout: float, windows: int, window_jobs: int, loads: Sequence[float],
            agents: Sequence[str], progress: bool = True) -> dict:
    """Per load and agent: the :func:`saturated_summary` over the windows, and each agent's mean JCT (h)."""
    from tqdm import tqdm

    from agents import make_scheduler
    from bench.ppo_study import build_windows, evaluation_setup, heldout_split
    from jigsaw_env.cluster import ClusterSpec
    from jigsaw_env.simulator import Simulator

    cluster_kwargs, cfg = evaluation_setup(gpus)
    cluster = ClusterSpec.from_gpus(**cluster_kwargs)
    _, held = heldout_split(trace, gpus, holdout)
    out: dict = {"loads": {}}
    bar = tqdm(total=len(loads) * windows * len(agents), desc="saturated rounds", unit="run", disable=not progress)
    for load in loads:
        part = {}
        wins = build_windows(held, window_jobs, windows, gpus, load)
        for name in agents:
            totals, jct = [], []
            for w, _info in wins:
                sim = Simulator(cluster, w, cfg)
                sim.run(make_scheduler(name))
                totals.append(saturated_totals(sim.cluster_frame(), cluster.num_gpus))
                jct.append(float(sim.metrics()["avg_jct_s"]) / 3600.0)
                bar.update(1)
            part[name] = {**saturated_summary(totals), "mean_jct_h": sum(jct) / len(jct)}
        out["loads"][str(load)] = part
    bar.close()
    out.update(trace=portable_text(trace), gpus=gpus, holdout=holdout, windows=windows, window_jobs=window_jobs,
               agents=list(agents), cluster=cluster_kwargs)
    return out


def write_md(path, res: dict) -> None:
    lines = ["# What the saturated rounds hold", "", run_line(res), "",
             f"{res['windows']} held-out windows of {res['window_jobs']} jobs of `{res['trace']}` on {res['gpus']} "
             "GPUs; saturated rounds (a job waiting at the round's start) pooled over the windows "
             "(`bench/saturated_rounds.py` says what each column is).", ""]
    for load, part in res["loads"].items():
        lines += [f"## Load {load}", "",
                  "| agent | mean JCT (h) | " + " | ".join(h for _, h in COLUMNS) + " |",
                  "|---|" + "---:|" * (len(COLUMNS) + 1)]
        for name, row in part.items():
            lines.append(f"| {name} | {row['mean_jct_h']:.3f} | " + " | ".join(f"{row[k]:.3f}" for k, _ in COLUMNS) + " |")
        lines.append("")
    path.write_text("\n".join(lines))


def main(argv=None) -> int:
    from agents import available_schedulers
    from bench.headroom import parse_loads
    from bench.ppo_study import _default_trace, add_study_window_arguments

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_study_window_arguments(p)
    p.add_argument("--loads", default="1.0,1.5", help="comma-separated offered loads (default 1.0,1.5)")
    p.add_argument("--agents", default="jigsaw,jigsaw-srtf", help="comma-separated agents (default jigsaw,jigsaw-srtf)")
    p.add_argument("--out", required=True, help="write results.json and results.md in this folder")
    a = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    agents = [x for x in a.agents.split(",") if x]
    bad = [x for x in agents if x not in available_schedulers()]
    if not agents or bad:
        p.error(f"--agents: unknown {bad or a.agents!r}; allowed: {', '.join(available_schedulers())}")
    if a.gpus < 1 or a.windows < 1 or a.window_jobs < 1:
        p.error(f"--gpus, --windows and --window-jobs must be positive, got {a.gpus}, {a.windows}, {a.window_jobs}")
    try:
        loads = parse_loads(a.loads)
    except ValueError as e:
        p.error(str(e))
    t0 = time.perf_counter()
    res = measure(a.trace or _default_trace(), a.gpus, a.holdout, a.windows, a.window_jobs, loads, agents)
    write_and_show(a.out, res, write_md, "bench.saturated_rounds", argv, t0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
