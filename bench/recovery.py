"""Full vs partial (CPR-style) recovery of a live SPB job: time lost per failure, and the effect
on the final held-out metric.

    nice -n 10 python -m bench.recovery [--seeds 5] [--failures 3] [--iterations 1200]
        [--checkpoint-every 200] [--out bench/results/recovery]
    python -m bench.recovery --quick [--out DIR]     # CI: 1 seed, 1 failure, 300 iterations

``--quick`` (``tests/executor/test_fault_matrix.py`` runs it) is a check, not a measurement: one seed, one
kill, 300 iterations with a checkpoint every 60, rounds of 100 steps; it writes to a temporary
folder unless ``--out`` is given, and its table has means without intervals.

The job: ``tiny_mlp`` on sklearn digits, 2 ranks on 2 CPU slots (one process each), SPB level 2
(rotating), ``--iterations`` iterations of work, a checkpoint every ``--checkpoint-every``
iterations, rounds of ``--steps-per-round`` lockstep steps. Per seed (model initialisation, data
order and failure schedule), three runs in one Ray session:

* ``none``: no failure (the reference);
* ``full``: ``--failures`` worker processes SIGKILLed (each kills itself at the start of a random
  iteration, a random rank; the same schedule in both modes); the executor restarts the job from
  its last checkpoint (every rank reloads it; the iterations since are run again);
* ``partial``: the same kills; the surviving rank goes on, a replacement copies the current
  weights and optimizer state from it (Maeng et al., CPR, MLSys 2021, adapted to data-parallel
  replicas: nothing to lose, since every replica holds the whole model).

Every slot has spare warm host processes (``--failures`` + 1 hosts per slot), so a replacement
does not wait for Ray to restart the killed process (6-13 s here); without spares both modes pay
that on top. Every run starts with every host warm.

Measured, per mode, as the mean over seeds with a 95 % confidence interval (t distribution over
the per-seed values, n = seeds):

* **time lost per failure, end to end**: (JCT with failures - JCT of the same seed without) /
  failures;
* **time lost per failure, by its parts**: downtime (from the failure, i.e. the first error a
  surviving rank saw or the executor seeing the process gone, whichever came first, to the
  restored workers being ready to step: detection, host, rendezvous, checkpoint load or state
  copy) plus redo (iterations lost x the run's mean iteration time);
* **iterations lost per failure** (work run again);
* **held-out metric**: accuracy and cross-entropy of the final model (its last checkpoint) on the
  held-out split, and its change against the same seed's run without failures; and how many runs
  end with exactly the no-failure run's weights.

Writes ``OUT/recovery.json`` (settings, every run, the aggregates) and ``OUT/recovery.md`` (the
table, also printed). docs/executor.md, "Fault tolerance", has the results.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

MODES = ("none", "full", "partial")


def failure_schedule(seed: int, failures: int, iterations: int, every: int, world: int = 2) -> list[tuple[int, int]]:
    """(rank, iteration) of each kill: iterations spread over the run, at least ``every`` apart and
    away from the first checkpoint and the end, ranks at random."""
    rng = np.random.default_rng(10_007 + seed)
    lo, hi = every + 1, iterations - every
    if hi - lo < failures * every:
        raise ValueError(f"{iterations} iterations are too few for {failures} failures {every} apart")
    while True:
        its = np.sort(rng.integers(lo, hi, size=failures))
        if failures < 2 or np.min(np.diff(its)) >= every:
            break
    return [(int(rng.integers(0, world)), int(t)) for t in its]


def heldout(ckpt_dir: Path, model_name: str, seed: int, lr: float | None) -> dict:
    """Accuracy and mean cross-entropy of the final checkpoint's model on the held-out split."""
    import torch
    import torch.nn.functional as F

    from jigsaw_executor.data import DigitsData
    from jigsaw_executor.models import build_executor_model
    from jigsaw_executor.spb_worker import read_checkpoint_meta

    meta = read_checkpoint_meta(ckpt_dir)
    state = torch.load(ckpt_dir / meta["state_file"], map_location="cpu", weights_only=True)
    model = build_executor_model(model_name)
    model.load_state_dict(state["model"])
    model.eval()
    x, y = DigitsData(seed=seed).holdout()
    with torch.no_grad():
        out = model(x)
    return {"accuracy": float((out.argmax(-1) == y).float().mean()), "loss": float(F.cross_entropy(out, y)),
            "iteration": int(meta["iteration"]), "hash": meta["model_sha256"]}


def ci95(values) -> dict:
    """Mean and 95 % confidence interval (t distribution) of per-seed values."""
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], dtype=float)
    if len(v) == 0:
        return {"mean": None, "lo": None, "hi": None, "n": 0, "sd": None}
    m = float(v.mean())
    if len(v) < 2:
        return {"mean": m, "lo": None, "hi": None, "n": 1, "sd": None}
    from scipy import stats

    sd = float(v.std(ddof=1))
    h = float(stats.t.ppf(0.975, len(v) - 1) * sd / math.sqrt(len(v)))
    return {"mean": m, "lo": m - h, "hi": m + h, "n": int(len(v)), "sd": sd}


def run_one(mode: str, seed: int, schedule, args, pool, hub, work: Path) -> dict:
    from jigsaw_env.spb import Pattern
    from jigsaw_env.state import Decision, JobDecision
    from jigsaw_executor.live import LiveConfig, LiveExecutor, LiveJob

    level = args.level

    def fixed(state):
        return Decision({0: JobDecision((0, 1), level, Pattern.ROTATING)} if 0 in state.active_ids else {})

    out = work / f"seed{seed}-{mode}"
    shutil.rmtree(out, ignore_errors=True)
    pool.refresh(timeout_s=180.0)  # every host warm: runs start alike
    job = LiveJob(0, args.model, 2, args.iterations, seed=seed, lr=args.lr)
    cfg = LiveConfig(slots=2, steps_per_round=args.steps_per_round, max_workers_per_gpu=pool.cap, pin=False,
                     timeout_s=20.0, checkpoint_every=args.checkpoint_every, max_restarts=args.failures + 2,
                     recovery="full" if mode == "none" else mode, measure_activations=False)
    fail_at = {0: [(r, t, "kill") for r, t in schedule]} if mode != "none" else None
    t0 = time.time()
    ex = LiveExecutor([job], fixed, cfg, out, pool=pool, hub=hub, fail_at=fail_at)
    try:
        summary = ex.run()
    finally:
        ex.close()
    wall = time.time() - t0
    j = summary["jobs"][0]
    ho = heldout(out / "checkpoints" / "job0", args.model, seed, args.lr)
    mean_iter = j["mean_iter_s"]
    fails = []
    for rec in j["recoveries"]:
        # the failure: the first sign of it, a survivor's error or the executor seeing the process gone
        t_fail = min(x for x in (rec.get("t_fail"), rec["t_detect"]) if x is not None)
        down = rec["t_ready"] - t_fail if rec.get("t_ready") is not None else None
        redo = rec["iterations_lost"] * mean_iter
        fails.append({"mode": rec["mode"], "fail_iteration": rec.get("fail_iteration"),
                      "resume_iteration": rec["resume_iteration"], "iterations_lost": rec["iterations_lost"],
                      "detect_s": rec["t_detect"] - t_fail, "downtime_s": down, "redo_s": redo,
                      "time_lost_s": None if down is None else down + redo, "dead_ranks": rec.get("dead_ranks"),
                      "state_bytes": rec.get("state_bytes")})
    return {"mode": mode, "seed": seed, "schedule": schedule, "wall_s": wall, "jct_s": j["jct_s"],
            "status": j["status"], "iterations_run": j["iterations"], "final_iteration": j["final_iteration"],
            "iterations_lost": j["iterations_lost"], "mean_iter_s": mean_iter, "checkpoint_s": j["checkpoint_s"],
            "failures": j["failures"], "restarts": j["restarts"], "partial_recoveries": j["partial_recoveries"],
            "incarnations": j["incarnations"], "heldout_accuracy": ho["accuracy"], "heldout_loss": ho["loss"],
            "final_hash": ho["hash"], "rank_hashes": j["rank_hashes"], "recoveries": fails}


def aggregate(runs: list[dict], args) -> dict:
    by = {(r["seed"], r["mode"]): r for r in runs}
    seeds = sorted({r["seed"] for r in runs})
    agg = {}
    for mode in ("full", "partial"):
        per_seed = {k: [] for k in ("jct_lost", "downtime", "redo", "direct", "lost_its", "d_acc", "d_loss",
                                    "detect")}
        identical = 0
        for s in seeds:
            a, ref = by.get((s, mode)), by.get((s, "none"))
            if a is None or ref is None:
                continue
            nf = max(1, a["failures"])
            per_seed["jct_lost"].append((a["jct_s"] - ref["jct_s"]) / nf)
            fs = a["recoveries"]
            per_seed["downtime"].append(float(np.mean([f["downtime_s"] for f in fs if f["downtime_s"] is not None])))
            per_seed["detect"].append(float(np.mean([f["detect_s"] for f in fs])))
            per_seed["redo"].append(float(np.mean([f["redo_s"] for f in fs])))
            per_seed["direct"].append(float(np.mean([f["time_lost_s"] for f in fs if f["time_lost_s"] is not None])))
            per_seed["lost_its"].append(float(np.mean([f["iterations_lost"] for f in fs])))
            per_seed["d_acc"].append(a["heldout_accuracy"] - ref["heldout_accuracy"])
            per_seed["d_loss"].append(a["heldout_loss"] - ref["heldout_loss"])
            identical += int(a["final_hash"] == ref["final_hash"])
        agg[mode] = {k: ci95(v) for k, v in per_seed.items()}
        agg[mode]["identical_final_weights"] = f"{identical}/{len(per_seed['jct_lost'])}"
        agg[mode]["accuracy"] = ci95([by[(s, mode)]["heldout_accuracy"] for s in seeds if (s, mode) in by])
        agg[mode]["loss"] = ci95([by[(s, mode)]["heldout_loss"] for s in seeds if (s, mode) in by])
        agg[mode]["failures_per_run"] = float(np.mean([by[(s, mode)]["failures"] for s in seeds if (s, mode) in by]))
    agg["none"] = {"jct_s": ci95([by[(s, "none")]["jct_s"] for s in seeds if (s, "none") in by]),
                   "accuracy": ci95([by[(s, "none")]["heldout_accuracy"] for s in seeds if (s, "none") in by]),
                   "loss": ci95([by[(s, "none")]["heldout_loss"] for s in seeds if (s, "none") in by]),
                   "mean_iter_ms": ci95([1e3 * by[(s, "none")]["mean_iter_s"] for s in seeds if (s, "none") in by])}
    ck = [r["checkpoint_s"] / max(1, r["final_iteration"] // args.checkpoint_every) for r in runs if r["mode"] == "none"]
    agg["checkpoint_ms"] = ci95([1e3 * x for x in ck])
    return agg


def _fmt(c: dict, scale: float = 1.0, digits: int = 2, signed: bool = False) -> str:
    if c is None or c.get("mean") is None:
        return "-"
    f = f"{{:{'+' if signed else ''}.{digits}f}}"
    s = f.format(c["mean"] * scale)
    if c.get("lo") is not None:
        s += f" [{f.format(c['lo'] * scale)}, {f.format(c['hi'] * scale)}]"
    return s


def table(agg: dict, args) -> str:
    n = agg["full"]["jct_lost"]["n"]
    rows = [
        ("time lost per failure, end to end (s): (JCT - JCT without failures) / failures", "jct_lost", 1, 2, False),
        ("time lost per failure, downtime + redo (s)", "direct", 1, 2, False),
        ("  downtime: first error seen -> workers ready (s)", "downtime", 1, 2, False),
        ("    of which detection: failure -> executor notices (s)", "detect", 1, 3, False),
        ("  redo: iterations lost x mean iteration time (s)", "redo", 1, 2, False),
        ("iterations lost per failure", "lost_its", 1, 1, False),
        ("held-out accuracy, change vs no failure (points)", "d_acc", 100, 2, True),
        ("held-out loss, change vs no failure", "d_loss", 1, 4, True),
    ]
    lines = [f"| mean over {n} seeds [95 % CI] | full recovery | partial recovery (CPR-style) |", "|---|---:|---:|"]
    for label, key, scale, digits, signed in rows:
        lines.append(f"| {label} | {_fmt(agg['full'][key], scale, digits, signed)} | "
                     f"{_fmt(agg['partial'][key], scale, digits, signed)} |")
    lines.append(f"| final weights bit-identical to the run without failures | {agg['full']['identical_final_weights']} | "
                 f"{agg['partial']['identical_final_weights']} |")
    lines.append(f"| held-out accuracy (no failures: {_fmt(agg['none']['accuracy'], 100, 2)}) | "
                 f"{_fmt(agg['full']['accuracy'], 100, 2)} | {_fmt(agg['partial']['accuracy'], 100, 2)} |")
    foot = (f"\n{args.failures} failures per run (a worker process SIGKILLed at a random iteration), {args.model} "
            f"on digits, 2 ranks, SPB level {args.level}, {args.iterations} iterations of work, checkpoint every "
            f"{args.checkpoint_every} iterations. Without failures: JCT {_fmt(agg['none']['jct_s'], 1, 1)} s, "
            f"{_fmt(agg['none']['mean_iter_ms'], 1, 2)} ms per iteration; one checkpoint costs "
            f"{_fmt(agg['checkpoint_ms'], 1, 1)} ms.")
    return "\n".join(lines) + "\n" + foot + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.recovery", description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--failures", type=int, default=3, help="worker kills per run")
    p.add_argument("--iterations", type=int, default=1200, help="iterations of work of the job")
    p.add_argument("--checkpoint-every", type=int, default=200)
    p.add_argument("--steps-per-round", type=int, default=250)
    p.add_argument("--level", type=int, default=2, help="SPB level of the job")
    p.add_argument("--model", default="tiny_mlp")
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--out", default=None, help="default bench/results/recovery (--quick: a temporary folder)")
    p.add_argument("--quick", action="store_true",
                   help="a check for CI: 1 seed, 1 failure, 300 iterations, checkpoint every 60, 100 steps per round")
    args = p.parse_args(argv)
    if args.quick:
        args.seeds, args.failures, args.iterations, args.checkpoint_every, args.steps_per_round = 1, 1, 300, 60, 100
        args.out = args.out or tempfile.mkdtemp(prefix="jigsaw-recovery-quick-")
    elif args.seeds < 3:
        p.error("--seeds must be >= 3 for a confidence interval worth reading")
    args.out = args.out or "bench/results/recovery"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    from jigsaw_executor.cluster_ray import RaySession, SlotPool, get_or_create_hub, kill_actor

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="jigsaw-recovery-"))
    t_start = time.time()
    session = RaySession(2, allow_oversubscribe=True).start()
    pool = SlotPool(2, args.failures + 1, prefix="bench-recovery", pin=False)
    hub = get_or_create_hub("bench-recovery-hub")
    runs = []
    try:
        for seed in range(args.seeds):
            schedule = failure_schedule(seed, args.failures, args.iterations, args.checkpoint_every)
            for i in range(len(MODES)):  # the order rotates with the seed: load drift hits every mode
                mode = MODES[(i + seed) % len(MODES)]
                r = run_one(mode, seed, schedule, args, pool, hub, work)
                runs.append(r)
                print(f"seed {seed} {mode:7s} JCT {r['jct_s']:6.2f} s  failures {r['failures']}  lost "
                      f"{r['iterations_lost']:4d} it  acc {r['heldout_accuracy']:.4f}  loss {r['heldout_loss']:.4f}  "
                      + "  ".join(f"[{f['mode']} down {f['downtime_s']:.2f} s redo {f['redo_s']:.2f} s]"
                                  for f in r["recoveries"]), flush=True)
    finally:
        pool.close()
        kill_actor(hub)
        session.stop()
        shutil.rmtree(work, ignore_errors=True)
    agg = aggregate(runs, args)
    md = table(agg, args)
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    res = {"settings": vars(args), "command": "python -m bench.recovery " + " ".join(argv or sys.argv[1:]),
           "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "loadavg_end": load},
           "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "wall_s": time.time() - t_start,
           "aggregate": agg, "runs": runs}
    (out / "recovery.json").write_text(json.dumps(res, indent=1) + "\n")
    (out / "recovery.md").write_text("# Full vs partial recovery (python -m bench.recovery)\n\n" + md)
    print(md)
    print(f"wrote {out / 'recovery.json'} and {out / 'recovery.md'} ({time.time() - t_start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
