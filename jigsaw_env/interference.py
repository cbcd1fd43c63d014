"""Rates of workers that share one GPU: an interference model fitted to measured co-located pairs.

Two training processes on one GPU run concurrently (the driver interleaves their kernels), and one
job alone rarely saturates a GPU, so two together often do more work than either alone. Gavel
measured this for single-GPU pairs on K80, P100 and V100 (docs/colocation.md). The model here gives
each co-located worker's *normalized rate* ``x`` (its progress per second relative to running
alone, 0 < x <= 1) from features of the workers, never from a per-model constant:

    z(a, b) = c0 + c_peak * log(peak_T)
              + c_t * log(t_a) + c_b * log(B_a)                        (the slowed worker a)
              + d_t * log(t_b) + d_b * log(B_b)                        (its co-runner b)  (eq. I1)
    1 / x_a = 1 + sum over co-runners b of exp(z(a, b))                              (eq. I2)

``t`` is the worker's compute time alone on the GPU in its current SPB phase (seconds: a lighter
backward has a smaller ``t``, so the model follows the job's demand through its SPB cycle), ``B``
its per-worker batch size, ``peak_T`` the GPU type's peak FP32 throughput (TFLOP/s, vendor
datasheets). With one co-runner, eq. I2 is a logistic link on the pair's features; with two or more,
each co-runner adds its own slowdown term (an assumption: Gavel measured pairs only). Two identical
saturating workers at ``z = 0`` get ``x = 1/2`` each, the time-slicing answer; three get ``1/3``.

:func:`concurrent_time` turns rates into the time a GPU takes to finish its workers' compute of
one step: all run at their rates until the first finishes, the rest then run at the rates of the
smaller set, and so on (a fluid model). Under ``timeslice`` sharing the GPU's time is the sum of
its workers' compute (their work adds up), the comparison model kept by name.

Links are shared in both modes: the syncs of a lockstep step start together, and syncs that
cross one link (a node's network interface for a job that spans nodes, a node's intra-node
fabric for one that does not) share its bandwidth, so the step's sync lasts at least the busiest
link's total (:func:`linked_sync_s`, eq. L1).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from importlib.resources import files
from pathlib import Path
from typing import Sequence

import numpy as np

from .digest import file_sha256

#: ways to model workers of different jobs on one GPU: the fitted interference model (default), or
#: pure time-slicing (their work adds up; combined normalized throughput never above 1)
SHARING_MODES = ("fitted", "timeslice")
DEFAULT_SHARING = "fitted"

#: peak FP32 throughput per GPU (TFLOP/s, boost clock), from the vendors' datasheets: Tesla K80 8.73
#: per board of two GK210 GPUs (a job gets one of them), Tesla P100 PCIe 9.3, Tesla V100 SXM2 15.7
GPU_PEAK_TFLOPS = {"k80": 4.37, "p100": 9.3, "v100": 15.7}

#: device types whose co-located workers are time-sliced whatever the sharing mode: a CPU slot's
#: cores run its processes in turn, and no co-located pair was measured there
TIMESLICED_DEVICES = ("cpu",)

#: names of the coefficients of eq. I1, in order
COEF_NAMES = ("intercept", "log_peak", "self_log_time", "self_log_batch", "other_log_time", "other_log_batch")

#: the committed fit, in the package's folder (read through the package, not this module's file:
#: the compiled build of this module lives elsewhere, jigsaw_env/accel.py)
FIT_FILE = Path(str(files("jigsaw_env") / "colocation_fit.json"))


def pair_terms(log_t_a, log_t_b, log_b_a, log_b_b, log_peak) -> tuple:
    """The terms of eq. I1 that :data:`COEF_NAMES` multiply, in their order, for worker ``a``
    slowed by co-runner ``b``: 1, log peak, a's log alone time and log batch, and b's. Scalars or
    numpy arrays (the fit's design matrix and the scheduler's pairing tables use the same terms as
    the engine)."""
    return (1.0, log_peak, log_t_a, log_b_a, log_t_b, log_b_b)


def check_sharing(value: str) -> str:
    """``value`` if it names a sharing mode; else ValueError listing them."""
    if value not in SHARING_MODES:
        raise ValueError(f"sharing must be one of {', '.join(SHARING_MODES)}, got {value!r}")
    return value


@dataclass(frozen=True)
class WorkerLoad:
    """One worker's demand on a GPU for one step: ``alone_s`` seconds of compute alone (> 0) at
    per-worker batch size ``batch_size`` (>= 1)."""

    alone_s: float
    batch_size: int


@dataclass(frozen=True)
class InterferenceModel:
    """Eqs. I1-I2 with coefficients ``coef`` (named by :data:`COEF_NAMES`)."""

    coef: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.coef) != len(COEF_NAMES):
            raise ValueError(f"an interference model needs {len(COEF_NAMES)} coefficients ({', '.join(COEF_NAMES)}), "
                             f"got {len(self.coef)}")

    @staticmethod
    def peak_tflops(gpu_type: str) -> float:
        """Peak FP32 TFLOP/s of ``gpu_type``; ValueError naming the known types otherwise."""
        peak = GPU_PEAK_TFLOPS.get(gpu_type)
        if peak is None:
            raise ValueError(f"the fitted co-location model knows GPU types {', '.join(sorted(GPU_PEAK_TFLOPS))} "
                             f"(and time-slices {', '.join(TIMESLICED_DEVICES)}), not {gpu_type!r}; "
                             f"use sharing 'timeslice' for it")
        return peak

    def log_odds(self, a: WorkerLoad, b: WorkerLoad, gpu_type: str) -> float:
        """z(a, b) of eq. I1: the slowdown term co-runner ``b`` adds to worker ``a``."""
        terms = pair_terms(math.log(a.alone_s), math.log(b.alone_s), math.log(a.batch_size),
                           math.log(b.batch_size), math.log(self.peak_tflops(gpu_type)))
        return self.combine(terms)

    def combine(self, terms: tuple):
        """sum of coefficient x term over eq. I1's terms (:func:`pair_terms`), in their order."""
        z = 0.0
        for c, t in zip(self.coef, terms):
            z = z + c * t
        return z

    def rates(self, loads: Sequence[WorkerLoad], gpu_type: str) -> list[float]:
        """Normalized rate of each of ``loads`` running together on one GPU (eq. I2); 1.0 alone."""
        if len(loads) == 1:
            return [1.0]
        out = []
        for i, a in enumerate(loads):
            s = sum(math.exp(self.log_odds(a, b, gpu_type)) for j, b in enumerate(loads) if j != i)
            out.append(1.0 / (1.0 + s))
        return out


def pair_rates(host_s, guest_s, host_batch: int, guest_batch: int, peak_tflops, model: InterferenceModel):
    """Element-wise (numpy) normalized rates ``(x_host, x_guest)`` of a host worker of ``host_s``
    seconds alone and a guest worker of ``guest_s`` seconds alone (both > 0) computing together on
    one GPU of peak ``peak_tflops`` (broadcast against the times): eqs. I1-I2 for the pair. On a
    time-sliced device (NaN peak) the rates are NaN: the caller decides what time-slicing gives."""
    lh, lg, lp = np.log(host_s), np.log(guest_s), np.log(peak_tflops)
    bh, bg = math.log(host_batch), math.log(guest_batch)
    xh = 1.0 / (1.0 + np.exp(model.combine(pair_terms(lh, lg, bh, bg, lp))))
    xg = 1.0 / (1.0 + np.exp(model.combine(pair_terms(lg, lh, bg, bh, lp))))
    return xh, xg


def shared_gpu_time(host_s, guest_s, host_batch: int, guest_batch: int, peak_tflops, model: InterferenceModel):
    """Element-wise (numpy) GPU time of one step for a host worker of ``host_s`` seconds beside a
    guest worker of ``guest_s`` seconds (0 where a GPU has no guest worker: the host's time), both
    alone times, under ``model``: eqs. I1-I2 for the pair, then the fluid model of
    :func:`concurrent_time` (both at their rates until the first is done, the other then alone).
    ``peak_tflops``: each GPU's peak (broadcast against the loads). The scheduler's pairing search
    uses it; the simulator's engine computes the same numbers one GPU at a time."""
    has_guest = guest_s > 0
    g = np.where(has_guest, guest_s, 1.0)
    xh, xg = pair_rates(host_s, g, host_batch, guest_batch, peak_tflops, model)
    th, tg = host_s / xh, g / xg
    together = np.where(th <= tg, th + (g - xg * th), tg + (host_s - xh * tg))
    # a GPU without a guest worker keeps the host's time; a time-sliced device (NaN peak) the sum
    return np.where(has_guest & np.isfinite(together), together, host_s + guest_s)


def linked_sync_s(syncs: Sequence[float], links: Sequence[frozenset]) -> float:
    """Seconds until every sync of a lockstep step is done when the syncs (seconds each alone)
    start together and those that cross one link share its bandwidth (eq. L1): the longest alone,
    or the busiest link's total, whichever is longer. A sync of 0 s (a one-GPU job) uses no link."""
    longest = max(syncs, default=0.0)
    per_link: dict = {}
    for s, ls in zip(syncs, links):
        if s > 0:
            for link in ls:
                per_link[link] = per_link.get(link, 0.0) + s
    return max(longest, max(per_link.values(), default=0.0))


def concurrent_time(loads: Sequence[WorkerLoad], rates_of) -> float:
    """Seconds until every one of ``loads`` has done its ``alone_s`` of work on one GPU, when the
    workers still running run at ``rates_of(running loads)`` (a list of normalized rates): the
    fluid model of :mod:`jigsaw_env.interference`'s docstring. One worker takes its ``alone_s``."""
    if len(loads) == 1:
        return loads[0].alone_s
    left = [w.alone_s for w in loads]
    active = list(range(len(loads)))
    total = 0.0
    while active:
        rates = rates_of([loads[i] for i in active])
        dt = min(left[i] / r for i, r in zip(active, rates))
        total += dt
        still = []
        for i, r in zip(active, rates):
            left[i] -= r * dt
            if left[i] > 1e-12 * loads[i].alone_s:
                still.append(i)
        if len(still) == len(active):  # rounding kept every worker: the slowest-to-finish is done
            still.remove(min(still, key=lambda i: left[i]))
        active = still
    return total


class SharingModel:
    """What the simulator asks about co-located workers: the time a GPU takes for the compute of
    its workers in one step (seconds), under ``mode`` (:data:`SHARING_MODES`). ``gpu_types``: the
    type of each GPU of the cluster, by GPU id (for :meth:`time_on`). ``pace``: how the
    simulator steps co-located jobs (``jigsaw_env.free_running.PACES``: ``"free"``, eqs. F1-F4, or
    ``"lockstep"``, eqs. K1-K3), which the schedulers' pairing search scores pairs by."""

    def __init__(self, mode: str = DEFAULT_SHARING, gpu_types: Sequence[str] = (),
                 model: InterferenceModel | None = None, gpus_per_node: int | None = None, pace: str = "free"):
        self.mode = check_sharing(mode)
        if pace not in ("free", "lockstep"):
            raise ValueError(f"SharingModel: pace must be 'free' or 'lockstep', got {pace!r}")
        self.pace = pace
        self.model = model if model is not None else (fitted_model() if mode == "fitted" else None)
        self.gpu_types = tuple(gpu_types)
        # GPU g sits on node g // gpus_per_node (one node for every GPU when not given)
        self.gpus_per_node = gpus_per_node or max(1, len(self.gpu_types))
        for t in sorted(set(self.gpu_types)):
            self.check_gpu_type(t)
        self._memo: dict = {}        # gpu_time by (loads, GPU type)
        self._rates_memo: dict = {}  # rates by (loads, GPU type)
        #: the free pace's per-GPU tables of eq. F1 (``free_running``'s state rates), by the alone
        #: loads and batch sizes on a GPU and its type; pure functions of their keys (speed only)
        self.slot_tables: dict = {}

    def check_gpu_type(self, gpu_type: str) -> None:
        """ValueError when the fitted model cannot rate workers on ``gpu_type``."""
        if self.mode == "fitted" and gpu_type not in TIMESLICED_DEVICES:
            self.model.peak_tflops(gpu_type)

    def gpu_type_of(self, gpu: int) -> str:
        return self.gpu_types[gpu]

    def rates(self, loads: Sequence[WorkerLoad], gpu_type: str) -> list[float]:
        """Normalized rates of ``loads`` together on one GPU of ``gpu_type``."""
        if self.mode == "timeslice" or gpu_type in TIMESLICED_DEVICES:
            return [1.0 / len(loads)] * len(loads)
        key = (tuple(loads), gpu_type)
        r = self._rates_memo.get(key)
        if r is None:
            if len(self._rates_memo) > 100_000:
                self._rates_memo.clear()
            r = self._rates_memo[key] = tuple(self.model.rates(loads, gpu_type))
        return list(r)

    def gpu_time(self, loads: Sequence[WorkerLoad], gpu_type: str) -> float:
        """Seconds the GPU computes in a step whose workers on it are ``loads``: their sum when
        time-sliced (the work adds up), else :func:`concurrent_time` under the fitted rates."""
        if self.mode == "timeslice" or gpu_type in TIMESLICED_DEVICES or len(loads) == 1:
            total = 0.0
            for w in loads:
                total += w.alone_s
            return total
        key = (tuple(loads), gpu_type)
        t = self._memo.get(key)
        if t is None:
            if len(self._memo) > 100_000:
                self._memo.clear()
            t = self._memo[key] = concurrent_time(loads, lambda ls: self.rates(ls, gpu_type))
        return t

    @property
    def fitted(self) -> bool:
        """True when co-located workers run at the fitted model's rates (not time-sliced)."""
        return self.mode == "fitted"

    def peaks_of(self, gpus: Sequence[int]):
        """Peak TFLOP/s of each of the cluster's ``gpus`` (a numpy array; NaN on a time-sliced
        device, where :func:`shared_gpu_time` gives the sum)."""
        return np.array([GPU_PEAK_TFLOPS.get(self.gpu_types[g], np.nan) for g in gpus])

    def distinct_peaks(self, gpus: Sequence[int]) -> set:
        """The distinct values of :meth:`peaks_of` (Python floats; NaN for a time-sliced device)."""
        return {GPU_PEAK_TFLOPS.get(self.gpu_types[g], math.nan) for g in gpus}

    def links_of(self, gpus: Sequence[int]) -> frozenset:
        """The links a job on ``gpus`` syncs over (eq. L1): each of its nodes' network interface
        when it spans nodes, else its node's intra-node fabric."""
        nodes = {g // self.gpus_per_node for g in gpus}
        kind = "nic" if len(nodes) > 1 else "fabric"
        return frozenset((kind, n) for n in nodes)

    def node_signature(self, gpus: Sequence[int]) -> tuple[int, ...]:
        """Each of ``gpus``' node, numbered by first appearance (what link sharing depends on)."""
        seen: dict[int, int] = {}
        return tuple(seen.setdefault(g // self.gpus_per_node, len(seen)) for g in gpus)

    def time_on(self, gpu: int, loads: Sequence[WorkerLoad]) -> float:
        """:meth:`gpu_time` on the cluster's GPU ``gpu`` (its type from ``gpu_types``)."""
        return self.gpu_time(loads, self.gpu_types[gpu])


def fit_file_digest(path: Path = FIT_FILE) -> str:
    """SHA-256 (first 16 hex digits) of the committed fit file."""
    return file_sha256(path)[:16]


@lru_cache(maxsize=1)
def fitted_model() -> InterferenceModel:
    """The committed fit (``colocation_fit.json``; ``jigsaw colocation fit`` remakes it)."""
    d = json.loads(FIT_FILE.read_text())
    coef = d.get("coefficients")
    if not isinstance(coef, dict) or set(coef) != set(COEF_NAMES):
        raise ValueError(f"{FIT_FILE}: field 'coefficients' must be an object with keys {', '.join(COEF_NAMES)}")
    return InterferenceModel(tuple(float(coef[n]) for n in COEF_NAMES))
