"""Fitting and validating the co-location interference model (eqs. I1-I2 of
:mod:`jigsaw_env.interference`) on Gavel's measured single-GPU pairs.

Data: ``gavel/simulation_throughputs.json`` in the data folder (``JIGSAW_DATA``): per GPU type, per
job ``"('<job> (batch size B)', 1)"``, the throughput alone (``"null"``, iterations/s) and, per
co-located job, ``[rate_self, rate_other]`` (iterations/s). A ``[0, 0]`` entry means "not measured
or infeasible" and is left out. Each unordered pair counts once (the first of its two entries in
the file's order). Only the job types that stand behind a zoo model are used
(:data:`ZOO_GAVEL_JOBS`), and only scale factor 1 (one GPU each).

Split: the fit uses K80 and V100 pairs only; P100 pairs are never fitted on, and the form of the
model was chosen by cross-validation on K80 and V100 pairs alone (leave-one-GPU-type-out and
leave-one-model-out: ``tools/colocation_form_search.py``, docs/colocation.md). The features
of a job are its alone iteration time (1 / Gavel's alone throughput: what the cost tables are
anchored to), its batch size and the GPU type's peak throughput.

Fit: least squares on every job's normalized rate (soft-L1 loss, scale 0.1, ridge 0.01 on all but
the intercept), scipy's ``least_squares`` from zeros: deterministic, so refitting the same data
gives the same coefficients (tests/sim/test_colocation.py holds the committed file to it).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from traces.api import data_dir

from .digest import file_sha256
from .interference import COEF_NAMES, FIT_FILE, InterferenceModel, WorkerLoad, fitted_model, pair_terms

GAVEL_FILE = "gavel/simulation_throughputs.json"
#: Gavel job types with a zoo stand-in (jigsaw_env.zoo: each model's ``gavel_job``)
ZOO_GAVEL_JOBS = ("ResNet-18", "ResNet-50", "Transformer", "LM", "Recommendation")
FIT_GPU_TYPES = ("k80", "v100")
VALIDATION_GPU_TYPE = "p100"
LOSS_SCALE = 0.1
RIDGE = 0.01

_KEY = re.compile(r"\('(.+?)(?: \(batch size (\d+)\))?', (\d+)\)")


@dataclass(frozen=True)
class MeasuredPair:
    """One measured pair on one GPU: jobs ``a`` and ``b`` (Gavel job type, batch size), their
    alone throughputs and co-located throughputs (iterations/s)."""

    gpu_type: str
    job_a: str
    batch_a: int
    job_b: str
    batch_b: int
    alone_a: float
    alone_b: float
    together_a: float
    together_b: float

    @property
    def rate_a(self) -> float:
        """a's normalized rate: together / alone."""
        return self.together_a / self.alone_a

    @property
    def rate_b(self) -> float:
        return self.together_b / self.alone_b

    @property
    def combined(self) -> float:
        """Combined normalized throughput rate_a + rate_b (1 = no gain over running one at a time)."""
        return self.rate_a + self.rate_b

    def loads(self) -> tuple[WorkerLoad, WorkerLoad]:
        """The pair's workers as the model sees them (alone iteration time, batch size)."""
        return WorkerLoad(1.0 / self.alone_a, self.batch_a), WorkerLoad(1.0 / self.alone_b, self.batch_b)


def gavel_path(data: str | Path | None = None) -> Path:
    """Gavel's throughput file under ``data`` (default: the data folder, ``JIGSAW_DATA``)."""
    if data is None:
        data = data_dir()
    return Path(data) / GAVEL_FILE


def _parse_key(key: str, where: str) -> tuple[str, int | None, int]:
    m = _KEY.fullmatch(key)
    if m is None:
        raise ValueError(f"{where}: key {key!r} is not of the form \"('<job> (batch size N)', <scale factor>)\"")
    return m.group(1), (int(m.group(2)) if m.group(2) else None), int(m.group(3))


def load_pairs(path: str | Path | None = None, jobs: tuple[str, ...] = ZOO_GAVEL_JOBS) -> list[MeasuredPair]:
    """Every measured single-GPU pair of ``jobs`` on K80, P100 and V100 in Gavel's file."""
    p = Path(path) if path is not None else gavel_path()
    if not p.exists():
        raise FileNotFoundError(f"Gavel throughputs not found at {p}; set JIGSAW_DATA to the data folder "
                                f"(it must contain {GAVEL_FILE})")
    data = json.loads(p.read_text())
    pairs: list[MeasuredPair] = []
    for gpu in ("k80", "p100", "v100"):
        entries = data.get(gpu)
        if not isinstance(entries, dict):
            raise ValueError(f"{p}: no GPU type {gpu!r} (expected keys k80, p100, v100)")
        alone: dict[tuple[str, int], float] = {}
        for key, v in entries.items():
            job, bs, sf = _parse_key(key, f"{p} [{gpu!r}]")
            if sf == 1 and bs is not None and job in jobs and v.get("null"):
                alone[(job, bs)] = float(v["null"])
        seen: set = set()
        for key, v in entries.items():
            job, bs, sf = _parse_key(key, f"{p} [{gpu!r}]")
            if (job, bs) not in alone or sf != 1:
                continue
            for other, rates in v.items():
                if other == "null":
                    continue
                job2, bs2, sf2 = _parse_key(other, f"{p} [{gpu!r}][{key!r}]")
                if sf2 != 1 or (job2, bs2) not in alone:
                    continue
                if not (isinstance(rates, list) and len(rates) == 2):
                    raise ValueError(f"{p} [{gpu!r}][{key!r}][{other!r}]: expected [rate_self, rate_other], got {rates!r}")
                if rates[0] == 0 and rates[1] == 0:
                    continue  # not measured or infeasible, never zero speed
                ident = (gpu,) + tuple(sorted([(job, bs), (job2, bs2)]))
                if ident in seen:
                    continue
                seen.add(ident)
                pairs.append(MeasuredPair(gpu, job, bs, job2, bs2, alone[(job, bs)], alone[(job2, bs2)],
                                          float(rates[0]), float(rates[1])))
    return pairs


def data_digest(path: str | Path | None = None) -> str:
    """SHA-256 (first 16 hex digits) of Gavel's file, as the fit records it."""
    p = Path(path) if path is not None else gavel_path()
    return file_sha256(p)[:16]


# ----- the fit
def _design(pairs: list[MeasuredPair]) -> tuple[np.ndarray, np.ndarray]:
    """Feature rows of eq. I1 for (a slowed by b) and (b slowed by a), one row per pair."""
    def rows(first: bool) -> np.ndarray:
        out = []
        for p in pairs:
            a, b = p.loads() if first else p.loads()[::-1]
            out.append(pair_terms(np.log(a.alone_s), np.log(b.alone_s), np.log(a.batch_size), np.log(b.batch_size),
                                  np.log(InterferenceModel.peak_tflops(p.gpu_type))))
        return np.array(out, dtype=np.float64)
    return rows(True), rows(False)


def fit(pairs: list[MeasuredPair]) -> InterferenceModel:
    """Least-squares fit of eqs. I1-I2 to the pairs' normalized rates (the module docstring's
    settings)."""
    from scipy.optimize import least_squares
    if not pairs:
        raise ValueError("no measured pairs to fit on")
    da, db = _design(pairs)
    xa = np.array([p.rate_a for p in pairs])
    xb = np.array([p.rate_b for p in pairs])

    def residuals(c: np.ndarray) -> np.ndarray:
        pa = 1.0 / (1.0 + np.exp(da @ c))
        pb = 1.0 / (1.0 + np.exp(db @ c))
        return np.concatenate([pa - xa, pb - xb, RIDGE * c[1:]])

    sol = least_squares(residuals, np.zeros(len(COEF_NAMES)), loss="soft_l1", f_scale=LOSS_SCALE)
    return InterferenceModel(tuple(float(v) for v in sol.x))


def fit_pairs(pairs: list[MeasuredPair]) -> list[MeasuredPair]:
    """The pairs the committed model is fitted on (K80 and V100)."""
    return [p for p in pairs if p.gpu_type in FIT_GPU_TYPES]


def fit_record(path: str | Path | None = None) -> dict:
    """The fit as ``colocation_fit.json`` holds it: coefficients, data digest, settings, counts."""
    pairs = load_pairs(path)
    train = fit_pairs(pairs)
    model = fit(train)
    return {
        "model": "eqs. I1-I2 of jigsaw_env/interference.py (docs/colocation.md)",
        "coefficients": dict(zip(COEF_NAMES, model.coef)),
        "data": {"file": GAVEL_FILE, "sha256_16": data_digest(path), "jobs": list(ZOO_GAVEL_JOBS),
                 "fit_gpu_types": list(FIT_GPU_TYPES), "pairs": len(train)},
        "settings": {"loss": "soft_l1", "f_scale": LOSS_SCALE, "ridge": RIDGE, "start": "zeros"},
        "command": "jigsaw colocation fit",
    }


def write_fit(path: str | Path | None = None, out: Path = FIT_FILE) -> dict:
    rec = fit_record(path)
    out.write_text(json.dumps(rec, indent=2) + "\n")
    return rec


# ----- validation
@dataclass(frozen=True)
class SplitError:
    """Errors of one validation split: absolute errors of the combined normalized throughput and of
    each job's normalized rate (median, p90), the best constant predictor's median error (the
    split's own median combined throughput, a number the model cannot know), and time-slicing's
    (combined throughput 1 for every pair)."""

    split: str
    gpu_type: str
    pairs: int
    median_combined: float
    combined_median_err: float
    combined_p90_err: float
    rate_median_err: float
    rate_p90_err: float
    constant_median_err: float
    timeslice_median_err: float

    @property
    def target(self) -> float:
        """The bar: two thirds of the constant predictor's median error."""
        return 2.0 / 3.0 * self.constant_median_err

    @property
    def meets_target(self) -> bool:
        return self.combined_median_err <= self.target

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d.update(target=self.target, meets_target=self.meets_target)
        return d


def predict_pair(model: InterferenceModel, p: MeasuredPair) -> tuple[float, float]:
    a, b = p.loads()
    ra, rb = model.rates([a, b], p.gpu_type)
    return ra, rb


def split_error(model: InterferenceModel, pairs: list[MeasuredPair], split: str, gpu_type: str) -> SplitError:
    pred = np.array([predict_pair(model, p) for p in pairs])
    meas = np.array([[p.rate_a, p.rate_b] for p in pairs])
    comb = meas.sum(axis=1)
    ce = np.abs(pred.sum(axis=1) - comb)
    re_ = np.abs(pred - meas).ravel()
    return SplitError(split, gpu_type, len(pairs), float(np.median(comb)), float(np.median(ce)),
                      float(np.percentile(ce, 90)), float(np.median(re_)), float(np.percentile(re_, 90)),
                      float(np.median(np.abs(comb - np.median(comb)))), float(np.median(np.abs(comb - 1.0))))


def validate(path: str | Path | None = None, model: InterferenceModel | None = None) -> list[SplitError]:
    """The validation table: P100 (never fitted on), leave-one-model-out on V100 (refit without
    the model's pairs, tested on its V100 pairs), and the fit's own K80 and V100 pairs."""
    pairs = load_pairs(path)
    model = model or fitted_model()
    out = [split_error(model, [p for p in pairs if p.gpu_type == VALIDATION_GPU_TYPE], "held-out GPU type", "p100")]
    train = fit_pairs(pairs)
    for job in ZOO_GAVEL_JOBS:
        rest = [p for p in train if job not in (p.job_a, p.job_b)]
        held = [p for p in train if p.gpu_type == "v100" and job in (p.job_a, p.job_b)]
        out.append(split_error(fit(rest), held, f"leave out {job}", "v100"))
    for gpu in FIT_GPU_TYPES:
        out.append(split_error(model, [p for p in train if p.gpu_type == gpu], "fitted on (in sample)", gpu))
    return out
