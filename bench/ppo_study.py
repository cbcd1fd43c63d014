"""PPO study: MaskablePPO (3 training seeds) vs Tiresias, SRTF and Jigsaw on a fixed list of held-out
Philly windows, with paired confidence intervals (the learned-agent target: PPO's mean JCT below
Tiresias's).

    python -m bench.ppo_study                           # full study (3 x 25 min of training, then evaluation)
    python -m bench.ppo_study --reuse                   # re-evaluate the runs already trained
    python -m bench.ppo_study --seeds 0 --timesteps 256 --train-s 0 --windows 2 --window-jobs 10 \
        --max-jobs 10 --out /tmp/tiny                   # tiny mode (tests/agents/test_ppo_study.py)

1. **Training.** One ``jigsaw train`` (= ``python train_agent.py``) per seed, one after the other,
   each under ``nice -n 5`` with ``OMP_NUM_THREADS=1``: by default an imitation warm start from
   Jigsaw's decisions (behaviour cloning + DAgger, agents/imitation.py; its wall time counts in the
   run's budget), then MaskablePPO fine-tuning, ``--n-envs 2`` (SubprocVecEnv),
   episodes = windows of ``--max-jobs`` consecutive jobs from the *first* ``1 - holdout`` of the trace
   (``agents/rl_env.py: TrainingEnv``, split "train"), offered load ``--load``. Each run learns for
   ``--train-s`` seconds of wall time (``train_agent.py --max-wall-s``; the budget is 30 minutes
   per run) or ``--timesteps``, whichever comes first; a watchdog sends SIGINT to a run still going
   at ``--budget-s`` (train_agent saves the model on KeyboardInterrupt) and the report says so.
2. **Held-out windows.** The held-out split is exactly the one training never sees:
   ``TrainingEnv(split="eval").split_jobs()`` (the last ``holdout`` of the jobs by arrival). From it,
   ``--windows`` windows of ``--window-jobs`` consecutive jobs at evenly spaced offsets
   ``i * (len - n) // (W - 1)`` (deterministic; the same for every agent and seed), arrivals shifted
   to 0 and scaled to the offered load (``agents.rl_env.scale_to_load``, as training does).
3. **Evaluation.** Every agent on every window, through ``jigsaw_env.evaluate.run_task`` (the code
   ``jigsaw evaluate`` runs: a heuristic in the Simulator; a RUN_DIR's model played by
   ``agents.rl.LearnedAgent`` with exact masks, argmax), same cluster (``--gpus``) and SimConfig.
   With ``--val F`` (default 0.1) each run trains with ``train_agent.py --val F``: its in-training
   evaluations play episodes of a validation split (the F of the jobs before the held-out split,
   which training does not sample) and ``best/`` keeps the best of them, the clone included; the
   agent under test, ``ppo-sN``, is that ``best/`` (early stopping on validation data: no choice
   is made on held-out jobs) and the final ``model.zip`` is reported beside it as ``last-sN``.
   With ``--val 0`` the final model is the agent under test. A warm-started
   run's cloned policy (``RUN_DIR/warm_start``, before any PPO update) is evaluated too, as
   ``imit-sN``, so the report shows what imitation gives and what PPO changes.
4. **Statistics.** Paired differences per window, ``d_w = JCT_ppo(w) - JCT_ref(w)`` (mean JCT of the
   window, hours), with a 95 % t-interval over windows (per seed); over seeds x windows both the
   pooled interval (3W differences treated as independent: optimistic, windows are shared) and the
   window-level one (per window, the mean over seeds; t over W windows: the honest one).

Writes ``OUT/results.json``, ``OUT/results.md``, ``OUT/per_window_jct.png``; the runs go to
``OUT/runs/`` (git-ignored).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from bench.results_folder import portable_text
from traces import data_dir

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "bench" / "results" / "ppo_study"
HEURISTICS = ("tiresias", "srtf", "jigsaw", "jigsaw-srtf", "fifo")
REFS = ("tiresias", "srtf", "jigsaw", "jigsaw-srtf")
DEFAULT_TRAIN_ARGS = ("--warm-start jigsaw --dagger-rounds 3 --gamma 0.9995 --n-steps 1024 --ent-coef 0.0 --learning-rate 1e-5 "
                      "--target-kl 0.01")


def _default_trace() -> str:
    return f"philly:{data_dir() / 'philly' / 'philly.csv'}"


# ----------------------------------------------------------------------------------------- statistics
def t_interval(x: Sequence[float], conf: float = 0.95) -> dict[str, Any]:
    """mean +- t_{(1+conf)/2, n-1} x sd / sqrt(n) (sd with n - 1 dof); no interval for n < 2."""
    from scipy import stats

    a = np.asarray(list(x), dtype=np.float64)
    n = int(a.size)
    mean = float(a.mean()) if n else float("nan")
    if n < 2:
        return {"n": n, "mean": mean, "sd": float("nan"), "half_width": float("nan"),
                "lo": float("nan"), "hi": float("nan")}
    sd = float(a.std(ddof=1))
    hw = float(stats.t.ppf(0.5 + conf / 2.0, n - 1) * sd / math.sqrt(n))
    return {"n": n, "mean": mean, "sd": sd, "half_width": hw, "lo": mean - hw, "hi": mean + hw}


def paired(a: Sequence[float], b: Sequence[float], conf: float = 0.95) -> dict[str, Any]:
    """Paired differences a_i - b_i with their t-interval, plus wins/losses/ties (|d| <= 1e-9).
    Pairs with a missing (NaN: the policy stalled) value are left out and counted in ``missing``."""
    a = np.asarray(list(a), dtype=np.float64)
    b = np.asarray(list(b), dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"paired samples need the same length, got {a.shape} and {b.shape}")
    ok = np.isfinite(a) & np.isfinite(b)   # a stalled policy has no JCT on that window
    missing = int((~ok).sum())
    a, b = a[ok], b[ok]
    d = a - b
    out = t_interval(d, conf)
    out["missing"] = missing
    out["diffs"] = [float(v) for v in d]
    out["wins"] = int((d < -1e-9).sum())      # a lower (better) than b
    out["losses"] = int((d > 1e-9).sum())
    out["ties"] = int(d.size - out["wins"] - out["losses"])
    out["mean_a"] = float(a.mean()) if a.size else float("nan")
    out["mean_b"] = float(b.mean()) if b.size else float("nan")
    out["rel_diff"] = out["mean"] / out["mean_b"] if a.size and out["mean_b"] else float("nan")
    return out


def verdict(p: dict) -> str:
    """'beats (CI < 0)', 'lower mean, CI includes 0', 'higher mean, CI includes 0', 'loses (CI > 0)', 'equal'."""
    if not np.isfinite(p["mean"]):
        return "n/a"
    if np.isfinite(p["hi"]) and p["hi"] < 0:
        return "beats (95% CI < 0)"
    if np.isfinite(p["lo"]) and p["lo"] > 0:
        return "loses (95% CI > 0)"
    if abs(p["mean"]) <= 1e-9:
        return "equal"
    return ("lower" if p["mean"] < 0 else "higher") + " mean, 95% CI includes 0"


def study_stats(jct: dict[str, list[float]], ppo_labels: list[str], refs: Sequence[str] = REFS) -> dict:
    """``jct``: agent label -> mean JCT (h) per window (same window order for every agent)."""
    out: dict[str, Any] = {"per_seed": {}, "pooled": {}, "window_level": {}}
    for lab in ppo_labels:
        out["per_seed"][lab] = {r: paired(jct[lab], jct[r]) for r in refs if r in jct}
        for r in out["per_seed"][lab]:
            out["per_seed"][lab][r]["verdict"] = verdict(out["per_seed"][lab][r])
    for r in refs:
        if r not in jct:
            continue
        a = np.concatenate([np.asarray(jct[lab], dtype=np.float64) for lab in ppo_labels])
        b = np.concatenate([np.asarray(jct[r], dtype=np.float64) for _ in ppo_labels])
        p = paired(a, b)
        p["verdict"] = verdict(p)
        p["note"] = "seeds x windows pooled as independent pairs (optimistic: the windows are shared by the seeds)"
        out["pooled"][r] = p
        seed_mean = np.mean([np.asarray(jct[lab], dtype=np.float64) for lab in ppo_labels], axis=0)
        q = paired(seed_mean, jct[r])
        q["verdict"] = verdict(q)
        q["note"] = "per window the mean over seeds, then a t-interval over the windows"
        out["window_level"][r] = q
    return out


# ----------------------------------------------------------------------------------------- windows
def study_splits(trace: str, gpus: int, holdout: float, trace_gpu_type: str | None = None,
                 val: float = 0.0) -> dict:
    """The trace's train / val / eval parts exactly as ``TrainingEnv`` cuts them (one load of the
    trace, ``agents.rl_env.cut_splits``)."""
    from agents.rl_env import check_split_fractions, cut_splits

    from traces import load_trace

    # the fractions TrainingEnv checks; the trace (any spec, a synthetic one with its own jobs= and
    # seed= too: here it is one fixed trace to cut) is loaded once, here, capped as TrainingEnv caps it
    check_split_fractions(holdout, val)
    full = load_trace(str(trace), cluster_gpus=gpus, max_gpus=gpus, gpu_type=trace_gpu_type).jobs
    parts = {k: v.reset_index(drop=True) for k, v in cut_splits(full, holdout, val).items()}
    for k in ("train", "eval") + (("val",) if val > 0 else ()):
        if len(parts[k]) == 0:
            raise ValueError(f"trace {trace!r} has {len(full)} jobs: too few for a {k} split "
                             f"(holdout {holdout:.0%}, val {val:.0%})")
    return parts


def heldout_split(trace: str, gpus: int, holdout: float, trace_gpu_type: str | None = None, val: float = 0.0):
    """(train split, held-out split) exactly as ``TrainingEnv`` cuts them (with a validation
    fraction ``val``, the training split ends where the validation split begins)."""
    parts = study_splits(trace, gpus, holdout, trace_gpu_type, val)
    return parts["train"], parts["eval"]


def add_study_window_arguments(p: argparse.ArgumentParser, count_flag: str = "--windows",
                                count_help: str | None = None) -> None:
    """The options that pick the study's held-out windows, as the benches that replay them share:
    ``--trace``, ``--gpus``, ``--holdout``, the window count (``count_flag``) and ``--window-jobs``."""
    p.add_argument("--trace", default=None, help="KIND:PATH (default philly:$JIGSAW_DATA/philly/philly.csv)")
    p.add_argument("--gpus", type=int, default=64)
    p.add_argument("--holdout", type=float, default=0.2)
    p.add_argument(count_flag, type=int, default=12, help=count_help)
    p.add_argument("--window-jobs", type=int, default=80)


def window_starts(n_jobs: int, window_jobs: int, windows: int) -> list[int]:
    if n_jobs < window_jobs:
        raise ValueError(f"held-out split has {n_jobs} jobs, fewer than --window-jobs {window_jobs}")
    if windows == 1:
        return [0]
    return [i * (n_jobs - window_jobs) // (windows - 1) for i in range(windows)]


def build_windows(held, window_jobs: int, windows: int, gpus: int, load: float | None):
    from agents.rl_env import scale_to_load
    from traces import digest_of, offered_load
    from traces.models import default_throughput_fn, estimated_durations

    out = []
    for i, s in enumerate(window_starts(len(held), window_jobs, windows)):
        w = held.iloc[s:s + window_jobs].copy()
        w["arrival_s"] = w["arrival_s"] - w["arrival_s"].min()
        w = w.reset_index(drop=True)
        if load is not None:
            w = scale_to_load(w, gpus, load)
        off = float(offered_load(w, gpus, estimated_durations(w, default_throughput_fn())))
        out.append((w, {"window": i, "start_in_heldout": int(s), "jobs": int(len(w)),
                        "first_job_id": int(w["job_id"].iloc[0]), "last_job_id": int(w["job_id"].iloc[-1]),
                        "span_h": float(w["arrival_s"].max() / 3600.0), "max_gpus": int(w["num_gpus"].max()),
                        "offered_load": off, "digest": digest_of(w)}))
    return out


# ----------------------------------------------------------------------------------------- training
def train_cmd(a, seed: int, run_dir: Path, timesteps: int, eval_freq: int, eval_episodes: int) -> list[str]:
    wall = ["--max-wall-s", str(a.train_s)] if a.train_s else []
    return [*wall, *shlex.split(a.train_args), "--trace", a.trace, "--gpus", str(a.gpus), "--max-jobs", str(a.max_jobs), "--load", str(a.load),
            "--holdout", str(a.holdout), "--val", str(a.val), "--n-envs", str(a.n_envs), "--timesteps", str(timesteps),
            "--eval-freq", str(eval_freq), "--eval-episodes", str(eval_episodes),
            "--checkpoint-freq", str(max(1, min(timesteps, 16384))), "--seed", str(seed), "--no-progress",
            "--no-tensorboard", "--run-dir", str(run_dir)]


def run_training(args_list: list[str], log: Path, budget_s: float) -> dict:
    """``nice -n 5 python train_agent.py ARGS`` with OMP_NUM_THREADS=1; SIGINT at ``budget_s``."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = ["nice", "-n", "5", sys.executable, str(ROOT / "train_agent.py"), *args_list]
    t0 = time.perf_counter()
    interrupted = False
    with open(log, "w") as f:
        # a job started in the background by a non-interactive shell inherits SIGINT ignored, and Python
        # then never raises KeyboardInterrupt: restore the default so the budget stop saves the model
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        while proc.poll() is None:
            if time.perf_counter() - t0 > budget_s and not interrupted:
                proc.send_signal(signal.SIGINT)   # train_agent saves model.zip on KeyboardInterrupt
                interrupted = True
                try:
                    proc.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    proc.terminate()
            time.sleep(1.0)
    wall = time.perf_counter() - t0
    return {"rc": proc.returncode, "wall_s": wall, "interrupted_at_budget": interrupted}


def run_config(run_dir: Path) -> dict:
    return json.loads((run_dir / "config.json").read_text())


# ----------------------------------------------------------------------------------------- evaluation
def run_task_or_stall(task) -> dict:
    """``run_task``, but a learned policy that stalls (``PolicyStalled``) gives a row saying so
    instead of ending the study: ``avg_jct_s`` NaN and ``stalled`` = the message."""
    from jigsaw_env.evaluate import run_task
    from jigsaw_env.simulator import PolicyStalled

    try:
        return run_task(task)
    except PolicyStalled as e:
        return {"agent": task.agent.label, "seed": task.seed, "avg_jct_s": float("nan"), "wall_s": float("nan"),
                "stalled": str(e)}


def evaluation_setup(gpus: int) -> tuple[dict, object]:
    """(cluster keyword arguments, SimConfig) that ``jigsaw evaluate --gpus GPUS`` gives every agent
    with its defaults: the cluster and simulator settings the study's windows are played on."""
    from jigsaw_env.evaluate import add_arguments, evaluation_cluster

    p = argparse.ArgumentParser()
    add_arguments(p)
    _, cfg, cluster_kwargs = evaluation_cluster(p.parse_args(["--agents", "fifo", "--out", "unused", "--gpus", str(gpus)]))
    return cluster_kwargs, cfg


def evaluate_all(a, windows, runs: dict[str, Path]) -> list[dict]:
    """Every agent on every window via jigsaw_env.evaluate.run_task; returns metric rows."""
    from concurrent.futures import ProcessPoolExecutor
    import multiprocessing as mp

    from jigsaw_env.evaluate import AgentSpec, Task, init_worker

    cluster_kwargs, cfg = evaluation_setup(a.gpus)
    specs = [AgentSpec(h, "heuristic", h, h.startswith("jigsaw") or "spb" in h) for h in HEURISTICS]
    specs += [AgentSpec(lab, "learned", str(Path(d).resolve()), True) for lab, d in runs.items()]
    tmp = tempfile.mkdtemp(prefix="ppo_study_logs_")
    tasks = []
    for spec in specs:
        for w, info in windows:
            tasks.append(Task(spec, info["window"], a.load, None, os.path.join(tmp, spec.label, str(info["window"])),
                              w, cluster_kwargs, cfg, None, info["digest"], info["offered_load"]))
    rows: list[dict] = []
    if a.workers <= 1:
        init_worker(None)
        rows = [run_task_or_stall(t) for t in tasks]
    else:
        with ProcessPoolExecutor(max_workers=a.workers, mp_context=mp.get_context("spawn"),
                                 initializer=init_worker, initargs=(None,)) as ex:
            rows = list(ex.map(run_task_or_stall, tasks))
    import shutil
    shutil.rmtree(tmp, ignore_errors=True)
    return rows


# ----------------------------------------------------------------------------------------- report
def plot(path: Path, jct: dict[str, list[float]], order: list[str]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(next(iter(jct.values())))
    fig, ax = plt.subplots(figsize=(max(7.0, 0.75 * n + 3), 4.2))
    width = 0.8 / len(order)
    x = np.arange(n)
    for i, lab in enumerate(order):
        ax.bar(x - 0.4 + (i + 0.5) * width, jct[lab], width, label=lab)
    ax.set_xticks(x)
    ax.set_xticklabels([f"w{i}" for i in range(n)])
    ax.set_yscale("log")
    ax.set_xlabel("held-out Philly window")
    ax.set_ylabel("mean JCT (h, log scale)")
    ax.set_title("Mean JCT per held-out window (lower is better)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _f(x: float, nd: int = 3) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{x:.{nd}f}"


def _ci(p: dict) -> str:
    return f"{_f(p['mean'])} [{_f(p['lo'])}, {_f(p['hi'])}]"


def write_md(path: Path, res: dict) -> None:
    L: list[str] = []
    s = res["setup"]
    L.append("# PPO study: MaskablePPO vs Tiresias, SRTF and Jigsaw on held-out Philly windows\n")
    L.append(f"Generated by `python -m bench.ppo_study` on {res['created']} ({res['machine']}); "
             f"git {res['git_commit']}.\n")
    L.append("## Setup\n")
    L.append(f"- Trace `{s['trace']}`: {s['trace_jobs']} jobs after loading (GPUs capped at {s['gpus']}); "
             f"training windows from the first {s['train_jobs']} jobs (job ids {s['train_job_ids'][0]}..{s['train_job_ids'][1]}), "
             + (f"validation windows from the next {s['val_jobs']}, " if s.get("val_jobs") else "")
             + f"held-out split = the last {s['heldout_jobs']} (job ids {s['heldout_job_ids'][0]}..{s['heldout_job_ids'][1]}); "
             f"no held-out job is in the training split: {s['disjoint']}.")
    L.append(f"- Cluster: {s['gpus']} GPUs (v100, 8 per node), round 300 s; offered load {s['load']} "
             f"(arrivals scaled per window, as in training).")
    L.append(f"- Training: MaskablePPO, {s['n_envs']} SubprocVecEnv envs, episodes of {s['max_jobs']} consecutive jobs, "
             f"hyper-parameters `{s.get('train_args', '')}` over train_agent's defaults (batch 64, 10 epochs, net 128,128), observation includes "
             f"remaining work (`observe_remaining` = {s['observe_remaining']}: an oracle, as SRTF has).")
    how = []
    if s.get("train_s"):
        how.append(f"learning stops after {s['train_s']:.0f} s of wall time per run (`train_agent.py --max-wall-s`)")
    if s.get("timesteps"):
        how.append(f"or at --timesteps {s['timesteps']}")
    L.append(f"- Wall-clock budget: {' '.join(how) or 'none'}; hard stop (SIGINT) at {s['budget_s']:.0f} s. The "
             f"budget is 30 minutes per run. Runs were sequential, under `nice -n 5`, `OMP_NUM_THREADS=1`, on a machine "
             f"shared with other work (the frames each run got are in the table below).")
    if s.get("val"):
        vg = re.search(r"--val-gpus[ =](\S+)", s.get("train_args") or "")
        on = f"on clusters of {vg.group(1)} GPUs (`--val-gpus`, one drawn per episode)" if vg else f"on {s['gpus']} GPUs"
        which = (f"`ppo-sN` is each run's `best/`: the model with the best return on the validation split "
                 f"(`train_agent.py --val {s['val']}`: the {s['val']:.0%} of the trace's jobs just before the held-out "
                 f"split, which training does not sample; {s.get('eval_episodes', '?')} validation episodes per "
                 f"evaluation {on}; the cloned policy is evaluated before the first update and the final "
                 f"model when learning ends), so no choice is made on held-out "
                 f"jobs; `last-sN` is the same run's final `model.zip`")
    else:
        which = "the final `model.zip` of each run (not `best/`, which is selected on held-out episodes)"
    L.append(f"- Evaluation: {s['windows']} fixed held-out windows of {s['window_jobs']} consecutive jobs at evenly "
             f"spaced offsets of the held-out split (same jobs for every agent and seed); {which}; masked argmax, via "
             f"`jigsaw_env.evaluate.run_task` (what `jigsaw evaluate` runs).")
    for note in s.get("notes", []):
        L.append(f"- {note}")
    L.append("")
    L.append("## Training runs\n")
    L.append("| seed | warm start: expert, transitions (DAgger rounds), accuracy, wall s | PPO timesteps | "
             "selected at timestep | training wall incl. warm start (s) | process wall (s) | stopped at budget |")
    L.append("|---:|---|---:|---:|---:|---:|---|")
    for r in res["training"]:
        w = r.get("warm_start")
        ws = (f"{w['expert']}, {w.get('total_steps') or w.get('steps')} ({w.get('dagger_rounds', 0)}), "
              f"{_f(w.get('final_accuracy'))}, {_f(w.get('wall_s'), 0)}") if w else "none"
        sel = r.get("selected_timesteps")
        L.append(f"| {r['seed']} | {ws} | {r['trained_timesteps']} | {'final' if sel is None else sel} | {_f(r['train_wall_s'], 0)} | {_f(r['process_wall_s'], 0)} | "
                 f"{r['interrupted_at_budget']} |")
    if res.get("imitation_labels"):
        L.append("\n`imit-sN` is seed N's policy right after the imitation warm start (`RUN_DIR/warm_start/`), before "
                 "any PPO update; `ppo-sN` is the same run's model after PPO fine-tuning"
                 + (" selected on the validation split (`best/`; timestep 1 = the clone itself), `last-sN` its final "
                    "model." if res.get("final_labels") else " (its final model)."))
    L.append("")
    L.append("## Mean JCT over the windows (hours)\n")
    agents = res["agent_order"]
    L.append("| agent | " + " | ".join(agents) + " |")
    L.append("|---|" + "---:|" * len(agents))
    L.append("| mean JCT (h) | " + " | ".join(_f(res["mean_jct_h"][x]) for x in agents) + " |")
    L.append("")
    L.append("## Paired differences PPO - reference (hours; mean [95% CI]; negative = PPO better)\n")
    L.append("| PPO | vs | mean PPO | mean ref | diff [95% CI] | rel. | W/L/T windows | verdict |")
    L.append("|---|---|---:|---:|---|---:|---|---|")
    st = res["stats"]
    for lab, per in st["per_seed"].items():
        for r, p in per.items():
            L.append(f"| {lab} | {r} | {_f(p['mean_a'])} | {_f(p['mean_b'])} | {_ci(p)} | {_f(100 * p['rel_diff'], 1)}% | "
                     f"{p['wins']}/{p['losses']}/{p['ties']} | {p['verdict']} |")
    for kind, title in (("window_level", "seeds averaged per window (t over windows)"),
                        ("pooled", "seeds x windows pooled (optimistic)")):
        for r, p in st[kind].items():
            L.append(f"| all seeds: {title} | {r} | {_f(p['mean_a'])} | {_f(p['mean_b'])} | {_ci(p)} | "
                     f"{_f(100 * p['rel_diff'], 1)}% | {p['wins']}/{p['losses']}/{p['ties']} | {p['verdict']} |")
    L.append("")
    L.append("## Per-window mean JCT (hours)\n")
    L.append("| window | first job id | span (h) | max GPUs | " + " | ".join(agents) + " |")
    L.append("|---|---:|---:|---:|" + "---:|" * len(agents))
    for i, info in enumerate(res["windows"]):
        L.append(f"| w{i} | {info['first_job_id']} | {_f(info['span_h'], 1)} | {info['max_gpus']} | "
                 + " | ".join(_f(res["per_window_jct_h"][x][i]) for x in agents) + " |")
    L.append("")
    L.append("![per-window mean JCT](per_window_jct.png)\n")
    L.append("## Conclusion (as measured)\n")
    L.extend(res["conclusion"])
    L.append("")
    L.append("## Commands\n")
    L.append("```bash")
    L.append(res["command"])
    L.append("# which ran, per seed (sequentially):")
    for r in res["training"]:
        L.append(r["command"])
    L.append("```")
    L.append(f"\nTotal wall time of the study: {_f(res['wall_s'], 0)} s (training {_f(res['train_wall_total_s'], 0)} s, "
             f"evaluation {_f(res['eval_wall_s'], 0)} s).")
    path.write_text("\n".join(L) + "\n")


def conclusion(res: dict) -> list[str]:
    st = res["stats"]
    out = []
    ppo = res.get("ppo_labels") or list(st["per_seed"])
    beats = {lab: st["per_seed"][lab]["tiresias"]["verdict"] for lab in ppo if "tiresias" in st["per_seed"][lab]}
    lower = [lab for lab in ppo if "tiresias" in st["per_seed"][lab] and st["per_seed"][lab]["tiresias"]["mean"] < 0]
    out.append(f"- vs Tiresias: PPO has a lower mean JCT on {len(lower)} of {len(beats)} seeds; per seed: "
               + "; ".join(f"{k}: {v}" for k, v in beats.items()) + ".")
    for r in REFS:
        if r in st["window_level"]:
            p = st["window_level"][r]
            out.append(f"- vs {r} (seeds averaged per window): {_ci(p)} h ({_f(100 * p['rel_diff'], 1)}%), {p['verdict']}.")
    stalls = {lab: w for lab, w in res.get("stalled_windows", {}).items() if w}
    if stalls:
        out.append("- Stalled (ran nothing for 1000 rounds while jobs waited; left out of the pairs): "
                   + "; ".join(f"{lab} on windows {w}" for lab, w in stalls.items()) + ".")
    imit = res.get("imitation_labels") or []
    if imit:
        ib = [lab for lab in imit if st["per_seed"][lab]["tiresias"]["mean"] < 0]
        out.append(f"- The imitation warm start alone (RUN_DIR/warm_start, before PPO) has a lower mean JCT than Tiresias "
                   f"on {len(ib)} of {len(imit)} seeds; what PPO fine-tuning changed, per seed (mean JCT, h): "
                   + "; ".join(f"{i} {_f(res['mean_jct_h'][i])} -> {p} {_f(res['mean_jct_h'][p])}"
                               for i, p in zip(imit, [f"ppo-s{lab.split('-s')[1]}" for lab in imit])
                               if p in res["mean_jct_h"]) + ".")
    for ref in ("tiresias", "jigsaw"):
        if ref not in st["window_level"]:
            continue
        beats = all(st["per_seed"][lab][ref]["mean"] < 0 for lab in ppo) and \
            st["window_level"][ref]["hi"] < 0 and not any(stalls.get(lab) for lab in ppo)
        out.append(f"- Beats {ref.capitalize()} on the held-out windows: {'YES' if beats else 'NO'} in this run "
                   f"(criterion: every seed's mean paired difference < 0, the window-level 95% CI entirely below 0, "
                   f"and no stalled window).")
    return out


# ----------------------------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", default=None, help="KIND:PATH (default philly:$JIGSAW_DATA/philly/philly.csv)")
    p.add_argument("--seeds", default="0,1,2", help="training seeds (default 0,1,2)")
    p.add_argument("--gpus", type=int, default=64)
    p.add_argument("--max-jobs", type=int, default=80, help="jobs per training episode (default 80)")
    p.add_argument("--load", type=float, default=1.0, help="offered load of training episodes and windows")
    p.add_argument("--holdout", type=float, default=0.2)
    p.add_argument("--n-envs", type=int, default=2)
    p.add_argument("--train-s", type=float, default=1500.0,
                   help="wall-clock seconds of learning per run (train_agent --max-wall-s; default 1500 = 25 min; "
                        "0 = no limit)")
    p.add_argument("--timesteps", type=int, default=None, help="timesteps per run (default: the wall limit decides)")
    p.add_argument("--train-args", default=DEFAULT_TRAIN_ARGS,
                   help=f"extra `jigsaw train` options (default: {DEFAULT_TRAIN_ARGS!r}: clone Jigsaw's decisions "
                        "with DAgger first, then PPO fine-tunes with small, KL-bounded steps; one round is dozens "
                        "of decision steps and the reward comes at round ends, so the discount reaches far ahead)")
    p.add_argument("--eval-freq", type=int, default=None, help="in-training evaluation every N steps (default 32768)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="hard stop (SIGINT) per run, in case learning overruns (default --train-s + 300)")
    p.add_argument("--val", type=float, default=0.1,
                   help="validation fraction (train_agent --val, default 0.1: the 10%% of the jobs before the held-out "
                        "split); the PPO agent evaluated is then the run's best/ (best validation return, the clone "
                        "included), and its final model is reported beside it; 0 = no validation split, the final model")
    p.add_argument("--eval-episodes", type=int, default=6,
                   help="episodes per in-training evaluation (validation with --val; default 6)")
    p.add_argument("--windows", type=int, default=12, help="held-out evaluation windows (default 12)")
    p.add_argument("--window-jobs", type=int, default=80, help="jobs per evaluation window (default 80)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--reuse", action="store_true", help="skip training of seeds whose run has model.zip")
    p.add_argument("--out", default=str(DEFAULT_OUT))
    p.add_argument("--note", action="append", default=[], help="a line for results.md's setup (repeatable)")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    a = parse_args(argv)
    a.trace = a.trace or _default_trace()
    if a.budget_s is None:
        a.budget_s = (a.train_s or 3600.0) + 300.0
    seeds = [int(s) for s in str(a.seeds).split(",") if s.strip()]
    out = Path(a.out)
    runs_dir = out / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    cmdline = "python -m bench.ppo_study " + " ".join(shlex.quote(x) for x in (argv if argv is not None else sys.argv[1:]))

    # --- splits and windows first (cheap; fails early on a bad trace)
    parts = study_splits(a.trace, a.gpus, a.holdout, val=a.val)
    train_split, held, n_val = parts["train"], parts["eval"], len(parts["val"])
    disjoint = bool(set(train_split["job_id"]).isdisjoint(set(held["job_id"])))
    windows = build_windows(held, a.window_jobs, a.windows, a.gpus, a.load)
    print(f"[ppo_study] split: train {len(train_split)} jobs, held-out {len(held)}; {len(windows)} windows", flush=True)

    # --- how long: a wall-clock limit per run (train_agent --max-wall-s), or a fixed --timesteps
    timesteps = a.timesteps if a.timesteps is not None else 10 ** 9
    eval_freq = a.eval_freq if a.eval_freq is not None else max(256 * a.n_envs, min(timesteps // 3, 32768))

    # --- training
    training = []
    runs: dict[str, Path] = {}
    imitation: dict[str, Path] = {}  # RUN_DIR/warm_start: the cloned policy before PPO (--warm-start runs)
    finals: dict[str, Path] = {}     # with --val: each run's final model, beside the selected one
    t_train = time.perf_counter()
    for seed in seeds:
        rdir = runs_dir / f"seed{seed}"
        lab = f"ppo-s{seed}"
        targs = train_cmd(a, seed, rdir, timesteps, eval_freq, a.eval_episodes)
        shown = "nice -n 5 env OMP_NUM_THREADS=1 jigsaw train " + " ".join(shlex.quote(x) for x in targs)
        if a.reuse and (rdir / "model.zip").is_file():
            r = json.loads((runs_dir / f"seed{seed}.json").read_text()) if (runs_dir / f"seed{seed}.json").is_file() \
                else {"rc": 0, "wall_s": float("nan"), "interrupted_at_budget": False}
        else:
            if rdir.exists():
                import shutil
                shutil.rmtree(rdir)
            print(f"[ppo_study] training seed {seed}: {shown}", flush=True)
            r = run_training(targs, runs_dir / f"seed{seed}.log", a.budget_s)
            (runs_dir / f"seed{seed}.json").write_text(json.dumps(r))
        if not (rdir / "model.zip").is_file():
            ck = sorted((rdir / "checkpoints").glob("rl_model_*_steps.zip"), key=lambda q: int(q.stem.split("_")[2]))
            if ck:   # the budget stop did not save: fall back to the last checkpoint and say so
                import shutil
                steps = int(ck[-1].stem.split("_")[2])
                shutil.copy(ck[-1], rdir / "model.zip")
                shutil.copy(rdir / "checkpoints" / f"rl_model_vecnormalize_{steps}_steps.npz", rdir / "vecnormalize.npz")
                c = run_config(rdir)
                c["trained_timesteps"] = steps
                (rdir / "config.json").write_text(json.dumps(c, indent=1))
                r["fallback_checkpoint"] = ck[-1].name
        if not (rdir / "model.zip").is_file():
            raise SystemExit(f"training seed {seed} left no model.zip (rc {r['rc']}); see {runs_dir / f'seed{seed}.log'}")
        c = run_config(rdir)
        training.append({"seed": seed, "label": lab, "run_dir": os.path.relpath(rdir, out), "command": portable_text(shown),
                         "timesteps_requested": timesteps, "trained_timesteps": int(c.get("trained_timesteps") or 0),
                         "train_wall_s": float(c.get("train_wall_s") or float("nan")), "process_wall_s": r["wall_s"],
                         "rc": r["rc"], "interrupted_at_budget": r["interrupted_at_budget"],
                         "observe_remaining": c["env"].get("observe_remaining"),
                         "fallback_checkpoint": r.get("fallback_checkpoint")})
        ws = c.get("warm_start") or None
        if ws:
            training[-1]["warm_start"] = {k: ws.get(k) for k in ("expert", "steps", "total_steps", "episodes", "wall_s",
                                                                 "final_accuracy", "expert_mean_avg_jct_s")}
            training[-1]["warm_start"]["dagger_rounds"] = len(ws.get("dagger") or [])
        if a.val > 0 and (rdir / "best" / "model.zip").is_file():
            # the agent under test: best/, selected on the validation split (never on held-out jobs)
            runs[lab] = rdir / "best"
            finals[f"last-s{seed}"] = rdir
            bc = run_config(rdir / "best")
            training[-1]["selected_timesteps"] = int(bc.get("trained_timesteps") or 0)
        else:
            runs[lab] = rdir
        if ws and (rdir / "warm_start" / "model.zip").is_file():
            imitation[f"imit-s{seed}"] = rdir / "warm_start"
        print(f"[ppo_study] seed {seed}: {training[-1]['trained_timesteps']} steps in {r['wall_s']:.0f} s", flush=True)
    train_wall_total = time.perf_counter() - t_train

    # --- evaluation
    t_eval = time.perf_counter()
    rows = evaluate_all(a, windows, {**imitation, **finals, **runs})
    eval_wall = time.perf_counter() - t_eval
    order = list(HEURISTICS) + list(imitation) + list(finals) + list(runs)
    per_window: dict[str, list[float]] = {lab: [float("nan")] * len(windows) for lab in order}
    per_window_wall: dict[str, list[float]] = {lab: [float("nan")] * len(windows) for lab in order}
    stalled: dict[str, list[int]] = {lab: [] for lab in order}
    for row in rows:
        per_window[row["agent"]][int(row["seed"])] = float(row["avg_jct_s"]) / 3600.0
        per_window_wall[row["agent"]][int(row["seed"])] = float(row["wall_s"])
        if row.get("stalled"):
            stalled[row["agent"]].append(int(row["seed"]))
            print(f"[ppo_study] {row['agent']} stalled on window {row['seed']}: {row['stalled']}", flush=True)
    stats = study_stats(per_window, list(runs))
    if imitation or finals:  # the clones' and final models' rows, beside PPO's (pooled and window-level stats stay PPO's own)
        si = study_stats(per_window, list(imitation) + list(finals))
        stats["per_seed"] = {**si["per_seed"], **stats["per_seed"]}
        if imitation:
            stats["imitation_window_level"] = study_stats(per_window, list(imitation))["window_level"]

    from jigsaw_env.evaluate import git_commit
    res: dict[str, Any] = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared), python {platform.python_version()}",
        "git_commit": git_commit(),
        "command": portable_text(cmdline),
        "setup": {"trace": portable_text(a.trace), "trace_jobs": int(len(train_split) + n_val + len(held)), "gpus": a.gpus,
                  "holdout": a.holdout, "train_jobs": int(len(train_split)), "val_jobs": int(n_val),
                  "heldout_jobs": int(len(held)),
                  "train_job_ids": [int(train_split["job_id"].iloc[0]), int(train_split["job_id"].iloc[-1])],
                  "heldout_job_ids": [int(held["job_id"].iloc[0]), int(held["job_id"].iloc[-1])],
                  "disjoint": disjoint, "load": a.load, "max_jobs": a.max_jobs, "n_envs": a.n_envs,
                  "timesteps": a.timesteps, "eval_freq": eval_freq, "eval_episodes": a.eval_episodes, "train_s": a.train_s, "train_args": a.train_args, "budget_s": a.budget_s,
                  "observe_remaining": training[0]["observe_remaining"] if training else None,
                  "windows": a.windows, "window_jobs": a.window_jobs, "val": a.val,
                  "model_file": "best/ (selected on the validation split)" if finals else "model.zip (final)",
                  "notes": list(a.note)},
        "training": training,
        "windows": [info for _, info in windows],
        "agent_order": order,
        "per_window_jct_h": per_window,
        "per_window_eval_wall_s": per_window_wall,
        "stalled_windows": stalled,
        "mean_jct_h": {lab: float(np.nanmean(v)) if np.isfinite(v).any() else float("nan")
                       for lab, v in per_window.items()},
        "stats": stats,
        "ppo_labels": list(runs),
        "imitation_labels": list(imitation),
        "final_labels": list(finals),
        "train_wall_total_s": train_wall_total,
        "eval_wall_s": eval_wall,
    }
    res["conclusion"] = conclusion(res)
    res["wall_s"] = time.perf_counter() - t_start
    plot(out / "per_window_jct.png", per_window, order)
    (out / "results.json").write_text(json.dumps(res, indent=1, default=float) + "\n")
    write_md(out / "results.md", res)
    print("\n".join(res["conclusion"]), flush=True)
    print(f"[ppo_study] wrote {out / 'results.json'}, {out / 'results.md'}, {out / 'per_window_jct.png'}", flush=True)
    return res


if __name__ == "__main__":
    main()
