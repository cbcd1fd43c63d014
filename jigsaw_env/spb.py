"""The SPB cost model: levels, start slots, patterns, and what one job's SPB cycle costs.

Everything here follows docs/design.md section 2; the formulas, with equation labels, are in
``docs/spb_model.md``. Units: seconds, bytes, iterations.

Vocabulary:
    B       number of layer groups of the model (cost table).
    L       deepest SPB level (default 3); level ``l`` skips at most ``f_l = l/(L+1)`` of the groups.
    n       start slots per level (default 4).
    W       workers (GPUs) of the job.
    s_w(t)  start group of worker ``w`` at iteration ``t``: it backpropagates groups ``s_w..B-1``.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from functools import lru_cache

import numpy as np

from .cost_table import CostTable, get_table
from .network import CROSS_NODE, INTRA_NODE, Link, group_sync


class Pattern(str, Enum):
    """How start slots are assigned to workers over iterations (docs/design.md section 2)."""

    ROTATING = "rotating"  # worker w at iteration t takes slot (w + t) mod n
    STATIC = "static"      # worker w keeps slot w mod n

    @classmethod
    def parse(cls, value: "Pattern | str") -> "Pattern":
        if isinstance(value, Pattern):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            raise ValueError(f"unknown SPB pattern {value!r}; allowed: {[p.value for p in cls]}") from None


@dataclass(frozen=True)
class SPBConfig:
    """SPB parameters shared by the whole cluster.

    max_level: deepest level L (levels are 0..L; 0 = plain data-parallel training).
    num_slots: start slots per level, n.
    average_over: "contributors" (divide a group's gradient by |C_b|) or "all" (divide by W).
    eta_prior_slope: slope c of the assumed eta prior, eta = 1 - c * mean skipped fraction
        (docs/spb_model.md eq. E1); used where a cost table has no measured eta.
    """

    max_level: int = 3
    num_slots: int = 4
    average_over: str = "contributors"
    eta_prior_slope: float = 0.5

    def __post_init__(self) -> None:
        if not isinstance(self.max_level, int) or self.max_level < 0:
            raise ValueError(f"spb max_level must be an integer >= 0, got {self.max_level!r}")
        if not isinstance(self.num_slots, int) or self.num_slots < 1:
            raise ValueError(f"spb num_slots must be an integer >= 1, got {self.num_slots!r}")
        if self.average_over not in ("contributors", "all"):
            raise ValueError(f"spb average_over must be 'contributors' or 'all', got {self.average_over!r}")
        if not 0.0 <= self.eta_prior_slope <= 1.0:
            raise ValueError(f"spb eta_prior_slope must be in [0, 1], got {self.eta_prior_slope!r}")

    @property
    def levels(self) -> tuple[int, ...]:
        return tuple(range(self.max_level + 1))

    def skip_fraction(self, level: int) -> float:
        """f_l = l / (L + 1): the fraction of groups the shallowest start skips (eq. S1)."""
        self.check_level(level)
        return level / (self.max_level + 1)

    def check_level(self, level: int) -> None:
        if not (isinstance(level, (int, np.integer)) and 0 <= level <= self.max_level):
            raise ValueError(f"SPB level must be an integer in 0..{self.max_level}, got {level!r}")

    def start_slots(self, level: int, num_groups: int) -> tuple[int, ...]:
        """Start groups used at ``level`` for a model of ``num_groups`` groups (eq. S2)."""
        self.check_level(level)
        return start_slots(level, num_groups, self.max_level, self.num_slots)


@lru_cache(maxsize=4096)
def start_slots(level: int, num_groups: int, max_level: int = 3, num_slots: int = 4) -> tuple[int, ...]:
    """Evenly spaced start slots from 0 to ``floor(f_l * B)``, rounded down, duplicates removed.

    ``deepest = floor(l * B / (L + 1))``; slot ``i`` of ``n`` is ``floor(i * deepest / (n - 1))``.
    Slot 0 (full backprop) is always present.
    """
    if num_groups < 1:
        raise ValueError(f"num_groups must be >= 1, got {num_groups}")
    if not 0 <= level <= max_level:
        raise ValueError(f"SPB level must be an integer in 0..{max_level}, got {level!r}")
    deepest = (level * num_groups) // (max_level + 1)
    deepest = min(deepest, num_groups - 1)
    if deepest <= 0 or num_slots == 1:
        return (0,)
    return tuple(sorted({(i * deepest) // (num_slots - 1) for i in range(num_slots)}))


def worker_starts(slots: tuple[int, ...], pattern: Pattern, num_workers: int, iteration: int) -> np.ndarray:
    """Start group of every worker at ``iteration`` (eq. S3 rotating, S4 static)."""
    n = len(slots)
    w = np.arange(num_workers)
    idx = (w + iteration) % n if Pattern.parse(pattern) is Pattern.ROTATING else w % n
    return np.asarray(slots, dtype=np.int64)[idx]


def cycle_length(slots: tuple[int, ...], pattern: Pattern) -> int:
    """Iterations after which the start assignment repeats: n for rotating, 1 for static."""
    return len(slots) if (Pattern.parse(pattern) is Pattern.ROTATING and len(slots) > 1) else 1


@dataclass(frozen=True)
class IterationCost:
    """What one iteration of a job costs, given every worker's start group.

    compute_s: (W,) per-worker compute time (eq. C1), seconds.
    comm_s: gradient sync time summed over groups (eq. N3), seconds.
    bytes: bytes on the wire summed over groups and ranks (eq. N1/N2).
    contributors: (B,) |C_b|, workers that computed group b's gradient.
    algorithms: per-group collective chosen ("ring", "reduce_broadcast" or "none").
    """

    compute_s: np.ndarray
    comm_s: float
    bytes: float
    contributors: np.ndarray
    algorithms: tuple[str, ...]


def iteration_cost(table: CostTable, starts: np.ndarray, link: Link) -> IterationCost:
    """Cost of one iteration where worker ``w`` starts at ``starts[w]``."""
    starts = np.asarray(starts, dtype=np.int64)
    world = len(starts)
    B = table.num_groups
    if world < 1:
        raise ValueError("a job needs at least one worker")
    if starts.min() < 0 or starts.max() >= B:
        raise ValueError(f"start groups must be in 0..{B - 1}, got {starts.tolist()}")
    compute = table.compute_by_start()[starts]
    # |C_b| = #{w : s_w <= b}
    contributors = np.searchsorted(np.sort(starts), np.arange(B), side="right")
    pbytes = table.arrays()["param_bytes"]
    comm = 0.0
    nbytes = 0.0
    algos = []
    for b in range(B):
        t, by, algo = group_sync(int(contributors[b]), world, float(pbytes[b]), link)
        comm += t
        nbytes += by
        algos.append(algo)
    return IterationCost(compute_s=compute, comm_s=comm, bytes=nbytes, contributors=contributors,
                         algorithms=tuple(algos))


@dataclass(frozen=True)
class JobProfile:
    """A job's costs over one SPB cycle at a fixed configuration.

    Phase ``p`` is the job's iteration counter modulo ``period``.

    compute_s: (period, W) per-worker compute seconds per phase.
    comm_s: (period,) sync seconds per phase.
    bytes: (period,) bytes on the wire per phase.
    peak_bytes: (W,) peak memory of each worker process (fixed + activations at its deepest
        backprop over the cycle), eq. M1.
    eta: progress per iteration relative to full backprop (eq. E1).
    batch_size: per-worker batch size of the table the costs come from (a feature of the
        co-location model, docs/colocation.md; 1 for a profile built by hand without a table).
    """

    level: int
    pattern: Pattern
    slots: tuple[int, ...]
    period: int
    compute_s: np.ndarray
    comm_s: np.ndarray
    bytes: np.ndarray
    peak_bytes: np.ndarray
    eta: float
    batch_size: int = 1

    @property
    def num_workers(self) -> int:
        return self.compute_s.shape[1]

    def dedicated_iteration_s(self) -> np.ndarray:
        """(period,) iteration time on dedicated GPUs: slowest worker + sync (eq. T1)."""
        return self.compute_s.max(axis=1) + self.comm_s


def eta_key(level: int, pattern: "Pattern | str", num_workers: int | None = None) -> str:
    """Key of a measured eta in ``table.meta["eta"]``: ``"<level>/<pattern>"`` (measured at the
    worker count ``meta["eta_source"]["workers"]`` records, or at an unrecorded one in older tables)
    or, with ``num_workers``, ``"<level>/<pattern>/w<W>"`` (measured at exactly ``W`` workers)."""
    base = f"{int(level)}/{Pattern.parse(pattern).value}"
    return base if num_workers is None else f"{base}/w{int(num_workers)}"


def eta_measured_workers(table: CostTable) -> int | None:
    """Worker count at which the table's plain ``"<level>/<pattern>"`` eta values were measured
    (``meta["eta_source"]["workers"]``, written by ``bench.eta --write-tables``); None when the
    table does not say (older tables, or no measured eta)."""
    src = table.meta.get("eta_source") if isinstance(table.meta, dict) else None
    w = src.get("workers") if isinstance(src, dict) else None
    return int(w) if isinstance(w, (int, float)) and not isinstance(w, bool) and w >= 1 else None


def eta_for(table: CostTable, level: int, pattern: Pattern, spb: SPBConfig, slots: tuple[int, ...],
            num_workers: int) -> float:
    """Statistical efficiency of one SPB iteration relative to full backprop (eq. E1).

    Lookup order in ``table.meta["eta"]``: the value measured at this job's worker count
    (``"<level>/<pattern>/w<W>"``), then the table's default value (``"<level>/<pattern>"``,
    measured at :func:`eta_measured_workers` workers and applied at every W), then the assumed
    prior ``1 - c * mean skipped fraction``, the mean taken over the workers and phases of the
    cycle. Level 0 is exactly 1.
    """
    if level == 0:
        return 1.0
    measured = table.meta.get("eta", {}) if isinstance(table.meta, dict) else {}
    for key in (eta_key(level, pattern, num_workers), eta_key(level, pattern)):
        if key in measured:
            return float(measured[key])
    period = cycle_length(slots, pattern)
    starts = np.stack([worker_starts(slots, pattern, num_workers, t) for t in range(period)])
    mean_skip = float(starts.mean()) / table.num_groups
    return 1.0 - spb.eta_prior_slope * mean_skip


def job_profile(table: CostTable, level: int, pattern: Pattern | str, num_workers: int, link: Link,
                spb: SPBConfig = SPBConfig()) -> JobProfile:
    """Per-phase compute, sync and memory of a job of ``num_workers`` workers at ``level``."""
    pattern = Pattern.parse(pattern)
    spb.check_level(level)
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    slots = spb.start_slots(level, table.num_groups)
    period = cycle_length(slots, pattern)
    compute = np.empty((period, num_workers))
    comm = np.empty(period)
    nbytes = np.empty(period)
    min_start = np.full(num_workers, table.num_groups, dtype=np.int64)
    for t in range(period):
        starts = worker_starts(slots, pattern, num_workers, t)
        cost = iteration_cost(table, starts, link)
        compute[t] = cost.compute_s
        comm[t] = cost.comm_s
        nbytes[t] = cost.bytes
        min_start = np.minimum(min_start, starts)
    peak = np.array([table.process_peak_bytes(int(s)) for s in min_start], dtype=np.float64)
    eta = eta_for(table, level, pattern, spb, slots, num_workers)
    for a in (compute, comm, nbytes, peak):
        a.setflags(write=False)
    return JobProfile(level=level, pattern=pattern, slots=slots, period=period, compute_s=compute,
                      comm_s=comm, bytes=nbytes, peak_bytes=peak, eta=eta, batch_size=int(table.batch_size))


def spb_compute_bound(table: CostTable, level: int, pattern: Pattern | str, num_workers: int,
                      spb: SPBConfig = SPBConfig()) -> float:
    """Upper bound on the rise of useful work per GPU-second (docs/design.md section 2):
    full per-iteration compute / mean SPB per-iteration compute, times eta (eq. G1)."""
    prof = job_profile(table, level, pattern, num_workers, INTRA_NODE, spb)
    return table.compute_s(0) / float(prof.compute_s.mean()) * prof.eta


def isolated_throughput(model: str, batch_size: int | None, num_gpus: int, gpu_type: str,
                        gpus_per_node: int = 8, intra: Link = INTRA_NODE, cross: Link = CROSS_NODE) -> float:
    """Full-backprop iterations per second of a job alone on ``num_gpus`` consolidated GPUs.

    ``1 / (compute_s(0) + sync time of a full ring all-reduce)`` (eq. T1 at level 0); the job
    spans ``ceil(num_gpus / gpus_per_node)`` nodes and uses the cross-node link if more than one.
    A batch size without a table gets the nearest one's scaled by eq. B1 (docs/cost_tables.md
    section 9; ``get_table(..., nearest=True)``).
    """
    if num_gpus < 1:
        raise ValueError(f"num_gpus must be >= 1, got {num_gpus}")
    table = get_table(model, batch_size, gpu_type, nearest=True)
    link = intra if num_gpus <= gpus_per_node else cross
    prof = job_profile(table, 0, Pattern.ROTATING, int(num_gpus), link)
    return 1.0 / float(prof.dedicated_iteration_s()[0])
