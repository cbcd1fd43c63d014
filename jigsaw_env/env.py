"""``JigsawCluster-v0``: the Gymnasium environment on top of the simulator.

STATE
    The simulator's :class:`~jigsaw_env.state.ClusterState` (jobs, their progress and placements,
    the GPUs) plus the decision being built for the next round. The agent observes it through the
    shared :class:`~jigsaw_env.encoder.ObservationEncoder`: a ``Box`` of
    ``(K + H) * 27 + 10`` float32 values (K window slots, H = 8 host slots; every feature group;
    ``obs_features`` keeps some of them, docs/environment.md) whose shape does not depend on the
    cluster's size. With the ``proposal`` group (``proposer=``, a scheduler asked once per round)
    a block after the cluster features shows what that heuristic runs this round
    (jigsaw_env/proposal.py).
ACTIONS
    ``Discrete(K * ((5 + H) * (1 + 2L) + 1) + 1)``: one decision per step (Decima-style). Pick one
    job of the round's window of K waiting and running jobs (ordered by attained service, by
    2D-LAS rank with ``window_order="las"``, or by least remaining GPU-seconds with
    ``window_order="remaining"``) with a placement option (keep,
    consolidated, spread, packed, paired, or ``host:r``: beside the job of host slot r on its GPUs,
    jigsaw_env/actions.py) and an SPB level and pattern; or pause a running job; or *advance*, which
    applies the decision and runs one round of ``round_s`` seconds. ``action_masks()`` marks
    exactly the feasible actions (sb3-contrib protocol; all False once the episode is over, and a
    RuntimeError before the first ``reset()``; with ``work_conserving=True``, advance is masked
    while the decision runs nothing and a window job could start), and ``info["action_mask"]`` of ``reset`` and of
    every ``step`` holds the same mask (computed once per state). A job is decided at most once per
    round, and the window slides: a decided job's slot shows the next job behind the window, so one
    round can start a whole arrival burst. A pause decides the job for the round; with
    ``pause="requeue"`` it sends the job to the back of that line instead: it shows again once the
    jobs behind the window have, and may then be placed (a running job released from its GPUs to
    be moved after others are placed). After ``2K + 2`` steps plus one per job behind the window
    (two under ``requeue``) the env advances by itself. With ``spill=True`` an advance first runs
    every job the decision leaves waiting that can run: on free GPUs, or on the free GPUs plus
    GPUs of the lowest-priority jobs, shared (jigsaw_env/spill.py). ``step`` takes a Python or numpy integer (or a 0-d integer array, as
    ``Discrete.contains`` does); anything else raises ``InvalidAction`` and changes nothing.
REWARD
    ``-(jobs in system x elapsed seconds) / reward_scale`` on advance steps (0 otherwise), so the
    episode return is ``-(sum of JCTs) / reward_scale``. ``reward="efficiency"`` instead pays the
    round's useful GPU-seconds / (GPUs x reward_scale). ``info["dt_s"]`` of every step is the
    simulated seconds it took: the round's length on an advance step, 0.0 on a decision step (for
    discounting per simulated second, ``jigsaw train --gamma-per-hour``).
EPISODE
    ``terminated`` when every job of the episode has finished; ``truncated`` when ``max_time_s``
    of simulated time has passed, or when the policy has run nothing for ``max_stalled_rounds``
    rounds in a row while jobs waited (default 1000; ``info["policy_stalled"]`` says so), so an
    untrained policy that only advances cannot hang an evaluation. ``info["episode_metrics"]`` holds every metric at the end.
    ``gymnasium.make`` adds a ``TimeLimit`` of ``max_episode_steps`` env steps, by default
    ``jigsaw_env.MAX_EPISODE_STEPS`` = 200,000: a safety net that episodes of the default settings
    do not reach (at most 56,222 steps over 120 seeds of a random masked policy; see
    ``bench/episode_steps.py``).
    Each ``reset(seed=...)`` draws the episode's jobs: a new synthetic trace, or a window of
    ``max_jobs`` consecutive jobs at a seeded random offset of a real trace.
RENDER
    ``render_mode`` None, ``"ansi"`` (a text: the GPU map per node and the window) or
    ``"rgb_array"`` (an ``(H, W, 3)`` uint8 frame of the GPUs by node in their jobs' colours, each
    worker's SPB level, shared GPUs, the waiting queue and the simulated clock; drawn with numpy,
    :mod:`jigsaw_env.render`). ``metadata["render_modes"]`` lists both.
LOGS
    The episode's simulator (``env.unwrapped.sim``) keeps the per-job and per-round logs that
    metrics are computed from (``jobs_frame()``, ``cluster_frame()``). Its per-job-per-round log
    (``rounds_frame()``, rounds.csv) is kept only with ``log_rounds=True``: nothing in an episode
    reads it, and it grows with jobs x rounds.
"""
from __future__ import annotations

import copy
import math
import numbers
from typing import Any

import gymnasium as gym
import numpy as np
import pandas as pd
from gymnasium import spaces

from traces import load_trace, offered_load, parse_spec, synthetic
from traces.canonical import CANONICAL_DEFAULT_GPU_TYPE
from traces.models import default_throughput_fn, estimated_durations, fill_default_batch_sizes

from .actions import ActionCodec, InvalidAction, RoundBuilder, check_pause_mode, check_window_order
from .cluster import ClusterSpec
from .encoder import PROPOSAL_GROUP, ObservationEncoder, check_features
from .free_running import DEFAULT_PACE, check_pace
from .interference import DEFAULT_SHARING, check_sharing
from .render import FrameRenderer
from .simulator import SimConfig, Simulator, check_job_table, jobs_from_table
from .spb import SPBConfig
from .state import Decision

_REWARDS = ("jct", "efficiency")
#: the values ``render_mode`` takes besides None (``metadata["render_modes"]``)
RENDER_MODES = ("ansi", "rgb_array")
OBS_LOW, OBS_HIGH = -1.0, 10.0  # every encoder feature lies well inside (see encoder docstring)
_INVALID = ("noop", "raise")
#: spellings of iteration granularity for ``round_s`` (those of ``jigsaw simulate --round-s``)
_ITERATION = ("iteration", "iter", "none")
_TABLE_ORIGIN = "trace (DataFrame)"
_IDLE_ADVANCE = ("advance is masked (work_conserving=True): the decision runs nothing while a window job "
                 "could start")


class _DefaultInt(int):
    """An int default the constructor can tell apart from the same value passed explicitly."""


_MAX_JOBS_DEFAULT = _DefaultInt(50)


def _shown(v: Any) -> str:
    """An argument as a message shows it: numpy scalars as plain values, arrays by shape."""
    if isinstance(v, np.ndarray):
        return f"an array of shape {v.shape} and dtype {v.dtype}"
    if isinstance(v, np.generic):
        v = v.item()
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))


def _is_number(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))


def _int_arg(name: str, v: Any, low: int, none_ok: bool = False) -> int | None:
    """``v`` as an int (Python and numpy integers; not bools), or ValueError naming ``name``."""
    if v is None and none_ok:
        return None
    if not _is_int(v) or v < low:
        raise ValueError(f"{name} must be {'None or ' if none_ok else ''}an integer >= {low}, got {_shown(v)}")
    return int(v)


def _number_arg(name: str, v: Any, low: float, *, strict: bool, none_ok: bool = False, finite: bool = True,
                what: str = "a finite number") -> None:
    """ValueError naming ``name`` unless ``v`` is a real number (not a bool) > ``low``
    (``strict``) or >= ``low``, and finite unless ``finite=False``; None passes with ``none_ok``.
    The value itself is left as given (results must not depend on its type)."""
    if v is None and none_ok:
        return
    ok = (_is_number(v) and not math.isnan(v) and (v > low if strict else v >= low)
          and (not finite or math.isfinite(v)))
    if not ok:
        raise ValueError(f"{name} must be {'None or ' if none_ok else ''}{what} {'>' if strict else '>='} {low:g}, "
                         f"got {_shown(v)}")


def _bool_arg(name: str, v: Any) -> bool:
    if not isinstance(v, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {_shown(v)}")
    return bool(v)


def _proposer_arg(proposer: Any, features: tuple[str, ...]):
    """``proposer``: a callable ``state -> Decision`` (a scheduler) exactly when the observation
    has the ``proposal`` feature group; ValueError naming the argument otherwise."""
    wanted = PROPOSAL_GROUP in features
    if proposer is None and wanted:
        raise ValueError("obs_features includes 'proposal': give proposer, the scheduler whose round decision the "
                         "observation shows (e.g. agents.make_scheduler('jigsaw'))")
    if proposer is not None and not wanted:
        raise ValueError(f"proposer is given but obs_features {list(features)} has no 'proposal' group to show "
                         f"its decision; add 'proposal' or leave proposer out")
    if proposer is not None and not callable(proposer):
        raise ValueError(f"proposer must be a callable state -> Decision (a scheduler), got {_shown(proposer)}")
    return proposer


def _round_s_arg(v: Any) -> float | None:
    """``round_s``: seconds > 0, or None / 'iteration' (the spelling of ``--round-s``) for
    iteration granularity."""
    if v is None or (isinstance(v, str) and v.strip().lower() in _ITERATION):
        return None
    if not (_is_number(v) and v > 0 and math.isfinite(v)):
        raise ValueError(f"round_s must be a finite number of seconds > 0, or None or 'iteration' for iteration "
                         f"granularity, got {_shown(v)}")
    return v


class JigsawClusterEnv(gym.Env):
    """See the module docstring for STATE / ACTIONS / REWARD."""

    metadata = {"render_modes": list(RENDER_MODES), "render_fps": 4}

    def __init__(self, gpus: int = 64, gpus_per_node: int = 8, gpu_type: str = "v100",
                 gpu_memory_gib: float | None = None, trace: str | pd.DataFrame = "synthetic",
                 max_jobs: int = _MAX_JOBS_DEFAULT, load: float | None = None, window_k: int = 16, spb_levels: int = 3,
                 spb_slots: int = 4, max_workers_per_gpu: int = 2, round_s: float | None = 300.0,
                 restart_s: float = 30.0, reward: str = "jct", reward_scale: float = 3600.0,
                 observe_remaining: bool = True, backlogged: bool = False, max_time_s: float | None = None,
                 eta_scale: float = 1.0, eta_override: float | None = None, invalid_action: str = "noop",
                 render_mode: str | None = None, max_stalled_rounds: int | None = 1000, log_rounds: bool = False,
                 sharing: str = DEFAULT_SHARING, pace: str = DEFAULT_PACE, obs_features=None,
                 work_conserving: bool = False, window_order: str = "attained", pause: str = "leave",
                 proposer=None, spill: bool = False):
        super().__init__()
        # every argument is checked here, before anything is built: a bad one raises a ValueError
        # naming it and what was expected (not a TypeError from deep inside, nor one at reset())
        if reward not in _REWARDS:
            raise ValueError(f"reward must be one of {list(_REWARDS)}, got {reward!r}")
        if invalid_action not in _INVALID:
            raise ValueError(f"invalid_action must be one of {list(_INVALID)}, got {invalid_action!r}")
        if render_mode is not None and render_mode not in RENDER_MODES:
            raise ValueError(f"render_mode must be None or one of {list(RENDER_MODES)}, got {_shown(render_mode)}")
        max_jobs_given = max_jobs is not _MAX_JOBS_DEFAULT
        max_jobs = _int_arg("max_jobs", max_jobs, 1)
        _number_arg("reward_scale", reward_scale, 0, strict=True)
        max_stalled_rounds = _int_arg("max_stalled_rounds", max_stalled_rounds, 1, none_ok=True)
        window_k = _int_arg("window_k", window_k, 1)
        spb_levels = _int_arg("spb_levels", spb_levels, 0)
        spb_slots = _int_arg("spb_slots", spb_slots, 1)
        max_workers_per_gpu = _int_arg("max_workers_per_gpu", max_workers_per_gpu, 1)
        # gpus, gpus_per_node, gpu_type: ClusterSpec names them; numpy integers are integers
        gpus = int(gpus) if _is_int(gpus) else gpus
        gpus_per_node = int(gpus_per_node) if _is_int(gpus_per_node) else gpus_per_node
        _number_arg("gpu_memory_gib", gpu_memory_gib, 0, strict=True, none_ok=True)
        round_s = _round_s_arg(round_s)
        _number_arg("restart_s", restart_s, 0, strict=False, what="a finite number of seconds")
        _number_arg("max_time_s", max_time_s, 0, strict=True, none_ok=True, finite=False, what="a number of seconds")
        observe_remaining = _bool_arg("observe_remaining", observe_remaining)
        backlogged = _bool_arg("backlogged", backlogged)
        log_rounds = _bool_arg("log_rounds", log_rounds)
        #: mask advance while the decision runs nothing and a window job could start
        self.work_conserving = _bool_arg("work_conserving", work_conserving)
        #: how the window orders the active jobs (jigsaw_env.actions.WINDOW_ORDERS)
        self.window_order = check_window_order(window_order)
        if self.window_order == "remaining" and not observe_remaining:
            raise ValueError("window_order='remaining' orders the window by the jobs' remaining work, which "
                             "observe_remaining=False hides from the policy; observe it or pick another order")
        #: what a pause does with the job (jigsaw_env.actions.PAUSE_MODES)
        self.pause = check_pause_mode(pause)
        #: on advance, run the jobs the decision leaves waiting where they can (jigsaw_env.spill)
        self.spill = _bool_arg("spill", spill)
        _number_arg("eta_scale", eta_scale, 0, strict=True)
        if eta_override is not None and not (_is_number(eta_override) and 0 < eta_override <= 1):
            raise ValueError(f"eta_override must be None or a number in (0, 1], got {_shown(eta_override)}")
        _number_arg("load", load, 0, strict=True, none_ok=True)
        if not isinstance(trace, (str, pd.DataFrame)):
            raise ValueError(f"trace must be a trace spec (KIND:PATH or synthetic[:key=value,...]) or a pandas "
                             f"DataFrame job table, got {type(trace).__name__} {_shown(trace)}")
        self.max_stalled_rounds = max_stalled_rounds
        self._stalled_rounds = 0
        self.cluster = ClusterSpec.from_gpus(gpus, gpus_per_node=gpus_per_node, gpu_type=gpu_type,
                                             gpu_memory_gib=gpu_memory_gib)
        self.spb = SPBConfig(max_level=spb_levels, num_slots=spb_slots)
        self.sim_config = SimConfig(round_s=round_s, restart_s=restart_s, max_workers_per_gpu=max_workers_per_gpu,
                                    backlogged=backlogged, max_time_s=max_time_s, spb=self.spb,
                                    eta_override=eta_override, eta_scale=eta_scale, log_rounds=log_rounds,
                                    sharing=check_sharing(sharing), pace=check_pace(pace))
        self.trace = trace
        self.max_jobs = max_jobs
        self.load = load
        self.reward_kind = reward
        self.reward_scale = float(reward_scale)
        self.invalid_action = invalid_action
        self.render_mode = render_mode
        self.codec = ActionCodec(window_k, self.spb)
        self.encoder = ObservationEncoder(window_k, observe_remaining, check_features(obs_features))
        #: the heuristic whose round decision the ``proposal`` feature group shows (None without it)
        self.proposer = _proposer_arg(proposer, self.encoder.features)
        #: the proposer's decision for the round being built (None without a proposer)
        self.proposal: Decision | None = None
        #: the observation's feature groups (``jigsaw_env.encoder.FEATURE_GROUPS``; default every group)
        self.obs_features = self.encoder.features
        self.action_space = spaces.Discrete(self.codec.n)
        self.observation_space = spaces.Box(low=OBS_LOW, high=OBS_HIGH, shape=(self.encoder.size,), dtype=np.float32)
        self._full_trace: pd.DataFrame | None = None
        if isinstance(trace, pd.DataFrame):
            # the loaders' rules, the table's own rows in its order (windows are cut from it)
            table = check_job_table(trace, origin=_TABLE_ORIGIN)
            # models, batch sizes and GPUs per job: what reset() would check, now
            jobs_from_table(table, self.cluster, origin=_TABLE_ORIGIN, checked=True)
            self._full_trace = table if load is None else self._scaled_to_load(table, load)
        else:
            self._check_trace_spec(trace, max_jobs if max_jobs_given else None)
        self.sim: Simulator | None = None
        self._cost_models: dict[int, Any] = {}  # cost model of the last episode on each cluster size
        self.builder: RoundBuilder | None = None
        self._steps_in_round = 0
        self._mask_cache: dict = {}
        self._mask: np.ndarray | None = None  # the current state's action mask (computed once per state)
        self._renderer: FrameRenderer | None = None

    # ------------------------------------------------------------------ trace checks
    def _check_trace_spec(self, spec: str, max_jobs_given: int | None) -> None:
        """Check a trace spec now rather than at the first reset(): its kind, its synthetic
        parameters and, when this class draws the episodes, that it agrees with ``load`` and an
        explicit ``max_jobs`` (the "conflicting loads" check of ``jigsaw simulate``) and that it
        loads: a synthetic trace is drawn once, a real trace is loaded (once, as reset() would)."""
        kind, rest = parse_spec(spec)
        params = synthetic.parse_params(rest) if kind == "synthetic" else {}
        if type(self)._episode_jobs is not JigsawClusterEnv._episode_jobs:
            return  # a subclass draws its episodes its own way (and loads its trace itself)
        synthetic.check_spec_load(params, None if self.load is None else float(self.load), "the load argument")
        if "jobs" in params and max_jobs_given is not None and params["jobs"] != max_jobs_given:
            raise ValueError(f"conflicting job counts: the spec says jobs={params['jobs']}, the max_jobs argument "
                             f"says {max_jobs_given}; give one of them")
        self._episode_jobs(0)  # raises what reset() would; a real trace stays loaded

    def _scaled_to_load(self, table: pd.DataFrame, load: float) -> pd.DataFrame:
        """``table`` (checked) with its inter-arrival times scaled so that its offered load against
        this cluster equals ``load``, as ``traces.load_trace`` scales a KIND:PATH trace: a job with
        only iterations lasts iterations / its isolated throughput on its ``gpu_type`` (else the
        canonical CSV's default), at the model's default batch size when it gives none. The
        first arrival stays where it is."""
        est = table
        need_type = (est["gpu_type"] == "").to_numpy()
        need_bs = ((est["model"] != "").to_numpy() & est["batch_size"].isna().to_numpy()
                   & est["duration_s"].isna().to_numpy())
        if need_type.any() or need_bs.any():
            est = table.copy()
            est.loc[need_type, "gpu_type"] = CANONICAL_DEFAULT_GPU_TYPE
            fill_default_batch_sizes(est, need_bs, where=f"{_TABLE_ORIGIN}: ")
        tfn = default_throughput_fn() if est["duration_s"].isna().any() else None
        try:
            d = estimated_durations(est, tfn)
        except ValueError as e:
            raise ValueError(f"{_TABLE_ORIGIN}: cannot scale to load={load}: {e}") from None
        if np.isnan(d).any():
            first = est["job_id"].iloc[int(np.flatnonzero(np.isnan(d))[0])]
            raise ValueError(f"{_TABLE_ORIGIN}: cannot scale to load={load}: {int(np.isnan(d).sum())} job(s) have no "
                             f"duration_s and no model to estimate one from iterations (first: job_id {first})")
        before = offered_load(est, self.cluster.num_gpus, d)
        if not np.isfinite(before):
            raise ValueError(f"{_TABLE_ORIGIN}: cannot scale to load={load}: all jobs arrive at the same time")
        a = table["arrival_s"].to_numpy(dtype=np.float64)
        a0 = float(a.min())
        out = table.copy()
        out["arrival_s"] = a0 + (a - a0) * (before / load)
        return out

    # ------------------------------------------------------------------ episode jobs
    def _episode_jobs(self, seed: int) -> pd.DataFrame:
        if isinstance(self.trace, pd.DataFrame):
            df = self._full_trace  # the checked table (rescaled when load is given)
        else:
            spec = str(self.trace)
            kind, opts = parse_spec(spec)  # the kind as the loader reads it (any case, spaces around)
            if kind == "synthetic":
                parts = [p for p in opts.split(",") if p]
                keys = {p.split("=", 1)[0].strip() for p in parts}
                if "jobs" not in keys:
                    parts.append(f"jobs={self.max_jobs}")
                if "load" not in keys and self.load is not None:
                    parts.append(f"load={self.load}")
                if "seed" not in keys:
                    parts.append(f"seed={seed}")
                return load_trace("synthetic:" + ",".join(parts), cluster_gpus=self.cluster.num_gpus,
                                  max_gpus=self.cluster.num_gpus).jobs
            if self._full_trace is None:
                # load=None keeps the trace's own arrival times; a number rescales inter-arrival
                # times so the whole trace's offered load against this cluster equals it
                self._full_trace = load_trace(spec, cluster_gpus=self.cluster.num_gpus,
                                              max_gpus=self.cluster.num_gpus, load_scale=self.load).jobs
            df = self._full_trace
        if len(df) > self.max_jobs:
            rng = np.random.default_rng(seed)
            start = int(rng.integers(0, len(df) - self.max_jobs + 1))
            df = df.iloc[start:start + self.max_jobs].copy()
            df["arrival_s"] = df["arrival_s"] - df["arrival_s"].min()
        return df

    # ------------------------------------------------------------------ gym API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        ep_seed = int(self.np_random.integers(0, 2**31 - 1))
        jobs = (options or {}).get("jobs")
        if jobs is None:
            jobs = self._episode_jobs(ep_seed)
        # the cost model (cached profiles and step tables, which depend on the cluster and the
        # SPB settings only) carries over from the last episode
        # (one per cluster size, for training envs that draw the cluster per episode)
        if self.sim is not None:
            self._cost_models[self.sim.costs.cluster.num_gpus] = self.sim.costs
        costs = self._cost_models.get(self.cluster.num_gpus)
        if costs is not None and costs.mismatch(self.cluster, self.sim_config.spb, self.sim_config.eta_override,
                                                self.sim_config.eta_scale) is not None:
            costs = None  # the settings changed since
        self.sim = Simulator(self.cluster, jobs, self.sim_config, costs=costs)
        self._mask_cache = {}  # the round builders' mask cache, kept for the episode
        self._stalled_rounds = 0
        self.encoder.reset()  # the observation's LAS queue (features 19-21) starts afresh
        if self.proposer is not None and hasattr(self.proposer, "reset"):
            self.proposer.reset()  # a new episode for the proposing heuristic too
        self._new_round()
        return self._obs(), {"time_s": self.sim.state.time_s, "action_mask": self._refresh_mask()}

    def _new_round(self) -> None:
        state = self.sim.state
        self.builder = RoundBuilder(state, self.codec, self.sim.in_force_ledger(), self._mask_cache,
                                    self.encoder.window_rank(state, self.window_order),
                                    work_conserving=self.work_conserving,
                                    order=self.window_order, pause=self.pause, spill=self.spill)
        self._steps_in_round = 0
        if self.proposer is not None:
            self.proposal = self.proposer(state)  # asked once per round, as the simulator asks a policy

    def _obs(self) -> np.ndarray:
        b = self.builder
        obs = self.encoder.encode(self.sim.state, b.window, b.ledger, b.acted, self._steps_in_round, b.hosts(),
                                  self.proposal)
        # np.clip's result, with less call overhead
        return np.minimum(np.maximum(obs, OBS_LOW, out=obs), OBS_HIGH, out=obs)

    def action_masks(self) -> np.ndarray:
        """Boolean mask over the actions, True for every feasible one (exact); all False once the
        episode is over (``step`` takes no action then). The same values as ``info["action_mask"]``
        of the last ``reset``/``step``; a fresh array each call."""
        if self.sim is None:
            raise RuntimeError("action_masks() needs a state: call reset() first")
        if self._mask is None:
            self._refresh_mask()
        return self._mask.copy()

    def _refresh_mask(self) -> np.ndarray:
        """Compute the current state's mask once, keep it for :meth:`action_masks`, and return a
        copy (the one ``info["action_mask"]`` holds)."""
        if self.sim.done:
            self._mask = np.zeros(self.codec.n, dtype=bool)
        else:
            self._mask = self.builder.masks()
        return self._mask.copy()

    def step(self, action):
        if self.sim is None:
            raise RuntimeError("call reset() before step()")
        if self.sim.done:
            raise RuntimeError("the episode is over; call reset()")
        if type(action) is not int:
            action = self._action_index(action)
        info: dict[str, Any] = {}
        decoded = self.codec.decode(action) if 0 <= action < self.codec.n else None
        kind = decoded[0] if decoded is not None else "invalid"
        if kind == "invalid" and self.invalid_action == "raise":
            raise InvalidAction(f"action {action} is outside 0..{self.codec.n - 1}")  # nothing changed
        if kind == "advance" and self.work_conserving and not self._mask[action]:  # set by reset and step
            if self.invalid_action == "raise":
                raise InvalidAction(_IDLE_ADVANCE)  # nothing changed
            info["invalid_action"] = _IDLE_ADVANCE
            kind = "refused"
        self._steps_in_round += 1
        advance = kind == "advance" or self._steps_in_round > self.builder.step_cap
        if kind not in ("advance", "invalid", "refused"):
            try:
                self.builder.apply(action, decoded)
            except InvalidAction as e:
                if self.invalid_action == "raise":
                    self._steps_in_round -= 1
                    raise
                info["invalid_action"] = str(e)
        elif kind == "invalid":
            if self.invalid_action == "raise":
                raise InvalidAction(f"action {action} is outside 0..{self.codec.n - 1}")
            info["invalid_action"] = f"action {action} is outside 0..{self.codec.n - 1}"
        reward = 0.0
        stalled = False
        dt_s = 0.0
        if advance:
            t_before = self.sim.state.time_s
            waiting = len(self.sim.state.active_ids)
            # the builder's ledger was built from this round's in_force_ledger() by checked adds and
            # removes: the simulator takes it over instead of validating the decision again
            r = self.sim.step(self.builder.finish(), ledger=self.builder.ledger)
            self._stalled_rounds = self._stalled_rounds + 1 if (r.allocated_gpu_s == 0.0 and waiting) else 0
            stalled = self.max_stalled_rounds is not None and self._stalled_rounds >= self.max_stalled_rounds
            if self.reward_kind == "jct":
                reward = -r.job_seconds / self.reward_scale
            else:
                reward = r.useful_gpu_s / (self.cluster.num_gpus * self.reward_scale)
            info.update(round=r.round, time_s=r.end_s, finished=r.finished)
            dt_s = r.end_s - t_before
            if not self.sim.done:
                self._new_round()
        terminated = bool(self.sim.num_finished == len(self.sim.state.jobs))
        truncated = bool((self.sim.truncated or stalled) and not terminated)
        if stalled and not terminated:
            info["policy_stalled"] = (f"the policy ran nothing for {self._stalled_rounds} rounds in a row while jobs "
                                      f"waited (simulated time {self.sim.state.time_s:,.0f} s)")
        if terminated or truncated:
            info["episode_metrics"] = self.sim.metrics()
        info["dt_s"] = dt_s
        info["action_mask"] = self._refresh_mask()
        obs = self._obs()
        return obs, float(reward), terminated, truncated, info

    def _action_index(self, action: Any) -> int:
        """The action as an int: Python and numpy integers and 0-d integer arrays (what
        ``Discrete.contains`` takes). Anything else raises InvalidAction naming the action and
        the valid range, whatever ``invalid_action`` says (nothing has changed)."""
        if isinstance(action, np.ndarray) and action.ndim == 0 and action.dtype.kind in "iu":
            return int(action)
        if _is_int(action):
            return int(action)
        hint = ""
        if isinstance(action, np.ndarray) and action.size == 1 and action.dtype.kind in "iu":
            hint = "; pass the scalar (action.item()), not a 1-element array"
        got = _shown(action) if isinstance(action, np.ndarray) else f"{type(action).__name__} {_shown(action)}"
        raise InvalidAction(f"action must be an integer in 0..{self.codec.n - 1} (a Python or numpy integer, or a "
                            f"0-d integer array), got {got}{hint}")

    def render(self) -> str | np.ndarray | None:
        """The current state in ``render_mode``: ``"ansi"`` a text (the GPU map per node and the
        window), ``"rgb_array"`` an ``(H, W, 3)`` uint8 frame (:mod:`jigsaw_env.render` describes
        it); None without a render mode."""
        if self.render_mode is None:
            return None
        if self.sim is None:
            raise RuntimeError("render() needs a state: call reset() first")
        if self.render_mode == "rgb_array":
            return self._rgb_frame()
        return self._ansi_text()

    def _rgb_frame(self) -> np.ndarray:
        """The frame of the decision being built (the allocation in force once the episode is over)."""
        if self._renderer is None:
            c = self.cluster
            self._renderer = FrameRenderer(c.num_nodes, c.gpus_per_node, self.sim_config.max_workers_per_gpu,
                                           self.spb.max_level)
        decision = self.sim.state.current_decision() if self.sim.done else self.builder.ledger.decision
        return self._renderer.frame(self.sim.state, decision, self.sim.num_finished)

    def _ansi_text(self) -> str:
        st = self.sim.state
        lines = [f"t={st.time_s:,.0f}s round={st.round} waiting={len(st.queued())} running={len(st.running())} "
                 f"done={self.sim.num_finished}/{len(st.jobs)}"]
        owners = self.builder.ledger.owners
        row = []
        for g, o in enumerate(owners):
            row.append("." if not o else ("+".join(str(x) for x in o)))
            if (g + 1) % self.cluster.gpus_per_node == 0:
                lines.append(f"node {g // self.cluster.gpus_per_node}: " + " ".join(f"{x:>5}" for x in row))
                row = []
        for slot, jid in enumerate(self.builder.window):
            j = st.jobs[jid]
            lines.append(f"  [{slot:2d}] job {jid} {j.model} x{j.num_gpus} {j.status.value} L{j.level} "
                         f"{100 * j.progress / j.iterations:5.1f}%")
        return "\n".join(lines) + "\n"

    # ------------------------------------------------------------------ helpers
    def copy(self) -> "JigsawClusterEnv":
        """A deep copy (mask checks, look-ahead)."""
        return copy.deepcopy(self)
