"""Policy improvement by lookahead over Jigsaw: does any one-round change to its decision pay?

    python -m bench.lookahead --workers 2 --out bench/results/lookahead     # minutes to half an hour per window

On the windows of ``python -m bench.ppo_study`` (the held-out split, the same offsets, window length,
load and evaluation cluster), this plays the one-step rollout improvement of Jigsaw (Bertsekas'
rollout algorithm): at every round where Jigsaw's decision changes the allocation in force, each
*alternative* of that decision is scored by a rollout (a copy of the simulator and of the
scheduler: the alternative for one round, then Jigsaw to the window's end, with the window's real
arrivals and durations), and the decision with the lowest mean JCT is played. The alternatives of
a decision, each one job changed:

- ``defer``: a job Jigsaw starts or moves is left waiting this round;
- ``level``: a job runs at another SPB level / pattern on the same GPUs;
- ``keep``: a running job Jigsaw preempts keeps its GPUs (when that fits);
- ``place``: a job Jigsaw starts or moves goes where another placement option (consolidated,
  spread, packed, paired) or another host (as its guest, same width; the first 8 hosts) puts it instead.

The rollouts know the future, so no network distilled from the improved policy, seeing only the
observation, does better than it. Where the improved policy equals Jigsaw, lookahead-based
training (rollout labels distilled into the network) has nothing to teach beyond Jigsaw.

Writes ``OUT/results.json`` and ``OUT/results.md``: per window, Jigsaw's and the improved policy's
mean JCT (h), rounds, rounds checked, rollouts, switches by kind and the wall time.
"""
from __future__ import annotations

import argparse
import copy
import math
import multiprocessing as mp
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Iterator

from bench.results_folder import portable_text, run_line, run_record, write_results

KINDS = ("defer", "level", "keep", "place")


def alternatives(sim, decision, max_hosts: int = 8) -> Iterator[tuple[str, int, object]]:
    """``(kind, job id, decision)`` for every feasible one-job change of ``decision`` (module
    docstring), with at most ``max_hosts`` hosts per job (in decision order, as Jigsaw's own
    search bounds them)."""
    from jigsaw_env.actions import level_pattern_combos
    from jigsaw_env.placement import GpuLedger
    from jigsaw_env.state import Decision, JobDecision

    state = sim.state
    in_force = state.current_decision()
    combos = level_pattern_combos(sim.config.spb)

    def feasible(d) -> bool:
        try:
            sim.validate(d)
        except ValueError:
            return False
        return True

    for jid, jd in decision.items():
        changed = in_force.get(jid) != jd
        rest = Decision({k: v for k, v in decision.items() if k != jid})
        if changed and jid not in in_force:
            yield "defer", jid, rest
        for level, pattern in combos:
            if (level, pattern) != (jd.level, jd.pattern):
                d = Decision(decision)
                d[jid] = JobDecision(jd.gpus, level, pattern)
                if feasible(d):
                    yield "level", jid, d
        if not changed:
            continue
        led = GpuLedger(state, rest)
        job = state.jobs[jid]
        seen = {jd.gpus}
        placements = [led.place(job, opt, jd.level, jd.pattern) for opt in ("consolidated", "spread", "packed", "paired")]
        hosts = [gpus for _, gpus in led.hosts() if len(gpus) == job.num_gpus][:max_hosts]
        placements += [JobDecision(gpus, jd.level, jd.pattern) for gpus in hosts]
        for alt in placements:
            if alt is None or alt.gpus in seen:
                continue
            seen.add(alt.gpus)
            d = Decision(rest)
            d[jid] = alt
            if feasible(d):
                yield "place", jid, d
    for jid, jd in in_force.items():
        if jid not in decision:
            d = Decision(decision)
            d[jid] = jd
            if feasible(d):
                yield "keep", jid, d


def rollout_jct_s(sim, scheduler, first, horizon_s: float | None = None) -> float:
    """Mean JCT (s) of playing ``first`` for one round on a copy of ``sim``, then a copy of
    ``scheduler`` to the end; with ``horizon_s``, only up to ``horizon_s`` simulated seconds
    after the round starts, scored by :func:`time_in_system_s` up to then (the rollout's part of
    the total JCT, whose differences between rollouts from one state are those of the total JCT
    where the runs agree after the horizon)."""
    s = sim.copy()
    sched = copy.deepcopy(scheduler)
    start_s = s.state.time_s
    s.step(first)
    if horizon_s is None:
        while not s.done:
            s.step(sched.schedule(s.state))
        return float(s.metrics()["avg_jct_s"])
    end_s = start_s + horizon_s
    while not s.done and s.state.time_s < end_s:
        s.step(sched.schedule(s.state))
    return time_in_system_s(s.state.jobs.values(), start_s, end_s)


def time_in_system_s(jobs, start_s: float, end_s: float) -> float:
    """Job-seconds spent in the system between ``start_s`` and ``end_s`` (s): for every job that
    arrived before ``end_s``, from its arrival (or ``start_s``) to its finish (or ``end_s``). The
    integral of the number of jobs in the system over that interval, so the total JCT's share of it."""
    total = 0.0
    for j in jobs:
        if j.arrival_s >= end_s:
            continue
        finish = end_s if j.finish_s is None else min(j.finish_s, end_s)
        total += max(0.0, finish - max(j.arrival_s, start_s))
    return total


def improve(cluster, cfg, jobs, base: str = "jigsaw", horizon_s: float | None = None) -> dict:
    """Play the one-step rollout improvement of ``base`` on the job table ``jobs`` (module
    docstring); ``horizon_s``: rollouts cut that many simulated seconds after the round
    (:func:`rollout_jct_s`), the played run still to the window's end."""
    from agents import make_scheduler
    from jigsaw_env.simulator import Simulator

    t0 = time.perf_counter()
    ref = Simulator(cluster, jobs, cfg)
    ref.run(make_scheduler(base))
    sim = Simulator(cluster, jobs, cfg)
    sched = make_scheduler(base)
    sched.reset()
    rounds = checked = rollouts = 0
    switches = {k: 0 for k in KINDS}
    while not sim.done:
        decision = sched.schedule(sim.state)
        if decision != sim.state.current_decision():
            options = list(alternatives(sim, decision))
            if options:
                checked += 1
                best, best_kind = rollout_jct_s(sim, sched, decision, horizon_s), None
                rollouts += 1 + len(options)
                for kind, _, d in options:
                    jct = rollout_jct_s(sim, sched, d, horizon_s)
                    if jct < best - 1e-6:
                        best, best_kind, decision = jct, kind, d
                if best_kind is not None:
                    switches[best_kind] += 1
        sim.step(decision)
        rounds += 1
    return {"base_h": float(ref.metrics()["avg_jct_s"]) / 3600.0, "improved_h": float(sim.metrics()["avg_jct_s"]) / 3600.0,
            "rounds": rounds, "checked": checked, "rollouts": rollouts, "switches": switches,
            "wall_s": time.perf_counter() - t0}


def write_md(path: Path, res: dict) -> None:
    rows = res["windows"]
    lines = ["# Rollout improvement of Jigsaw (one-round alternatives, clairvoyant rollouts)", "",
             run_line(res), "",
             f"Held-out windows of {res['window_jobs']} jobs of `{res['trace']}` on {res['gpus']} GPUs at load "
             f"{res['load']} (`bench/lookahead.py`). Mean JCT in hours.", "",
             *([] if res.get("horizon_h") is None else [
                 f"Rollouts cut {res['horizon_h']:g} simulated hours after their round, scored by the job-hours in "
                 "the system until then; the played runs go to the window's end.", ""]),
             "| window | jigsaw | improved | improved - jigsaw | rounds | checked | rollouts | switches (defer/level/keep/place) | wall s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        sw = "/".join(str(r["switches"][k]) for k in KINDS)
        lines.append(f"| {r['window']} | {r['base_h']:.4f} | {r['improved_h']:.4f} | {r['improved_h'] - r['base_h']:+.4f} | "
                     f"{r['rounds']} | {r['checked']} | {r['rollouts']} | {sw} | {r['wall_s']:.0f} |")
    lines += ["", f"Mean over the windows: jigsaw {res['mean_base_h']:.4f} h, improved {res['mean_improved_h']:.4f} h "
              f"({res['mean_improved_h'] - res['mean_base_h']:+.4f} h).", ""]
    path.write_text("\n".join(lines))


def main(argv=None) -> int:
    from bench.ppo_study import _default_trace, add_study_window_arguments

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_study_window_arguments(p, "--study-windows", "windows the held-out split is cut into (default 12)")
    p.add_argument("--windows", default=None, help="comma-separated window indices to play (default: all)")
    p.add_argument("--load", type=float, default=1.0)
    p.add_argument("--workers", type=int, default=1, help="windows played in parallel, one process each (default 1)")
    p.add_argument("--horizon-h", type=float, default=None,
                   help="cut each rollout this many simulated hours after its round and score it by the job-hours "
                        "in the system until then (default: rollouts to the window's end, scored by mean JCT)")
    p.add_argument("--out", default=None, help="write results.json and results.md in this folder")
    a = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if a.gpus < 1 or a.study_windows < 1 or a.window_jobs < 1 or a.load <= 0 or a.workers < 1:
        p.error("--gpus, --study-windows, --window-jobs, --load and --workers must be positive")
    if a.horizon_h is not None and not (a.horizon_h > 0 and math.isfinite(a.horizon_h)):
        p.error(f"--horizon-h must be a positive number of hours, got {a.horizon_h}")
    horizon_s = None if a.horizon_h is None else a.horizon_h * 3600.0
    try:
        picked = None if a.windows is None else [int(x) for x in a.windows.split(",") if x.strip()]
    except ValueError:
        picked = []
    if picked is not None and (not picked or min(picked) < 0 or max(picked) >= a.study_windows):
        p.error(f"--windows must be comma-separated indices in 0..{a.study_windows - 1}, got {a.windows!r}")
    import numpy as np
    from tqdm import tqdm

    from bench.ppo_study import build_windows, evaluation_setup, heldout_split
    from jigsaw_env.cluster import ClusterSpec

    trace = a.trace or _default_trace()
    cluster_kwargs, cfg = evaluation_setup(a.gpus)
    cluster = ClusterSpec.from_gpus(**cluster_kwargs)
    _, held = heldout_split(trace, a.gpus, a.holdout)
    wins = build_windows(held, a.window_jobs, a.study_windows, a.gpus, a.load)
    chosen = [wins[i] for i in (picked if picked is not None else range(len(wins)))]
    t0 = time.perf_counter()
    rows = []
    with ProcessPoolExecutor(max_workers=a.workers, mp_context=mp.get_context("spawn")) as ex:
        futures = {ex.submit(improve, cluster, cfg, w, horizon_s=horizon_s): info["window"] for w, info in chosen}
        for f in tqdm(as_completed(futures), total=len(futures), desc="lookahead", unit="window"):
            r = f.result()
            r["window"] = futures[f]
            rows.append(r)
            print(f"window {r['window']}: jigsaw {r['base_h']:.4f} h, improved {r['improved_h']:.4f} h, "
                  f"{r['checked']} rounds checked, switches {r['switches']}", flush=True)
    rows.sort(key=lambda r: r["window"])
    res = {"trace": portable_text(trace), "gpus": a.gpus, "holdout": a.holdout, "window_jobs": a.window_jobs, "load": a.load,
           "horizon_h": a.horizon_h,
           "windows": rows, "mean_base_h": float(np.mean([r["base_h"] for r in rows])),
           "mean_improved_h": float(np.mean([r["improved_h"] for r in rows])),
           **run_record("bench.lookahead", argv, t0)}
    if a.out:
        out = write_results(a.out, res, write_md)
        print(f"wrote {out}/results.json, results.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
