"""Job traces -> one canonical job table (docs/traces.md).

Public API::

    load_trace(spec, *, cluster_gpus=None, gpu_type=None, window=None, vc=None, status=None,
               max_gpus=None, load_scale=None, sample=None, max_jobs=None, seed=0,
               map_models=True, skip_bad_rows=False, throughput_fn=None, batch_size_fn=None) -> Trace
    validate_jobs(df, origin) -> df          # the one validation every loader's output goes through
    to_canonical_csv(df, path)               # readable back with "csv:PATH"
    add_trace_arguments(parser); trace_from_args(args, cluster_gpus) -> Trace
    data_dir() -> Path                       # the data folder (JIGSAW_DATA)

Specs: ``philly:PATH``, ``philly-json:PATH``, ``alibaba2020:PATH``, ``alibaba2023:PATH``,
``helios:PATH``, ``gavel:PATH``, ``csv:PATH``, ``synthetic[:jobs=N,load=X,seed=S,...]``.
"""
from __future__ import annotations

from .api import (KINDS, LOADERS, Trace, add_trace_arguments, data_dir, load_trace, offered_load,
                  parse_spec, parse_window, trace_from_args)
from .models import ZOO_MODELS
from .schema import (CANONICAL_COLUMNS, SOURCE_PREFIXES, STATUSES, TraceFormatError, canonical_csv_bytes,
                     digest_of, to_canonical_csv, validate_jobs)

__all__ = [
    "CANONICAL_COLUMNS", "KINDS", "LOADERS", "SOURCE_PREFIXES", "STATUSES", "Trace", "TraceFormatError",
    "ZOO_MODELS", "add_trace_arguments", "canonical_csv_bytes", "data_dir", "digest_of", "load_trace",
    "offered_load", "parse_spec", "parse_window", "to_canonical_csv", "trace_from_args", "validate_jobs",
]
