"""``jigsaw deploy``: run real training jobs on local (or Ray-cluster) CPU slots under a scheduler.

Examples::

    jigsaw deploy --policy jigsaw --demo --slots 2            # the demo (about a minute)
    jigsaw deploy --policy policy.onnx --demo --slots 2       # an exported policy (jigsaw export)
    jigsaw deploy --policy tiresias --jobs jobs.csv --slots 2 --round-s 5 --out runs/live
    jigsaw deploy --policy jigsaw --demo --address 127.0.0.1:6379   # a running Ray cluster
    jigsaw deploy --resume runs/live                          # a restarted scheduler continues
    jigsaw deploy --policy jigsaw --demo --recovery partial --checkpoint-every 200   # fault tolerance

``--policy`` is a heuristic name (``agents.make_scheduler``), an ONNX file written by
``jigsaw export``, or a training RUN_DIR. Decisions come every round from it, through the
simulator's own state type (heuristics) or the env's observation encoder and action codec
(learned policies); a policy whose layout does not fit (observation size, action count, SPB
levels) is refused before any job starts.

The run writes to ``--out`` (default ``runs/deploy-<time>``): ``run_log.jsonl`` (events),
``iterations.jsonl`` (every worker's per-iteration report), ``decision_log.jsonl`` (replayable
through the simulator), ``scheduler_state.json`` (the persisted scheduler), ``checkpoints/``,
``summary.json`` (per job: JCT, iterations, bytes, final loss, held-out accuracy) and
``replay.json`` (the log replayed: same decisions? simulated vs measured). docs/deploy.md.

**The demo** (``--demo``): three jobs on sklearn's digits: a tiny CNN on 2 slots at t = 0, a tiny
MLP at t = 4 s and a tiny Transformer at t = 8 s (1 slot each), 3-second rounds; a heuristic gets
Tiresias/Jigsaw LAS thresholds of 8 GPU-seconds (instead of an hour) so that a demoted job is
preempted by a new arrival within the demo. :class:`DemoScenario` guarantees the two events the
demo must show whatever the policy does: if no job has been preempted by round 5, the running job
with the most attained service is held out of that round (waiting jobs that fit take its slots;
the policy resumes it later); if no
running job has changed its SPB level by round 7, one running job alone on its slots switches
level (0 <-> 2). Each forced change is recorded in the decision log (``forced``) next to the
policy's own decision, and the replay re-applies the same rule.

The demo runs with this machine's calibration (:mod:`jigsaw_executor.demo_calibration`: the tiny
models' CPU tables, the executor overhead, the loopback link; measured by the first demo, a few
minutes, then cached), so its replay compares the live run with a simulator that knows this
machine. ``--recalibrate`` measures again, ``--no-calibrate`` uses the shipped tables, ``--tables
DIR`` a calibration of your own; with ``--address`` (a cluster's machines) the demo does not
calibrate.
"""
from __future__ import annotations

import csv
import errno
import io
import json
import os
import sys
import time
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

from jigsaw_env.cli_args import non_negative_int, positive_float, positive_int
from jigsaw_env.cost_table import register_tables_dir
from jigsaw_env.free_running import DEFAULT_PACE, PACES
from jigsaw_env.network import INTRA_NODE, LINK_FILE, Link, load_link
from jigsaw_env.spb import SPBConfig

from .cluster_ray import check_slots, default_slots
from .decision_log import replay_decision_log
from .demo_calibration import demo_calibration
from .demo_scenario import DemoScenario
from .live import LiveConfig, LiveExecutor, LiveJob
from .lockstep import LOCKSTEP_FILE, lockstep_in_tables
from .policies import build_scheduler, is_policy_path, scheduler_spec

__all__ = ["DemoScenario", "demo_jobs", "DEMO_THRESHOLD_GPU_S", "register", "run", "deploy"]

DEMO_THRESHOLD_GPU_S = 8.0
DEMO_ROUND_S = 3.0


def demo_jobs(slots: int, scale: float = 1.0):
    """The demo's job set (module docstring). ``scale`` multiplies every job's iterations."""
    big = min(2, slots)
    return [LiveJob(0, "tiny_cnn", big, round(2500 * scale), arrival_s=0.0, seed=0),
            # lr 0.02, not the zoo's 0.05: at 0.05 a one-worker rotating SPB run of tiny_mlp at level
            # >= 2 diverges (docs/deploy.md section 6); at 0.02 it trains at every level
            LiveJob(1, "tiny_mlp", 1, round(3000 * scale), arrival_s=4.0, seed=1, lr=0.02),
            LiveJob(2, "tiny_transformer", 1, round(1200 * scale), arrival_s=8.0, seed=2)]


# --------------------------------------------------------------------------------------------
# the command
# --------------------------------------------------------------------------------------------
def register(subparsers) -> None:
    p = subparsers.add_parser("deploy", help="run real training jobs on CPU slots under a scheduler or policy",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--policy", default=None,
                   help="heuristic name (jigsaw, tiresias, ...), an exported policy.onnx, or a RUN_DIR")
    p.add_argument("--demo", action="store_true", help="run the built-in demo job set (docs/deploy.md)")
    p.add_argument("--jobs", default=None, help="job list: CSV or JSON with job_id, model, num_gpus, iterations, "
                                                 "arrival_s[, batch_size, seed, lr]")
    p.add_argument("--slots", type=positive_int("--slots"), default=None, help="CPU slots (default: physical cores, at most that)")
    p.add_argument("--round-s", type=positive_float("--round-s"), default=None,
                   help=f"round length in wall seconds (default {DEMO_ROUND_S} for the demo, else 5)")
    p.add_argument("--steps-per-round", type=positive_int("--steps-per-round"), default=None, help="fixed lockstep steps per round instead")
    p.add_argument("--max-workers-per-gpu", type=positive_int("--max-workers-per-gpu"), default=2, help="workers (of different jobs) per slot")
    p.add_argument("--slot-memory-gib", type=positive_float("--slot-memory-gib"), default=None, help="memory budget per slot (default 8 GiB)")
    p.add_argument("--thresholds", default=None,
                   help=f"LAS thresholds (GPU-s) for tiresias/jigsaw (demo default {DEMO_THRESHOLD_GPU_S:g})")
    p.add_argument("--link-alpha-us", type=float, default=None, help="slot-to-slot link latency the scheduler "
                                                                     "assumes (us; default: the simulator's intra-node)")
    p.add_argument("--link-gbps", type=float, default=None, help="slot-to-slot link bandwidth (GB/s)")
    p.add_argument("--demo-scale", type=positive_float("--demo-scale"), default=1.0,
                   help="multiply the demo jobs' iterations")
    p.add_argument("--out", default=None, help="output folder (default runs/deploy-<time>)")
    p.add_argument("--address", default=None, help="connect to a running Ray cluster (HOST:PORT) instead of "
                                                     "starting one")
    p.add_argument("--timeout-s", type=positive_float("--timeout-s"), default=60.0,
                   help="collective and store timeout: a stalled worker fails its job after it")
    p.add_argument("--checkpoint-every", type=non_negative_int("--checkpoint-every"), default=500, metavar="N",
                   help="checkpoint every running job every N iterations (0: only at pause and done); a "
                        "failure loses at most N iterations (default 500)")
    p.add_argument("--max-restarts", type=non_negative_int("--max-restarts"), default=3, metavar="N",
                   help="recoveries allowed per job before the run fails (default 3)")
    p.add_argument("--recovery", choices=("full", "partial"), default="full",
                   help="after a worker failure: restart the job from its last checkpoint (full, default) or "
                        "replace the dead workers, copying the weights from a surviving peer (partial, CPR-style)")
    p.add_argument("--tables", default=None, help="folder of extra cost tables (*.json), e.g. recalibrated cpu ones or "
                                                  "`jigsaw calibrate --executor` output (its link.json is used unless "
                                                  "--link-alpha-us/--link-gbps are given)")
    p.add_argument("--recalibrate", action="store_true",
                   help="with --demo: measure this machine's demo calibration again instead of using the cached one")
    p.add_argument("--no-calibrate", action="store_true",
                   help="with --demo: use the shipped CPU tables, not this machine's calibration (docs/deploy.md)")
    p.add_argument("--pace", choices=PACES, default=DEFAULT_PACE,
                   help="how jobs sharing a slot step: 'free' (each at its own pace) or 'lockstep' (a barrier "
                        "before every step); the replay simulates the same pace")
    p.add_argument("--count-loopback", action="store_true",
                   help="count the loopback interface's bytes (the kernel's counter, /proc/net/dev) around every "
                        "gradient sync and report them beside the formula's bytes (docs/executor.md)")
    p.add_argument("--no-pin", action="store_true", help="do not pin each slot's workers to one core")
    p.add_argument("--allow-oversubscribe", action="store_true", help="allow more slots than physical cores")
    p.add_argument("--no-replay", action="store_true", help="skip replaying the decision log at the end")
    p.add_argument("--resume", default=None, metavar="OUT", help="continue the run persisted in OUT")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.set_defaults(func=run)


_JOB_COLUMNS = ("job_id", "model", "num_gpus", "iterations")


def _job_records(p: Path) -> tuple[str, list[tuple[int, dict]]]:
    """The rows of a job list as (where, [(number, {column: value})]). CSV: the values as text and
    the number the row's line in the file (blank lines skipped, as rows, but counted); JSON (what
    ``pandas.read_json`` reads): the values as read and the number the record's position (1-based)."""
    if p.suffix == ".json":
        try:
            df = pd.read_json(p)
        except ValueError as e:
            raise ValueError(f"{p}: not a valid job list ({e})") from None
        for col in _JOB_COLUMNS:
            if col not in df.columns:
                raise ValueError(f"{p}: missing column {col!r} (need job_id, model, num_gpus, iterations[, arrival_s])")
        return "record", [(i + 1, r) for i, r in enumerate(df.to_dict("records"))]
    try:
        text = p.read_bytes().decode("utf-8-sig")  # utf-8-sig: a byte-order mark is not part of the header
    except UnicodeDecodeError as e:
        raise ValueError(f"{p}: not a valid job list (not UTF-8 text: {e.reason} at byte {e.start})") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    header: list[str] | None = None
    rows: list[tuple[int, dict]] = []
    try:
        for rec in reader:
            line = reader.line_num  # the file line the record ends on (a record is one line here)
            if not any(f.strip() for f in rec):
                continue  # a blank line
            if header is None:
                header = [h.strip() for h in rec]
                dup = sorted({h for h in header if header.count(h) > 1})
                if dup:
                    raise ValueError(f"{p}: line {line}: column {dup[0]!r} appears twice in the header; expected "
                                     f"each column once")
                for col in _JOB_COLUMNS:
                    if col not in header:
                        raise ValueError(f"{p}: missing column {col!r} (need job_id, model, num_gpus, "
                                         f"iterations[, arrival_s])")
                continue
            if len(rec) != len(header):
                raise ValueError(f"{p}: line {line}: expected {len(header)} fields ({', '.join(header)}), "
                                 f"got {len(rec)}")
            rows.append((line, {h: v.strip() for h, v in zip(header, rec)}))
    except csv.Error as e:
        raise ValueError(f"{p}: line {reader.line_num}: not a valid job list ({e})") from None
    if header is None:
        raise ValueError(f"{p}: empty file: expected a header line (job_id, model, num_gpus, iterations[, arrival_s])")
    return "line", rows


def _missing(v) -> bool:
    """An empty CSV field, or a JSON record's null / NaN."""
    return v is None or (isinstance(v, str) and v == "") or (isinstance(v, float) and v != v)


def _to_int(v) -> int:
    """An integer value, exactly: 3, "3", 3.0 or "3.0"; ValueError for 1.5, "1.5", "two", True, inf."""
    if isinstance(v, (bool, np.bool_)):
        raise ValueError(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, str):
        try:
            d = Decimal(v)
        except InvalidOperation:
            raise ValueError(v) from None
        if not d.is_finite() or d != d.to_integral_value():
            raise ValueError(v)
        return int(d)
    f = float(v)  # TypeError for other values
    if not f.is_integer():  # also inf and nan
        raise ValueError(v)
    return int(f)


def _to_float(v) -> float:
    if isinstance(v, (bool, np.bool_)):
        raise ValueError(v)
    return float(v)


def _read_jobs(path: str):
    p = Path(path)
    if p.is_dir():
        raise IsADirectoryError(f"job list is a folder, expected a CSV or JSON file: {p}")
    if not p.is_file():
        raise FileNotFoundError(f"job list not found: {p}")
    unit, records = _job_records(p)
    out = []
    for line, row in records:

        def conv(col, fn, what, default=None):
            v = row.get(col, default)
            try:
                return fn(v)
            except (TypeError, ValueError, OverflowError):
                raise ValueError(f"{p}: {unit} {line}: column {col!r} must be {what}, got {v!r}") from None

        kw = {k: row[k] for k in ("batch_size", "seed", "lr", "data") if k in row and not _missing(row[k])}
        if "batch_size" in kw:
            kw["batch_size"] = conv("batch_size", _to_int, "an integer")
        if "seed" in kw:
            kw["seed"] = conv("seed", _to_int, "an integer")
        if "lr" in kw and isinstance(kw["lr"], str):
            kw["lr"] = conv("lr", _to_float, "a number")
        if "data" in kw:
            kw["data"] = str(kw["data"])
        arrival = row.get("arrival_s")
        out.append(LiveJob(conv("job_id", _to_int, "an integer"), str(row["model"]),
                           conv("num_gpus", _to_int, "an integer"),
                           conv("iterations", _to_float, "a number"),
                           arrival_s=0.0 if _missing(arrival) else conv("arrival_s", _to_float, "a number"),
                           **kw))
    return out


def _use_tables(args, folder: str | Path) -> float:
    """Register the cost tables of ``folder``; take its ``link.json`` unless ``--link-alpha-us`` /
    ``--link-gbps`` are given; returns the lockstep barrier of its ``lockstep.json`` (0 without)."""
    register_tables_dir(folder)
    link_file = Path(folder) / LINK_FILE
    if link_file.is_file() and args.link_alpha_us is None and args.link_gbps is None:
        # the link `jigsaw calibrate --executor` fitted next to its tables (docs/deploy.md section 5)
        link = load_link(link_file)
        args.link_alpha_us, args.link_gbps = link.alpha_s * 1e6, link.bandwidth_Bps / 1e9
        if not args.json:
            print(f"link from {link_file}: alpha {args.link_alpha_us:.1f} us, {args.link_gbps:.3g} GB/s")
    found = lockstep_in_tables(folder)  # the barrier `jigsaw calibrate --executor` measured (eq. X3)
    if found is None:
        return 0.0
    if not args.json:
        print(f"lockstep barrier from {Path(folder) / LOCKSTEP_FILE}: {found * 1e3:.3f} ms per co-located step "
              "(used by the end-of-run replay)")
    return found


#: the file of a run folder that names the tables a calibrated demo ran with (``--resume`` reads it)
RUN_TABLES_FILE = "tables.json"


def _check_calibration_flags(args) -> None:
    if args.resume and (args.recalibrate or args.no_calibrate):
        raise ValueError("--resume uses the tables the run started with: --recalibrate / --no-calibrate do not apply")
    if (args.recalibrate or args.no_calibrate) and not args.demo:
        raise ValueError("--recalibrate and --no-calibrate apply to --demo only (give --tables DIR for other runs)")
    if args.recalibrate and args.no_calibrate:
        raise ValueError("give --recalibrate or --no-calibrate, not both")
    if args.tables and (args.recalibrate or args.no_calibrate):
        raise ValueError("--tables DIR replaces the demo's calibration: --recalibrate / --no-calibrate do not apply")


def _calibrated_demo_tables(args, slots: int) -> Path:
    """The demo's tables for this machine (:mod:`jigsaw_executor.demo_calibration`), after the
    policy and the slots are checked (a bad argument costs no measurement)."""
    _scheduler_for(args.policy, True, args.thresholds, SPBConfig())
    if args.address is None:
        check_slots(slots, args.allow_oversubscribe)
    log = (lambda s: print(s, file=sys.stderr, flush=True)) if args.json else _echo
    folder, _ = demo_calibration(slots, lockstep=args.pace == "lockstep", recalibrate=args.recalibrate, log=log)
    return folder


def run(args) -> int:
    _check_calibration_flags(args)
    if args.resume:
        return _resume(args)
    if args.policy is None:
        raise ValueError("--policy is required (a heuristic name, policy.onnx or a RUN_DIR)")
    if not args.demo and not args.jobs:
        raise ValueError("give --demo or --jobs FILE")
    slots = args.slots if args.slots is not None else default_slots()
    out = Path(args.out or f"runs/deploy-{time.strftime('%Y%m%d-%H%M%S')}")
    if out.exists() and not out.is_dir():
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(out))
    tables = args.tables
    if tables is None and args.demo and not args.no_calibrate:
        if args.address is None:
            tables = _calibrated_demo_tables(args, slots)
        elif not args.json:  # the calibration measures this machine, not the cluster's
            print("--address: the demo runs with the shipped CPU tables (give --tables DIR from `jigsaw calibrate "
                  "--device cpu --executor` run on the cluster's machines)")
    lockstep_s = _use_tables(args, tables) if tables else 0.0
    if args.address is None:
        check_slots(slots, args.allow_oversubscribe)
    jobs = demo_jobs(slots, args.demo_scale) if args.demo else _read_jobs(args.jobs)
    summary, replay = deploy(args.policy, jobs, slots=slots, out=out, demo=args.demo, round_s=args.round_s,
                             steps_per_round=args.steps_per_round, max_workers_per_gpu=args.max_workers_per_gpu,
                             slot_memory_gib=args.slot_memory_gib, thresholds=args.thresholds,
                             link_alpha_us=args.link_alpha_us, link_gbps=args.link_gbps, address=args.address,
                             timeout_s=args.timeout_s, pin=not args.no_pin,
                             allow_oversubscribe=args.allow_oversubscribe, replay=not args.no_replay,
                             echo=None if args.json else _echo, checkpoint_every=args.checkpoint_every,
                             max_restarts=args.max_restarts, recovery=args.recovery,
                             lockstep_s=lockstep_s, pace=args.pace, count_loopback=args.count_loopback,
                             tables=tables)
    if args.json:
        print(json.dumps({"summary": summary, "replay": replay}, default=str))
    else:
        print_summary(summary, replay, out)
    return failed_jobs_exit(summary, out)


#: the exit status of a run in which a job was given up (no checkpoint of it loads); bad input is 2
EXIT_JOB_FAILED = 1


def failed_jobs_exit(summary: dict, out: Path, file=None) -> int:
    """0, or, when the run gave a job up (``summary["failed_jobs"]``), one line on stderr naming
    the jobs, the first one's error and ``summary.json``, and :data:`EXIT_JOB_FAILED`."""
    failed = summary.get("failed_jobs") or []
    if not failed:
        return 0
    first = summary["jobs"][failed[0]] if failed[0] in summary["jobs"] else summary["jobs"][str(failed[0])]
    print(f"jigsaw deploy: {len(failed)} job(s) failed ({', '.join(map(str, failed))}); the others ran to the end; "
          f"{first.get('error')}; see {out}/summary.json", file=file or sys.stderr)
    return EXIT_JOB_FAILED


def _echo(s: str) -> None:
    print(s, flush=True)


def _scheduler_for(policy: str, demo: bool, thresholds: str | None, spb: SPBConfig):
    kwargs: dict[str, Any] = {}
    if not is_policy_path(policy):
        base = policy.split("+")[0]
        th = thresholds if thresholds is not None else (str(DEMO_THRESHOLD_GPU_S) if demo else None)
        if th is not None and base in ("tiresias", "jigsaw"):
            try:
                kwargs["thresholds"] = [float(x) for x in str(th).split(",") if x.strip()]
            except ValueError:
                raise ValueError(f"--thresholds must be comma-separated numbers (GPU-seconds), got {th!r}") from None
    spec = scheduler_spec(policy, kwargs)
    sched, rec = build_scheduler(spec, spb)
    return sched, rec, spec


def deploy(policy: str, jobs, *, slots: int, out: str | Path, demo: bool = False, round_s: float | None = None,
           steps_per_round: int | None = None, max_workers_per_gpu: int = 2, slot_memory_gib: float | None = None,
           thresholds: str | None = None, link_alpha_us: float | None = None, link_gbps: float | None = None,
           address: str | None = None, timeout_s: float = 60.0, pin: bool = True, allow_oversubscribe: bool = False,
           replay: bool = True, pool=None, hub=None, scenario=None, fail_at: dict | None = None,
           echo=None, spb: SPBConfig | None = None, checkpoint_every: int = 500, max_restarts: int = 3,
           recovery: str = "full", lockstep_s: float = 0.0, pace: str = DEFAULT_PACE,
           count_loopback: bool = False, tables: str | Path | None = None) -> tuple[dict, dict | None]:
    """Run ``jobs`` live under ``policy``; returns (summary, replay result as a dict or None).
    Every check (policy layout, jobs that cannot fit) happens before Ray or any job starts.
    ``tables``: the folder of cost tables the caller registered for this run
    (``jigsaw_env.cost_table.register_tables_dir``; ``jigsaw deploy --tables`` or the demo's
    calibration), recorded in ``OUT/tables.json`` for ``--resume`` and read by the replay."""
    spb = spb or SPBConfig()
    sched, rec, spec = _scheduler_for(policy, demo, thresholds, spb)  # policy layout checked here
    link = INTRA_NODE
    if link_alpha_us is not None or link_gbps is not None:
        link = Link(alpha_s=(link_alpha_us * 1e-6) if link_alpha_us is not None else INTRA_NODE.alpha_s,
                    bandwidth_Bps=(link_gbps * 1e9) if link_gbps is not None else INTRA_NODE.bandwidth_Bps)
    cfg = LiveConfig(slots=slots, round_s=round_s or (DEMO_ROUND_S if demo else 5.0), steps_per_round=steps_per_round,
                     max_workers_per_gpu=max_workers_per_gpu, slot_memory_gib=slot_memory_gib, spb=spb, link=link,
                     timeout_s=timeout_s, pin=pin, checkpoint_every=checkpoint_every, max_restarts=max_restarts,
                     recovery=recovery, lockstep_s=lockstep_s, pace=pace, count_loopback=count_loopback)
    if demo and scenario is None:
        scenario = DemoScenario()
    ex = LiveExecutor(jobs, sched, cfg, out, scheduler_spec=spec, pool=pool, hub=hub, address=address,
                      scenario=scenario, recorder=rec, fail_at=fail_at, allow_oversubscribe=allow_oversubscribe,
                      echo=echo)
    if tables is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / RUN_TABLES_FILE).write_text(json.dumps({"tables": str(Path(tables).resolve())}) + "\n")
    try:
        summary = ex.run()
    finally:
        ex.close()
    rep = None
    if replay:
        r = replay_decision_log(Path(out) / "decision_log.jsonl", scenario=scenario, tables=tables)
        rep = r.to_dict()
        (Path(out) / "replay.json").write_text(json.dumps(rep, indent=1, default=str) + "\n")
    return summary, rep


def _run_tables(out: Path) -> str | None:
    """The tables folder a run in ``out`` started with (``OUT/tables.json``), or None."""
    f = out / RUN_TABLES_FILE
    if not f.is_file():
        return None
    try:
        folder = json.loads(f.read_text())["tables"]
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{f}: expected {{\"tables\": FOLDER}}; give --tables DIR to resume with a folder") from None
    if not Path(folder).is_dir():
        raise FileNotFoundError(f"{f}: the run's tables folder {folder} is gone; give --tables DIR (e.g. a new "
                                f"`jigsaw calibrate --device cpu --executor --out DIR`)")
    return folder


def _resume(args) -> int:
    tables = args.tables or _run_tables(Path(args.resume))
    if tables:
        _use_tables(args, tables)
    ex = LiveExecutor.restore(args.resume, address=args.address)
    try:
        summary = ex.run()
    finally:
        ex.close()
    rep = None
    if not args.no_replay:
        rep = replay_decision_log(Path(args.resume) / "decision_log.jsonl", scenario=ex.scenario,
                                  tables=tables).to_dict()
        (Path(args.resume) / "replay.json").write_text(json.dumps(rep, indent=1, default=str) + "\n")
    if args.json:
        print(json.dumps({"summary": summary, "replay": rep}, default=str))
    else:
        print_summary(summary, rep, Path(args.resume))
    return failed_jobs_exit(summary, Path(args.resume))


def _f(v, fmt: str = "{:.3f}") -> str:
    return "-" if v is None else fmt.format(v)


def print_summary(summary: dict, replay: dict | None, out: Path, file=None) -> None:
    con = Console(file=file or sys.stdout, width=140)
    t = Table(title=f"jigsaw deploy: {summary['scheduler'].get('name') or summary['scheduler'].get('path')} on "
                    f"{summary['slots']} slots, {summary['rounds']} rounds, makespan {_f(summary['makespan_s'], '{:.1f}')} s")
    # "MB sent": the formula's bytes (counted at the collective calls); "MB lo": the kernel's loopback
    # count around the syncs (every process of the machine), with --count-loopback
    lo = any(j.get("loopback_bytes") is not None for j in summary["jobs"].values())
    for col in ("job", "model", "slots", "JCT s", "iterations", "ms/iter", "MB sent") + (("MB lo",) if lo else ()) + \
            ("final loss", "held-out acc", "preempt", "level chg", "levels used"):
        t.add_column(col, justify="right" if col not in ("model", "levels used") else "left")
    for j in summary["jobs"].values():
        t.add_row(str(j["job_id"]), j["model"], str(j["num_gpus"]), _f(j["jct_s"], "{:.1f}"), str(j["iterations"]),
                  _f(j["mean_iter_s"] and j["mean_iter_s"] * 1e3, "{:.2f}"), _f(j["bytes_sent"] / 1e6, "{:.1f}"),
                  *((_f(j.get("loopback_bytes") and j["loopback_bytes"] / 1e6, "{:.1f}"),) if lo else ()),
                  _f(j["final_loss"]), _f(j["heldout_accuracy"]), str(j["preemptions"]), str(j["level_changes"]),
                  ", ".join(f"L{k}:{v}" for k, v in j["levels_used"].items()))
    con.print(t)
    if replay is not None:
        ok = "same decisions" if replay["decisions_match"] else f"DIFFERENT decisions ({len(replay['mismatches'])})"
        con.print(f"replay: {ok} in {replay['rounds_checked']} rounds"
                  + (f", {replay['steps_checked']} policy steps" if replay["steps_checked"] else "")
                  + f"; simulated vs measured (restart_s {replay['restart_s']:.2f} s):")
        r = Table()
        for col in ("job", "live ms/iter", "sim ms/iter", "err", "live JCT s", "sim JCT s", "err"):
            r.add_column(col, justify="right")
        for j in replay["jobs"]:
            r.add_row(str(j["job_id"]), _f(j["live_iter_s"] and j["live_iter_s"] * 1e3, "{:.2f}"),
                      _f(j["sim_iter_s"] and j["sim_iter_s"] * 1e3, "{:.2f}"), _f(j["iter_rel_err"], "{:+.0%}"),
                      _f(j["live_jct_s"], "{:.1f}"), _f(j["sim_jct_s"], "{:.1f}"), _f(j["jct_rel_err"], "{:+.0%}"))
        con.print(r)
    con.print(f"logs: {out}/run_log.jsonl, decision_log.jsonl, iterations.jsonl; summary: {out}/summary.json")
