"""Sim vs real: the same small job set run live (several times) and replayed in the simulator.

    python -m bench.sim_vs_real [--repeats 3] [--round-s 2] [--policy gandiva+spb] [--out DIR]

1. **Live.** Four backlogged jobs on 2 CPU slots (tiny CNN on 1 slot, tiny MLP, tiny Transformer,
   tiny CNN on 2 slots; sklearn digits) under ``gandiva+spb`` (co-location on a shared slot, SPB
   levels, a 2-slot job), ``--repeats`` times in one Ray session. Run-to-run noise: the
   coefficient of variation (std / mean) over the repeats of each job's mean iteration time and
   JCT.
2. **Replay.** Every run's decision log through the simulator (same decisions, each round as long
   as it lasted live; restart = the measured start-up of resumed incarnations), with three sets
   of cost numbers:

   * ``shipped``: the shipped CPU tables (``jigsaw_env/tables/*-cpu.json``) and the simulator's
     intra-node link;
   * ``recalibrated``: ``jigsaw calibrate --device cpu`` run now, pinned to one core, into a temp
     folder (the same plain-PyTorch-loop measurement as the shipped tables, on today's machine);
   * ``executor``: the recalibrated tables plus the executor's own per-iteration overhead (its
     median level-0 iteration time of each model alone on one slot, minus the table's plain-loop
     compute; added to ``optimizer_s``, paid by every iteration whatever its start group), and a
     slot-to-slot link whose latency is fitted to a 2-slot level-0 job (loopback gloo; bandwidth
     kept). The calibration jobs are separate runs at level 0, alone or on 2 slots; the measured
     set runs at SPB levels, co-located, so this checks the model rather than fitting the answer.

   Per job: measured vs simulated mean iteration time and JCT, the relative error (mean over the
   repeats), and whether it meets the target: |error| <= 10 %, or <= 2 x the noise where the
   noise is larger than 5 %.

Writes ``OUT/sim_vs_real.json`` (and the runs' logs under ``OUT/runs/``); prints a table.
docs/deploy.md section 5 has the results and what they mean.
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


def calibration_set(n: int):
    from jigsaw_executor.live import LiveJob

    return [LiveJob(10, "tiny_cnn", 1, n, seed=0), LiveJob(11, "tiny_mlp", 1, n, seed=1, lr=0.02),
            LiveJob(12, "tiny_transformer", 1, n, seed=2), LiveJob(13, "tiny_cnn", 2, n, seed=3)]


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


def executor_tables(calib_out: Path, base_folder: Path, folder: Path) -> dict:
    """The ``executor`` variant (module docstring): the recalibrated tables in ``base_folder`` plus
    the executor's own per-iteration overhead (its level-0 iteration time alone on one slot minus
    the table's plain-loop compute), added to ``optimizer_s`` because every iteration pays it
    whatever its start group; and a slot-to-slot link whose latency is fitted to the 2-slot job."""
    from jigsaw_env.cost_table import CostTable
    from jigsaw_env.network import INTRA_NODE, Link, ring_allreduce_s

    its = _iters(calib_out)
    med = {}
    for jid in (10, 11, 12, 13):
        xs = [it["iter_s"] for it in its if it["job"] == jid and it["iter_s"]]
        med[jid] = float(np.median(xs[20:] if len(xs) > 40 else xs))
    overhead = {}
    folder.mkdir(parents=True, exist_ok=True)
    for jid, model in ((10, "tiny_cnn"), (11, "tiny_mlp"), (12, "tiny_transformer")):
        t = CostTable.load(base_folder / f"{model}-bs32-cpu.json")
        extra = max(0.0, med[jid] - t.compute_s(0))
        overhead[model] = extra
        src = dict(t.sources)
        src["optimizer_s"] = (src.get("optimizer_s", "") + f"; plus {extra * 1e3:.3f} ms of executor overhead per "
                              f"iteration (bench/sim_vs_real.py: the live executor's median level-0 iteration of "
                              f"{model} alone on one slot, {med[jid] * 1e3:.3f} ms, minus this table's compute_s(0))")
        CostTable(t.model, t.batch_size, "cpu", t.groups, t.optimizer_s + extra, t.fixed_memory_bytes, src,
                  dict(t.meta, kind="executor-overhead")).save(folder / f"{model}-bs32-cpu.json")
    # link: 2-slot tiny_cnn at level 0: iteration = the 1-slot iteration + one 2-rank ring per group
    t = CostTable.load(base_folder / "tiny_cnn-bs32-cpu.json")
    comm = med[13] - med[10]
    nbytes = [g.param_bytes for g in t.groups if g.param_bytes > 0]
    bw = INTRA_NODE.bandwidth_Bps
    beta_part = sum(ring_allreduce_s(2, m, Link(0.0, bw)) for m in nbytes)
    alpha = max(1e-6, (comm - beta_part) / (2 * len(nbytes)))
    return {"overhead_s": overhead, "median_iter_s": {str(k): v for k, v in med.items()}, "comm_s": comm,
            "link_alpha_s": alpha, "link_bandwidth_Bps": bw}


def recalibrate(folder: Path) -> dict:
    """`jigsaw calibrate --device cpu` for the tiny models, pinned to core 0, into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    jig = str(Path(sys.executable).with_name("jigsaw"))
    out = {}
    for m in MODELS:
        cmd = ["taskset", "-c", "0", jig, "calibrate", "--model", m, "--batch-size", "32", "--device", "cpu",
               "--out", str(folder / f"{m}-bs32-cpu.json"), "--no-progress"]
        if not shutil.which("taskset"):
            cmd = cmd[3:]
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
        from jigsaw_env.cost_table import CostTable

        out[m] = CostTable.load(folder / f"{m}-bs32-cpu.json").compute_s(0)
    return out


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
    ap.add_argument("--calibration-iterations", type=int, default=400)
    ap.add_argument("--out", default="bench/results/sim_vs_real")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from jigsaw_env.network import Link
    from jigsaw_executor.cluster_ray import RaySession, SlotPool, get_or_create_hub, kill_actor
    from jigsaw_executor.decision_log import replay_decision_log

    out = Path(args.out)
    if (out / "runs").exists():
        shutil.rmtree(out / "runs")
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="jigsaw-svr-"))
    load0 = os.getloadavg()
    t0 = time.time()
    print("recalibrating with `jigsaw calibrate --device cpu` (pinned to core 0)", flush=True)
    recal = recalibrate(tmp / "recalibrated")
    sess = RaySession(2, allow_oversubscribe=True).start()
    pool = SlotPool(2, 2, prefix=f"jigsaw-svr-{os.getpid()}")
    hub = get_or_create_hub(f"jigsaw-svr-{os.getpid()}-hub")
    try:
        print(f"calibration run ({args.calibration_iterations} iterations per job, level 0)", flush=True)
        run_live(calibration_set(args.calibration_iterations), "fifo", out / "runs" / "calibration", pool, hub,
                 round_s=1000.0)
        ex_cal = executor_tables(out / "runs" / "calibration", tmp / "recalibrated", tmp / "executor")
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
    link = Link(ex_cal["link_alpha_s"], ex_cal["link_bandwidth_Bps"])
    variants = {"shipped": dict(), "recalibrated": dict(tables=tmp / "recalibrated"),
                "executor": dict(tables=tmp / "executor", link=link)}
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
              "loadavg_start_end": [load0, load1], "wall_s": time.time() - t0, "cpus": os.cpu_count(),
              "calibration": {"executor": ex_cal, "recalibrated_compute_s0": recal},
              "decisions_match": {v: all(rep.decisions_match for rep in reps) for v, reps in replays.items()},
              "restart_s": [rep.restart_s for rep in replays["shipped"]],
              "round_boundary_overhead_fraction": ovh, "rows": rows,
              "notes": sorted({n for reps in replays.values() for rep in reps for n in rep.notes
                               if "restart_s" not in n})}
    (out / "sim_vs_real.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    _print(result)
    return 0


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
