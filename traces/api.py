"""``load_trace``: one entry point for every trace kind, with the options every command shares."""
from __future__ import annotations

import argparse
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from . import synthetic
from ._loader import LoaderResult
from .alibaba import load_alibaba2020, load_alibaba2023
from .canonical import load_canonical_csv
from .gavel import load_gavel, map_stand_ins
from .helios import load_helios
from .models import ZOO_MODELS, BatchSizeFn, ThroughputFn, estimated_durations, fill_iterations, fill_models, model_choices
from .philly import load_philly_csv, load_philly_json
from .schema import STATUSES, canonical_csv_bytes, digest_of, to_canonical_csv, validate_jobs

PROJECT_ROOT = Path(__file__).resolve().parent.parent

LOADERS: dict[str, Callable[..., LoaderResult]] = {
    "philly": load_philly_csv,
    "philly-json": load_philly_json,
    "alibaba2020": load_alibaba2020,
    "alibaba2023": load_alibaba2023,
    "helios": load_helios,
    "gavel": load_gavel,
    "csv": load_canonical_csv,
}
KINDS = tuple(LOADERS) + ("synthetic",)
#: where ``KIND:`` with an empty path looks (relative to the data folder)
DEFAULT_PATHS = {"philly": "philly/philly.csv"}
DEFAULT_SYNTHETIC_GPUS = 64


def data_dir() -> Path:
    """The reference data folder: ``$JIGSAW_DATA``, else ``<project root>/../shared/data`` (an
    empty or blank ``JIGSAW_DATA`` counts as unset, as ``jigsaw_env.table_builder.data_dir`` does)."""
    env = os.environ.get("JIGSAW_DATA", "").strip()
    return Path(env) if env else PROJECT_ROOT.parent / "shared" / "data"


@dataclass
class Trace:
    """A loaded trace: canonical ``jobs`` (sorted by arrival, arrival_s from 0), a ``summary``
    accounting for every row and job, and the ``source`` spec."""

    jobs: pd.DataFrame
    summary: dict[str, Any] = field(default_factory=dict)
    source: str = ""

    def digest(self) -> str:
        """sha256 of the canonical CSV bytes of ``jobs``, first 16 hex digits."""
        return digest_of(self.jobs)

    def __len__(self) -> int:
        return len(self.jobs)

    def to_csv(self, path: str | Path) -> Path:
        return to_canonical_csv(self.jobs, path)

    def csv_bytes(self) -> bytes:
        return canonical_csv_bytes(self.jobs)

    def offered_load(self, cluster_gpus: int, throughput_fn: ThroughputFn | None = None) -> float:
        """sum(num_gpus * duration_s) / (cluster_gpus * arrival span); see :func:`offered_load`."""
        return offered_load(self.jobs, cluster_gpus, estimated_durations(self.jobs, throughput_fn))


def offered_load(jobs: pd.DataFrame, cluster_gpus: int, durations: np.ndarray | None = None) -> float:
    """Offered load = sum(num_gpus * duration_s) / (cluster_gpus * (last - first arrival)).

    The GPU-seconds the jobs asked for (as they ran in the original cluster) over the
    GPU-seconds the cluster has while they arrive. NaN when a duration is unknown, inf when all
    jobs arrive at once.
    """
    if cluster_gpus is None or cluster_gpus < 1:
        raise ValueError(f"offered load needs a cluster size >= 1, got {cluster_gpus}")
    d = jobs["duration_s"].to_numpy(dtype=np.float64) if durations is None else np.asarray(durations, dtype=np.float64)
    if len(jobs) == 0 or np.isnan(d).any():
        return float("nan")
    work = float(np.sum(jobs["num_gpus"].to_numpy() * d))
    a = jobs["arrival_s"].to_numpy()
    span = float(a.max() - a.min())
    if span <= 0:
        return float("inf")
    return work / (cluster_gpus * span)


def parse_spec(spec: str) -> tuple[str, str]:
    """"KIND:PATH" -> (kind, path); "synthetic[:k=v,...]" -> ("synthetic", "k=v,...")."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"empty trace spec; expected KIND:PATH with KIND one of {list(KINDS)}")
    spec = spec.strip()
    kind, sep, rest = spec.partition(":")
    kind = kind.strip().lower()
    if kind not in KINDS:
        raise ValueError(f"unknown trace kind {kind!r} in {spec!r}; expected KIND:PATH with KIND one of {list(KINDS)}")
    if kind == "synthetic":
        return kind, rest
    if not rest.strip():
        if kind in DEFAULT_PATHS:
            return kind, str(data_dir() / DEFAULT_PATHS[kind])
        raise ValueError(f"trace kind {kind!r} needs a path: {kind}:PATH")
    return kind, rest.strip()


_DUR = re.compile(r"^\s*(?P<v>[0-9]*\.?[0-9]+(?:[eE][+-]?\d+)?)\s*(?P<u>s|m|min|h|d)?\s*$")
_UNITS = {None: 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """"90", "90s", "15m", "2h", "7d" -> seconds."""
    m = _DUR.match(text)
    if not m:
        raise ValueError(f"bad time {text!r}: expected a number of seconds, optionally with a unit s/m/h/d")
    return float(m.group("v")) * _UNITS[m.group("u")]


def parse_window(text: str) -> tuple[float, float]:
    """"START:END" (seconds from the trace start; units s/m/h/d allowed; either side may be empty)."""
    if ":" not in text:
        raise ValueError(f"bad window {text!r}: expected START:END, e.g. 0:7d or 3600:")
    a, b = text.split(":", 1)
    lo = parse_duration(a) if a.strip() else 0.0
    hi = parse_duration(b) if b.strip() else math.inf
    if not hi > lo:
        raise ValueError(f"bad window {text!r}: END must be after START")
    return lo, hi


def _names(v: Sequence[str] | str | None) -> list[str] | None:
    if v is None:
        return None
    if isinstance(v, str):
        v = v.split(",")
    out = [x.strip() for x in v if x and x.strip()]
    return out or None


def _check_positive(name: str, v, allow_none: bool = True) -> None:
    if v is None and allow_none:
        return
    if v is None or v < 1:
        raise ValueError(f"{name} must be >= 1, got {v}")


def load_trace(spec: str, *, cluster_gpus: int | None = None, gpu_type: str | None = None,
               window: tuple[float, float] | None = None, vc: list[str] | None = None,
               status: list[str] | None = None, max_gpus: int | None = None, load_scale: float | None = None,
               sample: int | None = None, max_jobs: int | None = None, seed: int = 0, map_models: bool = True,
               skip_bad_rows: bool = False, throughput_fn: ThroughputFn | None = None,
               batch_size_fn: BatchSizeFn | None = None, models: Sequence[str] = ZOO_MODELS,
               cap_to_cluster: bool = True) -> Trace:
    """Load a trace ("KIND:PATH", or "synthetic[:k=v,...]") into the canonical job table.

    Steps, in order (docs/traces.md): the format's loader (bad rows raise TraceFormatError, or are
    skipped and counted with ``skip_bad_rows``; jobs the format cannot replay are dropped and
    counted); ``window`` (seconds from the trace start, [start, end)); ``vc``; ``status``
    (canonical names); ``sample`` (seeded draw of N jobs); ``max_jobs`` (first N by arrival); GPU
    cap (``max_gpus``, and never more than ``cluster_gpus``); GPU type (``gpu_type`` overrides,
    else the job's own, else the format's default); model mapping and iterations
    (``map_models``); ``load_scale`` (inter-arrival times scaled so the offered load against
    ``cluster_gpus`` equals it; for ``synthetic`` it is the generator's target load); arrival_s
    shifted so the first kept job arrives at 0.

    Extra keywords: ``throughput_fn(model, batch_size, num_gpus, gpu_type) -> iterations/s``
    (default ``jigsaw_env.spb.isolated_throughput``), ``batch_size_fn(model) -> int`` (default
    ``jigsaw_env.cost_table.default_batch_size``), ``models`` (the mapping's zoo), and
    ``cap_to_cluster=False`` to leave GPU counts above ``cluster_gpus`` as they are (describe).
    """
    kind, rest = parse_spec(spec)
    if kind in DEFAULT_PATHS and not spec.partition(":")[2].strip() and not Path(rest).exists():
        # the default file of the data folder: say where that folder comes from
        raise FileNotFoundError(f"trace file not found: {rest} (the default {kind} trace of the data folder "
                                f"{data_dir()}; set JIGSAW_DATA to the folder holding {DEFAULT_PATHS[kind]}, "
                                f"or give {kind}:PATH)")
    for name, v in (("cluster_gpus", cluster_gpus), ("max_gpus", max_gpus), ("sample", sample),
                    ("max_jobs", max_jobs)):
        _check_positive(name, v)
    if load_scale is not None and not (load_scale > 0 and math.isfinite(load_scale)):
        raise ValueError(f"load must be a finite number > 0, got {load_scale}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    if window is not None:
        lo, hi = float(window[0]), float(window[1])
        if not hi > lo:
            raise ValueError(f"window end must be after its start, got {window}")
    vc = _names(vc)
    status = _names(status)
    if status is not None:
        status = [s.lower() for s in status]
        unknown = [s for s in status if s not in STATUSES]
        if unknown:
            raise ValueError(f"unknown status {unknown}; allowed: {list(STATUSES)}")

    load_cluster = cluster_gpus
    target_load = load_scale
    if kind == "synthetic":
        params = synthetic.parse_params(rest)
        synthetic.check_spec_load(params, load_scale)
        target_load = load_scale if load_scale is not None else params.get("load", synthetic.DEFAULTS["load"])
        load_cluster = params["gpus"] if "gpus" in params else (cluster_gpus or DEFAULT_SYNTHETIC_GPUS)
        n_jobs = params["jobs"] if "jobs" in params else (max_jobs or sample or synthetic.DEFAULTS["jobs"])
        res = synthetic.generate(jobs=n_jobs, load=target_load, seed=params.get("seed", seed), gpus=load_cluster,
                                 diurnal=params.get("diurnal", False), start_hour=params.get("start_hour", 0.0),
                                 models=params.get("models", tuple(models)))
        path_shown = ""
    else:
        if target_load is not None and cluster_gpus is None:
            raise ValueError("scaling a trace to a load needs the cluster size (cluster_gpus / --gpus)")
        res = LOADERS[kind](Path(rest).expanduser(), skip_bad_rows=skip_bad_rows)
        path_shown = res.path

    jobs = res.jobs.copy()
    pos = np.arange(len(jobs))
    filtered: dict[str, int] = dict(res.filtered)

    def apply(mask: np.ndarray, reason: str) -> None:
        nonlocal jobs, pos
        mask = np.asarray(mask, dtype=bool)
        dropped = int((~mask).sum())
        if dropped:
            filtered[reason] = filtered.get(reason, 0) + dropped
            jobs = jobs[mask].reset_index(drop=True)
            pos = pos[mask]

    if window is not None:
        a = jobs["arrival_s"].to_numpy()
        apply((a >= window[0]) & (a < window[1]), "outside_window")
    if vc is not None:
        if not res.has_vc:
            raise ValueError(f"{kind} traces have no virtual clusters; --vc does not apply")
        known = set(res.jobs["vc"].unique())
        missing = [v for v in vc if v not in known]
        if missing:
            raise ValueError(f"virtual cluster(s) {missing} not in the trace; it has: {sorted(known)[:30]}")
        apply(jobs["vc"].isin(vc).to_numpy(), "vc_not_selected")
    if status is not None:
        if not res.has_status:
            raise ValueError(f"{kind} traces record no job status; --status does not apply")
        apply(jobs["status"].isin(status).to_numpy(), "status_not_selected")
    if sample is not None and sample < len(jobs):
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x73616D706C65]))
        keep = np.zeros(len(jobs), dtype=bool)
        keep[rng.choice(len(jobs), size=sample, replace=False)] = True
        apply(keep, "not_sampled")
    if max_jobs is not None and max_jobs < len(jobs):
        apply(np.arange(len(jobs)) < max_jobs, "beyond_max_jobs")

    cap_cluster = cluster_gpus if cluster_gpus is not None else (load_cluster if kind == "synthetic" else None)
    if not cap_to_cluster:
        cap_cluster = None
    caps = [c for c in (max_gpus, cap_cluster) if c is not None]
    cap = min(caps) if caps else None
    capped = 0
    if cap is not None:
        over = jobs["num_gpus"].to_numpy() > cap
        capped = int(over.sum())
        if capped:
            jobs.loc[over, "num_gpus"] = cap

    if gpu_type:
        jobs["gpu_type"] = gpu_type
    else:
        jobs.loc[jobs["gpu_type"] == "", "gpu_type"] = res.default_gpu_type

    mapped = computed = 0
    stand_ins: dict[str, int] = {}
    if map_models and len(jobs):
        choices = model_choices(len(res.jobs), seed, models)[pos]
        if kind == "gavel":
            jobs, stand_ins = map_stand_ins(jobs, data_dir(), f"{kind}:{path_shown}")
        try:
            jobs, mapped = fill_models(jobs, choices, batch_size_fn)
            jobs, computed = fill_iterations(jobs, throughput_fn)
        except ValueError as e:  # name the trace: which file the job came from
            raise ValueError(f"{kind}:{path_shown}: {e}" if path_shown else f"{kind}: {e}") from None

    offset = float(jobs["arrival_s"].min()) if len(jobs) else 0.0
    jobs["arrival_s"] = jobs["arrival_s"].to_numpy() - offset
    load_info = None
    if target_load is not None and len(jobs):
        tfn = throughput_fn
        if tfn is None and map_models and jobs["duration_s"].isna().any():
            from .models import default_throughput_fn
            tfn = default_throughput_fn()
        d = estimated_durations(jobs, tfn)
        if np.isnan(d).any():
            raise ValueError(f"cannot scale to a load: {int(np.isnan(d).sum())} jobs have no duration "
                             "(and no model/throughput to estimate one)")
        before = offered_load(jobs, load_cluster, d)
        if not np.isfinite(before) and kind != "synthetic":
            raise ValueError("cannot scale to a load: all kept jobs arrive at the same time")
        factor = before / target_load if np.isfinite(before) else 1.0  # one synthetic arrival: nothing to scale
        jobs["arrival_s"] = jobs["arrival_s"].to_numpy() * factor
        load_info = {"target": float(target_load), "cluster_gpus": int(load_cluster),
                     "before_scaling": float(before), "arrival_scale": float(factor)}

    origin = f"{kind}:{path_shown}" if path_shown else kind
    jobs = validate_jobs(jobs, origin=origin)
    summary = {
        "source": spec,
        "kind": kind,
        "path": path_shown,
        "rows_read": res.rows_read,
        "bad_rows_skipped": dict(res.bad_rows),
        "bad_row_examples": list(res.bad_row_examples),
        "jobs_read": res.jobs_read,
        "filtered": filtered,
        "kept": len(jobs),
        "gpu_cap": cap,
        "capped_gpus": capped,
        "gpu_type": gpu_type or res.default_gpu_type,
        "models_mapped": mapped,
        "gavel_stand_ins": stand_ins,
        "iterations_computed": computed,
        "load": load_info,
        "time_offset_s": offset,
        "trace_start": res.trace_start,
        "seed": seed,
        "notes": res.notes,
    }
    return Trace(jobs=jobs, summary=summary, source=spec)


# ----------------------------------------------------------------------------------------------
# command-line options shared by every command


def _window_arg(text: str) -> tuple[float, float]:
    try:
        return parse_window(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_trace_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the trace options (--trace, --max-jobs, --sample, --seed, --load, --window, --vc,
    --status, --max-gpus-per-job, --skip-bad-rows, --gpu-type/--trace-gpu-type). Options the
    parser already has (e.g. its own --seed) are left as they are and shared.

    ``--gpu-type`` (dest ``trace_gpu_type``) is the GPU type the *trace* ran on. A command whose
    own ``--gpu-type`` means the simulated cluster's GPUs may add it after this call: it then owns
    ``--gpu-type`` and the trace's type stays reachable as ``--trace-gpu-type``."""
    from jigsaw_env.cli_args import non_negative_int, positive_float, positive_int  # one wording for every command

    have = set(getattr(parser, "_option_string_actions", {}))
    g = parser.add_argument_group("trace options")

    def addg(flag: str, **kw: Any) -> None:
        if flag not in have:
            g.add_argument(flag, **kw)

    addg("--trace", default="synthetic", metavar="KIND:PATH",
         help=f"job trace: KIND:PATH with KIND one of {', '.join(k for k in KINDS if k != 'synthetic')}, "
              "or synthetic[:jobs=N,load=X,seed=S,diurnal=1] (default: synthetic)")
    addg("--max-jobs", type=positive_int("--max-jobs"), default=None, metavar="N",
         help="keep the first N jobs by arrival")
    addg("--sample", type=positive_int("--sample"), default=None, metavar="N",
         help="keep a seeded random sample of N jobs")
    addg("--seed", type=non_negative_int("--seed"), default=0, help="seed for sampling, model mapping and synthetic traces (default 0)")
    addg("--load", type=positive_float("--load"), default=None, metavar="X",
         help="offered load: synthetic target; real traces: scale inter-arrival times so "
              "sum(num_gpus*duration)/(GPUs*arrival span) = X")
    addg("--window", type=_window_arg, default=None, metavar="START:END",
         help="keep jobs arriving in [START, END) seconds from the trace start (units s/m/h/d, e.g. 0:7d)")
    addg("--vc", default=None, metavar="VC[,VC...]", help="keep these virtual clusters")
    addg("--status", default=None, metavar="S[,S...]", help=f"keep jobs with these final statuses ({', '.join(STATUSES)})")
    addg("--max-gpus-per-job", type=positive_int("--max-gpus-per-job"), default=None, metavar="N",
         help="cap each job's GPUs (always capped to the cluster)")
    addg("--skip-bad-rows", action="store_true", help="skip malformed rows (counted by reason) instead of failing")
    flags = ["--trace-gpu-type"] + (["--gpu-type"] if "--gpu-type" not in have else [])
    if "--trace-gpu-type" not in have:
        g.add_argument(*flags, dest="trace_gpu_type", default=None, metavar="TYPE",
                       help="GPU type the trace ran on, for iterations (default: per format, see docs/traces.md)")
        if len(flags) == 2:
            # a command may add its own --gpu-type later (the simulated cluster's GPU type): let it
            # take that flag over; --trace-gpu-type stays
            parser.conflict_handler = "resolve"
            for grp in getattr(parser, "_action_groups", []):
                grp.conflict_handler = "resolve"
    return parser


def trace_from_args(args: argparse.Namespace, cluster_gpus: int | None, **kwargs: Any) -> Trace:
    """``load_trace`` with the options of :func:`add_trace_arguments` (extra kwargs pass through)."""
    return load_trace(
        getattr(args, "trace", None) or "synthetic",
        cluster_gpus=cluster_gpus,
        gpu_type=getattr(args, "trace_gpu_type", None),
        window=getattr(args, "window", None),
        vc=getattr(args, "vc", None),
        status=getattr(args, "status", None),
        max_gpus=getattr(args, "max_gpus_per_job", None),
        load_scale=getattr(args, "load", None),
        sample=getattr(args, "sample", None),
        max_jobs=getattr(args, "max_jobs", None),
        seed=getattr(args, "seed", 0) or 0,
        skip_bad_rows=bool(getattr(args, "skip_bad_rows", False)),
        **kwargs,
    )
