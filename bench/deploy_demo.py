"""The deploy demo as a user runs it: ``jigsaw deploy --policy P --demo --slots 2``, several times.

    python -m bench.deploy_demo [--runs 3] [--policy jigsaw] [--cache DIR] [--recalibrate] [--out DIR]

Each run is a fresh ``jigsaw deploy ... --json`` process (its own Ray session). The first run
finds this machine's demo calibration in the cache (``--cache``, default a new folder under
``--out``, so the first run measures it) or measures it; the later runs reuse it
(``jigsaw_executor.demo_calibration``). Per run and job: the replay's simulated against live mean
iteration time (``replay.json``: over the rounds in which the job ran live, the same decisions on
both sides) and JCT, and whether the replay made the same decisions. Run-to-run noise: the
coefficient of variation (std / mean) over the runs of each job's live mean iteration time.
Target (docs/deploy.md section 2): |iteration error| <= 15 % for every job in every run.

Writes ``OUT/deploy_demo.json`` and ``OUT/results.md`` (the runs' folders under ``OUT/runs/``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

TARGET = 0.15


def _one_run(policy: str, out: Path, cache: Path, recalibrate: bool) -> dict:
    env = {**os.environ, "JIGSAW_CACHE_DIR": str(cache), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    cmd = [sys.executable, "-m", "jigsaw_env.cli", "deploy", "--policy", policy, "--demo", "--slots", "2",
           "--out", str(out), "--json"] + (["--recalibrate"] if recalibrate else [])
    t0 = time.time()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.time() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}: {r.stderr[-2000:]}")
    data = json.loads(r.stdout.strip().splitlines()[-1])
    return {"wall_s": round(wall, 1), "calibrated_now": "demo calibration of this machine (once" in r.stderr,
            "summary": data["summary"], "replay": data["replay"], "loadavg_1min_end": os.getloadavg()[0]}


def _job_rows(runs: list[dict]) -> list[dict]:
    rows = []
    for jid in sorted({j["job_id"] for r in runs for j in r["replay"]["jobs"]}):
        per = [next(j for j in r["replay"]["jobs"] if j["job_id"] == jid) for r in runs]
        live = np.array([p["live_iter_s"] for p in per])
        errs = [p["iter_rel_err"] for p in per]
        rows.append({"job_id": jid, "model": per[0]["model"], "num_gpus": per[0]["num_gpus"],
                     "live_iter_ms": [round(x * 1e3, 3) for x in live],
                     "sim_iter_ms": [round(p["sim_iter_s"] * 1e3, 3) for p in per],
                     "iter_err": [round(e, 4) for e in errs],
                     "jct_err": [round(p["jct_rel_err"], 4) for p in per],
                     "noise_cv": round(float(live.std(ddof=1) / live.mean()), 4) if len(live) > 1 else None,
                     "within_target": all(abs(e) <= TARGET for e in errs)})
    return rows


def _markdown(res: dict) -> str:
    pct = lambda v: f"{v:+.0%}"  # noqa: E731
    first = res["runs"][0]
    later = ", ".join(f"{r['wall_s']:.0f}" for r in res["runs"][1:]) or "-"
    how = "measured the calibration" if first["calibrated_now"] else "used a cached one"
    lines = [f"`{res['command']}` at {res['commit']} on {res['machine']}, {res['date_utc']}; "
             f"first run {how} ({first['wall_s']:.0f} s), later runs {later} s; "
             f"the replay made the same decisions in {sum(r['decisions_match'] for r in res['runs'])} of "
             f"{len(res['runs'])} runs.", "",
             "| job | model | slots | live ms/iter (runs) | noise (CV) | sim ms/iter | iteration error | JCT error | within 15 % |",
             "|---|---|---|---|---|---|---|---|---|"]
    for j in res["jobs"]:
        noise = "-" if j["noise_cv"] is None else f"{j['noise_cv']:.0%}"
        lines.append(f"| {j['job_id']} | {j['model']} | {j['num_gpus']} | {', '.join(f'{x:.2f}' for x in j['live_iter_ms'])} "
                     f"| {noise} | {', '.join(f'{x:.2f}' for x in j['sim_iter_ms'])} "
                     f"| {', '.join(map(pct, j['iter_err']))} | {', '.join(map(pct, j['jct_err']))} "
                     f"| {'yes' if j['within_target'] else 'no'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--policy", default="jigsaw")
    p.add_argument("--cache", default=None, help="calibration cache (default OUT/cache: the first run measures)")
    p.add_argument("--recalibrate", action="store_true", help="the first run measures again")
    p.add_argument("--out", default="bench/results/deploy_demo")
    a = p.parse_args(argv)
    if a.runs < 1:
        raise SystemExit("--runs must be >= 1")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(a.cache) if a.cache else out / "cache"
    runs = []
    for i in range(a.runs):
        print(f"run {i + 1}/{a.runs} ...", flush=True)
        r = _one_run(a.policy, out / "runs" / f"run{i + 1}", cache, a.recalibrate and i == 0)
        print(f"  {r['wall_s']:.0f} s, calibrated now: {r['calibrated_now']}, "
              + ", ".join(f"job {j['job_id']} {j['iter_rel_err']:+.0%}" for j in r["replay"]["jobs"]), flush=True)
        runs.append(r)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    res = {"command": f"python -m bench.deploy_demo --runs {a.runs} --policy {a.policy}", "commit": commit,
           "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "machine": f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end",
           "target": TARGET, "jobs": _job_rows(runs),
           "runs": [{"wall_s": r["wall_s"], "calibrated_now": r["calibrated_now"],
                     "decisions_match": r["replay"]["decisions_match"], "notes": r["replay"]["notes"]} for r in runs]}
    (out / "deploy_demo.json").write_text(json.dumps(res, indent=1) + "\n")
    md = _markdown(res)
    (out / "results.md").write_text("# The deploy demo's replay against its live run\n\n" + md)
    print(md)
    return 0 if all(j["within_target"] for j in res["jobs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
