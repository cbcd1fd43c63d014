"""``jigsaw traces describe KIND:PATH [--gpus N] [--json]`` and ``jigsaw traces convert``."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from jigsaw_env.cli_args import positive_int

from .api import add_trace_arguments, trace_from_args
from .describe import describe_trace, render_description
from .models import default_throughput_fn

DEFAULT_DESCRIBE_GPUS = 64


def _spec(args: argparse.Namespace) -> None:
    if getattr(args, "spec", None):
        args.trace = args.spec


def _throughput_or_none():
    try:
        return default_throughput_fn()
    except ValueError:
        return None


def cmd_describe(args: argparse.Namespace) -> int:
    _spec(args)
    if args.gpus < 1:
        raise ValueError(f"--gpus must be >= 1, got {args.gpus}")
    # the trace as it is: no cap to the cluster (only --max-gpus-per-job caps), no model mapping
    # unless asked; the cluster size is the one the load refers to
    trace = trace_from_args(args, args.gpus, map_models=args.map_models, cap_to_cluster=False)
    tfn = _throughput_or_none() if trace.jobs["duration_s"].isna().any() else None
    d = describe_trace(trace, args.gpus, tfn)
    if args.json:
        print(json.dumps(d, indent=1, default=str))
    else:
        print(render_description(d))
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    _spec(args)
    out = Path(args.out)
    if out.is_dir():
        raise ValueError(f"{out} is a directory; give the output file name, e.g. {out / 'jobs.csv'}")
    if not out.parent.is_dir():
        raise FileNotFoundError(f"output folder does not exist: {out.parent}")
    trace = trace_from_args(args, args.gpus, map_models=not args.no_models)
    trace.to_csv(out)
    s = trace.summary
    print(f"wrote {out}: {len(trace):,} jobs (read {s['jobs_read']:,}; filtered {sum(s['filtered'].values()):,}"
          f"; bad rows skipped {sum(s['bad_rows_skipped'].values()):,}); digest {trace.digest()}",
          file=sys.stderr)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("traces", help="inspect and convert job traces",
                              description="Inspect and convert job traces (docs/traces.md).")
    sub = p.add_subparsers(dest="traces_command", metavar="SUBCOMMAND")
    sub.required = True

    d = sub.add_parser("describe", help="job count, GPU histogram, durations, arrival span, offered load",
                       description="Describe a trace: job count, GPU-count histogram, duration quantiles, "
                                   "arrival span, offered load against --gpus, and what was filtered.")
    d.add_argument("spec", nargs="?", default=None, metavar="KIND:PATH",
                   help="trace to describe (overrides --trace), e.g. philly:$JIGSAW_DATA/philly/philly.csv")
    d.add_argument("--gpus", type=positive_int("--gpus"), default=DEFAULT_DESCRIBE_GPUS,
                   help=f"cluster size for the offered load (default {DEFAULT_DESCRIBE_GPUS})")
    d.add_argument("--json", action="store_true", help="print JSON instead of text")
    d.add_argument("--map-models", action="store_true",
                   help="also map model-less jobs to zoo models and compute iterations")
    add_trace_arguments(d)
    d.set_defaults(func=cmd_describe)

    c = sub.add_parser("convert", help="write a trace as canonical CSV (readable with csv:PATH)")
    c.add_argument("spec", nargs="?", default=None, metavar="KIND:PATH", help="trace to convert (overrides --trace)")
    c.add_argument("out", metavar="OUT.csv", help="output file")
    c.add_argument("--gpus", type=positive_int("--gpus"), default=None,
                   help="cluster size (GPU cap and --load); default: none")
    c.add_argument("--no-models", action="store_true", help="do not map models or compute iterations")
    add_trace_arguments(c)
    c.set_defaults(func=cmd_convert)
