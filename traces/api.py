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

from jigsaw_env.cli_args import non_negative_int, positive_float, positive_int  # one wording for every command

from . import synthetic
from ._loader import LoaderResult
from .alibaba import load_alibaba2020, load_alibaba2023
from .canonical import load_canonical_csv
from .gavel import load_gavel, map_stand_ins
from .helios import load_helios
from .models import (ZOO_MODELS, BatchSizeFn, ThroughputFn, default_throughput_fn, estimated_durations, fill_iterations,
                     fill_models, model_choices)
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
    """The reference data folder (``JIGSAW_DATA``), else the project's default data folder (an
    empty or blank ``JIGSAW_DATA`` counts as unset). The one place the project resolves it."""
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


def _check_default_file(spec: str, kind: str, path: str) -> None:
    """``KIND:`` with an empty path reads the data folder's default file: when it is missing, say
    where that folder comes from (``JIGSAW_DATA``) and how to name a file instead."""
    if kind in DEFAULT_PATHS and not spec.partition(":")[2].strip() and not Path(path).exists():
        raise FileNotFoundError(f"trace file not found: {path} (the default {kind} trace of the data folder "
                                f"{data_dir()}; set JIGSAW_DATA to the folder holding {DEFAULT_PATHS[kind]}, "
                                f"or give {kind}:PATH)")


def _check_numbers(*, cluster_gpus: int | None, max_gpus: int | None, sample: int | None,
                   max_jobs: int | None, load_scale: float | None, seed: Any,
                   window: tuple[float, float] | None) -> None:
    """Check the numeric options of :func:`load_trace`: counts (GPUs, jobs) >= 1 when given, the
    load a finite number > 0, the seed an integer >= 0, the window (seconds) with its end after
    its start. Raises ValueError naming the argument."""
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


def _status_names(status: Sequence[str] | str | None) -> list[str] | None:
    """The ``status`` filter as lower-case canonical status names (None: no filter). Raises
    ValueError listing the unknown names and the allowed ones."""
    names = _names(status)
    if names is None:
        return None
    names = [s.lower() for s in names]
    unknown = [s for s in names if s not in STATUSES]
    if unknown:
        raise ValueError(f"unknown status {unknown}; allowed: {list(STATUSES)}")
    return names


@dataclass
class _Source:
    """The loaded (or generated) jobs before the filters.

    ``loaded``: the format loader's result. ``load_cluster``: the cluster size (GPUs) the offered
    load is measured against (``cluster_gpus``; for ``synthetic``, the generator's cluster).
    ``target_load``: the offered load to scale to (for ``synthetic``, the generator's target), or
    None. ``path``: the file as shown in the summary and in messages ("" for ``synthetic``).
    ``gpu_cap``: the most GPUs a kept job may ask for (:func:`_gpu_cap`; None: no cap), which the
    generator of a ``synthetic`` trace draws its arrivals for.
    """

    loaded: LoaderResult
    load_cluster: int | None
    target_load: float | None
    path: str
    gpu_cap: int | None


def _generate_synthetic(params_text: str, *, cluster_gpus: int | None, load_scale: float | None,
                        sample: int | None, max_jobs: int | None, seed: int, models: Sequence[str],
                        max_gpus: int | None, cap_to_cluster: bool) -> _Source:
    """Generate a ``synthetic[:k=v,...]`` trace. Parameters in the spec win over the options: its
    ``gpus`` over ``cluster_gpus`` (else 64 GPUs), its ``jobs`` over ``max_jobs``/``sample``, its
    ``seed`` over ``seed``; ``load_scale`` over its ``load`` (the two may not disagree). Drawn
    for the GPU cap :func:`load_trace` applies (``synthetic.generate``'s ``gpu_cap``)."""
    params = synthetic.parse_params(params_text)
    synthetic.check_spec_load(params, load_scale)
    target_load = load_scale if load_scale is not None else params.get("load", synthetic.DEFAULTS["load"])
    load_cluster = params["gpus"] if "gpus" in params else (cluster_gpus or DEFAULT_SYNTHETIC_GPUS)
    n_jobs = params["jobs"] if "jobs" in params else (max_jobs or sample or synthetic.DEFAULTS["jobs"])
    cap = _gpu_cap("synthetic", max_gpus=max_gpus, cluster_gpus=cluster_gpus, load_cluster=load_cluster,
                   cap_to_cluster=cap_to_cluster)
    loaded = synthetic.generate(jobs=n_jobs, load=target_load, seed=params.get("seed", seed), gpus=load_cluster,
                                diurnal=params.get("diurnal", False), start_hour=params.get("start_hour", 0.0),
                                models=params.get("models", tuple(models)), gpu_cap=cap)
    return _Source(loaded=loaded, load_cluster=load_cluster, target_load=target_load, path="", gpu_cap=cap)


def _read_file(kind: str, path: str, *, cluster_gpus: int | None, load_scale: float | None,
               skip_bad_rows: bool, max_gpus: int | None, cap_to_cluster: bool) -> _Source:
    """Read a trace file with its format's loader. Scaling to a load needs ``cluster_gpus``; the
    GPU cap is ``max_gpus`` and the cluster's size (:func:`_gpu_cap`)."""
    if load_scale is not None and cluster_gpus is None:
        raise ValueError("scaling a trace to a load needs the cluster size (cluster_gpus / --gpus)")
    loaded = LOADERS[kind](Path(path).expanduser(), skip_bad_rows=skip_bad_rows)
    cap = _gpu_cap(kind, max_gpus=max_gpus, cluster_gpus=cluster_gpus, load_cluster=cluster_gpus,
                   cap_to_cluster=cap_to_cluster)
    return _Source(loaded=loaded, load_cluster=cluster_gpus, target_load=load_scale, path=loaded.path, gpu_cap=cap)


@dataclass
class _JobTable:
    """The jobs as the filters leave them.

    ``jobs``: the kept rows (index 0..n-1). ``positions``: each kept job's row in the loader's
    table (the seeded model draw is made over that table, so a job's model does not depend on
    the filters). ``filtered``: jobs dropped so far, by reason (the loader's own counts first).
    """

    jobs: pd.DataFrame
    positions: np.ndarray
    filtered: dict[str, int]

    @classmethod
    def of(cls, loaded: LoaderResult) -> "_JobTable":
        """Every job of a loader's result, with the loader's filtered counts."""
        return cls(jobs=loaded.jobs.copy(), positions=np.arange(len(loaded.jobs)), filtered=dict(loaded.filtered))

    def keep(self, mask: np.ndarray, reason: str) -> None:
        """Keep the rows where ``mask`` is true; count the dropped ones under ``reason``."""
        mask = np.asarray(mask, dtype=bool)
        dropped = int((~mask).sum())
        if dropped:
            self.filtered[reason] = self.filtered.get(reason, 0) + dropped
            self.jobs = self.jobs[mask].reset_index(drop=True)
            self.positions = self.positions[mask]


def _filter_by_fields(table: _JobTable, loaded: LoaderResult, kind: str, *, window: tuple[float, float] | None,
                      vc: list[str] | None, status: list[str] | None) -> None:
    """Keep the jobs arriving in ``window`` ([start, end) seconds from the trace start), of the
    virtual clusters ``vc`` and with a final status in ``status`` (each None: no filter). Raises
    ValueError when the format records no virtual cluster / status, or a named one is not in the
    trace."""
    if window is not None:
        a = table.jobs["arrival_s"].to_numpy()
        table.keep((a >= window[0]) & (a < window[1]), "outside_window")
    if vc is not None:
        if not loaded.has_vc:
            raise ValueError(f"{kind} traces have no virtual clusters; --vc does not apply")
        known = set(loaded.jobs["vc"].unique())
        missing = [v for v in vc if v not in known]
        if missing:
            raise ValueError(f"virtual cluster(s) {missing} not in the trace; it has: {sorted(known)[:30]}")
        table.keep(table.jobs["vc"].isin(vc).to_numpy(), "vc_not_selected")
    if status is not None:
        if not loaded.has_status:
            raise ValueError(f"{kind} traces record no job status; --status does not apply")
        table.keep(table.jobs["status"].isin(status).to_numpy(), "status_not_selected")


def _filter_by_count(table: _JobTable, *, sample: int | None, max_jobs: int | None, seed: int) -> None:
    """Keep a seeded random ``sample`` of that many jobs, then the first ``max_jobs`` by arrival
    (each None, or not below the number of jobs: no filter)."""
    if sample is not None and sample < len(table.jobs):
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x73616D706C65]))
        keep = np.zeros(len(table.jobs), dtype=bool)
        keep[rng.choice(len(table.jobs), size=sample, replace=False)] = True
        table.keep(keep, "not_sampled")
    if max_jobs is not None and max_jobs < len(table.jobs):
        table.keep(np.arange(len(table.jobs)) < max_jobs, "beyond_max_jobs")


def _gpu_cap(kind: str, *, max_gpus: int | None, cluster_gpus: int | None, load_cluster: int | None,
             cap_to_cluster: bool) -> int | None:
    """The most GPUs a job may ask for: the smaller of ``max_gpus`` and the cluster size
    (``cluster_gpus``; for ``synthetic`` without it, the generator's cluster). The cluster size
    does not count with ``cap_to_cluster=False``. None: no cap."""
    cap_cluster = cluster_gpus if cluster_gpus is not None else (load_cluster if kind == "synthetic" else None)
    if not cap_to_cluster:
        cap_cluster = None
    caps = [c for c in (max_gpus, cap_cluster) if c is not None]
    return min(caps) if caps else None


def _cap_gpus(jobs: pd.DataFrame, cap: int | None) -> int:
    """Lower ``num_gpus`` above ``cap`` to it (in place); return how many jobs were capped."""
    if cap is None:
        return 0
    over = jobs["num_gpus"].to_numpy() > cap
    capped = int(over.sum())
    if capped:
        jobs.loc[over, "num_gpus"] = cap
    return capped


def _set_gpu_types(jobs: pd.DataFrame, gpu_type: str | None, default_gpu_type: str) -> None:
    """``gpu_type`` for every job when given, else the format's default where a job names none
    (in place)."""
    if gpu_type:
        jobs["gpu_type"] = gpu_type
    else:
        jobs.loc[jobs["gpu_type"] == "", "gpu_type"] = default_gpu_type


@dataclass
class _ModelMapping:
    """What the model mapping did: ``mapped`` jobs given a zoo model, ``computed`` jobs given
    iterations from their duration, and the Gavel ``stand_ins`` used (zoo model -> jobs)."""

    mapped: int = 0
    computed: int = 0
    stand_ins: dict[str, int] = field(default_factory=dict)


def _map_models(table: _JobTable, source: _Source, kind: str, *, seed: int, models: Sequence[str],
                batch_size_fn: BatchSizeFn | None, throughput_fn: ThroughputFn | None) -> _ModelMapping:
    """Give each job a zoo model (a seeded draw over the loader's table; Gavel's models map to
    their stand-ins) and its iterations (duration_s times the throughput, iterations/s). A
    ValueError from the mapping is raised again naming the trace."""
    mapping = _ModelMapping()
    if not len(table.jobs):
        return mapping
    choices = model_choices(len(source.loaded.jobs), seed, models)[table.positions]
    if kind == "gavel":
        table.jobs, mapping.stand_ins = map_stand_ins(table.jobs, data_dir(), f"{kind}:{source.path}")
    try:
        table.jobs, mapping.mapped = fill_models(table.jobs, choices, batch_size_fn)
        table.jobs, mapping.computed = fill_iterations(table.jobs, throughput_fn)
    except ValueError as e:  # name the trace: which file the job came from
        raise ValueError(f"{kind}:{source.path}: {e}" if source.path else f"{kind}: {e}") from None
    return mapping


def _shift_to_zero(jobs: pd.DataFrame) -> float:
    """Shift ``arrival_s`` so the first job arrives at 0 (in place); return the shift (seconds)."""
    offset = float(jobs["arrival_s"].min()) if len(jobs) else 0.0
    jobs["arrival_s"] = jobs["arrival_s"].to_numpy() - offset
    return offset


def _scale_to_load(jobs: pd.DataFrame, source: _Source, kind: str, *, map_models: bool,
                   throughput_fn: ThroughputFn | None) -> dict[str, Any] | None:
    """Scale the arrival times (in place) so the offered load against ``source.load_cluster``
    equals ``source.target_load`` (see :func:`offered_load`); return the summary's ``load``
    entry, or None when there is no target (or no job). Jobs without a duration_s use their
    iterations over the throughput (iterations/s)."""
    if source.target_load is None or not len(jobs):
        return None
    tfn = throughput_fn
    if tfn is None and map_models and jobs["duration_s"].isna().any():
        tfn = default_throughput_fn()
    d = estimated_durations(jobs, tfn)
    if np.isnan(d).any():
        raise ValueError(f"cannot scale to a load: {int(np.isnan(d).sum())} jobs have no duration "
                         "(and no model/throughput to estimate one)")
    before = offered_load(jobs, source.load_cluster, d)
    if not np.isfinite(before) and kind != "synthetic":
        raise ValueError("cannot scale to a load: all kept jobs arrive at the same time")
    factor = before / source.target_load if np.isfinite(before) else 1.0  # one synthetic arrival: nothing to scale
    jobs["arrival_s"] = jobs["arrival_s"].to_numpy() * factor
    return {"target": float(source.target_load), "cluster_gpus": int(source.load_cluster),
            "before_scaling": float(before), "arrival_scale": float(factor)}


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
    (``map_models``); arrival_s shifted so the first kept job arrives at 0 (``time_offset_s``,
    seconds before scaling); ``load_scale`` (arrival times scaled so the offered load against
    ``cluster_gpus`` equals it; for ``synthetic`` it is the generator's target load).

    Extra keywords: ``throughput_fn(model, batch_size, num_gpus, gpu_type) -> iterations/s``
    (default ``jigsaw_env.spb.isolated_throughput``), ``batch_size_fn(model) -> int`` (default
    ``jigsaw_env.cost_table.default_batch_size``), ``models`` (the mapping's zoo), and
    ``cap_to_cluster=False`` to leave GPU counts above ``cluster_gpus`` as they are (describe).
    """
    kind, rest = parse_spec(spec)
    _check_default_file(spec, kind, rest)
    _check_numbers(cluster_gpus=cluster_gpus, max_gpus=max_gpus, sample=sample, max_jobs=max_jobs,
                   load_scale=load_scale, seed=seed, window=window)
    vc = _names(vc)
    status = _status_names(status)

    if kind == "synthetic":
        source = _generate_synthetic(rest, cluster_gpus=cluster_gpus, load_scale=load_scale, sample=sample,
                                     max_jobs=max_jobs, seed=seed, models=models, max_gpus=max_gpus,
                                     cap_to_cluster=cap_to_cluster)
    else:
        source = _read_file(kind, rest, cluster_gpus=cluster_gpus, load_scale=load_scale,
                            skip_bad_rows=skip_bad_rows, max_gpus=max_gpus, cap_to_cluster=cap_to_cluster)
    loaded = source.loaded

    table = _JobTable.of(loaded)
    _filter_by_fields(table, loaded, kind, window=window, vc=vc, status=status)
    _filter_by_count(table, sample=sample, max_jobs=max_jobs, seed=seed)
    cap = source.gpu_cap
    capped = _cap_gpus(table.jobs, cap)
    _set_gpu_types(table.jobs, gpu_type, loaded.default_gpu_type)
    mapping = _ModelMapping()
    if map_models:
        mapping = _map_models(table, source, kind, seed=seed, models=models, batch_size_fn=batch_size_fn,
                              throughput_fn=throughput_fn)
    offset = _shift_to_zero(table.jobs)
    load_info = _scale_to_load(table.jobs, source, kind, map_models=map_models, throughput_fn=throughput_fn)

    jobs = validate_jobs(table.jobs, origin=f"{kind}:{source.path}" if source.path else kind)
    summary = {
        "source": spec,
        "kind": kind,
        "path": source.path,
        "rows_read": loaded.rows_read,
        "bad_rows_skipped": dict(loaded.bad_rows),
        "bad_row_examples": list(loaded.bad_row_examples),
        "jobs_read": loaded.jobs_read,
        "filtered": table.filtered,
        "kept": len(jobs),
        "gpu_cap": cap,
        "capped_gpus": capped,
        "gpu_type": gpu_type or loaded.default_gpu_type,
        "models_mapped": mapping.mapped,
        "gavel_stand_ins": mapping.stand_ins,
        "iterations_computed": mapping.computed,
        "load": load_info,
        "time_offset_s": offset,
        "trace_start": loaded.trace_start,
        "seed": seed,
        "notes": loaded.notes,
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
