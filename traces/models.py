"""Giving trace jobs a zoo model and a number of iterations.

Rule (Gavel's practice, ``scheduler/utils.py``: a job template drawn uniformly at random from
the job table; the trace's GPU count is the job's scale factor):

* a job without a model gets one drawn uniformly at random from :data:`ZOO_MODELS`, seeded; the
  draw for a job depends only on the seed and the job's position in the loaded file, so a subset
  (``--max-jobs``, ``--sample``) keeps the same model for each job;
* its batch size is the model's default (``jigsaw_env.cost_table.default_batch_size``);
* its GPU count stays the trace's (the scale factor);
* a job with a model and a duration but no iterations gets
  ``iterations = round(duration_s * throughput(model, batch_size, num_gpus, gpu_type))`` (at
  least 1), with ``throughput`` the model's isolated throughput (iterations/s) on the trace's GPU
  type (``jigsaw_env.spb.isolated_throughput`` by default), so the job alone on its GPUs runs
  exactly as long as it ran in the original cluster;
* iterations already in the trace are kept; ``duration_s`` always stays the original one.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import pandas as pd

from jigsaw_env.cost_table import default_batch_size
from jigsaw_env.spb import isolated_throughput

ZOO_MODELS: tuple[str, ...] = ("resnet18", "resnet50", "vgg16", "bert_base", "transformer_small",
                               "lstm_lm", "recommendation")

ThroughputFn = Callable[[str, int, int, str], float]
BatchSizeFn = Callable[[str], int]


def default_throughput_fn() -> ThroughputFn:
    """``jigsaw_env.spb.isolated_throughput``."""
    return isolated_throughput


def default_batch_size_fn() -> BatchSizeFn:
    """``jigsaw_env.cost_table.default_batch_size``."""
    return default_batch_size


def model_choices(n: int, seed: int, models: Sequence[str] = ZOO_MODELS) -> np.ndarray:
    """The seeded uniform model draw for jobs 0..n-1 of a loaded file (object array of names)."""
    if not models:
        raise ValueError("model mapping needs at least one zoo model")
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x6D6F64656C]))
    return np.asarray(models, dtype=object)[rng.integers(len(models), size=n)]


def fill_models(df: pd.DataFrame, choices: np.ndarray, batch_size_fn: BatchSizeFn | None = None) -> tuple[pd.DataFrame, int]:
    """Give each model-less job its drawn model (``choices`` aligned with ``df``'s rows) and
    every job with a model but no batch size the model's default. Returns (df, jobs mapped)."""
    df = df.copy()
    need = (df["model"] == "").to_numpy()
    if need.any():
        df.loc[need, "model"] = np.asarray(choices, dtype=object)[need]
    need_bs = (df["model"] != "").to_numpy() & df["batch_size"].isna().to_numpy()
    fill_default_batch_sizes(df, need_bs, batch_size_fn)
    return df, int(need.sum())


def fill_default_batch_sizes(df: pd.DataFrame, rows: np.ndarray, batch_size_fn: BatchSizeFn | None = None,
                             where: str = "") -> None:
    """Set ``batch_size`` of the ``rows`` (a boolean mask) of ``df``, in place, to their model's
    default (``batch_size_fn``, default :func:`default_batch_size_fn`); ``where`` prefixes the
    error naming a model without one."""
    if not rows.any():
        return
    fn = batch_size_fn or default_batch_size_fn()
    sizes = {}
    for m in pd.unique(df.loc[rows, "model"]):
        try:
            sizes[m] = int(fn(m))
        except Exception as e:  # noqa: BLE001 -- say which model
            raise ValueError(f"{where}no default batch size for model {m!r}: {e}") from None
    df.loc[rows, "batch_size"] = df.loc[rows, "model"].map(sizes).astype("Int64")


def _throughputs(df: pd.DataFrame, rows: np.ndarray, fn: ThroughputFn) -> np.ndarray:
    """Isolated throughput of each row in ``rows``: one call of ``fn`` per distinct job shape."""
    sub = df.loc[rows, ["model", "batch_size", "num_gpus", "gpu_type"]].reset_index(drop=True)
    ids = df.loc[rows, "job_id"].to_numpy() if "job_id" in df.columns else np.arange(len(sub))
    group = sub.groupby(["model", "batch_size", "num_gpus", "gpu_type"], sort=False, dropna=False).ngroup().to_numpy()
    first = sub.drop_duplicates(["model", "batch_size", "num_gpus", "gpu_type"])
    uniq = np.empty(len(first))
    for gi, pos, (m, bs, g, gt) in zip(group[first.index.to_numpy()], first.index.to_numpy(),
                                       first.itertuples(index=False, name=None)):
        who = f"job_id {ids[pos]}: "  # the first job of this shape
        try:
            tp = float(fn(m, int(bs), int(g), gt))
        except Exception as e:  # noqa: BLE001 -- say which job shape
            raise ValueError(f"{who}throughput of model {m!r} (batch {bs}, {g} GPUs, {gt}) unavailable: {e}") from None
        if not np.isfinite(tp) or tp <= 0:
            raise ValueError(f"{who}throughput of model {m!r} (batch {bs}, {g} GPUs, {gt}) must be > 0, got {tp}")
        uniq[gi] = tp
    return uniq[group]


def fill_iterations(df: pd.DataFrame, throughput_fn: ThroughputFn | None = None) -> tuple[pd.DataFrame, int]:
    """iterations = round(duration_s * isolated throughput), at least 1, for jobs with a model and
    a duration but no iterations. Returns (df, jobs filled)."""
    need = ((df["model"] != "").to_numpy() & df["iterations"].isna().to_numpy()
            & df["duration_s"].notna().to_numpy() & df["batch_size"].notna().to_numpy())
    if not need.any():
        return df, 0
    fn = throughput_fn or default_throughput_fn()
    df = df.copy()
    rows = np.flatnonzero(need)
    tp = _throughputs(df, df.index[rows], fn)
    it = np.maximum(1.0, np.round(df["duration_s"].to_numpy()[rows] * tp))
    col = df["iterations"].to_numpy(dtype=np.float64).copy()
    col[rows] = it
    df["iterations"] = col
    return df, int(rows.size)


def estimated_durations(df: pd.DataFrame, throughput_fn: ThroughputFn | None = None) -> np.ndarray:
    """duration_s, with iterations / isolated throughput where duration_s is missing and the job
    has a model (NaN where neither is possible). ``throughput_fn=None`` leaves them NaN."""
    d = df["duration_s"].to_numpy(dtype=np.float64).copy()
    need = np.isnan(d) & (df["model"] != "").to_numpy() & df["iterations"].notna().to_numpy() \
        & df["batch_size"].notna().to_numpy()
    if need.any() and throughput_fn is not None:
        rows = np.flatnonzero(need)
        d[rows] = df["iterations"].to_numpy()[rows] / _throughputs(df, df.index[rows], throughput_fn)
    return d
