"""Learned agents: load a training run (RUN_DIR) and act with exact action masks.

A RUN_DIR is what ``train_agent.py`` / ``jigsaw train`` writes::

    RUN_DIR/model.zip          the policy (stable-baselines3 / sb3-contrib .zip)
    RUN_DIR/vecnormalize.npz   VecNormalize observation statistics (plain arrays, agents/vecnorm_file.py)
    RUN_DIR/policy.onnx        optional: the policy exported by ``jigsaw export`` (used when present)
    RUN_DIR/config.json        the env config, the spaces, the algorithm, versions

:class:`LearnedAgent` loads the three, checks that the run's spaces fit an evaluation's config
(:meth:`LearnedAgent.check_compatible`: window K, SPB levels and slots, placement menu, observation
size and action count; a mismatch raises ValueError with one line naming expected vs found) and
acts deterministically: the action with the highest logit among the feasible ones (for
MaskablePPO the same as ``predict(obs, action_masks=mask, deterministic=True)``; PPO and A2C,
trained without masks, are masked the same way at evaluation).

It plays either a :class:`~jigsaw_env.env.JigsawClusterEnv` on a given job table
(:meth:`LearnedAgent.play`, what ``jigsaw evaluate`` uses) or, through :class:`LearnedScheduler`,
any simulator or live state round by round, like a heuristic. Both are work-conserving by default
(``RoundBuilder(work_conserving=True)``): the policy cannot advance while its decision runs nothing
and a window job could start, so it never leaves the whole cluster idle while a job fits, as no
heuristic does; where it would have advanced, its best-scored feasible action runs instead.
"""
from __future__ import annotations

import json
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from jigsaw_env.actions import PAUSE_MODES, WINDOW_ORDERS, ActionCodec, RoundBuilder, level_pattern_combos
from jigsaw_env.digest import file_sha256
from jigsaw_env.encoder import CLUSTER_FEATURES, ObservationEncoder, check_features
from jigsaw_env.env import OBS_HIGH, OBS_LOW, JigsawClusterEnv
from jigsaw_env.simulator import PolicyStalled
from jigsaw_env.spb import SPBConfig
from jigsaw_env.state import ClusterState, Decision

from .base import Scheduler
from .rl_env import make_proposer
from .vecnorm_file import FILE_NAME as VECNORM_FILE
from .vecnorm_file import read_vecnormalize, stats_path

RUN_FORMAT = "jigsaw-run/1"
ALGOS = ("maskable_ppo", "ppo", "a2c")
POLICIES = ("mlp", "slots")  # train_agent.py --policy (agents/slot_policy.py)


def algo_class(name: str):
    """The stable-baselines3 / sb3-contrib class of an algorithm name."""
    name = name.lower().replace("-", "_")
    if name == "maskable_ppo":
        from sb3_contrib import MaskablePPO
        return MaskablePPO
    if name == "ppo":
        from stable_baselines3 import PPO
        return PPO
    if name == "a2c":
        from stable_baselines3 import A2C
        return A2C
    raise ValueError(f"unknown algorithm {name!r}; allowed: {list(ALGOS)}")


def spaces_signature(window_k: int, spb_levels: int, spb_slots: int, obs_features=None) -> dict:
    """What a policy's input and output layout depends on (recorded in config.json);
    ``obs_features``: the observation's feature groups (None: every group)."""
    spb = SPBConfig(max_level=spb_levels, num_slots=spb_slots)
    codec = ActionCodec(window_k, spb)
    enc = ObservationEncoder(window_k, features=obs_features)
    return {
        "window_k": int(window_k),
        "spb_levels": int(spb_levels),
        "spb_slots": int(spb_slots),
        "placement_options": list(codec.options),
        "host_slots": codec.host_slots,
        "level_pattern_combos": [f"{lv}/{pt.value}" for lv, pt in level_pattern_combos(spb)],
        "obs_features": list(enc.features),
        "job_features": enc.job_features,
        "cluster_features": CLUSTER_FEATURES,
        "observation_size": enc.size,
        "n_actions": codec.n,
    }


def run_features(cfg: dict, where: str | Path = "config.json") -> tuple[str, ...]:
    """The observation feature groups a run was trained with: ``spaces.obs_features`` of its
    config (a config without the field: every group, the default layout). ValueError (one line naming the field and the allowed groups) for an unknown
    group, or when ``env.obs_features`` names other groups than ``spaces.obs_features``."""
    sp = (cfg.get("spaces") or {}).get("obs_features")
    env = (cfg.get("env") or {}).get("obs_features")
    groups = check_features(sp, f"{where}: field 'spaces.obs_features'")
    if env is not None and check_features(env, f"{where}: field 'env.obs_features'") != groups:
        raise ValueError(f"{where}: field 'env.obs_features' {list(env)} differs from 'spaces.obs_features' "
                         f"{list(groups)}")
    return groups


def is_run_dir(path: str | Path) -> bool:
    p = Path(path)
    return p.is_dir() and (p / "config.json").is_file()


def json_kind(v: Any) -> str:
    """What a JSON value is, for an error message: "null", "a number (123)", "a list", ..."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"a boolean ({str(v).lower()})"
    if isinstance(v, (int, float)):
        return f"a number ({v!r})"
    if isinstance(v, str):
        return f"a string ({v!r})" if len(v) <= 40 else "a string"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, dict):
        return "an object"
    return type(v).__name__


#: what :func:`read_run_config` requires of config.json, for its error messages
CONFIG_SHAPE = ("a JSON object with algo (one of {algos}), env (object: the env options) and spaces (object with "
                "window_k, spb_levels, spb_slots, ...), as written by `jigsaw train`")


def check_run_config(cfg: Any, cfg_path: str | Path) -> dict:
    """``cfg`` (config.json's parsed value) if it has the structure a run's config needs (a JSON
    object with ``algo``, ``env`` an object, ``spaces`` an object with an integer ``window_k``
    >= 1; ``sampling`` and ``hyperparameters``, when present, objects); else ValueError, one line
    naming the file, the field and what was expected."""
    shape = CONFIG_SHAPE.format(algos=list(ALGOS))
    if not isinstance(cfg, dict):
        raise ValueError(f"{cfg_path}: expected {shape}; got {json_kind(cfg)}")
    for key in ("algo", "env", "spaces"):
        if key not in cfg:
            raise ValueError(f"{cfg_path}: missing field {key!r}; expected a config written by `jigsaw train`")
    algo = cfg["algo"]
    if not isinstance(algo, str) or algo.lower().replace("-", "_") not in ALGOS:
        raise ValueError(f"{cfg_path}: field 'algo': expected one of {list(ALGOS)}, got {json_kind(algo)}")
    for key, what in (("env", "the env options"), ("spaces", "window_k, spb_levels, spb_slots, ..."),
                      ("sampling", "the episode sampling options"), ("hyperparameters", "the algorithm's options")):
        if key in cfg and not isinstance(cfg[key], dict) and not (key in ("sampling", "hyperparameters")
                                                                  and cfg[key] is None):
            raise ValueError(f"{cfg_path}: field {key!r}: expected a JSON object ({what}), got {json_kind(cfg[key])}")
    k = cfg["spaces"].get("window_k")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"{cfg_path}: field 'spaces.window_k': expected an integer >= 1 (the policy's window K), "
                         f"got {json_kind(k) if 'window_k' in cfg['spaces'] else 'nothing'}")
    return cfg


def run_window_order(config: dict, where: Path) -> str:
    """A run's window order (``env.window_order`` of its config; ``attained`` when absent);
    ValueError naming the file, the field and the allowed values otherwise."""
    order = config["env"].get("window_order", "attained")
    if order not in WINDOW_ORDERS:
        raise ValueError(f"{where}: field 'env.window_order': expected one of {list(WINDOW_ORDERS)}, got {order!r}")
    return order


def run_pause_mode(config: dict, where: Path) -> str:
    """What a pause did in a run's env (``env.pause`` of its config; ``leave``, the env's default,
    when absent); ValueError naming the file, the field and the allowed values otherwise."""
    mode = config["env"].get("pause", "leave")
    if mode not in PAUSE_MODES:
        raise ValueError(f"{where}: field 'env.pause': expected one of {list(PAUSE_MODES)}, got {mode!r}")
    return mode


def run_spill(config: dict, where: Path) -> bool:
    """Whether a run's env spilled waiting jobs onto shared GPUs on advance (``env.spill`` of its
    config; false when absent); ValueError naming the file and the field otherwise."""
    spill = config["env"].get("spill", False)
    if not isinstance(spill, bool):
        raise ValueError(f"{where}: field 'env.spill': expected true or false, got {json_kind(spill)}")
    return spill


def read_run_config(run_dir: str | Path) -> dict:
    """RUN_DIR/config.json, checked by :func:`check_run_config`; FileNotFoundError or ValueError
    (one line naming the file) otherwise."""
    p = Path(run_dir)
    cfg_path = p / "config.json"
    if not p.is_dir():
        raise FileNotFoundError(f"run directory not found: {p}")
    if not cfg_path.is_file():
        raise ValueError(f"{p} is not a training run: expected config.json, model.zip and vecnormalize.npz "
                         f"(written by `jigsaw train`)")
    try:
        cfg = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{cfg_path}: not valid JSON ({e})") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{cfg_path}: not a text file ({e.reason} at byte {e.start})") from None
    return check_run_config(cfg, cfg_path)


def exported_policy(run_dir: Path, model_file: str = "model.zip"):
    """RUN_DIR's ``policy.onnx`` as an OnnxPolicy when it was exported from ``model_file``
    (``model.zip`` only) and that file is unchanged since (the metadata's ``model_sha256``), or
    when there is no ``model_file``; None otherwise (no export, a stale one, or no onnxruntime)."""
    onnx_path = run_dir / "policy.onnx"
    if model_file != "model.zip" or not onnx_path.is_file():
        return None
    try:
        from jigsaw_executor.onnx_policy import OnnxPolicy
    except ImportError:
        return None
    pol = OnnxPolicy(onnx_path)  # ValueError (one line) for a file that is not a jigsaw policy
    model_path = run_dir / model_file
    if model_path.is_file() and pol.raw_metadata.get("model_sha256") != file_sha256(model_path):
        return None
    return pol


def _load_sb3_model(model_path: Path, run_dir: Path, model_file: str, algo: str):
    """The stable-baselines3 model of a run (trusted input: SB3's zip may carry cloudpickle)."""
    if not model_path.is_file():
        raise ValueError(f"{run_dir}: expected the trained model {model_file} (is training finished?)")
    cls = algo_class(algo)
    if not zipfile.is_zipfile(model_path):
        raise ValueError(f"{model_path}: not a stable-baselines3 model (not a zip archive; corrupted?)")
    import torch
    torch.set_num_threads(1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return cls.load(str(model_path), device="cpu")
    except Exception as e:  # noqa: BLE001 - a corrupted or foreign zip: one line for the user
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ValueError(f"{model_path}: cannot load it as a {algo} model ({type(e).__name__}: {first})") from None


@dataclass
class EvalSpaces:
    """The layout an evaluation gives a policy."""

    window_k: int | None  # None: the run's own K
    spb_levels: int
    spb_slots: int


class LearnedAgent:
    """A trained policy loaded from RUN_DIR (module docstring).

    When RUN_DIR holds ``policy.onnx`` exported from its ``model.zip`` (the ONNX metadata's
    ``model_sha256`` is that file's, or there is no ``model.zip``), the agent acts with the ONNX
    graph (:class:`~jigsaw_executor.onnx_policy.OnnxPolicy`) and ``model.zip`` is never opened;
    ``prefer_onnx=False`` always loads the stable-baselines3 model."""

    def __init__(self, run_dir: str | Path, model_file: str = "model.zip", name: str | None = None, *,
                 prefer_onnx: bool = True):
        self.run_dir = Path(run_dir)
        #: what error messages call this agent (``jigsaw evaluate`` passes its label)
        self.name = name or self.run_dir.name
        self.config = read_run_config(self.run_dir)
        self.algo = str(self.config["algo"])
        self.obs_mean: np.ndarray | None = None
        self.obs_var: np.ndarray | None = None
        self.clip_obs = 10.0
        self.epsilon = 1e-8
        self.model = None
        #: the observation's feature groups (config.json's spaces.obs_features)
        self.features = run_features(self.config, self.run_dir / "config.json")
        #: the window's order the policy was trained with (config.json's env.window_order; a run
        #: without it ordered by attained service)
        self.window_order = run_window_order(self.config, self.run_dir / "config.json")
        #: what a pause did in the env the policy was trained in (config.json's env.pause)
        self.pause = run_pause_mode(self.config, self.run_dir / "config.json")
        #: whether the env the policy was trained in spilled waiting jobs on advance (env.spill)
        self.spill = run_spill(self.config, self.run_dir / "config.json")
        self.onnx = exported_policy(self.run_dir, model_file) if prefer_onnx else None
        #: the file the agent acts with (``policy.onnx`` or the model zip)
        self.policy_file = self.onnx.path.name if self.onnx is not None else model_file
        if self.onnx is None:
            self.model = _load_sb3_model(self.run_dir / model_file, self.run_dir, model_file, self.algo)
            self._load_statistics()

    def _load_statistics(self) -> None:
        """The observation mean/variance of ``vecnormalize.npz`` (data only; a folder with only
        ``vecnormalize.pkl`` is refused unread, agents/vecnorm_file.py)."""
        vn = stats_path(self.run_dir)
        if vn is None:
            if self.config.get("normalize_obs", True):
                raise ValueError(f"{self.run_dir}: expected {VECNORM_FILE} (the observation statistics)")
            return
        st = read_vecnormalize(vn)
        if st.norm_obs:
            self.obs_mean, self.obs_var, self.clip_obs, self.epsilon = st.obs_mean, st.obs_var, st.clip_obs, st.epsilon

    # ------------------------------------------------------------------ compatibility
    @property
    def window_k(self) -> int:
        return int(self.config["spaces"]["window_k"])

    def check_compatible(self, spaces: EvalSpaces) -> None:
        """Raise ValueError (one line: expected vs found) if the policy cannot act in an
        evaluation with this layout."""
        run = self.config["spaces"]
        k = spaces.window_k if spaces.window_k is not None else run.get("window_k")
        want = spaces_signature(int(k), spaces.spb_levels, spaces.spb_slots, self.features)
        where = f"RUN_DIR {self.run_dir} does not fit:"
        groups = f" (feature groups {','.join(self.features)})"
        # the sizes before the placement menu: a run of another action space (e.g. without the
        # host slots) is refused naming the sizes expected and found
        for key, label in (("window_k", "window K"), ("spb_levels", "SPB levels"), ("spb_slots", "SPB slots"),
                           ("level_pattern_combos", "level/pattern combos"),
                           ("job_features", "per-job features"), ("cluster_features", "cluster features"),
                           ("observation_size", "observation size"), ("n_actions", "action count"),
                           ("placement_options", "placement menu"), ("host_slots", "host slots")):
            if run.get(key) != want[key]:
                note = groups if key in ("job_features", "observation_size") else ""
                raise ValueError(f"{where} {label} expected {want[key]}{note}, found {run.get(key)} in config.json")
        if self.onnx is not None:
            self.onnx.check_layout(spaces.spb_levels, spaces.spb_slots, int(k))
            if tuple(self.onnx.obs_features) != self.features:
                raise ValueError(f"{where} feature groups expected {','.join(self.features)} (config.json), found "
                                 f"{','.join(self.onnx.obs_features)} in {self.onnx.path.name}")
            return
        obs_shape = tuple(self.model.observation_space.shape or ())
        if obs_shape != (want["observation_size"],):
            raise ValueError(f"{where} observation size expected {want['observation_size']}{groups}, found "
                             f"{obs_shape} in model.zip")
        n = getattr(self.model.action_space, "n", None)
        if n is None or int(n) != want["n_actions"]:
            raise ValueError(f"{where} action count expected {want['n_actions']}, found {n} in model.zip")
        if self.obs_mean is not None and tuple(self.obs_mean.shape) != (want["observation_size"],):
            raise ValueError(f"{where} observation size expected {want['observation_size']}, "
                             f"found {tuple(self.obs_mean.shape)} in {VECNORM_FILE}")

    # ------------------------------------------------------------------ acting
    def normalize(self, obs: np.ndarray) -> np.ndarray:
        """VecNormalize's observation normalization (float64, clipped to +-clip_obs, then float32)."""
        if self.obs_mean is None:
            return obs.astype(np.float32)
        o = (obs - self.obs_mean) / np.sqrt(self.obs_var + self.epsilon)
        return np.clip(o, -self.clip_obs, self.clip_obs).astype(np.float32)

    def act(self, obs: np.ndarray, mask: np.ndarray) -> int:
        """The feasible action with the highest logit (deterministic, masked).

        ValueError (one line naming the agent and its RUN_DIR) when the observation or the
        policy's logits are not finite (NaN or infinite weights: a diverged model)."""
        if self.onnx is not None:
            return self._act_onnx(obs, mask)
        import torch
        policy = self.model.policy
        raw = np.asarray(obs, dtype=np.float32)
        if not np.isfinite(raw).all():
            raise ValueError(f"agent {self.name} ({self.run_dir}): the observation has non-finite values at "
                             f"{np.flatnonzero(~np.isfinite(raw))[:5].tolist()} (expected finite features)")
        o = self.normalize(raw)
        if not np.isfinite(o).all():
            raise ValueError(f"agent {self.name} ({self.run_dir}): the observation is not finite after normalization "
                             f"with {VECNORM_FILE} (non-finite mean or variance: corrupted statistics?)")
        diverged = (f"agent {self.name} ({self.run_dir}): the policy produced non-finite logits "
                    f"(a diverged model?)")
        with torch.no_grad():
            t, _ = policy.obs_to_tensor(o)
            try:
                dist = policy.get_distribution(t)
            except ValueError as e:  # torch's argument check: NaN logits
                if "invalid values" in str(e):
                    raise ValueError(diverged) from None
                raise
            logits = dist.distribution.logits[0].cpu().numpy().astype(np.float64)
        if not np.isfinite(logits).all():
            # the distribution normalises logits (minus their log-sum-exp): one infinite logit
            # makes them all NaN or infinite
            raise ValueError(diverged)
        logits[~np.asarray(mask, dtype=bool)] = -np.inf
        return int(np.argmax(logits))

    def _act_onnx(self, obs: np.ndarray, mask: np.ndarray) -> int:
        """The exported graph's action; its errors name the agent (one line)."""
        try:
            return self.onnx.act(obs, mask)
        except ValueError as e:
            raise ValueError(f"agent {self.name} ({self.onnx.path}): {e}") from None

    def make_env(self, *, cluster_kwargs: dict, sim_config, observe_remaining: bool | None = None,
                 work_conserving: bool = True):
        """A JigsawClusterEnv with the evaluation's cluster and the exact SimConfig the heuristics
        use; the run's window K and observation options; work-conserving masks unless
        ``work_conserving=False`` (the module docstring)."""
        envc = self.config["env"]
        ck = dict(cluster_kwargs)
        ck["gpus"] = ck.pop("num_gpus", ck.get("gpus"))
        env = JigsawClusterEnv(**ck, trace="synthetic", window_k=self.window_k,
                               spb_levels=sim_config.spb.max_level, spb_slots=sim_config.spb.num_slots,
                               observe_remaining=bool(envc.get("observe_remaining", True)
                                                      if observe_remaining is None else observe_remaining),
                               max_workers_per_gpu=sim_config.max_workers_per_gpu, invalid_action="raise",
                               obs_features=self.features, work_conserving=work_conserving,
                               window_order=self.window_order, pause=self.pause, spill=self.spill,
                               proposer=make_proposer({**envc, "obs_features": list(self.features)}))
        env.sim_config = sim_config  # the very config the heuristics run with
        return env

    def play(self, env, jobs, seed: int = 0):
        """Play one episode of ``env`` on the job table ``jobs``; returns the env's Simulator.

        Like ``Simulator.run``, raises :class:`~jigsaw_env.simulator.PolicyStalled` when the policy
        runs nothing for the env's ``max_stalled_rounds`` rounds in a row while jobs wait."""
        obs, _ = env.reset(seed=seed, options={"jobs": jobs})
        while True:
            a = self.act(obs, env.action_masks())
            obs, _, term, trunc, info = env.step(a)
            if trunc and "policy_stalled" in info:
                raise PolicyStalled(info["policy_stalled"] + "; it never starts them (an undertrained policy?)")
            if term or trunc:
                return env.sim


class LearnedScheduler(Scheduler):
    """A learned agent as a round-by-round scheduler: builds each round's decision with the same
    action codec, masks and observation encoder as the env (steps exactly as ``env.step`` does);
    work-conserving masks unless ``work_conserving=False`` (the module docstring)."""

    name = "learned"

    def __init__(self, run_dir: str | Path | None = None, agent: LearnedAgent | None = None,
                 work_conserving: bool = True):
        self.agent = agent if agent is not None else LearnedAgent(run_dir)
        self.work_conserving = work_conserving
        self._codec: ActionCodec | None = None
        # the run's feature groups (an exported policy's are in its metadata's env)
        features = getattr(self.agent, "features", None) or run_features(self.agent.config)
        self._encoder = ObservationEncoder(self.agent.window_k,
                                           bool(self.agent.config["env"].get("observe_remaining", True)), features)
        #: the scheduler whose round decision the ``proposal`` feature group shows (None without it)
        self.proposer = make_proposer({**self.agent.config["env"], "obs_features": list(features)})

    def reset(self) -> None:
        """A new run: the observation's LAS queue (features 19-21) starts afresh, and so does the
        proposer."""
        self._encoder.reset()
        if self.proposer is not None:
            self.proposer.reset()

    def _state(self) -> dict:
        """The observation's LAS queue and when it was last updated, and the proposer's own state;
        the encoder's other tables and the action codec are caches of one round or of the SPB
        layout, rebuilt on demand. The policy's weights are its file's, not state."""
        d = {"las": self._encoder.las_state_dict()}
        if self.proposer is not None:
            d["proposer"] = self.proposer.state_dict()
        return d

    def _load_state(self, d: dict) -> None:
        self._encoder.load_las_state_dict(d.get("las"))
        if self.proposer is not None:
            if "proposer" not in d:
                raise ValueError("scheduler state: field 'proposer': expected the proposing scheduler's state "
                                 "(the policy's observation shows its decision)")
            self.proposer.load_state_dict(d["proposer"])

    def schedule(self, state: ClusterState) -> Decision:
        if self._codec is None or self._codec.spb != state.spb:
            self.agent.check_compatible(EvalSpaces(None, state.spb.max_level, state.spb.num_slots))
            self._codec = ActionCodec(self.agent.window_k, state.spb)
        codec = self._codec
        order = getattr(self.agent, "window_order", "attained")
        b = RoundBuilder(state, codec, priority=self._encoder.window_rank(state, order),
                         work_conserving=self.work_conserving, order=order,
                         pause=getattr(self.agent, "pause", "leave"), spill=getattr(self.agent, "spill", False))
        steps = 0
        proposal = None if self.proposer is None else self.proposer(state)
        while True:
            obs = self._encoder.encode(state, b.window, b.ledger, b.acted, steps, b.hosts(), proposal)
            np.clip(obs, OBS_LOW, OBS_HIGH, out=obs)
            a = self.agent.act(obs, b.masks())
            steps += 1
            if a != codec.advance:
                b.apply(a)
            if a == codec.advance or steps > b.step_cap:
                return b.finish()


def describe(agent: LearnedAgent) -> dict[str, Any]:
    c = agent.config
    return {"run_dir": str(agent.run_dir), "policy_file": agent.policy_file, "algo": agent.algo, "trained_timesteps": c.get("trained_timesteps"),
            "window_k": agent.window_k, "seed": c.get("seed"),
            "trained_on": {k: c["env"].get(k) for k in ("trace", "gpus", "max_jobs", "load", "round_s", "reward",
                                                        "backlogged", "observe_remaining", "work_conserving",
                                                        "window_order", "pause", "proposer", "spill")},
            "obs_features": list(agent.features)}
