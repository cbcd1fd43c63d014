"""What an agent's saturated rounds hold, on the study's held-out windows: why its saturated
efficiency is what it is.

    python -m bench.saturated_rounds --agents jigsaw,jigsaw-srtf,learned --windows 48 --window-jobs 200 --out DIR

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

#: the parts of the trace the windows may come from (``--split``)
SPLITS = ("heldout", "val")
#: the pooled quantities of :func:`saturated_summary`, in table order, with their headings
COLUMNS = (("saturated_h", "saturated h"), ("efficiency", "efficiency (pooled)"),
           ("mean_window_efficiency", "efficiency (mean of windows)"), ("allocated_share", "allocated share"),
           ("useful_per_allocated", "useful / allocated"), ("mean_queued", "mean waiting jobs"),
           ("free_share", "share with a free GPU"))


def saturated_totals(cluster_rounds, num_gpus: int) -> dict:
    """Sums over the saturated rounds of one cluster log (``Simulator.cluster_frame()``): seconds,
    GPU-seconds (GPUs x seconds), useful and allocated GPU-seconds, waiting-job-seconds and the
    seconds of rounds with a free GPU."""
    from jigsaw_env.metrics import saturated_work

    useful, total_s = saturated_work(cluster_rounds)  # the rounds and sums the reported metric uses
    sat = cluster_rounds[cluster_rounds["queued"].to_numpy() > 0]
    seconds = (sat["end_s"] - sat["start_s"]).to_numpy(float)
    free = sat["allocated_gpus"].to_numpy() < num_gpus
    return {"seconds": total_s, "gpu_s": num_gpus * total_s, "useful_gpu_s": useful,
            "allocated_gpu_s": float(sat["allocated_gpu_s"].sum()),
            "queued_s": float((sat["queued"].to_numpy(float) * seconds).sum()), "free_s": float(seconds[free].sum())}


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
            agents: str, progress: bool = True, split: str = "heldout", val: float = 0.1) -> dict:
    """Per load and agent: the :func:`saturated_summary` over the windows, the agent's mean JCT (h),
    each window's JCT (h) and each window's saturated efficiency as the simulator reports it
    (None: no saturated round). ``split``: the windows' part of the trace, ``heldout`` (the last
    ``holdout`` of it) or ``val`` (the ``val`` before it, the training recipe's validation part).
    ``agents`` is ``jigsaw evaluate``'s ``--agents`` text (heuristics, ``learned``, run folders);
    each run goes through ``jigsaw_env.evaluate.run_task``, what ``jigsaw evaluate`` runs."""
    import tempfile

    import pandas as pd
    from tqdm import tqdm

    from bench.ppo_study import build_windows, evaluation_setup, study_splits
    from jigsaw_env.evaluate import Task, init_worker, parse_agents, run_task

    specs = parse_agents(agents)
    cluster_kwargs, cfg = evaluation_setup(gpus)
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
    held = study_splits(trace, gpus, holdout, val=val)["eval" if split == "heldout" else "val"]
    init_worker(None)
    out: dict = {"loads": {}}
    bar = tqdm(total=len(loads) * windows * len(specs), desc="saturated rounds", unit="run", disable=not progress)
    with tempfile.TemporaryDirectory(prefix="saturated_rounds_") as tmp:
        for load in loads:
            part = {}
            wins = build_windows(held, window_jobs, windows, gpus, load)
            for spec in specs:
                totals, jct, reported = [], [], []
                for jobs, info in wins:
                    logs = os.path.join(tmp, f"{load}", spec.label, str(info["window"]))
                    row = run_task(Task(spec, info["window"], load, None, logs, jobs, cluster_kwargs, cfg, None,
                                        info["digest"], info["offered_load"]))
                    totals.append(saturated_totals(pd.read_csv(os.path.join(logs, "cluster.csv")), gpus))
                    jct.append(float(row["avg_jct_s"]) / 3600.0)
                    reported.append(row["saturated_efficiency"])
                    bar.update(1)
                part[spec.label] = {**saturated_summary(totals), "mean_jct_h": sum(jct) / len(jct),
                                    "jct_h": jct, "reported_efficiency": reported}
            out["loads"][str(load)] = part
    bar.close()
    out.update(trace=portable_text(trace), gpus=gpus, holdout=holdout, split=split,
               val=val if split == "val" else None, windows=windows, window_jobs=window_jobs,
               agents=[s.label for s in specs], cluster=cluster_kwargs)
    return out


def paired_jct(part: dict, baseline: str) -> dict:
    """Per agent: its per-window JCT minus ``baseline``'s (h), as (mean, 95 % t half-width) by
    ``jigsaw evaluate``'s ``ci95``; (0, 0) for the baseline itself. Needs each agent's ``jct_h``
    (one number per window, same windows)."""
    from jigsaw_env.report import ci95

    base = part[baseline]["jct_h"]
    return {name: ci95([a - b for a, b in zip(row["jct_h"], base)])[:2] for name, row in part.items()}


def write_md(path, res: dict) -> None:
    split = res.get("split", "heldout")
    which = "held-out" if split == "heldout" else f"validation (the {res.get('val')} of the trace before the held-out part)"
    lines = ["# What the saturated rounds hold", "", run_line(res), "",
             f"{res['windows']} {which} windows of {res['window_jobs']} jobs of `{res['trace']}` on {res['gpus']} "
             "GPUs; saturated rounds (a job waiting at the round's start) pooled over the windows "
             "(`bench/saturated_rounds.py` says what each column is); JCT minus the first agent's, "
             "mean and 95 % t-interval over the windows.", ""]
    for load, part in res["loads"].items():
        first = next(iter(part))
        paired = paired_jct(part, first) if all("jct_h" in r for r in part.values()) else {}
        lines += [f"## Load {load}", "",
                  f"| agent | mean JCT (h) | minus {first} (h) | " + " | ".join(h for _, h in COLUMNS) + " |",
                  "|---|" + "---:|" * (len(COLUMNS) + 2)]
        for name, row in part.items():
            cells = " | ".join(f"{row[k]:.3f}" for k, _ in COLUMNS)
            m, hw = paired.get(name, (float("nan"), float("nan")))
            diff = f"{m:+.3f} [{m - hw:+.3f}, {m + hw:+.3f}]" if name != first else "-"
            lines.append(f"| {name} | {row['mean_jct_h']:.3f} | {diff} | {cells} |")
        lines.append("")
    path.write_text("\n".join(lines))


def main(argv=None) -> int:
    from bench.headroom import parse_loads
    from bench.ppo_study import _default_trace, add_study_window_arguments

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_study_window_arguments(p)
    p.add_argument("--loads", default="1.0,1.5", help="comma-separated offered loads (default 1.0,1.5)")
    p.add_argument("--agents", default="jigsaw,jigsaw-srtf",
                   help="as jigsaw evaluate's --agents: heuristics, learned, run folders (default jigsaw,jigsaw-srtf)")
    p.add_argument("--split", choices=SPLITS, default="heldout",
                   help="the windows' part of the trace: the held-out jobs, or the validation jobs before them "
                        "(the training recipe's, to choose a heuristic on) (default heldout)")
    p.add_argument("--val", type=float, default=0.1, help="with --split val: the validation fraction (default 0.1)")
    p.add_argument("--out", required=True, help="write results.json and results.md in this folder")
    a = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from jigsaw_env.evaluate import parse_agents

    try:
        parse_agents(a.agents)
    except (ValueError, FileNotFoundError) as e:
        p.error(f"--agents: {e}")
    if a.gpus < 1 or a.windows < 1 or a.window_jobs < 1:
        p.error(f"--gpus, --windows and --window-jobs must be positive, got {a.gpus}, {a.windows}, {a.window_jobs}")
    try:
        loads = parse_loads(a.loads)
    except ValueError as e:
        p.error(str(e))
    t0 = time.perf_counter()
    res = measure(a.trace or _default_trace(), a.gpus, a.holdout, a.windows, a.window_jobs, loads, a.agents,
                  split=a.split, val=a.val)
    write_and_show(a.out, res, write_md, "bench.saturated_rounds", argv, t0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
