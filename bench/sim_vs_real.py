"""Sim vs real: the same small job set run live (several times) and replayed in the simulator.

    python -m bench.sim_vs_real [--repeats 3] [--round-s 2] [--policy gandiva+spb] [--out DIR]
                                [--calibration-repeats 5] [--calibration-iterations 1000]

1. **Calibration** (separate from the measured runs, before them): ``jigsaw calibrate --device cpu
   --executor`` (a subprocess, its own Ray session) for the three tiny models: a fresh plain-loop
   CPU table of each, plus the executor's per-iteration overhead (median over
   ``--calibration-repeats`` live runs of each model's **level-0** iteration **alone** on one
   slot, minus the table's compute; docs/deploy.md eq. X1), the slot-to-slot latency fitted to
   the **2-slot level-0** runs (eq. X2, ``link.json``) and the lockstep barrier of **co-located
   level-0 pairs** (eq. X3, ``lockstep.json``).
2. **Live.** Four backlogged jobs on 2 CPU slots (tiny CNN on 1 slot, tiny MLP, tiny Transformer,
   tiny CNN on 2 slots; sklearn digits) under ``gandiva+spb`` (co-location on a shared slot in
   lockstep, SPB level 3, a 2-slot job), ``--repeats`` times in one Ray session. Run-to-run
   noise: the coefficient of variation (std / mean) over the repeats of each job's mean iteration
   time and JCT. The measured set runs at SPB level 3 and co-located, the calibration at level 0
   alone: the calibrated model is checked, not fitted to the answer.
3. **Replay.** Every run's decision log through the simulator (same decisions, each round as long
   as it lasted live; restart = the measured start-up of resumed incarnations), with:

   * ``shipped``: the shipped CPU tables (``jigsaw_env/tables/*-cpu.json``) and the simulator's
     intra-node link (10 us, 7.67 GB/s);
   * ``recalibrated``: the calibration's fresh plain-loop tables (overhead 0), intra-node link;
   * ``executor``: the calibration's output as written (``executor_overhead_s``, ``link.json`` and
     ``lockstep.json``: what ``jigsaw deploy --tables OUT`` uses).

   Per job: measured vs simulated mean iteration time (over the rounds in which the job ran live:
   the same decisions on both sides) and JCT, the relative error (mean over the repeats), and
   whether it meets the target: |error| <= 10 %, or <= 2 x the noise where that is larger.

Writes ``OUT/sim_vs_real.json`` (and the runs' logs under ``OUT/runs/``, the calibration under
``OUT/calibration/``); prints a table. docs/deploy.md section 5 has the results and what they mean.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("tiny_cnn", "tiny_mlp", "tiny_transformer")


def job_set(scale: float = 1.0):
    from jigsaw_executor.live import LiveJob

    return [LiveJob(0, "tiny_cnn", 1, round(1500 * scale), seed=0),
            LiveJob(1, "tiny_mlp", 1, round(3000 * scale), seed=1, lr=0.02),
            LiveJob(2, "tiny_transformer", 1, round(800 * scale), seed=2),
            LiveJob(3, "tiny_cnn", 2, round(1000 * scale), seed=3)]


def _iters(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "iterations.jsonl").read_text().splitlines() if x.strip()]


def run_live(jobs, policy: str, out: Path, pool, hub, round_s: float, steps_per_round: int | None = None):
    from jigsaw_env.spb import SPBConfig
    from jigsaw_executor.live import LiveConfig, LiveExecutor
    from jigsaw_executor.policies import build_scheduler, scheduler_spec

    spec = scheduler_spec(policy)
    sched, rec = build_scheduler(spec, SPBConfig())
    cfg = LiveConfig(slots=2, round_s=round_s, steps_per_round=steps_per_round, timeout_s=60)
    ex = LiveExecutor(jobs, sched, cfg, out, scheduler_spec=spec, pool=pool, hub=hub, recorder=rec)
    try:
        return ex.run()
    finally:
        ex.close()


def calibrate(folder: Path, repeats: int, iterations: int) -> dict:
    """``jigsaw calibrate --device cpu --executor`` for the tiny models into ``folder`` (a
    subprocess with its own Ray session); returns the written link and per-model overheads."""
    from jigsaw_env.cost_table import CostTable
    from jigsaw_env.network import LINK_FILE, load_link

    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    jig = str(Path(sys.executable).with_name("jigsaw"))
    cmd = [jig, "calibrate", "--device", "cpu", "--executor", "--only", *MODELS, "--out", str(folder),
           "--executor-repeats", str(repeats), "--executor-iterations", str(iterations), "--no-progress"]
    subprocess.run(cmd, check=True, env=env)
    return dict(_read_calibration(folder), command=" ".join(["jigsaw"] + cmd[1:]))


def _read_calibration(folder: Path) -> dict:
    from jigsaw_env.cost_table import CostTable
    from jigsaw_env.network import LINK_FILE, load_link

    link = load_link(folder / LINK_FILE)
    out = {"command": f"(reused {folder})", "link_alpha_s": link.alpha_s, "link_bandwidth_Bps": link.bandwidth_Bps,
           "link_source": json.loads((folder / LINK_FILE).read_text()), "models": {}}
    from jigsaw_executor.lockstep import LOCKSTEP_FILE

    if (folder / LOCKSTEP_FILE).is_file():
        out["lockstep"] = json.loads((folder / LOCKSTEP_FILE).read_text())
    for m in MODELS:
        t = CostTable.load(folder / f"{m}-bs32-cpu.json")
        out["models"][m] = {"plain_compute_s0": t.plain_compute_s(0), "executor_overhead_s": t.executor_overhead_s,
                            "calibration": t.meta.get("executor_calibration")}
    return out


def plain_tables(src: Path, folder: Path) -> None:
    """The calibration's tables with the executor overhead removed (the ``recalibrated`` variant)."""
    import dataclasses

    from jigsaw_env.cost_table import CostTable, table_files

    folder.mkdir(parents=True, exist_ok=True)
    for f in table_files(src):
        t = CostTable.load(f)
        dataclasses.replace(t, executor_overhead_s=0.0).save(folder / f.name)


def cv(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    if len(xs) < 2:
        return None
    return float(np.std(xs, ddof=1) / np.mean(xs))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--round-s", type=float, default=2.0)
    ap.add_argument("--policy", default="gandiva+spb")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the jobs' iterations")
    ap.add_argument("--calibration-repeats", type=int, default=5, help="executor calibration runs (median)")
    ap.add_argument("--calibration-iterations", type=int, default=1000, help="iterations per calibration job")
    ap.add_argument("--calibration", default=None, metavar="DIR",
                    help="reuse the output of an earlier `jigsaw calibrate --device cpu --executor` instead of running it")
    ap.add_argument("--sessions", type=int, default=1,
                    help="repeat the whole check (calibration, live runs, replays) this many times, each in "
                         "OUT/sessionK/, and summarise the errors across sessions in OUT/sessions.json: the "
                         "calibration's own run-to-run variation is then part of what is measured")
    ap.add_argument("--out", default="bench/results/sim_vs_real")
    args = ap.parse_args(argv)
    if args.sessions < 1:
        ap.error(f"--sessions must be >= 1, got {args.sessions}")
    if args.sessions > 1 and args.calibration:
        ap.error("--sessions > 1 calibrates in every session: do not give --calibration")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.sessions == 1:
        run_session(args, Path(args.out))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for k in range(args.sessions):
        print(f"\n=== session {k + 1}/{args.sessions} ===", flush=True)
        results.append(run_session(args, out / f"session{k}"))
    summary = summarise_sessions(results)
    (out / "sessions.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    _print_sessions(summary)
    return 0


def summarise_sessions(results: list[dict]) -> dict:
    """Per job, the ``executor`` variant's iteration and JCT errors in every session, their mean
    and range, and in how many sessions each met the target."""
    jobs = []
    for i, row in enumerate(results[0]["rows"]):
        rs = [r["rows"][i] for r in results]
        d = {"job_id": row["job_id"], "model": row["model"], "num_gpus": row["num_gpus"]}
        for what in ("iter", "jct"):
            errs = [r[f"executor_{what}_err"] for r in rs]
            d[f"{what}_err"] = errs
            d[f"{what}_err_mean"] = float(np.mean(errs))
            d[f"{what}_err_range"] = [float(min(errs)), float(max(errs))]
            d[f"{what}_ok_sessions"] = int(sum(r[f"executor_{what}_ok"] for r in rs))
            d[f"live_{what}_noise"] = [r[f"noise_{what}_cv"] for r in rs]
        jobs.append(d)
    return {"date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "sessions": len(results),
            "all_jobs_ok_sessions": int(sum(all(r[f"executor_{w}_ok"] for r in res["rows"] for w in ("iter", "jct"))
                                            for res in results)),
            "lockstep_ms": [(res["calibration"].get("lockstep") or {}).get("lockstep_ms") for res in results],
            "jobs": jobs}


def _print_sessions(s: dict) -> None:
    n = s["sessions"]
    print(f"\nsim vs real over {n} sessions (executor-calibrated tables): every job within target in "
          f"{s['all_jobs_ok_sessions']} of {n}")
    print(f"{'job':>3} {'model':<17}{'slots':>5} | {'iter err mean [range]':>24} {'ok':>5} | {'JCT err mean [range]':>24} {'ok':>5}")
    for j in s["jobs"]:
        cells = []
        for w in ("iter", "jct"):
            lo, hi = j[f"{w}_err_range"]
            cells.append(f"{_pct(j[f'{w}_err_mean'], True):>6} [{_pct(lo, True)}, {_pct(hi, True)}]".rjust(24)
                         + f" {j[f'{w}_ok_sessions']}/{n}".rjust(6))
        print(f"{j['job_id']:>3} {j['model']:<17}{j['num_gpus']:>5} | {cells[0]} | {cells[1]}")


def run_session(args, out: Path) -> dict:
    """One calibration, ``args.repeats`` live runs and their replays, written under ``out``;
    returns what ``out/sim_vs_real.json`` holds."""
    from jigsaw_executor.cluster_ray import RaySession, SlotPool, get_or_create_hub, kill_actor
    from jigsaw_executor.decision_log import replay_decision_log

    for d in ("runs", "calibration"):
        if (out / d).exists() and not (args.calibration and Path(args.calibration).resolve() == (out / d).resolve()):
            shutil.rmtree(out / d)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="jigsaw-svr-"))
    load0 = os.getloadavg()
    t0 = time.time()
    cal_dir = Path(args.calibration) if args.calibration else out / "calibration"
    if not args.calibration:
        print(f"calibrating: jigsaw calibrate --device cpu --executor ({args.calibration_repeats} runs, "
              f"{args.calibration_iterations} iterations per job, level 0)", flush=True)
    cal = calibrate(cal_dir, args.calibration_repeats, args.calibration_iterations) if not args.calibration else \
        _read_calibration(cal_dir)
    load_cal = os.getloadavg()
    plain_tables(cal_dir, tmp / "recalibrated")
    sess = RaySession(2, allow_oversubscribe=True).start()
    pool = SlotPool(2, 2, prefix=f"jigsaw-svr-{os.getpid()}")
    hub = get_or_create_hub(f"jigsaw-svr-{os.getpid()}-hub")
    try:
        summaries = []
        for r in range(args.repeats):
            print(f"live run {r + 1}/{args.repeats}", flush=True)
            summaries.append(run_live(job_set(args.scale), args.policy, out / "runs" / f"run{r}", pool, hub,
                                      args.round_s))
    finally:
        pool.close()
        kill_actor(hub)
        sess.stop()
    load1 = os.getloadavg()
    # the executor variant: the calibration folder as written (its link.json is picked up by the replay)
    variants = {"shipped": dict(), "recalibrated": dict(tables=tmp / "recalibrated"),
                "executor": dict(tables=cal_dir)}
    replays = {v: [] for v in variants}
    for r in range(args.repeats):
        log = out / "runs" / f"run{r}" / "decision_log.jsonl"
        for v, kw in variants.items():
            replays[v].append(replay_decision_log(log, **kw))
    jobs = [j.job_id for j in job_set()]
    rows = []
    for jid in jobs:
        live_iter = [s["jobs"][jid]["mean_iter_s"] for s in summaries]
        live_jct = [s["jobs"][jid]["jct_s"] for s in summaries]
        noise_iter, noise_jct = cv(live_iter), cv(live_jct)
        row = {"job_id": jid, "model": summaries[0]["jobs"][jid]["model"], "num_gpus": summaries[0]["jobs"][jid]["num_gpus"],
               "live_iter_ms": float(np.mean(live_iter)) * 1e3, "live_jct_s": float(np.mean(live_jct)),
               "noise_iter_cv": noise_iter, "noise_jct_cv": noise_jct}
        for v in variants:
            js = [next(j for j in rep.jobs if j["job_id"] == jid) for rep in replays[v]]
            ei = [j["iter_rel_err"] for j in js]
            ej = [j["jct_rel_err"] for j in js]
            row[f"{v}_sim_iter_ms"] = float(np.mean([j["sim_iter_s"] for j in js])) * 1e3
            row[f"{v}_sim_jct_s"] = float(np.mean([j["sim_jct_s"] for j in js]))
            row[f"{v}_iter_err"] = float(np.mean(ei))
            row[f"{v}_jct_err"] = float(np.mean(ej))
            for what, err, noise in (("iter", row[f"{v}_iter_err"], noise_iter), ("jct", row[f"{v}_jct_err"], noise_jct)):
                bound = max(0.10, 2 * noise) if noise is not None and noise > 0.05 else 0.10
                row[f"{v}_{what}_ok"] = bool(abs(err) <= bound)
        rows.append(row)
    overhead = []
    for r in range(args.repeats):
        lines = [json.loads(x) for x in (out / "runs" / f"run{r}" / "decision_log.jsonl").read_text().splitlines()]
        for rec in lines:
            if rec.get("kind") == "round" and rec["outcome"]:
                dur = rec["t_end"] - rec["t_start"]
                step = max(o["stepping_s"] for o in rec["outcome"].values())
                overhead.append((dur - step, dur))
    ovh = sum(a for a, _ in overhead) / max(1e-9, sum(b for _, b in overhead))
    result = {"date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "repeats": args.repeats,
              "policy": args.policy, "round_s": args.round_s, "jobs": [j.to_dict() for j in job_set(args.scale)],
              "loadavg_start_end": [load0, load1], "loadavg_after_calibration": load_cal,
              "wall_s": time.time() - t0, "cpus": os.cpu_count(), "calibration": cal,
              "decisions_match": {v: all(rep.decisions_match for rep in reps) for v, reps in replays.items()},
              "restart_s": [rep.restart_s for rep in replays["shipped"]],
              "round_boundary_overhead_fraction": ovh, "rows": rows,
              "notes": sorted({n for reps in replays.values() for rep in reps for n in rep.notes
                               if "restart_s" not in n})}
    (out / "sim_vs_real.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    _print(result)
    return result


def _print(res: dict) -> None:
    print(f"\nsim vs real: {res['repeats']} live runs of {len(res['rows'])} jobs under {res['policy']}, "
          f"{res['round_s']} s rounds; load average {res['loadavg_start_end'][0][0]:.1f} -> "
          f"{res['loadavg_start_end'][1][0]:.1f} on {res['cpus']} CPUs; round-boundary overhead "
          f"{res['round_boundary_overhead_fraction']:.1%} of the wall time")
    hdr = f"{'job':>3} {'model':<17}{'slots':>5} {'live ms/it':>10} {'noise':>6} {'live JCT':>9} {'noise':>6}"
    for v in ("shipped", "recalibrated", "executor"):
        hdr += f" | {v[:5] + ' it err':>12} {'JCT err':>8}"
    print(hdr)
    for r in res["rows"]:
        line = (f"{r['job_id']:>3} {r['model']:<17}{r['num_gpus']:>5} {r['live_iter_ms']:>10.2f} "
                f"{_pct(r['noise_iter_cv']):>6} {r['live_jct_s']:>9.1f} {_pct(r['noise_jct_cv']):>6}")
        for v in ("shipped", "recalibrated", "executor"):
            line += (f" | {_pct(r[v + '_iter_err'], True) + ('' if r[v + '_iter_ok'] else '!'):>12} "
                     f"{_pct(r[v + '_jct_err'], True) + ('' if r[v + '_jct_ok'] else '!'):>8}")
        print(line)
    print("(! = misses the target: |error| <= 10 %, or <= 2 x the run-to-run noise where that is larger)")
    print(f"decisions replayed identically: {res['decisions_match']}")


def _pct(x, sign: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x:+.0%}" if sign else f"{x:.1%}"


if __name__ == "__main__":
    sys.exit(main())
