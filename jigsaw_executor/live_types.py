"""The live executor's data types and shared helpers: a job (:class:`LiveJob`), a run's settings
(:class:`LiveConfig`), the failures a run raises (:class:`JobFailed`, :class:`CheckpointLost`), the
checks of a job list against the live cluster (:func:`check_jobs`), and the grouping of a round's
decision into co-location components (:func:`components_of`, :func:`segments_of`).
:mod:`jigsaw_executor.live` re-exports all of them (docs/executor.md).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from jigsaw_env.cluster import ClusterSpec
from jigsaw_env.cost_table import default_batch_size, get_table
from jigsaw_env.free_running import DEFAULT_PACE, check_pace
from jigsaw_env.network import INTRA_NODE, Link
from jigsaw_env.placement import connected_groups
from jigsaw_env.simulator import SimConfig, Simulator, check_lockstep_s
from jigsaw_env.spb import Pattern, SPBConfig
from jigsaw_env.state import JobState

from .decision_log import spb_from_dict, spb_to_dict

__all__ = ["LiveJob", "LiveConfig", "JobFailed", "CheckpointLost", "RECOVERY_MODES", "live_cluster", "components_of",
           "segments_of", "check_jobs", "job_state", "steps_to_finish", "jsonable", "none_if_nan"]

RECOVERY_MODES = ("full", "partial")


class JobFailed(RuntimeError):
    """A live job failed: a worker raised, died, or stalled. ``job_id``, ``rank`` (root cause, or
    None), ``errors`` (every rank's error record)."""

    def __init__(self, message: str, job_id: int, rank: int | None, errors: dict[int, dict]):
        super().__init__(message)
        self.job_id = job_id
        self.rank = rank
        self.errors = errors


class CheckpointLost(JobFailed):
    """No checkpoint of a job loads (every one kept is truncated or corrupt): the job cannot go on.
    The executor gives that job up (status ``failed`` in ``summary.json``) and the others run on."""


@dataclass(frozen=True)
class LiveJob:
    """One live training job. ``iterations``: full-backprop-equivalent iterations of work (as
    ``JobState.iterations``); ``batch_size``: per worker, default the CPU cost table's;
    ``arrival_s``: seconds after the run starts."""

    job_id: int
    model: str
    num_gpus: int
    iterations: float
    arrival_s: float = 0.0
    batch_size: int | None = None
    data: str = "digits"
    seed: int = 0
    lr: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class LiveConfig:
    """Settings of a live run.

    slots: CPU slots, each one "GPU" of the live cluster (one core by default).
    round_s: wall seconds per round; steps_per_round: instead, a fixed number of lockstep steps
        per round (deterministic; for tests).
    slot_memory_gib: memory budget per slot (default: ``jigsaw_env.cluster``'s cpu value).
    link: the alpha-beta link the scheduler's cost model assumes between slots (and that the
        workers use to choose ring vs reduce+broadcast, as the simulator does).
    restart_s: the bookkeeping restart delay recorded in the state on resume/migration (the
        simulator's meaning; the scheduler may read it). The replay uses measured start-ups.
    timeout_s: process-group and store timeout (a stalled worker fails its peers after it).
    round_timeout_s: bound on one round's wall time (steps mode), a stall watchdog.
    checkpoint_every: every running job checkpoints every this many iterations (0: only when it
        is paused or done). A failure loses at most this many iterations.
    max_restarts: recoveries allowed per job (full restarts and partial recoveries); one more
        failure fails the run with :class:`JobFailed` naming the job, the count and the last error.
    recovery: ``"full"`` (a failed job restarts every worker from its last checkpoint, losing the
        iterations since) or ``"partial"`` (CPR-style: the surviving workers go on; a replacement
        for each dead worker copies the current weights and optimizer state from a survivor; falls
        back to full when no worker survived, for one-worker jobs, and while a job is paused).
        docs/executor.md, "Fault tolerance".
    lockstep_s: the barrier the simulator charges every co-located lockstep step when it replays
        this run's decision log (``SimConfig.lockstep_s``, eq. K3; recorded in the log's header).
        ``jigsaw deploy --tables OUT`` takes it from ``OUT/lockstep.json``. It changes nothing live.
    pace: how jobs that share slots step: ``"free"`` (each at its own pace: no barrier between
        them) or ``"lockstep"`` (their rank 0s meet at a store barrier before every step). The
        decision log's header records it and the replay runs the simulator at the same pace
        (``SimConfig.pace``).
    count_loopback: every worker counts the loopback interface's bytes around its gradient syncs
        (the kernel's counter; ``jigsaw_executor.transport``); ``summary.json`` reports the job's
        ``loopback_bytes`` beside ``bytes_sent`` (the formula's). Off: None.
    """

    slots: int = 2
    round_s: float = 5.0
    steps_per_round: int | None = None
    max_workers_per_gpu: int = 2
    slot_memory_gib: float | None = None
    spb: SPBConfig = field(default_factory=SPBConfig)
    link: Link = INTRA_NODE
    restart_s: float = 0.0
    timeout_s: float = 60.0
    hold_timeout_s: float = 600.0
    round_timeout_s: float = 600.0
    measure_activations: bool = True
    pin: bool = True
    evaluate: bool = True
    checkpoint_root: str | None = None
    checkpoint_every: int = 500
    max_restarts: int = 3
    recovery: str = "full"
    lockstep_s: float = 0.0
    pace: str = DEFAULT_PACE
    count_loopback: bool = False

    def __post_init__(self) -> None:
        check_lockstep_s(self.lockstep_s)
        check_pace(self.pace)
        if self.recovery not in RECOVERY_MODES:
            raise ValueError(f"recovery must be one of {list(RECOVERY_MODES)}, got {self.recovery!r}")
        for name in ("checkpoint_every", "max_restarts"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
        if self.steps_per_round is None and not (self.round_s > 0 and math.isfinite(self.round_s)):
            raise ValueError(f"round_s must be > 0 seconds, got {self.round_s!r}")
        if self.steps_per_round is not None and (not isinstance(self.steps_per_round, int) or self.steps_per_round < 1):
            raise ValueError(f"steps_per_round must be an integer >= 1 or None, got {self.steps_per_round!r}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["spb"] = spb_to_dict(self.spb)
        d["link"] = [self.link.alpha_s, self.link.bandwidth_Bps]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "LiveConfig":
        d = dict(d)
        d.setdefault("pace", "lockstep")  # a run folder without it was run in lockstep
        d["spb"] = spb_from_dict(d["spb"])
        d["link"] = Link(*d["link"])
        return cls(**d)


def live_cluster(cfg: LiveConfig) -> ClusterSpec:
    return ClusterSpec.from_gpus(cfg.slots, gpus_per_node=cfg.slots, gpu_type="cpu",
                                 gpu_memory_gib=cfg.slot_memory_gib, intra=cfg.link, cross=cfg.link)


def components_of(decision: dict) -> list[list[int]]:
    """Jobs connected through shared slots, each list sorted, ordered by smallest job id."""
    return connected_groups({jid: jd.gpus for jid, jd in decision.items()})


def segments_of(decision: dict, pace: str) -> list[list[int]]:
    """The groups of jobs whose rank 0s meet at a barrier before every step: the components of
    ``decision`` under the lockstep pace, every job on its own under the free pace (the
    simulator's ``SimConfig.pace`` likewise forms one component per job)."""
    comps = components_of(decision)
    if check_pace(pace) == "free":
        return [[jid] for members in comps for jid in members]
    return comps


def steps_to_finish(job: JobState, eta: float) -> int:
    """The simulator's count (jigsaw_env.sim_advance.finish_time): iterations left at this eta."""
    return max(0, int(math.ceil(job.remaining / eta - 1e-9)))


def job_state(j: LiveJob) -> JobState:
    """The simulator's state of a live job (its batch size already resolved)."""
    return JobState(job_id=j.job_id, arrival_s=float(j.arrival_s), num_gpus=j.num_gpus, model=j.model,
                    batch_size=int(j.batch_size), iterations=float(j.iterations))


def check_jobs(jobs: list[LiveJob], cfg: LiveConfig, cluster: ClusterSpec) -> list[LiveJob]:
    """The jobs with their batch sizes resolved and arrivals counted from the first one; ValueError
    naming the job and the field for a job the live cluster cannot run (unknown model, more slots
    than ``cfg.slots``, no iterations, a batch size without a cost table, a worker that fits no slot)."""
    from .models import executor_model_names

    if not jobs:
        raise ValueError("the live executor needs at least one job")
    ids = [j.job_id for j in jobs]
    if len(set(ids)) != len(ids):
        raise ValueError(f"job ids must be unique, got {ids}")
    out = []
    first = min(j.arrival_s for j in jobs)
    for j in jobs:
        if j.model not in executor_model_names():
            raise ValueError(f"job {j.job_id}: unknown model {j.model!r}; allowed: {executor_model_names()}")
        if j.num_gpus > cfg.slots:
            raise ValueError(f"job {j.job_id} ({j.model}) needs {j.num_gpus} slots but the live cluster has "
                             f"{cfg.slots} (--slots): it can never run")
        if j.num_gpus < 1:
            raise ValueError(f"job {j.job_id}: num_gpus must be >= 1, got {j.num_gpus}")
        if not (j.iterations > 0 and math.isfinite(j.iterations)):
            raise ValueError(f"job {j.job_id}: iterations must be > 0, got {j.iterations!r}")
        bs = j.batch_size
        if bs is None:
            bs = default_batch_size(j.model)
        get_table(j.model, bs, "cpu")  # ValueError naming the allowed batch sizes
        if j.data == "digits":
            from .data import DigitsData

            DigitsData(seed=j.seed).iterations_per_epoch(j.num_gpus, bs)
        # arrivals relative to the first one (the run's clock starts when the first job arrives)
        out.append(replace(j, batch_size=bs, arrival_s=float(j.arrival_s - first)))
    # memory: the simulator's own feasibility check (a full-depth worker must fit a slot)
    try:
        Simulator(cluster, [job_state(j) for j in out],
                  SimConfig(max_workers_per_gpu=cfg.max_workers_per_gpu, spb=cfg.spb))
    except ValueError as e:
        raise ValueError(str(e).replace("GPUs", "slots").replace("GPU ", "slot ")) from None
    return out


def none_if_nan(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def jsonable(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Pattern):
        return o.value
    if isinstance(o, tuple):
        return list(o)
    raise TypeError(f"not JSON-serialisable: {type(o).__name__}")
