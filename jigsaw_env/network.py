"""Alpha-beta link model and collective-communication times (docs/spb_model.md, section 4).

A link is ``(alpha_s, bandwidth_Bps)``: sending ``m`` bytes over it takes ``alpha_s + m / bandwidth``.
A job whose workers all sit on one node talks over the intra-node link, otherwise over the
cross-node link (the slower link bounds a ring and a star alike).

Default constants are fitted to the Pollux sync-time measurements
(``pollux-profiles/{cifar10,imagenet,bert}/placements.csv``, column ``sync_time``, median per
placement) by non-negative least squares on the ring all-reduce formula; see
:func:`fit_pollux_alpha_beta`, which reproduces them. The fit puts alpha at 0; we use small assumed
latencies instead (an alpha of exactly 0 would make tiny tensors free).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .jsonfile import read_json_file


@dataclass(frozen=True)
class Link:
    """One link class. ``alpha_s``: per-message latency (s); ``bandwidth_Bps``: bytes per second."""

    alpha_s: float
    bandwidth_Bps: float

    def __post_init__(self) -> None:
        if not (self.alpha_s >= 0 and np.isfinite(self.alpha_s)):
            raise ValueError(f"link alpha_s must be a finite number >= 0, got {self.alpha_s!r}")
        if not (self.bandwidth_Bps > 0 and np.isfinite(self.bandwidth_Bps)):
            raise ValueError(f"link bandwidth_Bps must be a finite number > 0, got {self.bandwidth_Bps!r}")

    def send_s(self, nbytes: float) -> float:
        return self.alpha_s + nbytes / self.bandwidth_Bps


# Fitted with fit_pollux_alpha_beta() on pollux-profiles (see module docstring): 7.67 GB/s within a
# node and 0.818 GB/s across nodes. Latencies are assumed (the fit gives 0).
INTRA_NODE = Link(alpha_s=10e-6, bandwidth_Bps=7.67e9)
CROSS_NODE = Link(alpha_s=50e-6, bandwidth_Bps=0.818e9)

RING = "ring"
REDUCE_BROADCAST = "reduce_broadcast"
NONE = "none"


def ring_allreduce_s(world: int, nbytes: float, link: Link) -> float:
    """Ring all-reduce of ``nbytes`` over ``world`` ranks: ``2(W-1) (alpha + M/(W beta))`` seconds."""
    if world <= 1:
        return 0.0
    return 2.0 * (world - 1) * (link.alpha_s + nbytes / world / link.bandwidth_Bps)


def ring_allreduce_bytes(world: int, nbytes: float) -> float:
    """Bytes on the wire of a ring all-reduce, all ranks together: ``2(W-1) M``."""
    return 2.0 * (world - 1) * nbytes if world > 1 else 0.0


def reduce_broadcast_s(contributors: int, world: int, nbytes: float, link: Link) -> float:
    """Reduce to the root over ``C`` contributors, then broadcast to ``W`` ranks.

    The root's link carries ``C-1`` messages in and ``W-1`` out, one after the other:
    ``(C-1 + W-1) (alpha + M/beta)`` seconds.
    """
    if world <= 1 or contributors <= 0:
        return 0.0
    return (contributors - 1 + world - 1) * link.send_s(nbytes)


def reduce_broadcast_bytes(contributors: int, world: int, nbytes: float) -> float:
    """Bytes on the wire: ``(C-1) + (W-1)`` tensor sizes."""
    if world <= 1 or contributors <= 0:
        return 0.0
    return float(contributors - 1 + world - 1) * nbytes


#: how an executor may sync a layer group: the faster of the two (the simulator's choice), or one forced
SYNC_METHODS = ("fastest", RING, REDUCE_BROADCAST)


def group_sync(contributors: int, world: int, nbytes: float, link: Link,
               method: str = "fastest") -> tuple[float, float, str]:
    """Time (s), bytes and algorithm of syncing one layer group's gradient (eqs. N1, N2, N4).

    Two methods give the same sum: a ring all-reduce over all ``W`` workers in which the
    ``W - C`` non-contributors send zeros (N1), and a reduce to a root over the ``C`` contributors
    followed by a broadcast to all ``W`` (N2). ``method="fastest"`` (the simulator's and the
    executor's choice, eq. N4) takes the one with the smaller time, ties going to fewer bytes;
    ``"ring"`` or ``"reduce_broadcast"`` forces one (the executor's tests compare them). No
    contributor, no parameter or a single worker: no communication (and, with no contributor, no
    update).
    """
    if method not in SYNC_METHODS:
        raise ValueError(f"sync method must be one of {list(SYNC_METHODS)}, got {method!r}")
    if world <= 1 or contributors <= 0 or nbytes <= 0:
        return 0.0, 0.0, NONE
    rb_t = reduce_broadcast_s(contributors, world, nbytes, link)
    rb_b = reduce_broadcast_bytes(contributors, world, nbytes)
    ring_t = ring_allreduce_s(world, nbytes, link)
    ring_b = ring_allreduce_bytes(world, nbytes)
    if method == RING or (method == "fastest" and (ring_t < rb_t or (ring_t == rb_t and ring_b <= rb_b))):
        return ring_t, ring_b, RING
    return rb_t, rb_b, REDUCE_BROADCAST


def fit_pollux_alpha_beta(data_dir: str | Path) -> dict[str, tuple[float, float, float]]:
    """Re-fit the link constants from the Pollux profiles.

    Returns ``{"intra": (alpha_s, bandwidth_Bps, median_rel_err), "cross": (...)}``. Placement
    strings give GPUs per node (``"1111"``: 4 nodes, 1 GPU each). Gradient bytes per model are the
    fp32 parameter counts of the models Pollux profiled: cifar10 = ResNet-18 (11.17 M params),
    imagenet = ResNet-50 (25.56 M), bert = BERT-base (110 M).
    """
    import pandas as pd
    from scipy.optimize import nnls

    params = {"cifar10": 11.17e6 * 4, "imagenet": 25.56e6 * 4, "bert": 110e6 * 4}
    frames = []
    for model, nbytes in params.items():
        path = Path(data_dir) / "pollux-profiles" / model / "placements.csv"
        d = pd.read_csv(path, dtype={"placement": str})
        d["W"] = d["placement"].map(lambda p: sum(int(c) for c in p))
        d["nodes"] = d["placement"].str.len()
        g = d.groupby(["placement", "W", "nodes"])["sync_time"].median().reset_index()
        g["M"] = nbytes
        frames.append(g)
    d = pd.concat(frames)
    d = d[d["W"] > 1]
    out = {}
    for name, sel in (("intra", d["nodes"] == 1), ("cross", d["nodes"] > 1)):
        s = d[sel]
        A = np.c_[2 * (s["W"] - 1), 2 * (s["W"] - 1) / s["W"] * s["M"]]
        x, _ = nnls(A, s["sync_time"].to_numpy())
        pred = A @ x
        err = float(np.median(np.abs(pred - s["sync_time"].to_numpy()) / s["sync_time"].to_numpy()))
        out[name] = (float(x[0]), float(1.0 / x[1]), err)
    return out


# --------------------------------------------------------------------------------------------
# a calibrated slot-to-slot link (jigsaw calibrate --executor), stored next to the tables
# --------------------------------------------------------------------------------------------
LINK_FILE = "link.json"


def fit_executor_alpha(points: list[tuple[int, float, float]], bandwidth_Bps: float) -> float:
    """Per-message latency (s) of the live executor's slot-to-slot link, least squares.

    ``points``: one per 2-slot level-0 calibration job, ``(messages, gradient_bytes, comm_s)``:
    ``messages`` = ``2 x`` the layer groups with parameters (one W = 2 ring all-reduce per group
    sends 2 messages per rank, eq. N1), ``gradient_bytes`` = the model's parameter bytes,
    ``comm_s`` = the measured iteration time on 2 slots minus the one on 1 slot. With the bandwidth
    held at ``bandwidth_Bps``, N1 for W = 2 summed over the groups is
    ``comm = messages x alpha + gradient_bytes / bandwidth``, so
    ``alpha = sum_m n_m (c_m - P_m / beta) / sum_m n_m^2``, clipped at 1 us (docs/deploy.md
    section 5, eq. X2). Raises ValueError without a usable point.
    """
    pts = [(float(n), float(p), float(c)) for n, p, c in points if n > 0]
    if not pts:
        raise ValueError("fitting the link needs at least one 2-slot calibration job with parameters")
    num = sum(n * (c - p / bandwidth_Bps) for n, p, c in pts)
    den = sum(n * n for n, _, _ in pts)
    return max(1e-6, num / den)


def save_link(path: str | Path, link: Link, source: str, extra: dict | None = None) -> None:
    """Write ``link`` to ``path`` (JSON: alpha_s, bandwidth_Bps, the same in us and GB/s, source)."""
    d = {"alpha_s": link.alpha_s, "bandwidth_Bps": link.bandwidth_Bps, "alpha_us": link.alpha_s * 1e6,
         "gbps": link.bandwidth_Bps / 1e9, "source": source}
    d.update(extra or {})
    Path(path).write_text(json.dumps(d, indent=1) + "\n")


def load_link(path: str | Path) -> Link:
    """Read a link written by :func:`save_link`. A missing file, bad JSON, or a field that is not a
    finite number (alpha_s >= 0, bandwidth_Bps > 0) raises one line naming the file and field."""
    p = Path(path)
    d = read_json_file(p, "link file")
    if not isinstance(d, dict):
        raise ValueError(f"{p}: expected a JSON object with alpha_s and bandwidth_Bps")
    vals = {}
    for name, ok, what in (("alpha_s", lambda v: v >= 0, ">= 0 (seconds per message)"),
                           ("bandwidth_Bps", lambda v: v > 0, "> 0 (bytes per second)")):
        v = d.get(name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or not ok(v):
            raise ValueError(f"{p}: field {name} must be a finite number {what}, got {v!r}")
        vals[name] = float(v)
    return Link(vals["alpha_s"], vals["bandwidth_Bps"])
