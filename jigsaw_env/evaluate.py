"""``jigsaw evaluate``: every agent on the same jobs and seeds, in parallel, with a report.

    jigsaw evaluate --agents fifo,tiresias,jigsaw,runs/ppo1 --trace synthetic --gpus 64 \\
        --seeds 5 --max-jobs 200 --out results/eval1 [--load 0.5,1.0,1.5] [--eta-sweep 0.7,0.8,0.9,1.0]
        [--backlogged]

An agent is a scheduler name (``jigsaw simulate --list-agents``) or a RUN_DIR written by
``jigsaw train`` (played through :class:`agents.rl.LearnedAgent`, whose spaces must fit the
evaluation: window K, SPB levels and slots, placement menu).

Seeds: seed ``s`` (``--seed`` + 0 .. ``--seeds`` - 1) is one job set shared by every agent: the
synthetic generator's seed, or for a real trace a window of ``--max-jobs`` consecutive jobs at an
offset drawn from ``s`` (the whole trace when it is not longer), with models mapped with seed ``s``.
``--load L1,L2`` repeats everything per offered load (arrivals scaled; metrics.csv has ``load``);
``--eta-sweep v1,v2`` repeats everything with ``eta = v`` for every SPB iteration (level > 0;
level 0 stays 1; metrics.csv has ``eta``, otherwise ``eta = table``: the cost tables' values).

OUT gets metrics.csv (agent, seed, load, eta, efficiency_form and every metric of docs/design.md
section 5), report.html (self-contained: PNGs embedded), metadata.json, and per run
``runs/<agent>/[<condition>/]<seed>/{jobs,rounds,cluster}.csv``. A summary table goes to stdout.
docs/evaluation.md explains the report.

Runs go to ``--workers`` processes, or with ``--ray [ADDRESS]`` each is a Ray task, embedded or on a
cluster (jigsaw_env/ray_sweep.py, docs/scale.md), with the same results.

A run that fails (e.g. a diverged model's NaN logits) does not throw the others away: every run
finishes, the finished ones are written as above, metadata.json lists the failed ones under
``failed_runs`` (agent, seed, load, eta, the error) and report.html shows them at the top; then
the command exits with status 2 and one line naming the failed agents and the first error.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import math
import multiprocessing as mp
import os
import pkgutil
import re
import subprocess
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

import agents
from agents import available_schedulers, make_scheduler
from agents.base import is_import_path, scheduler_class
from agents.rl import EvalSpaces, LearnedAgent, describe, is_run_dir, read_run_config
from agents.rl_env import (SYNTHETIC_SEED_SPLIT, is_synthetic, same_trace_file, scale_to_load, training_job_ids,
                            window_of)
from agents.shipped import is_shipped_name, shipped_policy
from traces import add_trace_arguments, digest_of, load_trace, offered_load, parse_spec
from traces.models import default_throughput_fn, estimated_durations
from traces.synthetic import DEFAULTS, parse_params

from .actions import level_pattern_combos
from .cli import error_line
from .cli_args import positive_int
from .cluster import ClusterSpec
from .cost_table import get_table, register_tables_dir
from .overload import overload_warning, show_progress, warn
from .report import paired_differences, print_summary, summarize, write_report
from .simulate_cli import add_cluster_arguments, build_cluster_and_config, check_out_dir
from .simulator import Simulator
from .spb import SPBConfig, eta_for

LEAD_COLUMNS = ["agent", "seed", "load", "eta", "efficiency_form"]
EXTRA_COLUMNS = ["offered_load", "trace_digest"]
TIMING_KEYS = ("agent", "seed", "load", "eta", "run_dir")   # timings.csv: these and each run's wall_s


# ----------------------------------------------------------------------------------------------- parsing
def _float_list(flag: str, lo: float = 0.0, hi: float = math.inf, hi_inclusive: bool = True):
    def parse(text: str) -> list[float]:
        try:
            vals = [float(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be a comma-separated list of numbers, got {text!r}") from None
        if not vals:
            raise argparse.ArgumentTypeError(f"{flag} needs at least one value")
        for v in vals:
            if not (v > lo and (v <= hi if hi_inclusive else v < hi)):
                raise argparse.ArgumentTypeError(f"{flag} values must be in ({lo:g}, {hi:g}], got {v:g}")
        if len(set(vals)) != len(vals):
            raise argparse.ArgumentTypeError(f"{flag} has repeated values: {text!r}")
        return vals
    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--agents", required=True, metavar="A[,A...]",
                   help="comma-separated scheduler names and/or RUN_DIRs of trained agents")
    p.add_argument("--seeds", type=positive_int("--seeds"), default=3,
                   help="job sets (seeds --seed .. --seed+N-1), shared by every agent (default 3)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--load", type=_float_list("--load"), default=None, metavar="X[,X...]",
                   help="offered load(s); several values give JCT-vs-load curves (synthetic default 1.0)")
    p.add_argument("--eta-sweep", type=_float_list("--eta-sweep", 0.0, 1.0), default=None, metavar="V[,V...]",
                   help="repeat with eta = V for every SPB iteration (level 0 stays 1), e.g. 0.7,0.8,0.9,1.0")
    p.add_argument("--workers", type=positive_int("--workers"), default=max(1, min(2, os.cpu_count() or 1)),
                   help="parallel processes (default min(2, CPUs)); with --ray alone, the embedded Ray's CPUs")
    p.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   help="run each run as a Ray task: --ray alone in an embedded Ray, --ray auto on the cluster "
                        "started on this machine, --ray HOST:PORT on that cluster (docs/scale.md)")
    p.add_argument("--window-k", type=positive_int("--window-k"), default=None,
                   help="window K learned agents must have (default: each RUN_DIR's own)")
    p.add_argument("--spb-levels", type=int, default=3, help="deepest SPB level L of the cluster (default 3)")
    p.add_argument("--spb-slots", type=positive_int("--spb-slots"), default=4, help="start slots per level (default 4)")
    p.add_argument("--heldout", action="store_true",
                   help="draw the job sets only from jobs no learned agent among --agents trained on (a real "
                        "trace: their training splits' jobs are removed before windows are drawn; synthetic: "
                        "generator seeds from the held-out range)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on stderr (default: on when stderr is a terminal, off with --json piped)")
    p.add_argument("--baseline", default=None, metavar="AGENT",
                   help="report every other agent's per-seed paired difference from AGENT (one of --agents): "
                        "mean JCT, saturated and cluster efficiency, with 95%% CIs (paired.csv, report, --json)")
    p.add_argument("--json", action="store_true",
                   help="print a JSON summary on stdout (per agent means and CIs; paired differences with --baseline)")
    add_trace_arguments(p)
    add_cluster_arguments(p)


def register(subparsers) -> None:
    p = subparsers.add_parser("evaluate", help="run agents on the same jobs and seeds; metrics.csv and report.html",
                              description=__doc__.split("\n\n")[0])
    add_arguments(p)
    p.set_defaults(func=run)


# ----------------------------------------------------------------------------------------------- agents
@dataclass(frozen=True)
class AgentSpec:
    label: str              # name in metrics.csv and the report
    kind: str               # "heuristic" or "learned"
    ref: str                # scheduler name or RUN_DIR (absolute)
    spb_aware: bool


def _import_schedulers() -> list[str]:
    """Import every scheduler module of ``agents`` (so each registers itself); returns the ones
    that failed to import, as "module: error"."""
    failed = []
    for m in pkgutil.iter_modules(agents.__path__):
        if m.name.startswith("rl") or m.name in ("base", "common", "export"):
            continue
        try:
            importlib.import_module(f"agents.{m.name}")
        except Exception as e:  # noqa: BLE001 -- a broken module must not hide the others
            failed.append(f"agents.{m.name}: {type(e).__name__}: {e}")
    return failed


def parse_agents(text: str) -> list[AgentSpec]:
    """Scheduler names and RUN_DIRs -> AgentSpecs; ValueError (one line) for anything else."""
    failed = _import_schedulers()
    names = available_schedulers()
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise ValueError(f"--agents is empty; expected scheduler names (one of {names}) and/or RUN_DIRs")
    out: list[AgentSpec] = []
    labels: set[str] = set()
    for it in items:
        if is_shipped_name(it) and (folder := shipped_policy(it)) is not None:  # a policy shipped in the package
            label, spec = it, AgentSpec(it, "learned", str(folder), True)
        elif it in names or is_import_path(it):
            scheduler_class(it)  # a plug-in that does not load: one line saying why
            label, spec = it, AgentSpec(it, "heuristic", it, "spb" in it or it.startswith("jigsaw"))
        elif is_run_dir(it):
            base = re.sub(r"[^A-Za-z0-9_.+-]", "_", Path(it).resolve().name) or "run"
            label = base if base not in names else f"{base}-rl"
            spec = AgentSpec(label, "learned", str(Path(it).resolve()), True)
        elif Path(it).is_dir():
            raise ValueError(f"agent {it!r} is a folder but not a training run: expected config.json, model.zip and "
                             f"vecnormalize.npz written by `jigsaw train`")
        else:
            extra = f" (modules that failed to import: {'; '.join(failed)})" if failed else ""
            raise ValueError(f"unknown agent {it!r}; expected a scheduler name (one of {names}) or a RUN_DIR "
                             f"written by `jigsaw train` (or a plug-in module.path:ClassName){extra}")
        k = 2
        while spec.label in labels:
            spec = replace(spec, label=f"{label}-{k}")
            k += 1
        labels.add(spec.label)
        out.append(spec)
    return out


# ----------------------------------------------------------------------------------------------- job sets
def training_splits(args, specs: list[AgentSpec]) -> dict[str, frozenset[int]]:
    """For each learned agent trained on the very trace file being evaluated: the job ids of its
    training split (``agents.rl_env.training_job_ids``)."""
    out: dict[str, frozenset[int]] = {}
    for s in specs:
        if s.kind != "learned":
            continue
        cfg = read_run_config(s.ref)
        if not same_trace_file(str(cfg["env"].get("trace")), args.trace or "synthetic"):
            continue
        ids = training_job_ids(cfg)
        if ids is not None:
            out[s.label] = ids
    return out


def training_overlap(trained_on: dict[str, frozenset[int]], job_sets: list[pd.DataFrame]) -> dict[str, dict]:
    """Per learned agent: how many evaluation jobs (over every job set) it trained on."""
    out = {}
    for label, ids in trained_on.items():
        n = sum(int(j["job_id"].isin(ids).sum()) for j in job_sets)
        out[label] = {"jobs": n, "of": int(sum(len(j) for j in job_sets))}
    return out



def _nominal_load(args, load: float | None) -> float | None:
    if load is not None:
        return float(load)
    kind, rest = parse_spec(args.trace or "synthetic")
    if kind == "synthetic":
        return float(parse_params(rest).get("load", DEFAULTS["load"]))
    return None


def job_set(args, cluster_gpus: int, seed: int, load: float | None,
            exclude_ids: frozenset[int] | None = None) -> tuple[pd.DataFrame, dict]:
    """The jobs of one (seed, load): see the module docstring. Returns (jobs, info).
    ``exclude_ids``: job ids removed from a real trace before the window is drawn (``--heldout``)."""
    spec = args.trace or "synthetic"
    kind, _ = parse_spec(spec)
    common = dict(cluster_gpus=cluster_gpus, gpu_type=getattr(args, "trace_gpu_type", None),
                  window=getattr(args, "window", None), vc=getattr(args, "vc", None),
                  status=getattr(args, "status", None), max_gpus=getattr(args, "max_gpus_per_job", None),
                  sample=getattr(args, "sample", None), seed=seed, skip_bad_rows=bool(getattr(args, "skip_bad_rows", False)))
    if kind == "synthetic":
        jobs = load_trace(spec, load_scale=load, max_jobs=args.max_jobs, **common).jobs
    else:
        jobs = load_trace(spec, **common).jobs
        if exclude_ids:
            jobs = jobs[~jobs["job_id"].isin(exclude_ids)].reset_index(drop=True)
        if args.max_jobs is not None:
            jobs = window_of(jobs, args.max_jobs, np.random.default_rng(np.random.SeedSequence([seed, 0x77696E])))
        if load is not None and len(jobs):
            if len(jobs) > 1 and jobs["arrival_s"].nunique() == 1:
                # scale_to_load leaves such a window as it is (an episode may be one burst);
                # an evaluation that reports a load must have it
                raise ValueError(f"trace {spec!r}, seed {seed}: cannot scale to load {load:g}: all "
                                 f"{len(jobs)} kept jobs arrive at the same time (drop --load, or evaluate "
                                 f"with --backlogged)")
            jobs = scale_to_load(jobs, cluster_gpus, load)
    if len(jobs) == 0:
        why = " and after removing the learned agents' training jobs (--heldout)" if exclude_ids else ""
        raise ValueError(f"trace {spec!r} has no jobs (seed {seed}, after filters{why}); expected at least one job "
                         f"to evaluate")
    jobs = jobs.reset_index(drop=True)
    try:
        off = float(offered_load(jobs, cluster_gpus, estimated_durations(jobs, default_throughput_fn())))
    except Exception:  # noqa: BLE001 -- informative only
        off = float("nan")
    return jobs, {"digest": digest_of(jobs), "offered_load": off, "jobs": int(len(jobs)),
                  "first_job_id": int(jobs["job_id"].iloc[0]), "span_s": float(jobs["arrival_s"].max())}


def _warn_overload(sets: dict, gpus: int, args) -> None:
    """One stderr line per offered load whose job set (first seed) is far above 1 (jigsaw_env/overload.py)."""
    seen: set = set()
    for (load, _seed), (jobs, info) in sets.items():
        if load in seen or len(jobs) == 0:
            continue
        seen.add(load)
        span = float(jobs["arrival_s"].max() - jobs["arrival_s"].min())
        warn(overload_warning(info["offered_load"], gpus, len(jobs), span,
                              f"--load {load:g}" if load is not None else ""), args)


# ----------------------------------------------------------------------------------------------- one run
@dataclass(frozen=True)
class Task:
    agent: AgentSpec
    seed: int
    load: float | None
    eta: float | None
    out_dir: str
    jobs: pd.DataFrame
    cluster_kwargs: dict
    sim_config: Any
    tables: str | None
    trace_digest: str
    offered_load: float


_WORKER_CACHE: dict = {}


def keep_learned_agent(ref: str, agent) -> None:
    """Make ``agent`` the learned agent :func:`run_task` plays for run folder ``ref`` in this
    process (a Ray worker installs the run folders it was sent this way)."""
    _WORKER_CACHE[("learned", ref)] = agent


def init_worker(tables: str | None) -> None:
    """Prepare a process that runs tasks: one thread per process (OpenMP, MKL, torch), the cost
    tables folder ``tables`` registered (if given), and the schedulers imported."""
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)
    if tables:
        register_tables_dir(tables)
    _import_schedulers()


def run_task(task: Task) -> dict:
    """Run one (agent, seed, load, eta); write its logs; return its metrics row."""
    if task.tables and ("tables", task.tables) not in _WORKER_CACHE:
        init_worker(task.tables)
        _WORKER_CACHE[("tables", task.tables)] = True
    t0 = time.perf_counter()
    cluster = ClusterSpec.from_gpus(**task.cluster_kwargs)
    if task.agent.kind == "heuristic":
        if task.agent.ref not in _list_schedulers():
            _import_schedulers()
        sched = make_scheduler(task.agent.ref)
        sched.reset()
        sim = Simulator(cluster, task.jobs, task.sim_config)
        sim.run(sched)
    else:
        agent = _WORKER_CACHE.get(("learned", task.agent.ref))
        if agent is None:
            agent = _WORKER_CACHE[("learned", task.agent.ref)] = LearnedAgent(task.agent.ref, name=task.agent.label)
        env = agent.make_env(cluster_kwargs=task.cluster_kwargs, sim_config=task.sim_config)
        sim = agent.play(env, task.jobs, seed=task.seed)
    m = sim.metrics()
    m["wall_s"] = time.perf_counter() - t0
    sim.write_logs(task.out_dir)
    row: dict[str, Any] = {"agent": task.agent.label, "seed": task.seed,
                           "load": task.load if task.load is not None else float("nan"),
                           "eta": "table" if task.eta is None else f"{task.eta:g}",
                           "efficiency_form": m.get("efficiency_form")}
    for k, v in m.items():
        if k == "efficiency_form":
            continue
        if isinstance(v, dict):
            if k == "jct_by_gpus_s":
                for n, x in v.items():
                    row[f"jct_gpus_{n}_s"] = x
            continue
        row[k] = v
    row["offered_load"] = task.offered_load
    row["trace_digest"] = task.trace_digest
    return row


def _list_schedulers() -> list[str]:
    return available_schedulers()


def _cond_name(load: float | None, eta: float | None, multi_load: bool, multi_eta: bool) -> str:
    parts = []
    if multi_load:
        parts.append(f"load{load:g}")
    if multi_eta:
        parts.append(f"eta{eta:g}")
    return "-".join(parts)


def metrics_frame(rows: list[dict], agent_order: list[str]) -> pd.DataFrame:
    """Rows -> metrics.csv frame: lead columns, the metrics in Simulator.metrics() order, then
    jct_gpus_<n>_s sorted by n, then extras."""
    df = pd.DataFrame(rows)
    size_cols = sorted([c for c in df.columns if re.fullmatch(r"jct_gpus_\d+_s", c)], key=lambda c: int(c.split("_")[2]))
    tail = EXTRA_COLUMNS + ["run_dir"]
    mid = [c for c in df.columns if c not in LEAD_COLUMNS and c not in size_cols and c not in tail]
    df = df[LEAD_COLUMNS + mid + size_cols + [c for c in tail if c in df.columns]]
    order = {a: i for i, a in enumerate(agent_order)}
    df["_o"] = df["agent"].map(order)
    df["_l"] = pd.to_numeric(df["load"], errors="coerce")
    df = df.sort_values(["_o", "_l", "eta", "seed"], kind="stable").drop(columns=["_o", "_l"]).reset_index(drop=True)
    return df


# ----------------------------------------------------------------------------------------------- metadata
def _versions() -> dict[str, str]:
    out = {}
    for pkg in ("jigsaw", "numpy", "pandas", "scipy", "torch", "gymnasium", "stable-baselines3", "sb3-contrib",
                "matplotlib"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def git_commit() -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        if r.returncode != 0 or not r.stdout.strip():
            return "unknown"
        commit = r.stdout.strip()
        d = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True,
                           text=True, timeout=10)
        return commit + (" (with uncommitted changes)" if d.returncode == 0 and d.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def eta_table(jobs_sets: list[pd.DataFrame], cluster, spb) -> tuple[dict, dict]:
    """eta per model and level/pattern (min..max over the job sizes present) and its source."""
    values: dict[str, dict[str, list[float]]] = {}
    sources: dict[str, str] = {}
    shapes = pd.concat([j[["model", "batch_size", "num_gpus"]] for j in jobs_sets]).drop_duplicates()
    gtype = cluster.main_gpu_type
    for (model, bs), grp in shapes.groupby(["model", "batch_size"]):
        table = get_table(str(model), int(bs), gtype, nearest=True)
        measured = table.meta.get("eta", {}) if isinstance(table.meta, dict) else {}
        per: dict[str, list[float]] = {}
        kinds = set()
        for level, pattern in level_pattern_combos(spb):
            if level == 0:
                continue
            key = f"{level}/{pattern.value}"
            slots = spb.start_slots(level, table.num_groups)
            vals = [eta_for(table, level, pattern, spb, slots, int(w)) for w in sorted(grp["num_gpus"].unique())]
            per[key] = [round(min(vals), 4), round(max(vals), 4)]
            kinds.add("measured" if key in measured else "prior")
        values[f"{model}-bs{int(bs)}"] = per
        sources[f"{model}-bs{int(bs)}"] = ("measured (cost table meta.eta)" if kinds == {"measured"} else
                                           f"assumed prior eta = 1 - {spb.eta_prior_slope:g} x mean skipped fraction "
                                           f"(docs/spb_model.md eq. E1)" if kinds == {"prior"} else
                                           "measured where the cost table has meta.eta, else the prior eq. E1")
    return values, sources


def table_digests(jobs_sets: list[pd.DataFrame], cluster) -> dict[str, str]:
    out = {}
    shapes = pd.concat([j[["model", "batch_size"]] for j in jobs_sets]).drop_duplicates()
    for model, bs in shapes.itertuples(index=False):
        for t in sorted(set(cluster.gpu_types)):
            out[f"{model}-bs{int(bs)}-{t}"] = get_table(str(model), int(bs), t, nearest=True).digest()
    return dict(sorted(out.items()))


# ----------------------------------------------------------------------------------------------- main
def evaluation_cluster(args) -> tuple[Any, Any, dict]:
    """(ClusterSpec, SimConfig, the cluster's keyword arguments for ``ClusterSpec.from_gpus`` in a
    worker) of an evaluation from its parsed arguments: every agent runs on these."""
    cluster, cfg = build_cluster_and_config(args)
    cfg = replace(cfg, spb=SPBConfig(max_level=args.spb_levels, num_slots=args.spb_slots))
    cluster_kwargs = dict(num_gpus=args.gpus, gpus_per_node=args.gpus_per_node, gpu_type=args.gpu_type,
                          gpu_memory_gib=args.gpu_memory_gib)
    return cluster, cfg, cluster_kwargs


@dataclass
class _Plan:
    """What an evaluation runs, worked out from its arguments before anything is written."""
    specs: list            # AgentSpec per --agents entry
    baseline: str | None
    cluster: Any           # ClusterSpec
    base_cfg: Any          # SimConfig
    cluster_kwargs: dict
    tables: str | None     # --tables, resolved
    learned: dict          # label -> rl.describe() of each learned agent
    loads: list
    etas: list
    seeds: list[int]
    heldout: bool
    exclude: frozenset | None   # training jobs left out under --heldout
    syn_offset: int
    sets: dict             # (load, seed) -> (jobs frame, job set info)
    overlap: dict          # learned label -> training_overlap()


def evaluate(args) -> tuple[pd.DataFrame, dict, Path]:
    """Run the whole evaluation; returns (metrics frame, metadata, out dir)."""
    t_start = time.perf_counter()
    check_out_dir(args.out)
    if getattr(args, "ray", None) not in (None, "local"):
        from jigsaw_executor.cluster_ray import probe_address
        probe_address(args.ray)  # an address nobody answers: one line now, before anything is written
    plan = _plan(args)
    ray_owned = False
    if getattr(args, "ray", None) is not None:  # connected before anything is written
        from jigsaw_executor.cluster_ray import connect
        ray_owned = connect(args.ray, num_cpus=args.workers)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tasks = _tasks(args, plan, out)
    if not args.backlogged:
        _warn_overload(plan.sets, plan.cluster.num_gpus, args)
    ray_info = None
    if getattr(args, "ray", None) is not None:
        from .ray_sweep import rerun_note, run_on_ray  # here: ray_sweep imports this module (cycle)
        results, ray_info = run_on_ray(tasks, plan.cluster, args.ray, ray_owned, show_progress(args))
        note = rerun_note(ray_info)
        if note:
            print(f"jigsaw evaluate: note: {note}", file=sys.stderr)
    else:
        results = _run_tasks(tasks, args.workers, show_progress(args))
    rows, failures = [], []
    for res, t in zip(results, tasks):
        if isinstance(res, RunFailure):
            failures.append(res)
            continue
        res["run_dir"] = os.path.relpath(t.out_dir, out)
        rows.append(res)
    # the runs that finished are written whatever happened to the others (a failed run is listed
    # in metadata.json "failed_runs" and at the top of report.html)
    df, paired = _write_tables(out, rows, plan)
    meta = _metadata(args, plan, ray_info, tasks, rows, failures)
    meta["wall_s"] = time.perf_counter() - t_start
    if paired is not None:
        meta["paired"] = {"baseline": plan.baseline, "file": "paired.csv",
                          "rows": json.loads(paired.to_json(orient="records"))}
    (out / "metadata.json").write_text(json.dumps(meta, indent=1, default=str) + "\n")
    if rows:
        write_report(out, df, meta, plan.specs)  # failed runs first (meta["failed_runs"])
    meta["wall_s"] = time.perf_counter() - t_start
    (out / "metadata.json").write_text(json.dumps(meta, indent=1, default=str) + "\n")
    if failures:
        raise RunsFailed(df, meta, out, failures, len(tasks))
    return df, meta, out


def _plan(args) -> _Plan:
    """Check the arguments, read the agents and build every job set (each checked by the
    simulator once, before any worker starts)."""
    tables = str(Path(args.tables).resolve()) if args.tables else None
    if tables:
        register_tables_dir(tables)
    specs = parse_agents(args.agents)
    baseline = getattr(args, "baseline", None)
    if baseline is not None and baseline not in [sp.label for sp in specs]:
        raise ValueError(f"--baseline {baseline!r} is not one of --agents ({', '.join(sp.label for sp in specs)})")
    if args.spb_levels < 0:
        raise ValueError(f"--spb-levels must be >= 0, got {args.spb_levels}")
    cluster, base_cfg, cluster_kwargs = evaluation_cluster(args)
    learned = {}
    for s in specs:
        if s.kind == "learned":
            agent = LearnedAgent(s.ref, name=s.label)
            agent.check_compatible(EvalSpaces(args.window_k, args.spb_levels, args.spb_slots))
            learned[s.label] = describe(agent)
    loads: list[float | None] = list(args.load) if args.load else [None]
    seeds = [int(args.seed or 0) + i for i in range(args.seeds)]
    trained_on = training_splits(args, specs)
    heldout = bool(getattr(args, "heldout", False))
    if heldout and not any(s.kind == "learned" for s in specs):
        raise ValueError("--heldout needs at least one RUN_DIR among --agents (it removes what they trained on)")
    exclude = frozenset().union(*trained_on.values()) if heldout and trained_on else None
    syn_offset = SYNTHETIC_SEED_SPLIT if heldout and is_synthetic(args.trace or "synthetic") else 0
    sets = {(load, seed): job_set(args, cluster.num_gpus, syn_offset + seed, load, exclude)
            for load in loads for seed in seeds}
    overlap = training_overlap(trained_on, [j for j, _ in sets.values()])
    for label, o in overlap.items():
        if o["jobs"]:
            print(f"jigsaw evaluate: warning: {o['jobs']} of the {o['of']} evaluation jobs are in the training split "
                  f"of {label}; pass --heldout to evaluate on jobs it never saw", file=sys.stderr)
    for jobs, _ in sets.values():
        Simulator(cluster, jobs, base_cfg)
    return _Plan(specs, baseline, cluster, base_cfg, cluster_kwargs, tables, learned, loads,
                 list(args.eta_sweep) if args.eta_sweep else [None], seeds, heldout, exclude, syn_offset, sets, overlap)


def _tasks(args, plan: _Plan, out: Path) -> list[Task]:
    """One task per (agent, load, eta, seed), each with its own run folder under ``out/runs``."""
    multi_load, multi_eta = len(plan.loads) > 1, args.eta_sweep is not None
    tasks = []
    for spec in plan.specs:
        for load in plan.loads:
            for eta in plan.etas:
                cfg = replace(plan.base_cfg, eta_override=eta)
                cond = _cond_name(load, eta, multi_load, multi_eta)
                for seed in plan.seeds:
                    jobs, info = plan.sets[(load, seed)]
                    d = out / "runs" / spec.label / cond / str(seed) if cond else out / "runs" / spec.label / str(seed)
                    tasks.append(Task(spec, seed, _nominal_load(args, load), eta, str(d), jobs, plan.cluster_kwargs,
                                      cfg, plan.tables, info["digest"], info["offered_load"]))
    return tasks


def _write_tables(out: Path, rows: list[dict], plan: _Plan) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """metrics.csv, timings.csv (each run's wall time, kept out of the metrics) and, with a
    baseline, paired.csv; returns the metrics frame and the paired differences."""
    wall_by_run = {r["run_dir"]: r.pop("wall_s") for r in rows}
    df = metrics_frame(rows, [s.label for s in plan.specs]) if rows else pd.DataFrame(columns=LEAD_COLUMNS + ["run_dir"])
    df.to_csv(out / "metrics.csv", index=False)
    df[list(TIMING_KEYS)].assign(wall_s=df["run_dir"].map(wall_by_run)).to_csv(out / "timings.csv", index=False)
    paired = None
    if plan.baseline is not None and rows:
        paired = paired_differences(df, plan.baseline)
        paired.to_csv(out / "paired.csv", index=False)
    return df, paired


def _metadata(args, plan: _Plan, ray_info, tasks, rows, failures) -> dict:
    """metadata.json: the command, versions, agents, job sets, loads, efficiency form, eta
    source, cost tables, cluster and simulator settings, and which runs finished."""
    sets, cluster = plan.sets, plan.cluster
    job_frames = [j for j, _ in sets.values()]
    eta_vals, eta_src = eta_table(job_frames, cluster, plan.base_cfg.spb)
    combined = hashlib.sha256("".join(i["digest"] for _, i in sets.values()).encode()).hexdigest()[:16]
    nominal = sorted({_nominal_load(args, ld) for ld in plan.loads}, key=lambda x: (x is None, x or 0))
    synthetic = is_synthetic(args.trace or "synthetic")
    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": "jigsaw evaluate " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["evaluate"] else " ".join(sys.argv),
        "git_commit": git_commit(),
        "versions": _versions(),
        "agents": [asdict(s) for s in plan.specs],
        "learned_agents": plan.learned,
        "trace": {"spec": args.trace, "digest": combined,
                  "job_sets": [{"load": ld, "seed": s, **i} for (ld, s), (_, i) in sets.items()],
                  "max_jobs": args.max_jobs, "selection": ("synthetic generator seed = seed" if synthetic
                                                           else "window of --max-jobs consecutive jobs at an offset drawn from the seed")},
        "seeds": plan.seeds,
        "heldout": {"on": plan.heldout, "synthetic_seed_offset": plan.syn_offset,
                    "excluded_training_jobs": len(plan.exclude) if plan.exclude else 0,
                    "training_overlap": plan.overlap},
        "load": {"values": nominal,
                 "meaning": ("backlogged: every job submitted at t = 0 (the load only shapes the job set)" if args.backlogged
                             else "offered load = sum(num_gpus x duration_s) / (GPUs x arrival span) (traces.offered_load)"),
                 "measured_offered_load": {f"{ld}/{s}": i["offered_load"] for (ld, s), (_, i) in sets.items()}},
        "efficiency_form": {"form": "backlogged" if args.backlogged else "trace-window",
                            "definition": ("useful GPU-seconds / (GPUs x makespan); every job at t = 0 (docs/design.md 5a)"
                                           if args.backlogged else
                                           "useful GPU-seconds done by the last arrival / (GPUs x (last - first arrival)) (docs/design.md 5b)")},
        "eta": {"values": [("table" if e is None else e) for e in plan.etas],
                "source": ("cost tables: " + "; ".join(f"{k}: {v}" for k, v in eta_src.items())) if args.eta_sweep is None
                          else ("--eta-sweep: eta_override = v for every SPB iteration (level > 0) in the simulation; "
                                "level 0 is 1; schedulers and observations see the cost tables' values"),
                "table_values": eta_vals, "table_sources": eta_src},
        "cost_tables": table_digests(job_frames, cluster),
        "tables_dir": plan.tables,
        "cluster": {**plan.cluster_kwargs, "gpu_memory_bytes": {k: int(v) for k, v in cluster.gpu_memory_bytes.items()}},
        "sim_config": {k: (asdict(v) if hasattr(v, "__dataclass_fields__") else v) for k, v in asdict(plan.base_cfg).items()},
        "workers": args.workers,
        **({"ray": ray_info} if ray_info is not None else {}),
        "runs": {"total": len(tasks), "finished": len(rows), "failed": len(failures)},
        "failed_runs": [asdict(f) for f in failures],
    }


# ----------------------------------------------------------------------------------------------- failed runs
@dataclass(frozen=True)
class RunFailure:
    """One (agent, seed, load, eta) run that raised: what metadata.json "failed_runs" lists."""
    agent: str
    ref: str              # scheduler name or RUN_DIR
    seed: int
    load: float | None
    eta: float | None
    error: str            # one line: "agent A (RUN_DIR), seed S: what went wrong"
    error_type: str
    traceback: str | None  # for an unexpected exception (a bug), not for a user error


class RunsFailed(ValueError):
    """Some runs of an evaluation failed; the others are written (metrics.csv, metadata.json,
    report.html). ``str()`` is one line naming the failed agents and the first error."""

    def __init__(self, frame: pd.DataFrame, meta: dict, out: Path, failures: list[RunFailure], total: int):
        self.frame, self.meta, self.out, self.failures, self.total = frame, meta, out, failures, total
        agents = list(dict.fromkeys(f.agent for f in failures))
        done = total - len(failures)
        where = (f"the {done} finished run{'s are' if done != 1 else ' is'} written to {out} (metrics.csv, report.html; "
                 f"metadata.json lists every failed run)" if done else
                 f"no run finished; {out}/metadata.json lists every failed run")
        first = "first: " if len(failures) > 1 else ""
        super().__init__(f"{len(failures)} of {total} runs failed (agent{'s' if len(agents) > 1 else ''} "
                         f"{', '.join(agents)}); {first}{failures[0].error}; {where}")


def run_failure(task: Task, e: BaseException, show_load: bool = False) -> RunFailure:
    """The failure of ``task``: its error as one line that names the agent and the seed (and the
    load when ``show_load``, the eta when it is swept)."""
    who = f"agent {task.agent.label}" + (f" ({task.agent.ref})" if task.agent.kind == "learned" else "")
    line = error_line(e)
    if line.startswith(who + ":"):  # LearnedAgent names itself the same way
        line = line[len(who) + 1:].strip()
    user_error = isinstance(e, (ValueError, OSError))
    if not user_error:
        line = f"{type(e).__name__}: {line}"
    where = f"{who}, seed {task.seed}"
    if show_load and task.load is not None:
        where += f", load {task.load:g}"
    if task.eta is not None:
        where += f", eta {task.eta:g}"
    tb = None
    if not user_error:
        tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        cause = e.__cause__  # a worker's traceback (concurrent.futures' _RemoteTraceback)
        if cause is not None and type(cause).__name__ == "_RemoteTraceback":
            tb = str(cause) + "\n" + tb
    return RunFailure(task.agent.label, task.agent.ref, task.seed, task.load, task.eta, f"{where}: {line}",
                      type(e).__name__, tb)


def _run_tasks(tasks: list[Task], workers: int, progress: bool) -> list[dict | RunFailure]:
    """Every task's metrics row, or its :class:`RunFailure` when it raised (the other tasks go
    on: one agent's failure does not throw away the others' runs)."""
    bar = tqdm(total=len(tasks), unit="run", desc="evaluating", disable=not progress, file=sys.stderr)
    rows: list[dict | RunFailure | None] = [None] * len(tasks)
    show_load = len({t.load for t in tasks}) > 1
    try:
        if workers <= 1 or len(tasks) == 1:
            init_worker(tasks[0].tables if tasks else None)
            for i, t in enumerate(tasks):
                try:
                    rows[i] = run_task(t)
                except Exception as e:  # noqa: BLE001 -- recorded, named, and raised after the others
                    rows[i] = run_failure(t, e, show_load)
                bar.update(1)
        else:
            tables = tasks[0].tables if tasks else None
            with ProcessPoolExecutor(max_workers=min(workers, len(tasks)), mp_context=mp.get_context("spawn"),
                                     initializer=init_worker, initargs=(tables,)) as ex:
                futs = {ex.submit(run_task, t): i for i, t in enumerate(tasks)}
                try:
                    for f in as_completed(futs):
                        try:
                            rows[futs[f]] = f.result()
                        except Exception as e:  # noqa: BLE001 -- a worker's error (or a broken pool)
                            rows[futs[f]] = run_failure(tasks[futs[f]], e, show_load)
                        bar.update(1)
                except BaseException:
                    for f in futs:
                        f.cancel()
                    raise
    finally:
        bar.close()
    return rows  # type: ignore[return-value]


def run(args) -> int:
    try:
        df, meta, out = evaluate(args)
    except RunsFailed as e:  # the finished runs are written: show them, then the one-line error
        if len(e.frame):
            print_summary(e.frame, e.meta)
            print(f"wrote {e.out / 'metrics.csv'}, {e.out / 'report.html'}, {e.out / 'metadata.json'} "
                  f"({e.total - len(e.failures)} of {e.total} runs)")
        raise
    if getattr(args, "json", False):
        print(json.dumps(json_summary(df, meta, out), indent=1))
        return 0
    print_summary(df, meta)
    print(f"wrote {out / 'metrics.csv'}, {out / 'report.html'}, {out / 'metadata.json'}")
    return 0


def json_summary(df: pd.DataFrame, meta: dict, out: Path) -> dict:
    """What ``--json`` prints: per agent (and load, eta) the mean and 95% CI half-width of each
    summary metric over seeds (null where undefined: one seed), and the paired differences."""
    summary = json.loads(summarize(df).to_json(orient="records"))
    return {"out": str(out), "efficiency_form": meta["efficiency_form"]["form"], "seeds": meta["seeds"],
            "summary": summary, "paired": meta.get("paired")}
