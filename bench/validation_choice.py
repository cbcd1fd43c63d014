"""Choose between trained policies on validation windows, so that the held-out windows only report.

    python -m bench.validation_choice --agents jigsaw,tiresias,learned,runs/B/best --window-jobs 80,200 \\
        --loads 1.0,1.5 --out DIR

The windows are cut from the validation split (``--val``, default 0.1: the jobs just before the
held-out ones, which ``jigsaw train --val`` keeps out of training) exactly as ``bench.ppo_study``
cuts its held-out windows (evenly spaced offsets, arrivals rescaled to each load, the evaluation
cluster of ``jigsaw evaluate --gpus GPUS``). Every agent plays every (window length, load,
window), through ``jigsaw_env.evaluate.run_task``, what ``jigsaw evaluate`` runs.

The choice among the learned agents is fixed before any number is seen: the lowest mean JCT over
all the settings' windows together (each window counted once). Each agent's difference from
``--baseline`` (default jigsaw) is reported per setting with its paired 95 % t-interval over the
windows.

Writes ``OUT/results.json`` and ``OUT/results.md``.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from bench.results_folder import portable_text, run_line, write_and_show


def validation_windows(trace: str, gpus: int, holdout: float, val: float, window_jobs: int, windows: int,
                       load: float) -> list:
    """``(jobs, info)`` of each validation window (``bench.ppo_study.build_windows`` on the
    validation split)."""
    from bench.ppo_study import build_windows, study_splits

    if not 0.0 < val < 1.0:
        raise ValueError(f"--val must be in (0, 1): the validation split's share of the trace, got {val}")
    return build_windows(study_splits(trace, gpus, holdout, val=val)["val"], window_jobs, windows, gpus, load)


def play(specs, settings: dict, gpus: int, workers: int) -> dict:
    """Mean JCT (h) per agent label, per setting key, per window (in window order)."""
    from bench.ppo_study import evaluation_setup, run_task_or_stall
    from jigsaw_env.evaluate import Task, init_worker

    cluster_kwargs, cfg = evaluation_setup(gpus)
    tmp = tempfile.mkdtemp(prefix="validation_choice_")
    tasks, where = [], []
    for key, (load, wins) in settings.items():
        for spec in specs:
            for jobs, info in wins:
                tasks.append(Task(spec, info["window"], load, None, os.path.join(tmp, key, spec.label, str(info["window"])),
                                  jobs, cluster_kwargs, cfg, None, info["digest"], info["offered_load"]))
                where.append((key, spec.label, info["window"]))
    try:
        if workers <= 1:
            init_worker(None)
            rows = [run_task_or_stall(t) for t in tasks]
        else:
            with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                                     initializer=init_worker, initargs=(None,)) as ex:
                rows = list(ex.map(run_task_or_stall, tasks))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out: dict = {key: {s.label: [float("nan")] * len(wins) for s in specs} for key, (_, wins) in settings.items()}
    for (key, label, w), row in zip(where, rows):
        out[key][label][w] = float(row["avg_jct_s"]) / 3600.0
    return out


def choose(jct: dict, candidates: list[str]) -> tuple[str | None, dict]:
    """(the candidate with the lowest mean JCT over every setting's windows, each candidate's
    mean); a candidate that stalled on some window (NaN) is never chosen."""
    means = {}
    for lab in candidates:
        vals = np.concatenate([np.asarray(per[lab], dtype=np.float64) for per in jct.values()])
        means[lab] = float(vals.mean())
    finite = [lab for lab in candidates if np.isfinite(means[lab])]
    return (min(finite, key=lambda lab: means[lab]) if finite else None), means


def measure(agents: str, trace: str, gpus: int, holdout: float, val: float, window_jobs: list[int],
            loads: list[float], windows: int, baseline: str, workers: int) -> dict:
    from bench.ppo_study import paired, verdict
    from jigsaw_env.evaluate import parse_agents

    specs = parse_agents(agents)
    labels = [s.label for s in specs]
    if baseline not in labels:
        raise ValueError(f"--baseline {baseline!r} is not among --agents {labels}")
    learned = [s.label for s in specs if s.kind == "learned"]
    if not learned:
        raise ValueError(f"--agents {agents!r} holds no learned agent (a RUN_DIR or a shipped policy) to choose from")
    settings = {f"{n} jobs, load {load:g}": (load, validation_windows(trace, gpus, holdout, val, n, windows, load))
                for n in window_jobs for load in loads}
    jct = play(specs, settings, gpus, workers)
    diffs = {}
    for key, per in jct.items():
        diffs[key] = {}
        for lab in labels:
            if lab == baseline:
                continue
            p = paired(per[lab], per[baseline])
            diffs[key][lab] = {k: p[k] for k in ("mean", "lo", "hi", "wins", "losses", "ties", "missing")}
            diffs[key][lab]["verdict"] = verdict(p)
    chosen, means = choose(jct, learned)
    return {"agents": labels, "refs": {s.label: _shown_path(s.ref) for s in specs}, "learned": learned, "baseline": baseline,
            "trace": portable_text(trace), "gpus": gpus, "holdout": holdout, "val": val, "windows": windows,
            "window_jobs": window_jobs, "loads": loads, "per_window_jct_h": jct, "vs_baseline": diffs,
            "pooled_mean_jct_h": means, "chosen": chosen,
            "window_info": {key: [info for _, info in wins] for key, (_, wins) in settings.items()}}


def _shown_path(ref: str) -> str:
    """A RUN_DIR relative to the working folder when it lies inside it; anything else as given."""
    try:
        return str(Path(ref).relative_to(Path.cwd()))
    except ValueError:
        return ref


def write_md(path: Path, res: dict) -> None:
    base = res["baseline"]
    L = ["# Choosing a policy on validation windows", "",
         run_line(res), "",
         f"{res['windows']} windows per setting from the validation split of `{res['trace']}` (validation share "
         f"{res['val']}, held-out share {res['holdout']}), {res['gpus']} GPUs. Mean JCT in hours; the differences "
         f"are each agent minus {base}, mean [95 % t-interval over the windows] (windows won/lost).", ""]
    for key, per in res["per_window_jct_h"].items():
        L += [f"## {key}", "", "| agent | mean JCT (h) | minus " + base + " | won/lost |", "|---|---:|---|---|"]
        for lab in res["agents"]:
            mean = float(np.nanmean(per[lab]))
            if lab == base:
                L.append(f"| {lab} | {mean:.3f} | | |")
                continue
            d = res["vs_baseline"][key][lab]
            L.append(f"| {lab} | {mean:.3f} | {d['mean']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}] | "
                     f"{d['wins']}/{d['losses']} |")
        L.append("")
    L += ["## The choice", "", "| learned agent | run | mean JCT over every window (h) |", "|---|---|---:|"]
    for lab in res["learned"]:
        L.append(f"| {lab} | `{res['refs'][lab]}` | {res['pooled_mean_jct_h'][lab]:.3f} |")
    L += ["", f"Chosen (lowest mean, fixed before the run): **{res['chosen']}**.", ""]
    path.write_text("\n".join(L))


def _floats(text: str, flag: str) -> list[float]:
    try:
        out = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} must be comma-separated numbers, got {text!r}") from None
    if not out:
        raise ValueError(f"{flag}: expected at least one value")
    return out


def main(argv=None) -> int:
    from bench.ppo_study import _default_trace

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", required=True,
                   help="comma-separated scheduler names, shipped policies and RUN_DIRs (as jigsaw evaluate takes them)")
    p.add_argument("--baseline", default="jigsaw", help="agent the others are paired against (default jigsaw)")
    p.add_argument("--trace", default=None, help="KIND:PATH (default philly:$JIGSAW_DATA/philly/philly.csv)")
    p.add_argument("--gpus", type=int, default=64)
    p.add_argument("--holdout", type=float, default=0.2)
    p.add_argument("--val", type=float, default=0.1, help="validation share of the trace (default 0.1)")
    p.add_argument("--window-jobs", default="80", help="comma-separated window lengths in jobs (default 80)")
    p.add_argument("--loads", default="1.0,1.5", help="comma-separated offered loads (default 1.0,1.5)")
    p.add_argument("--windows", type=int, default=12, help="windows per setting (default 12)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", required=True, help="write results.json and results.md here")
    a = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    t0 = time.perf_counter()
    try:
        window_jobs = [int(x) for x in _floats(a.window_jobs, "--window-jobs")]
        res = measure(a.agents, a.trace or _default_trace(), a.gpus, a.holdout, a.val, window_jobs,
                      _floats(a.loads, "--loads"), a.windows, a.baseline, a.workers)
    except ValueError as e:
        p.error(str(e))
    write_and_show(a.out, res, write_md, "bench.validation_choice", argv, t0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
