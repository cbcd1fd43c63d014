"""``JigsawCluster-v0``: the Gymnasium environment on top of the simulator.

STATE
    The simulator's :class:`~jigsaw_env.state.ClusterState` (jobs, their progress and placements,
    the GPUs) plus the decision being built for the next round. The agent observes it through the
    shared :class:`~jigsaw_env.encoder.ObservationEncoder`: a ``Box`` of
    ``K * 27 + 10`` float32 values whose shape does not depend on the cluster's size.
ACTIONS
    ``Discrete(K * (5 * (1 + 2L) + 1) + 1)``: one decision per step (Decima-style). Pick one job of
    the round's window of K waiting and running jobs with a placement option (keep, consolidated,
    spread, packed, paired) and an SPB level and pattern; or pause a running job; or *advance*, which
    applies the decision and runs one round of ``round_s`` seconds. ``action_masks()`` marks
    exactly the feasible actions (sb3-contrib protocol). A job is decided at most once per round,
    and the window slides: a decided job's slot shows the next job behind the window, so one round
    can start a whole arrival burst. After ``2K + 2`` steps plus one per job behind the window the
    env advances by itself.
REWARD
    ``-(jobs in system x elapsed seconds) / reward_scale`` on advance steps (0 otherwise), so the
    episode return is ``-(sum of JCTs) / reward_scale``. ``reward="efficiency"`` instead pays the
    round's useful GPU-seconds / (GPUs x reward_scale).
EPISODE
    ``terminated`` when every job of the episode has finished; ``truncated`` when ``max_time_s``
    of simulated time has passed, or when the policy has run nothing for ``max_stalled_rounds``
    rounds in a row while jobs waited (default 1000; ``info["policy_stalled"]`` says so), so an
    untrained policy that only advances cannot hang an evaluation. ``info["episode_metrics"]`` holds every metric at the end.
    Each ``reset(seed=...)`` draws the episode's jobs: a new synthetic trace, or a window of
    ``max_jobs`` consecutive jobs at a seeded random offset of a real trace.
"""
from __future__ import annotations

import copy
from typing import Any

import gymnasium as gym
import numpy as np
import pandas as pd
from gymnasium import spaces

from .actions import ActionCodec, InvalidAction, RoundBuilder
from .cluster import ClusterSpec
from .encoder import ObservationEncoder
from .simulator import SimConfig, Simulator
from .spb import SPBConfig

_REWARDS = ("jct", "efficiency")
OBS_LOW, OBS_HIGH = -1.0, 10.0  # every encoder feature lies well inside (see encoder docstring)
_INVALID = ("noop", "raise")


class JigsawClusterEnv(gym.Env):
    """See the module docstring for STATE / ACTIONS / REWARD."""

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(self, gpus: int = 64, gpus_per_node: int = 8, gpu_type: str = "v100",
                 gpu_memory_gib: float | None = None, trace: str | pd.DataFrame = "synthetic",
                 max_jobs: int = 50, load: float | None = None, window_k: int = 16, spb_levels: int = 3,
                 spb_slots: int = 4, max_workers_per_gpu: int = 2, round_s: float | None = 300.0,
                 restart_s: float = 30.0, reward: str = "jct", reward_scale: float = 3600.0,
                 observe_remaining: bool = True, backlogged: bool = False, max_time_s: float | None = None,
                 eta_scale: float = 1.0, eta_override: float | None = None, invalid_action: str = "noop",
                 render_mode: str | None = None, max_stalled_rounds: int | None = 1000):
        super().__init__()
        if reward not in _REWARDS:
            raise ValueError(f"reward must be one of {list(_REWARDS)}, got {reward!r}")
        if invalid_action not in _INVALID:
            raise ValueError(f"invalid_action must be one of {list(_INVALID)}, got {invalid_action!r}")
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        if not isinstance(max_jobs, int) or max_jobs < 1:
            raise ValueError(f"max_jobs must be an integer >= 1, got {max_jobs!r}")
        if not reward_scale > 0:
            raise ValueError(f"reward_scale must be > 0, got {reward_scale!r}")
        if max_stalled_rounds is not None and (not isinstance(max_stalled_rounds, int) or max_stalled_rounds < 1):
            raise ValueError(f"max_stalled_rounds must be None or an integer >= 1, got {max_stalled_rounds!r}")
        self.max_stalled_rounds = max_stalled_rounds
        self._stalled_rounds = 0
        self.cluster = ClusterSpec.from_gpus(gpus, gpus_per_node=gpus_per_node, gpu_type=gpu_type,
                                             gpu_memory_gib=gpu_memory_gib)
        self.spb = SPBConfig(max_level=spb_levels, num_slots=spb_slots)
        self.sim_config = SimConfig(round_s=round_s, restart_s=restart_s, max_workers_per_gpu=max_workers_per_gpu,
                                    backlogged=backlogged, max_time_s=max_time_s, spb=self.spb,
                                    eta_override=eta_override, eta_scale=eta_scale)
        self.trace = trace
        self.max_jobs = max_jobs
        self.load = load
        self.reward_kind = reward
        self.reward_scale = float(reward_scale)
        self.invalid_action = invalid_action
        self.render_mode = render_mode
        self.codec = ActionCodec(window_k, self.spb)
        self.encoder = ObservationEncoder(window_k, observe_remaining)
        self.action_space = spaces.Discrete(self.codec.n)
        self.observation_space = spaces.Box(low=OBS_LOW, high=OBS_HIGH, shape=(self.encoder.size,), dtype=np.float32)
        self._full_trace: pd.DataFrame | None = trace if isinstance(trace, pd.DataFrame) else None
        self.sim: Simulator | None = None
        self._cost_models: dict[int, Any] = {}  # cost model of the last episode on each cluster size
        self.builder: RoundBuilder | None = None
        self._steps_in_round = 0
        self._mask_caches: tuple[dict, dict] = ({}, {})

    # ------------------------------------------------------------------ episode jobs
    def _episode_jobs(self, seed: int) -> pd.DataFrame:
        if isinstance(self.trace, pd.DataFrame):
            df = self.trace
        else:
            spec = str(self.trace)
            from traces import load_trace
            if spec.split(":", 1)[0] == "synthetic":
                opts = spec.split(":", 1)[1] if ":" in spec else ""
                parts = [p for p in opts.split(",") if p]
                keys = {p.split("=", 1)[0] for p in parts}
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
        self._mask_caches = ({}, {})  # the round builders' mask caches, kept for the episode
        self._stalled_rounds = 0
        self.encoder.reset()  # the observation's LAS queue (features 19-21) starts afresh
        self._new_round()
        return self._obs(), {"time_s": self.sim.state.time_s}

    def _new_round(self) -> None:
        self.builder = RoundBuilder(self.sim.state, self.codec, self.sim.in_force_ledger(), self._mask_caches)
        self._steps_in_round = 0

    def _obs(self) -> np.ndarray:
        b = self.builder
        obs = self.encoder.encode(self.sim.state, b.window, b.ledger, b.acted, self._steps_in_round)
        # np.clip's result, with less call overhead
        return np.minimum(np.maximum(obs, OBS_LOW, out=obs), OBS_HIGH, out=obs)

    def action_masks(self) -> np.ndarray:
        """Boolean mask, True for every feasible action (exact)."""
        return self.builder.masks()

    def step(self, action):
        if self.sim is None:
            raise RuntimeError("call reset() before step()")
        if self.sim.done:
            raise RuntimeError("the episode is over; call reset()")
        info: dict[str, Any] = {}
        decoded = self.codec.decode(action) if 0 <= int(action) < self.codec.n else None
        kind = decoded[0] if decoded is not None else "invalid"
        if kind == "invalid" and self.invalid_action == "raise":
            raise InvalidAction(f"action {action} is outside 0..{self.codec.n - 1}")  # nothing changed
        self._steps_in_round += 1
        advance = kind == "advance" or self._steps_in_round > self.builder.step_cap
        if kind not in ("advance", "invalid"):
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
        if advance:
            waiting = len(self.sim.state.active_ids)
            # the builder's ledger was built from this round's in_force_ledger() by checked adds and
            # removes: the simulator takes it over instead of validating the decision again
            r = self.sim.step(self.builder.ledger.decision, ledger=self.builder.ledger)
            self._stalled_rounds = self._stalled_rounds + 1 if (r.allocated_gpu_s == 0.0 and waiting) else 0
            stalled = self.max_stalled_rounds is not None and self._stalled_rounds >= self.max_stalled_rounds
            if self.reward_kind == "jct":
                reward = -r.job_seconds / self.reward_scale
            else:
                reward = r.useful_gpu_s / (self.cluster.num_gpus * self.reward_scale)
            info.update(round=r.round, time_s=r.end_s, finished=r.finished)
            if not self.sim.done:
                self._new_round()
        terminated = bool(self.sim.num_finished == len(self.sim.state.jobs))
        truncated = bool((self.sim.truncated or stalled) and not terminated)
        if stalled and not terminated:
            info["policy_stalled"] = (f"the policy ran nothing for {self._stalled_rounds} rounds in a row while jobs "
                                      f"waited (simulated time {self.sim.state.time_s:,.0f} s)")
        if terminated or truncated:
            info["episode_metrics"] = self.sim.metrics()
        obs = self._obs()
        return obs, float(reward), terminated, truncated, info

    def render(self):
        if self.render_mode != "ansi":
            return None
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
