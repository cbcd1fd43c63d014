"""The synthetic trace generator, fitted to the Philly trace (numbers in :mod:`traces._philly_fit`).

``synthetic:jobs=500,load=1.0,seed=0`` -- every parameter optional:

=============  ==========  =====================================================================
parameter      default     meaning
=============  ==========  =====================================================================
jobs           500         number of jobs (``--max-jobs``/``--sample`` when given and jobs is not)
load           1.0         offered load against ``gpus`` (``--load`` when given)
seed           --seed      random seed
gpus           64          cluster size the load refers to (the command's cluster size if given)
diurnal        0           1: arrival rate follows Philly's hour-of-day profile
start_hour     0           hour of day at t = 0 (diurnal only)
models         the zoo     model mix, '+'-separated (uniform over these)
=============  ==========  =====================================================================

How a trace is drawn (docs/traces.md has the fitted numbers):

1. GPU counts: i.i.d. from Philly's GPU-count shares.
2. Durations: for each job, inverse-CDF sampling from the Philly duration quantile table of its
   GPU-count bucket (1, 2-4, 5-8, >8), interpolating log-linearly between the tabulated
   quantiles, rounded to whole seconds (the trace's resolution), at least 1 s.
3. Arrivals: a Poisson process conditioned on its span: the first job at 0, the last at
   ``S = sum(num_gpus * duration_s) / (gpus * load)``, the others i.i.d. on [0, S] with density
   proportional to the arrival rate (uniform; or Philly's hourly profile with ``diurnal=1``), so
   the trace's offered load is exactly ``load``.
4. Models: uniform over the zoo (Gavel's practice), default batch sizes filled by the mapping step.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from . import _philly_fit as FIT
from ._loader import LoaderResult, build_jobs
from .models import ZOO_MODELS
from .philly import PHILLY_GPU_TYPE
from .schema import BadRows

DEFAULTS: dict[str, Any] = {"jobs": 500, "load": 1.0, "seed": 0, "gpus": 64, "diurnal": False,
                            "start_hour": 0.0, "models": ZOO_MODELS}
PARAMS = tuple(DEFAULTS)


def parse_params(text: str) -> dict[str, Any]:
    """"jobs=500,load=1.0,seed=0" -> typed dict (only the keys given). ValueError on bad input."""
    out: dict[str, Any] = {}
    seen: dict[str, str] = {}
    if not text.strip():
        return out
    for part in text.split(","):
        if not part.strip():
            continue
        if "=" not in part:
            raise ValueError(f"synthetic: expected key=value, got {part!r}; keys: {list(PARAMS)}")
        k, v = (x.strip() for x in part.split("=", 1))
        if k not in DEFAULTS:
            raise ValueError(f"synthetic: unknown parameter {k!r}; allowed: {list(PARAMS)}")
        if k in seen:
            raise ValueError(f"synthetic: parameter {k!r} given twice ({k}={seen[k]} and {k}={v}); give it once")
        seen[k] = v
        try:
            if k in ("jobs", "seed", "gpus"):
                out[k] = int(v)
            elif k in ("load", "start_hour"):
                out[k] = float(v)
            elif k == "diurnal":
                if v.lower() not in ("0", "1", "true", "false", "yes", "no"):
                    raise ValueError(v)
                out[k] = v.lower() in ("1", "true", "yes")
            else:
                out[k] = tuple(m.strip() for m in v.split("+") if m.strip())
        except ValueError:
            raise ValueError(f"synthetic: bad value for {k}: {v!r}") from None
        _check_value(k, out[k])
    return out


def check_spec_load(params: dict, load: Any, source: str = "the option") -> None:
    """ValueError when a spec's ``load=`` (in ``params``, :func:`parse_params`'s result) and a
    ``load`` given beside it (``source`` names it; shown as given) disagree; either alone is fine."""
    if "load" in params and load is not None and not math.isclose(params["load"], float(load)):
        raise ValueError(f"conflicting loads: the spec says load={params['load']}, {source} says {load}")


def _check_value(key: str, value: Any) -> None:
    """ValueError naming the parameter for values no trace can be drawn with (the checks that do
    not depend on other parameters; :func:`generate` repeats them for direct calls)."""
    if key == "seed" and value < 0:
        raise ValueError(f"synthetic: seed must be >= 0, got {value}")
    if key == "load" and not (value > 0 and math.isfinite(value)):
        raise ValueError(f"synthetic: load must be a finite number > 0, got {value}")
    if key == "start_hour" and not math.isfinite(value):
        raise ValueError(f"synthetic: start_hour must be a finite number, got {value}")


def _bucket_index(g: np.ndarray) -> np.ndarray:
    idx = np.zeros(g.shape, dtype=np.int64)
    for i, (_, lo, hi) in enumerate(FIT.DURATION_BUCKETS):
        idx[(g >= lo) & (g <= hi)] = i
    return idx


def sample_durations(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Durations (whole seconds, >= 1) for GPU counts ``g`` from uniforms ``u`` in [0, 1)."""
    out = np.empty(g.shape)
    b = _bucket_index(g)
    for i, (name, _, _) in enumerate(FIT.DURATION_BUCKETS):
        sel = b == i
        if not sel.any():
            continue
        lv = np.log(np.maximum(np.asarray(FIT.DURATION_QUANTILES[name]["values"], dtype=np.float64), 1.0))
        k = lv.size - 1
        x = u[sel] * k
        j = np.minimum(np.floor(x).astype(np.int64), k - 1)
        f = x - j
        out[sel] = np.exp(lv[j] * (1.0 - f) + lv[j + 1] * f)
    return np.maximum(1.0, np.round(out))


def _hourly_rate() -> np.ndarray:
    share = np.asarray(FIT.HOURLY_SHARE, dtype=np.float64)
    return share / share.mean()


def _diurnal_points(u: np.ndarray, span: float, start_hour: float) -> np.ndarray:
    """Points on [0, span] with density proportional to the hourly rate (inverse cumulative rate)."""
    rate = _hourly_rate()
    edges_t = np.arange(25) * 3600.0
    edges_c = np.concatenate([[0.0], np.cumsum(rate * 3600.0)])
    day_c = edges_c[-1]

    def cum(tau):
        d = np.floor(tau / 86400.0)
        return d * day_c + np.interp(tau - d * 86400.0, edges_t, edges_c)

    def inv(c):
        d = np.floor(c / day_c)
        return d * 86400.0 + np.interp(c - d * day_c, edges_c, edges_t)

    t0 = (start_hour % 24.0) * 3600.0
    c0, c1 = cum(np.float64(t0)), cum(np.float64(t0 + span))
    return np.clip(inv(c0 + u * (c1 - c0)) - t0, 0.0, span)


def generate(jobs: int = 500, load: float = 1.0, seed: int = 0, gpus: int = 64, diurnal: bool = False,
             start_hour: float = 0.0, models: Sequence[str] = ZOO_MODELS, gpu_cap: int | None = None) -> LoaderResult:
    """Draw a synthetic trace (see the module docstring). Returns a loader result (canonical jobs).

    ``gpu_cap``: the GPU count jobs will be capped to (``traces.load_trace`` caps them at the
    cluster size). The span ``S`` is computed from the capped counts, so the capped trace's
    offered load is ``load`` as drawn and its arrivals need no rescaling, which would move a
    diurnal trace's arrivals off its hours of the day. The returned counts are not capped."""
    if jobs < 1:
        raise ValueError(f"synthetic: jobs must be >= 1, got {jobs}")
    _check_value("load", load)
    if gpus < 1:
        raise ValueError(f"synthetic: gpus must be >= 1, got {gpus}")
    _check_value("seed", seed)
    _check_value("start_hour", start_hour)
    if not models:
        raise ValueError("synthetic: models must name at least one model")
    ss = np.random.SeedSequence([int(seed), 0x5359]).spawn(4)
    r_gpu, r_dur, r_arr, r_mod = (np.random.default_rng(s) for s in ss)
    values = np.asarray(sorted(FIT.GPU_COUNTS), dtype=np.int64)
    counts = np.asarray([FIT.GPU_COUNTS[v] for v in values], dtype=np.float64)
    g = r_gpu.choice(values, size=jobs, p=counts / counts.sum())
    d = sample_durations(g, r_dur.random(jobs))
    g_load = g if gpu_cap is None else np.minimum(g, gpu_cap)
    span = float(np.sum(g_load * d)) / (gpus * load)
    if jobs == 1:
        arrival = np.zeros(1)
    else:
        u = r_arr.random(jobs - 2)
        inner = _diurnal_points(u, span, start_hour) if diurnal else u * span
        arrival = np.concatenate([[0.0], np.sort(inner), [span]])
    model = np.asarray(models, dtype=object)[r_mod.integers(len(models), size=jobs)]
    bad = BadRows("synthetic")
    params = {"jobs": jobs, "load": load, "seed": seed, "gpus": gpus, "diurnal": diurnal,
              "start_hour": start_hour, "models": list(models)}
    return build_jobs("synthetic", "", bad, rows_read=jobs, arrival=arrival, num_gpus=g, duration_s=d,
                      model=model, clock="trace", default_gpu_type=PHILLY_GPU_TYPE,
                      notes={"synthetic": params, "fitted_to": FIT.SOURCE})
