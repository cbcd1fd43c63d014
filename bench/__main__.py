"""The benchmark runner: env speed, training throughput, ONNX latency, whole-trace replays, replay
scaling and instruction counts, written to bench/results.md.

    python -m bench                      # full sizes (tens of minutes on 2 cores)
    python -m bench --quick --out DIR    # tiny sizes: checks that every part works (CI)
    python -m bench --only env,onnx      # some parts (the others are kept from OUT/results.json, dated)

Parts (each a median over ``--repeats`` runs unless said otherwise, with the command beside it):
  env      env steps/s with K=16 at 64, 512 and 2,048 GPUs over whole episodes under a random masked
           policy (masks included); decisions applied per second; simulated seconds per wall second
  train    MaskablePPO training frames per second (``jigsaw train``, evaluation off)
  onnx     decision latency of the exported ONNX policy (onnxruntime, one thread)
  replay   the whole Philly trace on 512 GPUs with fifo, tiresias and jigsaw: wall time and peak
           memory, each replay in its own process
  scaling  replay time (tiresias) at 1k, 10k and all 82k Philly jobs at a fixed offered load, and at
           10k, 40k and 82k jobs of the synthetic trace with stationary arrivals; the exponent b of a
           least-squares fit time = a * jobs^b for each; three repeats interleaved across the sizes
           (medians), and the time per job-round in the system beside each row
  instructions  the same stationary series in instructions executed (valgrind's cachegrind,
           ``bench.instructions``): within about 0.2 % run to run, so its fit is free of the machine's noise;
           and the env part's 64-GPU episodes (seeds 0-2) in instructions per step; skipped, with the
           reason, where valgrind is not installed
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.results_folder import portable_text
from traces import data_dir

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("env", "train", "onnx", "replay", "scaling", "instructions")


def _shown_command(cmd: list[str]) -> str:
    """``cmd`` as results.md shows it: ``python`` for this interpreter, ``$JIGSAW_DATA`` for the
    data folder (:func:`bench.results_folder.portable_text`)."""
    return portable_text(_cmd_str(cmd))


def _philly() -> Path | None:
    p = data_dir() / "philly" / "philly.csv"
    return p if p.is_file() else None


def _py() -> list[str]:
    return [sys.executable]


def _run_json(cmd: list[str], timeout: float | None = None) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _cmd_str(cmd: list[str]) -> str:
    return " ".join(["python" if c == sys.executable else c for c in cmd])


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem_gib = float("nan")
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = float("nan")
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem_gib, 1), "python": platform.python_version(),
            "numpy": np.__version__, "commit": commit, "date": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
            "load_avg_at_start": round(load, 2), "compiled": compiled_summary()}


def compiled_summary() -> str:
    """Which hot modules the runs import compiled (jigsaw_env/accel.py), in words."""
    from jigsaw_env import accel

    st = accel.status()
    n = sum(v == "compiled" for v in st.values())
    if n == len(st):
        return f"all {n} hot modules compiled (jigsaw accel build)"
    reasons = sorted({v.removeprefix("python: ") for v in st.values() if v != "compiled"})
    return f"{n} of {len(st)} hot modules compiled; the others from their sources ({'; '.join(reasons)})"


# --------------------------------------------------------------------------------------------- parts
def part_env(quick: bool, repeats: int) -> list[dict]:
    from bench.env_speed import measure

    sizes = [(16, 20)] if quick else [(64, 200), (512, 200), (2048, 200)]
    rows = []
    for gpus, jobs in sizes:
        runs = [measure(gpus, 16, 1, jobs, 1.0, seed=r) for r in range(repeats)]
        med = {k: statistics.median(r[k] for r in runs) for k in ("steps_per_s", "decisions_per_s", "rounds_per_s",
                                                                 "sim_s_per_wall_s", "wall_s", "steps")}
        rows.append({"gpus": gpus, "window_k": 16, "jobs": jobs, "repeats": repeats, **med,
                     "command": f"python -m bench.env_speed --gpus {gpus} --window-k 16 --episodes 1 --max-jobs {jobs} --load 1.0 --seed R"})
    return rows


def part_train(quick: bool, workdir: Path) -> dict:
    steps = 256 if quick else 8192
    run_dir = workdir / "ppo"
    cmd = _py() + ["-m", "jigsaw_env.cli", "train", "--run-dir", str(run_dir), "--timesteps", str(steps),
                   "--gpus", "16" if quick else "64", "--max-jobs", "10" if quick else "50", "--n-envs", "2",
                   "--n-steps", "64" if quick else "256", "--batch-size", "64", "--eval-freq", str(10 * steps),
                   "--checkpoint-freq", str(10 * steps), "--seed", "0"]
    t0 = time.perf_counter()
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{_cmd_str(cmd)} failed: {r.stderr.strip()[-2000:]}")
    wall = time.perf_counter() - t0
    cfg = json.loads((run_dir / "config.json").read_text())
    learn_s = float(cfg.get("train_wall_s", wall))
    return {"timesteps": int(cfg.get("trained_timesteps", steps)), "learn_s": round(learn_s, 2),
            "frames_per_s": cfg.get("trained_timesteps", steps) / learn_s, "process_wall_s": round(wall, 2),
            "n_envs": 2, "run_dir": str(run_dir), "command": _cmd_str(cmd).replace(str(workdir), "TMP")}


def part_onnx(run_dir: Path, workdir: Path, repeats: int, quick: bool) -> dict:
    from jigsaw_executor.export import export_policy
    from jigsaw_executor.onnx_policy import OnnxPolicy

    out = workdir / "policy.onnx"
    export_policy(run_dir, out)
    pol = OnnxPolicy(out)
    n = 300 if quick else 2000
    runs = [pol.benchmark(n, seed=r) for r in range(repeats)]
    return {"observation": pol.observation_size, "actions": pol.n_actions, "calls_per_repeat": n, "repeats": repeats,
            "median_ms": statistics.median(r["median_ms"] for r in runs),
            "p99_ms": statistics.median(r["p99_ms"] for r in runs),
            "command": "jigsaw export RUN_DIR --out policy.onnx --bench 2000"}


def part_replay(quick: bool, repeats: int) -> list[dict]:
    philly = _philly()
    if quick or philly is None:
        trace, gpus = "synthetic:jobs=60,load=1.2,seed=3", 16
    else:
        trace, gpus = f"philly:{philly}", 512
    rows = []
    for agent in ("fifo", "tiresias", "jigsaw"):
        cmd = _py() + ["-m", "bench.replay", "--trace", trace, "--gpus", str(gpus), "--agent", agent]
        runs = [_run_json(cmd) for _ in range(repeats)]
        best = runs[0]
        rows.append({**best, "trace": portable_text(trace), "repeats": repeats,
                     "wall_s": statistics.median(r["wall_s"] for r in runs),
                     "run_s": statistics.median(r["run_s"] for r in runs),
                     "gc_s": statistics.median(r["gc_s"] for r in runs),
                     "peak_rss_mib": max(r["peak_rss_mib"] for r in runs),
                     "command": _shown_command(cmd)})
    return rows


def _fit_exponent(jobs: list[int], secs: list[float]) -> tuple[float, float]:
    """(b, a) of the least-squares fit log(secs) = log(a) + b log(jobs)."""
    b, log_a = np.polyfit(np.log(jobs), np.log([max(t, 1e-6) for t in secs]), 1)
    return float(b), float(np.exp(log_a))


def _scaling_series(trace_of, sizes, gpus: int, load, agent: str, repeats: int) -> dict:
    """Replay ``trace_of(n)`` (its first ``n`` jobs) for each ``n`` of ``sizes``: rows with the median
    replay time, the time per job (ms), the jobs in the system summed over rounds (``active_job_rounds``,
    its mean per round and the replay's microseconds per active job-round) and the fit time = a * jobs^b,
    over all points and over the last two alone (the steady part, past the warm-up of short prefixes),
    with the exponents of the time per round and per active job-round against jobs."""
    rows = []
    cmds = {n: _py() + ["-m", "bench.replay", "--trace", trace_of(n), "--gpus", str(gpus), "--agent", agent,
                        "--max-jobs", str(n)] + (["--load", str(load)] if load else []) for n in sizes}
    # repeats interleaved (every size once, then again): a VM that drifts over minutes shifts every
    # size alike instead of the last size alone
    all_runs: dict[int, list[dict]] = {n: [] for n in sizes}
    for _ in range(repeats):
        for n in sizes:
            all_runs[n].append(_run_json(cmds[n]))
    for n in sizes:
        cmd, runs = cmds[n], all_runs[n]
        run_s = statistics.median(r["run_s"] for r in runs)
        ajr = runs[0]["active_job_rounds"]
        rows.append({"jobs": runs[0]["jobs"], "run_s": run_s, "ms_per_job": 1000.0 * run_s / max(runs[0]["jobs"], 1),
                     "rounds": runs[0]["rounds"], "quiet_rounds": runs[0]["quiet_rounds"],
                     "active_job_rounds": ajr, "mean_active": ajr / max(runs[0]["rounds"], 1),
                     "us_per_active_job_round": 1e6 * run_s / max(ajr, 1),
                     "peak_rss_mib": max(r["peak_rss_mib"] for r in runs),
                     "command": _shown_command(cmd)})
    jobs, secs = [r["jobs"] for r in rows], [r["run_s"] for r in rows]
    b, a = _fit_exponent(jobs, secs)
    per_round = [t / max(r["rounds"], 1) for t, r in zip(secs, rows)]
    per_active = [r["us_per_active_job_round"] for r in rows]
    return {"agent": agent, "gpus": gpus, "load": load, "repeats": repeats, "rows": rows, "exponent": b, "coef": a,
            "per_round_exponent": _fit_exponent(jobs, per_round)[0],
            "per_active_job_round_exponent": _fit_exponent(jobs, per_active)[0],
            "last_two_exponent": _fit_exponent(jobs[-2:], secs[-2:])[0]}


def part_scaling(quick: bool, repeats: int, agent: str = "tiresias") -> dict:
    """Two series: Philly prefixes at a fixed offered load (1k, 10k and all 82k jobs), whose
    queue lengths change along the trace, and the Philly-fitted synthetic trace with stationary
    arrivals (``stationary``), which separates the simulator's scaling from the trace's."""
    philly = _philly()
    if quick or philly is None:
        out = _scaling_series(lambda n: "synthetic:jobs=200,load=1.0,seed=3", (50, 100, 200), 16, None, agent, repeats)
        out["stationary"] = _scaling_series(lambda n: f"synthetic:jobs={n},load=0.7,seed=0", (50, 100, 200), 16,
                                            None, agent, repeats)
        return out
    out = _scaling_series(lambda n: f"philly:{philly}", (1000, 10000, 82247), 512, 0.7, agent, repeats)
    out["stationary"] = _scaling_series(lambda n: f"synthetic:jobs={n},load=0.7,seed=0", (10000, 40000, 82247), 512,
                                        None, agent, repeats)
    return out


def part_instructions(quick: bool, agent: str = "tiresias") -> dict:
    """The stationary series of ``part_scaling`` counted in instructions
    (``bench.instructions.replay_instructions``: each replay less its load-only run, under
    cachegrind), as many sizes at once as there are cores (the largest first), and the fit
    instructions = a * jobs^b, with the thousand instructions per job-round in the system beside
    each row; and ``env``: the env part's 64-GPU episodes (seeds 0-2) in instructions per step
    (``bench.instructions.env_instructions``), run beside the replays. ``{"skipped": reason}``
    without valgrind."""
    from concurrent.futures import ThreadPoolExecutor

    from bench import instructions as ins

    if ins.valgrind() is None:
        return {"skipped": "valgrind is not installed (Debian/Ubuntu: apt install valgrind)"}
    # quick: two sizes give the fit its exponent; each size is two runs under valgrind
    sizes, gpus = ((50, 200), 16) if quick else ((10000, 40000, 82247), 512)
    env_gpus, env_jobs, env_seeds = (16, 20, (0,)) if quick else (64, 200, (0, 1, 2))
    trace = "synthetic:jobs={},load=0.7,seed=0".format
    largest, *others = sorted(sizes, reverse=True)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        # the largest replay first (the longest), then the env episodes and the other replays
        futs = {largest: pool.submit(ins.replay_instructions, trace(largest), gpus, agent)}
        env_futs = [pool.submit(ins.env_instructions, env_gpus, env_jobs, seed) for seed in env_seeds]
        futs.update({n: pool.submit(ins.replay_instructions, trace(n), gpus, agent) for n in others})
        runs = {n: f.result() for n, f in futs.items()}
        env_rows = [f.result() for f in env_futs]
    for r in env_rows:
        r["command"] = _cmd_str([sys.executable, "-m", "bench.instructions", "--env", "--gpus", str(env_gpus),
                                 "--max-jobs", str(env_jobs), "--seed", str(r["seed"])])
    rows = []
    for n in sizes:
        r = runs[n]
        ajr = r["active_job_rounds"]
        rows.append({"jobs": r["jobs"], "rounds": r["rounds"], "active_job_rounds": ajr,
                     "mean_active": ajr / max(r["rounds"], 1), "instructions": r["instructions"],
                     "instructions_load": r["instructions_load"],
                     "k_per_active_job_round": r["instructions"] / max(ajr, 1) / 1e3, "avg_jct_s": r["avg_jct_s"],
                     "command": _cmd_str([sys.executable, "-m", "bench.instructions", "--trace", trace(n), "--gpus",
                                          str(gpus), "--agent", agent])})
    jobs = [r["jobs"] for r in rows]
    b, a = _fit_exponent(jobs, [r["instructions"] for r in rows])
    return {"agent": agent, "gpus": gpus, "rows": rows, "exponent": b, "coef": a,
            "per_active_job_round_exponent": _fit_exponent(jobs, [r["k_per_active_job_round"] for r in rows])[0],
            "env": {"gpus": env_gpus, "jobs": env_jobs, "rows": env_rows,
                    "median_per_step": statistics.median(r["per_step"] for r in env_rows)}}


def keep_earlier_parts(res: dict, prev: dict, parts: list[str]) -> None:
    """Copy into ``res`` the parts of an earlier full-size run ``prev`` (a results.json) that this run
    does not measure, each with the date and commit it was measured at; a quick run's are not kept."""
    for part in PARTS:
        if part not in parts:
            keep_earlier_part(res, prev, part)


def keep_earlier_part(res: dict, prev: dict | None, part: str) -> bool:
    """Copy ``part`` of the earlier full-size run ``prev`` into ``res`` with the date and commit it
    was measured at; False when there is none (no earlier run, a quick one, or no such part). Also
    used when a rerun part fails: the earlier numbers stay in results.md, dated, and the failure is
    listed below them."""
    if not prev or prev.get("quick") or part not in prev:
        return False
    res[part] = prev[part]
    res.setdefault("measured", {})[part] = prev.get("measured", {}).get(part) or {
        "date": prev["machine"]["date"], "commit": prev["machine"]["commit"], "cpu": prev["machine"].get("cpu")}
    res["merged"] = True
    return True


# --------------------------------------------------------------------------------------------- report
def _stamp(res: dict, part: str) -> list[str]:
    """A 'Measured on ...' line for a part kept from an earlier run (``--only`` merges), else nothing.
    It names the CPU when it is not this run's (the VM behind this project changes; timings from
    two CPUs are not comparable)."""
    m = res.get("measured", {}).get(part)
    if not m or (m.get("date"), m.get("commit")) == (res["machine"]["date"], res["machine"]["commit"]):
        return []
    cpu = m.get("cpu")
    on = f", on {cpu}" if cpu and cpu != res["machine"].get("cpu") else ""
    return [f"Measured on {m.get('date')} (commit {m.get('commit')}{on}), kept from an earlier run.", ""]


def write_markdown(res: dict, path: Path, quick: bool) -> None:
    m = res["machine"]
    L = ["# Benchmark results", "",
         f"Written by `python -m bench{' --quick' if quick else ''}{res.get('only_flag', '')}` on {m['date']} "
         f"(commit {m['commit']})." + (" Parts not rerun are kept from earlier runs; their sections say when."
                                       if res.get("merged") else ""),
         f"Machine of this run: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, Python {m['python']}, numpy {m['numpy']}; "
         f"load average at start {m['load_avg_at_start']}. One thread per process. Timings on a shared machine are "
         f"noisy: compare ratios taken in one run."
         + (f" Compiled build: {m['compiled']}." if m.get("compiled") else ""), ""]
    if "env" in res:
        L += ["## Env steps per second (K=16, random masked policy, masks included, whole episodes)", "",
              "| GPUs | jobs/episode | steps/s | decisions/s | rounds/s | simulated s per wall s | repeats | command |",
              "|---:|---:|---:|---:|---:|---:|---:|---|"]
        L[-2:-2] = _stamp(res, "env")
        for r in res["env"]:
            L.append(f"| {r['gpus']} | {r['jobs']} | {r['steps_per_s']:,.0f} | {r['decisions_per_s']:,.0f} | "
                     f"{r['rounds_per_s']:,.0f} | {r['sim_s_per_wall_s']:,.0f} | {r['repeats']} | `{r['command']}` |")
        L += ["", "Target: 10,000 steps/s at 64 GPUs (decisions/s counts only actions that change the decision).", ""]
    if "train" in res:
        t = res["train"]
        L += ["## MaskablePPO training throughput", "", *_stamp(res, "train"),
              f"{t['frames_per_s']:,.0f} env frames/s over {t['timesteps']:,} timesteps with {t['n_envs']} SubprocVecEnv "
              f"workers ({t['learn_s']} s of learning, VecNormalize on, evaluation off).", "",
              f"`{t['command']}`", ""]
    if "onnx" in res:
        o = res["onnx"]
        L += ["## Exported-policy decision latency", "", *_stamp(res, "onnx"),
              f"Median {o['median_ms']:.4f} ms, p99 {o['p99_ms']:.4f} ms per decision (observation {o['observation']}, "
              f"{o['actions']} actions; {o['calls_per_repeat']} calls x {o['repeats']} repeats, medians of the "
              f"per-repeat values; onnxruntime, one thread, input checks included). Target: at most 1 ms median.", "",
              f"`{o['command']}`", ""]
    if "replay" in res:
        L += ["## Whole-trace replay", "", *_stamp(res, "replay"),
              "| trace | GPUs | agent | jobs | rounds | rounds without a scheduler call | replay s | of it in the garbage collector s | total wall s | peak memory MiB | mean JCT h | command |",
              "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in res["replay"]:
            gc_s = f"{r['gc_s']:.1f}" if r.get("gc_s") is not None else "n/a"  # absent from results.json files written without the field
            L.append(f"| {r['trace'].split(':')[0]} | {r['gpus']} | {r['agent']} | {r['jobs']:,} | {r['rounds']:,} | "
                     f"{r['quiet_rounds']:,} | {r['run_s']:.1f} | {gc_s} | {r['wall_s']:.1f} | {r['peak_rss_mib']:.0f} | "
                     f"{r['avg_jct_s'] / 3600:.2f} | `{r['command']}` |")
        L += ["", "Target: Jigsaw on the whole Philly trace, 512 GPUs, at most 60 s and 2 GiB.", ""]
    if "scaling" in res:
        s = res["scaling"]
        L += [f"## Replay time against job count ({s['agent']}, {s['gpus']} GPUs)", "", *_stamp(res, "scaling")]
        series = [("Trace prefixes at offered load " + str(s["load"]), s)]
        if "stationary" in s:
            series.append(("Stationary arrivals (the Philly-fitted synthetic trace, load 0.7): the simulator's "
                           "own scaling, without the trace's changing queue lengths", s["stationary"]))
        for title, ser in series:
            L += [f"{title}:", "", "| jobs | rounds | mean jobs in the system per round | replay s | ms per job | "
                  "us per job-round in the system | peak memory MiB | command |",
                  "|---:|---:|---:|---:|---:|---:|---:|---|"]
            for r in ser["rows"]:
                ms = r.get("ms_per_job", 1000.0 * r["run_s"] / max(r["jobs"], 1))
                act = f"{r['mean_active']:.1f}" if "mean_active" in r else "n/a"  # absent from results.json files written without the field
                us = f"{r['us_per_active_job_round']:.2f}" if "us_per_active_job_round" in r else "n/a"
                L.append(f"| {r['jobs']:,} | {r['rounds']:,} | {act} | {r['run_s']:.2f} | {ms:.3f} | {us} | "
                         f"{r['peak_rss_mib']:.0f} | `{r['command']}` |")
            tail = (f"; between the last two points alone jobs^{ser['last_two_exponent']:.2f}"
                    if "last_two_exponent" in ser else "")
            per_active = (f"; time per job-round in the system as jobs^{ser['per_active_job_round_exponent']:.2f}"
                          if "per_active_job_round_exponent" in ser else "")
            reps = (f" Replay s: the median of {ser['repeats']} runs per size, interleaved across the sizes."
                    if ser.get("repeats", 1) > 1 else "")
            L += ["", f"Least-squares fit: replay time = {ser['coef']:.3g} x jobs^{ser['exponent']:.2f}{tail}; time per "
                      f"round grows as jobs^{ser['per_round_exponent']:.2f}{per_active}.{reps}", ""]
        L += ["Target: exponent at most 1 (no faster than linear). A job-round in the system is one waiting or "
              "running job at one round's start; the per-round passes (the scheduler's order, the simulator's "
              "advance) walk those jobs, so a flat time per job-round says the cost follows the jobs in the "
              "system, not the jobs finished (docs/simulator.md section 8).", ""]
    if "instructions" in res:
        s = res["instructions"]
        L += ["## Replay instructions against job count (stationary arrivals, valgrind)", "", *_stamp(res, "instructions")]
        if "skipped" in s:
            L += [f"Not measured: {s['skipped']}.", ""]
        else:
            L += [f"{s['agent']} on {s['gpus']} GPUs, the synthetic trace at load 0.7 (the stationary series above). "
                  "Instructions of building the simulator, the replay and its metrics: the count under "
                  "`valgrind --tool=cachegrind --cache-sim=no` less that of loading the trace alone. The count is "
                  "within about 0.2 % from run to run (string hashing and addresses differ per process); it does not include "
                  "cache misses or memory stalls.", "",
                  "| jobs | rounds | mean jobs in the system per round | instructions (G) | thousand instructions "
                  "per job-round in the system | mean JCT h | command |",
                  "|---:|---:|---:|---:|---:|---:|---|"]
            for r in s["rows"]:
                L.append(f"| {r['jobs']:,} | {r['rounds']:,} | {r['mean_active']:.1f} | {r['instructions'] / 1e9:.2f} | "
                         f"{r['k_per_active_job_round']:.1f} | {r['avg_jct_s'] / 3600:.2f} | `{r['command']}` |")
            L += ["", f"Least-squares fit: instructions = {s['coef']:.3g} x jobs^{s['exponent']:.3f}; instructions per "
                      f"job-round in the system as jobs^{s['per_active_job_round_exponent']:.3f}. Target (as for time): "
                      "exponent at most 1.", ""]
            e = s.get("env")
            if e:
                L += ["### Env instructions per step", "",
                      f"The env part's episodes ({e['gpus']} GPUs, {e['jobs']} jobs, K=16, random masked policy, masks "
                      "included), one per seed: the count of `python -m bench.env_speed ... --episodes 1` less the same "
                      "command with `--episodes 0` (imports and the env's construction), per env step. A measure of "
                      "the env's code the VM's speed cannot move; steps/s above is what a user waits.", "",
                      "| seed | steps | decisions | rounds | instructions (G) | thousand instructions per step | command |",
                      "|---:|---:|---:|---:|---:|---:|---|"]
                for r in e["rows"]:
                    L.append(f"| {r['seed']} | {r['steps']:,} | {r['decisions']:,} | {r['rounds']:,} | "
                             f"{r['instructions'] / 1e9:.2f} | {r['per_step'] / 1e3:.1f} | `{r['command']}` |")
                L += ["", f"Median: {e['median_per_step'] / 1e3:.1f} thousand instructions per step.", ""]
    if res.get("errors"):
        L += ["## Parts that failed", ""] + [f"- {k}: {v}" for k, v in res["errors"].items()] + [""]
    path.write_text("\n".join(L))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes, one repeat: checks that every part works")
    p.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts of {', '.join(PARTS)}")
    p.add_argument("--repeats", type=int, default=None, help="repeats per measurement (default 3; whole-trace replays 1; quick 1)")
    p.add_argument("--out", default=None, help="folder for results.md and results.json (default bench/)")
    a = p.parse_args(argv)
    parts = [x.strip() for x in a.only.split(",") if x.strip()]
    bad = [x for x in parts if x not in PARTS]
    if bad:
        p.error(f"--only: unknown part(s) {bad}; allowed: {list(PARTS)}")
    repeats = a.repeats or (1 if a.quick else 3)
    replay_repeats = a.repeats or 1
    out = Path(a.out) if a.out else Path(__file__).resolve().parent
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    torch.set_num_threads(1)
    res: dict = {"machine": machine(), "quick": a.quick, "errors": {}, "measured": {}}
    prev = None  # the earlier results.json, when this run merges into it
    if set(parts) != set(PARTS):
        res["only_flag"] = f" --only {','.join(parts)}"
        prev_path = out / "results.json"
        if not a.quick and prev_path.is_file():  # keep the parts not rerun, with when they were measured
            try:
                prev = json.loads(prev_path.read_text())
            except (OSError, ValueError) as e:
                p.error(f"--only: cannot read the earlier {prev_path} to keep its other parts: {e}")
            keep_earlier_parts(res, prev, parts)
    from tqdm.auto import tqdm

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        trained: Path | None = None  # the run dir the train part made in this run (a kept one's is gone)
        bar = tqdm(parts, desc="bench", unit="part")
        for part in bar:
            bar.set_postfix_str(part)
            try:
                if part == "env":
                    res["env"] = part_env(a.quick, repeats)
                elif part == "train":
                    res["train"] = part_train(a.quick, work)
                    trained = Path(res["train"]["run_dir"])
                elif part == "onnx":
                    # the latency does not depend on training: without this run's train part, a quick one
                    run_dir = trained if trained is not None else Path(part_train(True, work)["run_dir"])
                    res["onnx"] = part_onnx(run_dir, work, repeats, a.quick)
                elif part == "replay":
                    res["replay"] = part_replay(a.quick, 1 if not a.quick else replay_repeats)
                elif part == "instructions":
                    res["instructions"] = part_instructions(a.quick)
                elif part == "scaling":
                    # the fit compares sizes run minutes apart: three interleaved repeats by default
                    res["scaling"] = part_scaling(a.quick, replay_repeats if a.quick else (a.repeats or 3))
                res["measured"][part] = {"date": res["machine"]["date"], "commit": res["machine"]["commit"],
                                         "cpu": res["machine"]["cpu"]}
            except Exception as e:  # a failed part is reported; the others still run and are written
                res["errors"][part] = f"{type(e).__name__}: {e}"
                keep_earlier_part(res, prev, part)  # and its earlier numbers, if any, are not lost
            # write after every part: nothing measured is lost if a later part fails or is stopped
            (out / "results.json").write_text(json.dumps(res, indent=1, default=str))
            write_markdown(res, out / "results.md", a.quick)
    print(f"wrote {out / 'results.md'}")
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
