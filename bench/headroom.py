"""How much room a scheduler has on the study's windows: each window's mean JCT against a lower bound.

    python -m bench.headroom --out bench/results/headroom                    # the PPO study's windows (~5 min)
    python -m bench.headroom --loads 1.0,2.0 --window-jobs 200 --out DIR    # a busier setting

The windows are those of ``python -m bench.ppo_study`` (the held-out split, the same offsets,
window length, load and evaluation cluster). For every window this plays each agent of
``--agents`` and computes the **alone bound**: the mean over the window's jobs of each job's JCT
when it runs alone on the empty cluster from its arrival, at its best SPB level and pattern on
consolidated GPUs (the smallest JCT over every level/pattern combination). No schedule gives a job
a smaller JCT under the simulator's model, whose sharing never raises a job's rate above its rate
alone and whose restarts only add time; so ``agent - bound`` is the most any scheduler could gain
on that window, and a learned policy that is to beat an agent with a paired confidence interval
over windows needs that room on most of them.

Writes ``OUT/results.json``, ``OUT/results.md`` (per load: per window and mean, each agent, the
bound and each agent's gap) and ``OUT/headroom.png``.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Sequence

from bench.results_folder import portable_text, run_line, run_record, write_results


def fixed_config_scheduler(level: int, pattern):
    """A scheduler that runs every active job, in arrival order, on consolidated GPUs at ``level``
    and ``pattern`` while they fit (for a window of one job: that job alone, as configured)."""
    from agents.base import Scheduler
    from jigsaw_env.placement import GpuLedger
    from jigsaw_env.state import Decision, JobStatus

    class _FixedConfig(Scheduler):
        name = f"alone-l{level}-{getattr(pattern, 'value', pattern)}"

        def schedule(self, state):
            led = GpuLedger(state)
            for jid in state.active_ids:
                job = state.jobs[jid]
                if job.status is JobStatus.RUNNING and job.placement:
                    jd = led.place(job, "keep", level, pattern)
                else:
                    jd = led.place(job, "consolidated", level, pattern)
                if jd is not None:
                    led.add(jid, jd)
            return Decision(led.decision)

    return _FixedConfig()


def alone_jct_s(cluster, sim_config, job_row) -> float:
    """The smallest JCT (s) of one job (a one-row job table) alone on ``cluster``, over every SPB
    level/pattern combination of ``sim_config``, placed on consolidated GPUs at its arrival."""
    from jigsaw_env.actions import level_pattern_combos
    from jigsaw_env.simulator import Simulator

    one = job_row.copy().reset_index(drop=True)
    one["arrival_s"] = 0.0
    best = float("inf")
    for level, pattern in level_pattern_combos(sim_config.spb):
        sim = Simulator(cluster, one, sim_config)
        sim.run(fixed_config_scheduler(level, pattern))
        best = min(best, float(sim.metrics()["avg_jct_s"]))
    return best


def alone_bound_s(cluster, sim_config, jobs) -> float:
    """Mean over the rows of the job table ``jobs`` of :func:`alone_jct_s` (s)."""
    import numpy as np

    return float(np.mean([alone_jct_s(cluster, sim_config, jobs.iloc[[i]]) for i in range(len(jobs))]))


def measure(trace: str, gpus: int, holdout: float, windows: int, window_jobs: int, loads: Sequence[float],
            agents: Sequence[str], progress: bool = True, round_s: float | None = None) -> dict:
    """Per load and window: each agent's mean JCT (h) and the alone bound (h) (module docstring);
    ``round_s`` replaces the evaluation setup's round length (s) when given."""
    import dataclasses

    import numpy as np
    from tqdm import tqdm

    from agents import make_scheduler
    from bench.ppo_study import build_windows, evaluation_setup, heldout_split
    from jigsaw_env.cluster import ClusterSpec
    from jigsaw_env.simulator import Simulator

    cluster_kwargs, cfg = evaluation_setup(gpus)
    if round_s is not None:
        cfg = dataclasses.replace(cfg, round_s=float(round_s))
    cluster = ClusterSpec.from_gpus(**cluster_kwargs)
    _, held = heldout_split(trace, gpus, holdout)
    out: dict = {"loads": {}}
    bound_of: dict[tuple, float] = {}  # a window's jobs (ids) -> bound: arrivals do not change it
    bar = tqdm(total=len(loads) * windows, desc="headroom", unit="window", disable=not progress)
    for load in loads:
        rows = []
        for w, info in build_windows(held, window_jobs, windows, gpus, load):
            row = {"window": info["window"], "max_gpus": info["max_gpus"], "offered_load": info["offered_load"]}
            for name in agents:
                sim = Simulator(cluster, w, cfg)
                sim.run(make_scheduler(name))
                row[name] = float(sim.metrics()["avg_jct_s"]) / 3600.0
            key = tuple(int(x) for x in w["job_id"])
            if key not in bound_of:
                bound_of[key] = alone_bound_s(cluster, cfg, w) / 3600.0
            row["bound"] = bound_of[key]
            rows.append(row)
            bar.update(1)
        mean = {k: float(np.mean([r[k] for r in rows])) for k in (*agents, "bound")}
        out["loads"][str(load)] = {"windows": rows, "mean_jct_h": mean,
                                   "gap_h": {a: mean[a] - mean["bound"] for a in agents}}
    bar.close()
    out.update(trace=portable_text(trace), gpus=gpus, holdout=holdout, windows=windows, window_jobs=window_jobs,
               agents=list(agents), cluster=cluster_kwargs, round_s=cfg.round_s)
    return out


def write_md(path: Path, res: dict) -> None:
    agents = res["agents"]
    lines = ["# Headroom on the study's windows: each agent against the alone bound", "",
             run_line(res), "",
             f"{res['windows']} windows of {res['window_jobs']} held-out jobs of `{res['trace']}` "
             f"on {res['gpus']} GPUs, rounds of {res['round_s']:g} s. Mean JCT in hours; *bound*: the mean of each job's JCT alone on the "
             "empty cluster at its best SPB configuration (`bench/headroom.py`); *gap*: agent - bound, the most "
             "any scheduler could gain.", ""]
    for load, part in res["loads"].items():
        lines += [f"## Load {load}", "",
                  "| window | max GPUs | " + " | ".join(agents) + " | bound | " + " | ".join(f"{a} gap" for a in agents) + " |",
                  "|---|---|" + "---|" * (2 * len(agents) + 1)]
        for r in part["windows"]:
            lines.append(f"| {r['window']} | {r['max_gpus']} | " + " | ".join(f"{r[a]:.3f}" for a in agents)
                         + f" | {r['bound']:.3f} | " + " | ".join(f"{r[a] - r['bound']:+.3f}" for a in agents) + " |")
        m = part["mean_jct_h"]
        lines.append("| **mean** | | " + " | ".join(f"**{m[a]:.3f}**" for a in agents) + f" | **{m['bound']:.3f}** | "
                     + " | ".join(f"**{part['gap_h'][a]:+.3f}**" for a in agents) + " |")
        lines.append("")
    path.write_text("\n".join(lines))


def plot(path: Path, res: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    loads = list(res["loads"])
    fig, axes = plt.subplots(1, len(loads), figsize=(6 * len(loads), 4), squeeze=False)
    for ax, load in zip(axes[0], loads):
        rows = res["loads"][load]["windows"]
        x = np.arange(len(rows))
        width = 0.8 / len(res["agents"])
        for i, a in enumerate(res["agents"]):
            ax.bar(x + i * width, [r[a] - r["bound"] for r in rows], width, label=a)
        ax.set_xticks(x + 0.4 - width / 2, [str(r["window"]) for r in rows])
        ax.set_xlabel("window")
        ax.set_ylabel("mean JCT - alone bound (h)")
        ax.set_title(f"load {load}")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_loads(text: str) -> list[float]:
    """``--loads``' comma-separated positive numbers; ValueError naming the flag otherwise."""
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        vals = []
    if not vals or min(vals) <= 0:
        raise ValueError(f"--loads must be comma-separated positive numbers, got {text!r}")
    return vals


def main(argv=None) -> int:
    from bench.ppo_study import _default_trace, add_study_window_arguments

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_study_window_arguments(p)
    p.add_argument("--loads", default="1.0,1.5", help="comma-separated offered loads (default 1.0,1.5)")
    p.add_argument("--agents", default="tiresias,jigsaw", help="comma-separated agents (default tiresias,jigsaw)")
    p.add_argument("--round-s", type=float, default=None,
                   help="round length in seconds (default: the evaluation setup's, as jigsaw evaluate uses)")
    p.add_argument("--out", default=None, help="write results.json, results.md and headroom.png in this folder")
    a = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from agents import available_schedulers

    agents = [x for x in a.agents.split(",") if x]
    bad = [x for x in agents if x not in available_schedulers()]
    if not agents or bad:
        p.error(f"--agents: unknown {bad or a.agents!r}; allowed: {', '.join(available_schedulers())}")
    if a.gpus < 1 or a.windows < 1 or a.window_jobs < 1 or (a.round_s is not None and not a.round_s > 0):
        p.error(f"--gpus, --windows, --window-jobs and --round-s must be positive, got {a.gpus}, {a.windows}, "
                f"{a.window_jobs}, {a.round_s}")
    try:
        loads = parse_loads(a.loads)
    except ValueError as e:
        p.error(str(e))
    t0 = time.perf_counter()
    res = measure(a.trace or _default_trace(), a.gpus, a.holdout, a.windows, a.window_jobs, loads, agents,
                  round_s=a.round_s)
    res.update(run_record("bench.headroom", argv, t0))
    for load, part in res["loads"].items():
        print(f"load {load}: mean JCT (h) " + ", ".join(f"{k} {v:.3f}" for k, v in part["mean_jct_h"].items())
              + "; gap " + ", ".join(f"{k} {v:+.3f}" for k, v in part["gap_h"].items()))
    if a.out:
        out = write_results(a.out, res, write_md)
        plot(out / "headroom.png", res)
        print(f"wrote {out}/results.json, results.md, headroom.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
