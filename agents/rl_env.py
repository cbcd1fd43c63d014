"""The training environment of learned agents: ``JigsawClusterEnv`` with trace sampling.

One agent should generalise across trace windows, so each episode draws its jobs afresh, from a
split that keeps the evaluation episodes apart from the training ones:

* **synthetic traces**: a new synthetic trace per episode; the training split draws generator
  seeds from ``[0, 2**30)``, the held-out split from ``[2**30, 2**31)``;
* **real traces** (``KIND:PATH``): the trace is loaded once and cut by job position; the training
  split takes windows of ``max_jobs`` consecutive jobs from the first ``1 - holdout`` of the jobs
  (default 80%), the held-out split from the last ``holdout`` (20%).

An optional **validation** split (``val`` > 0, a fraction of all jobs) is cut from the end of the
training part: training keeps the first ``1 - holdout - val``, validation the next ``val``, so a
model can be selected (early stopping, ``best/``) on jobs that neither training nor the held-out
evaluation uses. Synthetic traces draw its generator seeds from ``[2**31, 2**31 + 2**30)``.

With ``wide_share`` > 0, that share of the training episodes (real traces) is built around a
job of at least ``wide_gpus`` GPUs (one drawn uniformly, then a window holding it): such jobs are
rare (2.3 % of Philly's jobs ask for 8 GPUs or more) and the decisions about them decide the mean
JCT of the windows that have them.

With ``cluster_sizes`` (training and validation splits), each episode runs on a cluster of one of
these GPU counts, drawn uniformly per episode (same GPU type, memory and node size); the held-out
evaluation split always keeps ``gpus``. The observation is the same size on every cluster
and its width features are fractions of the cluster (``jigsaw_env.encoder``), so a small training
cluster shows what a real trace rarely does: jobs that take half or all of the cluster (on Philly,
0.16 % of the jobs ask for 16 GPUs or more; on a 16-GPU cluster every 8-GPU job is half of it).
Jobs wider than the episode's cluster are capped to it, and the load is scaled to its size.

Per episode the offered load is drawn uniformly from ``loads`` (one value: fixed; ``None``: the
synthetic default 1.0, or a real trace's own arrival times). A **curriculum** (``difficulty`` in
[0, 1], set by the trainer through ``env_method("set_difficulty", d)``) grows episodes from
``ceil(max_jobs / 4)`` jobs at half the load (d = 0) to ``max_jobs`` jobs at the full load (d = 1).

Nothing here imports stable-baselines3 or torch: the evaluation command uses it too.
"""
from __future__ import annotations

import math
import os
import signal
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from jigsaw_env.cluster import ClusterSpec
from jigsaw_env.cost_table import register_tables_dir
from jigsaw_env.digest import file_sha256
from jigsaw_env.encoder import PROPOSAL_GROUP, check_features
from jigsaw_env.env import JigsawClusterEnv
from agents.base import Scheduler, available_schedulers, make_scheduler
from traces import load_trace, offered_load, parse_spec
from traces.models import default_throughput_fn, estimated_durations
from traces.synthetic import check_spec_load, parse_params

SPLITS = ("train", "val", "eval")
SYNTHETIC_SEED_SPLIT = 2**30
SYNTHETIC_VAL_BASE = 2**31

#: JigsawClusterEnv keyword arguments that a run's config.json records under "env"
ENV_KEYS = ("gpus", "gpus_per_node", "gpu_type", "gpu_memory_gib", "trace", "max_jobs", "load", "window_k",
            "spb_levels", "spb_slots", "max_workers_per_gpu", "round_s", "restart_s", "reward", "reward_scale",
            "observe_remaining", "backlogged", "max_time_s", "eta_scale", "eta_override", "sharing", "pace",
            "obs_features", "work_conserving", "window_order", "pause", "proposer", "spill")

#: the heuristic the ``proposal`` feature group shows when a run names none (``--proposer``)
DEFAULT_PROPOSER = "jigsaw"


def proposer_name(env_config: dict, labels: tuple[str, str] = ("field 'env.proposer'", "'env.obs_features'")) \
        -> str | None:
    """The scheduler a run's observation shows (its config's ``env.proposer``; the default one when
    ``env.obs_features`` has the ``proposal`` group and names none), or None without that group.
    ValueError (one line, naming the two settings as ``labels`` calls them) for a proposer named
    without the group, or a name no scheduler has."""
    name = env_config.get("proposer")
    name_label, features_label = labels
    if PROPOSAL_GROUP not in check_features(env_config.get("obs_features"), features_label):
        if name is not None:
            raise ValueError(f"{name_label} is {name!r} but {features_label} has no 'proposal' group to show its "
                             f"decision; add 'proposal' there or leave the proposer out")
        return None
    name = DEFAULT_PROPOSER if name is None else name
    if not isinstance(name, str) or name not in available_schedulers():
        raise ValueError(f"{name_label}: expected a scheduler name from {available_schedulers()}, got {name!r}")
    return name


def make_proposer(env_config: dict) -> Scheduler | None:
    """A fresh scheduler for the run's ``proposal`` feature group (:func:`proposer_name`), or None."""
    name = proposer_name(env_config)
    return None if name is None else make_scheduler(name)


def is_synthetic(spec: str) -> bool:
    return str(spec).strip().split(":", 1)[0].lower() == "synthetic"


def training_synthetic_params(spec: str, loads: Sequence[float] | None = None) -> dict[str, Any]:
    """The parameters of a synthetic trace spec that training draws episodes from, checked:
    ValueError (one line) for a value the generator cannot parse (``traces.synthetic``'s own
    message), for ``jobs=`` or ``seed=`` (training sets them: every episode has ``max_jobs`` jobs,
    ``--max-jobs``, and draws its generator seed from its split), and for a ``load=`` that
    differs from one of ``loads`` (``--load``; the same "conflicting loads" error as
    ``traces.load_trace``)."""
    kind, rest = parse_spec(spec)
    if kind != "synthetic":
        raise ValueError(f"not a synthetic trace spec: {spec!r}")
    params = parse_params(rest)
    fixed = [k for k in ("jobs", "seed") if k in params]
    if fixed:
        why = []
        if "jobs" in fixed:
            why.append("every episode has --max-jobs jobs (set the episode size there)")
        if "seed" in fixed:
            why.append("each episode draws its generator seed from its split, so that training, validation and "
                       "held-out episodes stay apart (--seed seeds the draws)")
        raise ValueError(f"synthetic: {' and '.join(k + '=' for k in fixed)} cannot be set in a training trace: "
                         f"{'; '.join(why)}; drop {'it' if len(fixed) == 1 else 'them'} from --trace {spec!r}")
    for x in loads or ():  # (parse_params has checked the spec's load itself)
        check_spec_load(params, float(x))
    return params


def synthetic_spec(spec: str, jobs: int, load: float | None, seed: int) -> str:
    """The spec with ``jobs``, ``load`` (if given) and ``seed`` set: a training episode's trace.
    Their values in ``spec`` are replaced (:func:`training_synthetic_params` refuses a spec with
    jobs= or seed= and a load= that conflicts; the caller passes the spec's load, scaled by the
    curriculum, as ``load``)."""
    opts = spec.split(":", 1)[1] if ":" in spec else ""
    parts = [p for p in opts.split(",")
             if p.strip() and p.split("=", 1)[0].strip() not in ("jobs", "seed") + (("load",) if load is not None else ())]
    parts.append(f"jobs={int(jobs)}")
    if load is not None:
        parts.append(f"load={float(load)}")
    parts.append(f"seed={int(seed)}")
    return "synthetic:" + ",".join(parts)


def scale_to_load(df: pd.DataFrame, cluster_gpus: int, load: float, gpus_per_node: int = 8) -> pd.DataFrame:
    """Scale inter-arrival times so that sum(num_gpus x isolated duration) / (GPUs x arrival
    span) = ``load`` (the definition of ``traces.offered_load``). A window whose jobs all arrive
    at once is returned unchanged."""
    d = estimated_durations(df, default_throughput_fn())
    before = offered_load(df, cluster_gpus, d)
    if not np.isfinite(before) or before <= 0:
        return df
    out = df.copy()
    a = out["arrival_s"].to_numpy(dtype=np.float64)
    out["arrival_s"] = (a - a.min()) * (before / float(load))
    return out


def window_of(df: pd.DataFrame, n: int, rng: np.random.Generator, around: np.ndarray | None = None) -> pd.DataFrame:
    """``n`` consecutive jobs at a random offset (all of them when there are fewer), arrivals from 0.

    ``around``: positions of jobs to build the window around: one is drawn uniformly, then the
    offset uniformly among the windows that hold it, so a window's chance grows with how many
    of those jobs it holds."""
    if len(df) > n:
        if around is not None and len(around):
            pos = int(around[int(rng.integers(0, len(around)))])
            start = int(rng.integers(max(0, pos - n + 1), min(pos, len(df) - n) + 1))
        else:
            start = int(rng.integers(0, len(df) - n + 1))
        df = df.iloc[start:start + n]
    df = df.copy()
    if len(df):
        df["arrival_s"] = df["arrival_s"] - df["arrival_s"].min()
    return df.reset_index(drop=True)


def check_split_fractions(holdout: float, val: float = 0.0) -> None:
    """ValueError unless ``0 < holdout < 1`` and ``0 <= val < 1 - holdout`` (the split fractions
    :func:`cut_splits` takes)."""
    if not 0.0 < holdout < 1.0:
        raise ValueError(f"holdout must be in (0, 1), got {holdout!r}")
    if not (0.0 <= val < 1.0 - holdout):
        raise ValueError(f"val must be in [0, 1 - holdout) = [0, {1.0 - holdout:g}), got {val!r}")


def cut_splits(full: pd.DataFrame, holdout: float, val: float = 0.0) -> dict[str, pd.DataFrame]:
    """``{"train", "val", "eval"}`` parts of a loaded trace by job position: the first
    ``1 - holdout - val``, the next ``val`` and the last ``holdout`` (module docstring)."""
    n = len(full)
    cut = int(math.floor(n * (1.0 - holdout)))
    vcut = int(math.floor(n * (1.0 - holdout - val)))
    return {"train": full.iloc[:vcut], "val": full.iloc[vcut:cut], "eval": full.iloc[cut:]}


def same_trace_file(a: str, b: str) -> bool:
    """Whether two real-trace specs (``KIND:PATH``, or a kind with a default path such as
    ``philly``) name the same file or two files with the same content (a policy trained on
    Philly elsewhere, evaluated on a copy here); False for synthetic ones and bad specs."""
    if is_synthetic(a) or is_synthetic(b):
        return False
    try:
        pa, pb = Path(parse_spec(a)[1]).resolve(), Path(parse_spec(b)[1]).resolve()
        if pa == pb:
            return True
        return pa.is_file() and pb.is_file() and pa.stat().st_size == pb.stat().st_size \
            and file_sha256(pa) == file_sha256(pb)
    except (OSError, ValueError):
        return False



def training_job_ids(config: dict) -> frozenset[int] | None:
    """The job ids of the real trace a run has seen: its training split and, when it had one, its
    validation split (``best/`` was chosen on it), from its config.json (env trace, GPUs and GPU
    type; sampling holdout, val and trace GPU type), cut exactly as :class:`TrainingEnv` cuts them:
    everything before the held-out split. None for a synthetic trace (training draws generator
    seeds from ``[0, 2**30)``, evaluation splits use the seeds above)."""
    env, sampling = config["env"], config.get("sampling", {})
    trace = env.get("trace")
    if not isinstance(trace, str) or is_synthetic(trace):
        return None
    # train + val = everything before the held-out cut: the train split of the same holdout, no val
    te = TrainingEnv(split="train", holdout=float(sampling.get("holdout", 0.2)), trace=trace, gpus=int(env["gpus"]),
                     gpus_per_node=int(env.get("gpus_per_node", 8)), max_jobs=1,
                     trace_gpu_type=sampling.get("trace_gpu_type"))
    return frozenset(int(x) for x in te.split_jobs()["job_id"])


class TrainingEnv(JigsawClusterEnv):
    """``JigsawClusterEnv`` whose episodes come from a train or held-out split of the trace, with
    per-episode load sampling and an optional curriculum (module docstring)."""

    def __init__(self, *, split: str = "train", holdout: float = 0.2, val: float = 0.0,
                 loads: Sequence[float] | None = None, trace_gpu_type: str | None = None, difficulty: float = 1.0,
                 wide_share: float = 0.0, wide_gpus: int = 8, cluster_sizes: Sequence[int] | None = None, **kw: Any):
        if split not in SPLITS:
            raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
        check_split_fractions(holdout, val)
        if split == "val" and val == 0.0:
            raise ValueError("split 'val' needs a validation fraction val > 0")
        if not 0.0 <= wide_share <= 1.0:
            raise ValueError(f"wide_share must be in [0, 1], got {wide_share!r}")
        if wide_gpus < 1:
            raise ValueError(f"wide_gpus must be >= 1, got {wide_gpus!r}")
        if not callable(kw.get("proposer")):
            # config.json records the proposer by name (or none): the env asks a scheduler of that name
            kw["proposer"] = make_proposer(kw)
        super().__init__(**kw)
        self.cluster_sizes: list[int] | None = None
        self._clusters: dict[int, Any] = {self.cluster.num_gpus: self.cluster}
        if cluster_sizes and split == "eval":
            raise ValueError("cluster_sizes: the held-out evaluation split keeps the env's own cluster (gpus)")
        if cluster_sizes:
            sizes = [int(g) for g in cluster_sizes]
            # the same call the env made for its own cluster, with another GPU count
            same = {k: kw[k] for k in ("gpus_per_node", "gpu_type", "gpu_memory_gib") if k in kw}
            for g in sizes:
                if g not in self._clusters:
                    try:
                        self._clusters[g] = ClusterSpec.from_gpus(g, **same)
                    except ValueError as e:
                        raise ValueError(f"cluster_sizes: {g} GPUs: {e}") from None
            self.cluster_sizes = sizes
        if not isinstance(self.trace, str):
            raise ValueError("TrainingEnv needs a trace spec (str); use JigsawClusterEnv for a fixed job table")
        self._spec_load: float | None = None  # a synthetic spec's load= (the episodes' load when no --load)
        if is_synthetic(self.trace):
            option = [float(x) for x in loads] if loads else ([float(self.load)] if self.load is not None else None)
            self._spec_load = training_synthetic_params(self.trace, option).get("load")
        self.split = split
        self.holdout = float(holdout)
        self.val = float(val)
        # training windows built around a wide job (>= wide_gpus GPUs) with this probability
        # (real traces, train split only: evaluation splits keep uniform windows)
        self.wide_share = float(wide_share) if split == "train" else 0.0
        self.wide_gpus = int(wide_gpus)
        self._wide_pos: np.ndarray | None = None
        self.loads = [float(x) for x in loads] if loads else None
        if self.loads and any(not x > 0 for x in self.loads):
            raise ValueError(f"loads must be > 0, got {self.loads}")
        self.trace_gpu_type = trace_gpu_type
        self.difficulty = 1.0
        self.set_difficulty(difficulty)
        self._split_jobs: dict[int, pd.DataFrame] = {}  # per cluster size (GPUs)

    # ----- curriculum
    def set_difficulty(self, d: float) -> None:
        """0 = smallest episodes (a quarter of max_jobs, half the load), 1 = the full task."""
        self.difficulty = float(min(1.0, max(0.0, d)))

    def episode_size(self) -> tuple[int, float]:
        """(jobs, load multiplier) of the next episode under the current difficulty."""
        lo = max(1, math.ceil(self.max_jobs / 4))
        n = int(round(lo + self.difficulty * (self.max_jobs - lo)))
        return max(1, n), 0.5 + 0.5 * self.difficulty

    # ----- episode jobs
    def split_jobs(self, gpus: int | None = None) -> pd.DataFrame:
        """This env's split of the trace as loaded for a cluster of ``gpus`` GPUs (default: its
        largest; each loaded once): the jobs its episodes' windows are drawn from. Jobs wider than
        the cluster are capped to it and their iterations computed at the capped width, as
        ``load_trace`` does, so a job alone runs as long as it ran in the trace. Capping drops no
        job, so every size's split holds the same jobs in the same rows."""
        cap = max(self._clusters) if gpus is None else int(gpus)
        part = self._split_jobs.get(cap)
        if part is None:
            full = load_trace(str(self.trace), cluster_gpus=cap, max_gpus=cap, gpu_type=self.trace_gpu_type).jobs
            n = len(full)
            part = cut_splits(full, self.holdout, self.val)[self.split]
            if len(part) == 0:
                # enough jobs that every split in use gets one (about 1 / the smallest fraction)
                fracs = [f for f in (1.0 - self.holdout - self.val, self.val, self.holdout) if f > 0]
                val = f", val {self.val:.0%}" if self.val > 0 else ""
                raise ValueError(f"trace {self.trace!r} has {n} jobs: too few for a {self.split} split "
                                 f"(holdout {self.holdout:.0%}{val}); expected at least "
                                 f"{int(math.ceil(1 / min(fracs)))}")
            part = self._split_jobs[cap] = part.reset_index(drop=True)
        return part

    def _episode_jobs(self, seed: int) -> pd.DataFrame:
        rng = np.random.default_rng(seed)
        if self.cluster_sizes:
            # the episode's cluster (drawn from its own stream, so that the jobs drawn below are
            # those the same seed gives without cluster_sizes)
            g = self.cluster_sizes[int(np.random.default_rng([seed, 1]).integers(len(self.cluster_sizes)))]
            self.cluster = self._clusters[g]
        n, mult = self.episode_size()
        load = float(rng.choice(self.loads)) if self.loads else self.load
        spec = str(self.trace)
        if is_synthetic(spec):
            base = {"train": 0, "eval": SYNTHETIC_SEED_SPLIT, "val": SYNTHETIC_VAL_BASE}[self.split]
            syn_seed = base + int(rng.integers(0, SYNTHETIC_SEED_SPLIT))
            base_load = load if load is not None else self._spec_load if self._spec_load is not None else 1.0
            eff_load = base_load * mult
            return load_trace(synthetic_spec(spec, n, eff_load, syn_seed), cluster_gpus=self.cluster.num_gpus,
                              max_gpus=self.cluster.num_gpus, gpu_type=self.trace_gpu_type).jobs
        part = self.split_jobs(self.cluster.num_gpus)
        around = None
        if self.wide_share > 0 and rng.random() < self.wide_share:
            if self._wide_pos is None:  # the rows of wide jobs, as wide as the largest cluster lets them be
                self._wide_pos = np.flatnonzero(self.split_jobs()["num_gpus"].to_numpy() >= self.wide_gpus)
            around = self._wide_pos
        df = window_of(part, n, rng, around)
        if load is not None or mult != 1.0:
            if load is None:
                load = offered_load(df, self.cluster.num_gpus, estimated_durations(df, default_throughput_fn()))
                if not np.isfinite(load) or load <= 0:
                    return df
            df = scale_to_load(df, self.cluster.num_gpus, load * mult, self.cluster.gpus_per_node)
        return df


def make_env_fn(env_kwargs: dict, *, split: str, rank: int, seed: int, holdout: float = 0.2, val: float = 0.0,
                loads: Sequence[float] | None = None, trace_gpu_type: str | None = None,
                tables: str | None = None, difficulty: float = 1.0, monitor: bool = True,
                wide_share: float = 0.0, wide_gpus: int = 8,
                cluster_sizes: Sequence[int] | None = None, ignore_signals: bool = False) -> Callable[[], Any]:
    """A picklable env factory for (Subproc|Dummy)VecEnv: registers ``tables`` in the process
    that builds the env (SubprocVecEnv workers do not see tables registered in the parent),
    pins torch to one thread, and wraps the env in an SB3 Monitor. ``ignore_signals`` (for
    SubprocVecEnv workers only): the process ignores SIGINT and SIGTERM, so that a signal sent to
    the whole process group (Ctrl-C, Slurm, ``timeout``) leaves the workers to the trainer, which
    saves and then closes them; a worker still ends when its pipe to the trainer closes."""

    def _init():
        if ignore_signals:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        try:
            import torch
            torch.set_num_threads(1)
        except ImportError:  # pragma: no cover
            pass
        if tables:
            register_tables_dir(tables)
        env = TrainingEnv(split=split, holdout=holdout, val=val, loads=loads, trace_gpu_type=trace_gpu_type,
                          difficulty=difficulty, wide_share=wide_share, wide_gpus=wide_gpus,
                          cluster_sizes=cluster_sizes, **env_kwargs)
        env.reset(seed=seed + rank)
        if monitor:
            from stable_baselines3.common.monitor import Monitor
            env = Monitor(env)
        return env

    return _init
