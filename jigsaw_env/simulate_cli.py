"""``jigsaw simulate``: one full episode of a scheduler on a trace, with metrics and logs."""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from agents import available_schedulers, make_scheduler
from traces import add_trace_arguments, offered_load, trace_from_args
from traces.models import default_throughput_fn, estimated_durations

from .cli_args import file_above, non_negative_float, positive_float, positive_int
from .cluster import ClusterSpec
from .cost_table import register_tables_dir
from .free_running import DEFAULT_PACE, PACES
from .interference import DEFAULT_SHARING, SHARING_MODES
from .overload import overload_warning, show_progress, warn
from .simulator import SimConfig, Simulator, jobs_from_table


def _round_s(v: str) -> float | None:
    if v.lower() in ("iteration", "iter", "none"):
        return None
    try:
        x = float(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--round-s must be seconds > 0 or 'iteration', got {v!r}") from None
    if not x > 0:
        raise argparse.ArgumentTypeError(f"--round-s must be > 0, got {v}")
    if not math.isfinite(x):
        raise argparse.ArgumentTypeError(f"--round-s must be a finite number of seconds or 'iteration', got {v}")
    return x


def add_cluster_arguments(p: argparse.ArgumentParser) -> None:
    """Cluster and simulator options shared by simulate, evaluate and train."""
    p.add_argument("--gpus", type=positive_int("--gpus"), default=64, help="GPUs in the cluster (default 64)")
    p.add_argument("--gpus-per-node", type=positive_int("--gpus-per-node"), default=8, help="GPUs per node (default 8)")
    p.add_argument("--gpu-type", default="v100", help="GPU type of every node: k80, p100, v100 or cpu (default v100)")
    p.add_argument("--gpu-memory-gib", type=positive_float("--gpu-memory-gib"), default=None,
                   help="override the GPU memory (GiB)")
    p.add_argument("--round-s", type=_round_s, default=300.0,
                   help="round length in seconds, or 'iteration' for iteration granularity (default 300)")
    p.add_argument("--restart-s", type=non_negative_float("--restart-s"), default=30.0,
                   help="resume/migration cost in seconds (default 30)")
    p.add_argument("--max-workers-per-gpu", type=positive_int("--max-workers-per-gpu"), default=2,
                   help="most workers (of different jobs) on one GPU, besides its memory (default 2)")
    p.add_argument("--backlogged", action="store_true",
                   help="submit every job at t=0 and report the backlogged efficiency form")
    p.add_argument("--tables", default=None, help="folder of extra cost tables (*.json) to use")
    p.add_argument("--sharing", choices=SHARING_MODES, default=DEFAULT_SHARING,
                   help="how jobs on one GPU share it: 'fitted' (interference model fitted to measured "
                        "pairs, docs/colocation.md) or 'timeslice' (their work adds up)")
    p.add_argument("--pace", choices=PACES, default=DEFAULT_PACE,
                   help="how co-located jobs step: 'free' (each at its own pace, docs/colocation.md) or "
                        "'lockstep' (one iteration each per step, held by a barrier)")


def check_out_dir(path, what: str = "--out") -> None:
    """Fail before any work when an output folder cannot be one (it is a file, or lies under one)."""
    if path is None:
        return
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ValueError(f"{what} {p} is a file; expected a folder (it is created if missing)")
    blocker = file_above(p)
    if blocker is not None:
        raise ValueError(f"{what} {p}: {blocker} is a file, not a folder")


def require_jobs(trace, purpose: str = "to simulate") -> None:
    """ValueError naming the trace and what was dropped when no job is left to run."""
    if len(trace.jobs):
        return
    s = trace.summary
    dropped = {**{f"bad row: {k}": v for k, v in s.get("bad_rows_skipped", {}).items()}, **s.get("filtered", {})}
    why = f"{s.get('rows_read', 0)} rows read"
    if dropped:
        why += "; dropped: " + ", ".join(f"{k} {v}" for k, v in dropped.items())
    raise ValueError(f"trace {trace.source!r} has no jobs {purpose} ({why})")


def build_cluster_and_config(args):
    if args.tables:
        register_tables_dir(args.tables)
    cluster = ClusterSpec.from_gpus(args.gpus, gpus_per_node=args.gpus_per_node, gpu_type=args.gpu_type,
                                    gpu_memory_gib=args.gpu_memory_gib)
    config = SimConfig(round_s=args.round_s, restart_s=args.restart_s, max_workers_per_gpu=args.max_workers_per_gpu,
                       backlogged=args.backlogged, sharing=args.sharing, pace=args.pace)
    return cluster, config


def register(subparsers) -> None:
    p = subparsers.add_parser("simulate", help="run one episode of a scheduler on a trace",
                              description="Run one full episode of a scheduler and print its metrics.")
    add_trace_arguments(p)
    add_cluster_arguments(p)
    p.add_argument("--agent", default="fifo", help="scheduler name (see `jigsaw simulate --list-agents`)")
    p.add_argument("--list-agents", action="store_true", help="list the scheduler names and exit")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--out", default=None, help="write jobs.csv, rounds.csv and cluster.csv to this folder")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on stderr (default: on when stderr is a terminal, off with --json piped)")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.list_agents:
        print("\n".join(available_schedulers()))
        return 0
    t0 = time.perf_counter()
    agent = make_scheduler(args.agent)
    check_out_dir(args.out)
    cluster, config = build_cluster_and_config(args)
    trace = trace_from_args(args, cluster.num_gpus)
    require_jobs(trace)
    # (its checks first: a job that cannot run is the one line, naming the trace)
    sim = Simulator(cluster, jobs_from_table(trace.jobs, cluster, config.backlogged, origin=trace.source), config)
    if not args.backlogged:
        warn(trace_overload_warning(trace.jobs, cluster.num_gpus), args)
    agent.reset()
    metrics = sim.run(agent, progress=show_progress(args))
    metrics["wall_s"] = time.perf_counter() - t0
    metrics.update(agent=args.agent, trace=trace.source, gpus=cluster.num_gpus)
    if args.out:
        sim.write_logs(args.out)
    if args.json:
        print(json.dumps(metrics, default=float))
    else:
        _print_table(metrics)
    return 0


def trace_overload_warning(jobs, gpus: int, label: str = "") -> str | None:
    """:func:`~jigsaw_env.overload.overload_warning` for a job table (durations estimated as
    ``jigsaw evaluate`` does); None when the load cannot be estimated."""
    try:
        load = float(offered_load(jobs, gpus, estimated_durations(jobs, default_throughput_fn())))
    except Exception:  # noqa: BLE001 -- informative only
        return None
    span = float(jobs["arrival_s"].max() - jobs["arrival_s"].min()) if len(jobs) else 0.0
    return overload_warning(load, gpus, len(jobs), span, label)


def _fmt(v) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:,.3f}" if abs(v) < 100 else f"{v:,.0f}"
    return str(v)


def _print_table(m: dict) -> None:
    t = Table(title=f"{m['agent']} on {m['trace']} ({m['gpus']} GPUs)")
    t.add_column("metric")
    t.add_column("value", justify="right")
    for k, v in m.items():
        if k in ("agent", "trace", "gpus") or isinstance(v, dict):
            continue
        t.add_row(k, _fmt(v))
    Console(file=sys.stdout).print(t)
