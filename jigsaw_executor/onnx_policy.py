"""Run a policy exported by ``jigsaw export`` with onnxruntime and numpy alone.

    from jigsaw_executor.onnx_policy import OnnxPolicy, make_scheduler

    policy = OnnxPolicy("policy.onnx")                  # reads and checks the graph and its metadata
    policy.check_compatible(obs_size=74, n_actions=117)  # ValueError (one line) on a mismatch
    a = policy.act(obs, mask)                           # int: the feasible action with the highest logit

    sched = make_scheduler("policy.onnx", spb=SPBConfig())  # a round-by-round Scheduler
    Simulator(cluster, jobs, SimConfig()).run(sched)       # the same object drives the live executor

The graph holds the observation clip, the VecNormalize normalization, the policy network, the
mask and the argmax (jigsaw_executor/export.py, docs/export.md); this module only feeds it.

This module imports numpy and onnxruntime only (no torch, no stable-baselines3, no Gymnasium);
:func:`make_scheduler` and :meth:`OnnxPolicy.check_compatible` with an ``EvalSpaces`` import the
jigsaw encoder/codec lazily, because that is the code the policy must agree with.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "jigsaw-onnx-policy/1"
_INT_KEYS = ("observation_size", "n_actions", "window_k", "spb_levels", "spb_slots", "job_features",
             "cluster_features")
_JSON_KEYS = ("placement_options", "level_pattern_combos", "observe_remaining", "spaces", "env")
# (keyword, metadata key, label) in the order they are checked
_CHECKS = (("obs_size", "observation_size", "observation size"), ("n_actions", "n_actions", "action count"),
           ("window_k", "window_k", "window K"), ("spb_levels", "spb_levels", "SPB levels"),
           ("spb_slots", "spb_slots", "SPB slots"), ("placement_options", "placement_options", "placement menu"),
           ("level_pattern_combos", "level_pattern_combos", "level/pattern combos"),
           ("job_features", "job_features", "per-job features"),
           ("cluster_features", "cluster_features", "cluster features"),
           ("observe_remaining", "observe_remaining", "observe_remaining"))


def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0] if s else type(e).__name__


class OnnxPolicy:
    """An exported jigsaw policy (module docstring). ``threads``: onnxruntime intra-op threads
    (1 is the fastest for one observation)."""

    def __init__(self, path: str | Path, *, threads: int = 1):
        import onnxruntime as ort

        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"ONNX policy not found: {self.path}")
        so = ort.SessionOptions()
        so.intra_op_num_threads = int(threads)
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.log_severity_level = 3
        try:
            self._session = ort.InferenceSession(str(self.path), so, providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001 - onnxruntime raises its own pybind11 types
            raise ValueError(f"{self.path}: not a valid ONNX model ({_first_line(e)})") from None
        raw = dict(self._session.get_modelmeta().custom_metadata_map)
        if raw.get("format") != FORMAT:
            raise ValueError(f"{self.path}: not a jigsaw policy (metadata format expected {FORMAT!r}, found "
                             f"{raw.get('format')!r}); export one with `jigsaw export RUN_DIR`")
        self.raw_metadata = raw
        self.metadata: dict[str, Any] = dict(raw)
        try:
            for k in _INT_KEYS:
                self.metadata[k] = int(raw[k])
            for k in _JSON_KEYS:
                self.metadata[k] = json.loads(raw[k])
        except (KeyError, ValueError) as e:
            raise ValueError(f"{self.path}: bad jigsaw policy metadata ({type(e).__name__}: {_first_line(e)})") from None
        self._check_graph()
        self._out = ["action"]

    # ------------------------------------------------------------------ layout
    def _check_graph(self) -> None:
        """The graph's own input/output shapes must match its metadata (a policy whose observation
        size or action space does not match its configuration is refused here)."""
        d, a = self.observation_size, self.n_actions
        ins = {i.name: i for i in self._session.get_inputs()}
        outs = {o.name: o for o in self._session.get_outputs()}
        for name, typ, width, label in (("obs", "tensor(float)", d, "observation size"),
                                        ("mask", "tensor(bool)", a, "action count")):
            i = ins.get(name)
            if i is None:
                raise ValueError(f"{self.path}: the graph has no input {name!r} (inputs: {sorted(ins)})")
            if i.type != typ or len(i.shape) != 2:
                raise ValueError(f"{self.path}: input {name!r} expected {typ} [N, {width}], found {i.type} {i.shape}")
            if i.shape[1] != width:
                raise ValueError(f"{self.path}: {label} expected {width} (metadata), found {i.shape[1]} in the graph")
        if "action" not in outs or outs["action"].type != "tensor(int64)":
            raise ValueError(f"{self.path}: the graph has no int64 output 'action' (outputs: {sorted(outs)})")
        lg = outs.get("logits")
        if lg is not None and len(lg.shape) == 2 and isinstance(lg.shape[1], int) and lg.shape[1] != a:
            raise ValueError(f"{self.path}: action count expected {a} (metadata), found {lg.shape[1]} in the graph")

    @property
    def observation_size(self) -> int:
        return int(self.metadata["observation_size"])

    @property
    def n_actions(self) -> int:
        return int(self.metadata["n_actions"])

    @property
    def window_k(self) -> int:
        return int(self.metadata["window_k"])

    @property
    def spb_levels(self) -> int:
        return int(self.metadata["spb_levels"])

    @property
    def spb_slots(self) -> int:
        return int(self.metadata["spb_slots"])

    @property
    def observe_remaining(self) -> bool:
        return bool(self.metadata["observe_remaining"])

    @property
    def obs_features(self) -> tuple[str, ...]:
        """The observation's feature groups (metadata ``obs_features``; a policy exported without
        the key has every group)."""
        from jigsaw_env.encoder import check_features
        raw = self.raw_metadata.get("obs_features")
        try:
            return check_features(None if raw is None else json.loads(raw), "obs_features")
        except (ValueError, TypeError) as e:
            raise ValueError(f"{self.path}: bad jigsaw policy metadata ({_first_line(e)})") from None

    @property
    def features(self) -> tuple[str, ...]:
        """:attr:`obs_features` (the name ``LearnedScheduler`` reads, as of ``LearnedAgent``)."""
        return self.obs_features

    def _env_choice(self, field: str, allowed: tuple[str, ...], default: str) -> str:
        """The training env's ``field`` from the metadata (``default`` when absent); ValueError
        naming the file, the field and ``allowed`` for any other value."""
        value = (self.metadata["env"] or {}).get(field, default)
        if value not in allowed:
            raise ValueError(f"{self.path}: bad jigsaw policy metadata (env.{field} expected one of "
                             f"{list(allowed)}, got {value!r})")
        return value

    @property
    def window_order(self) -> str:
        """The window's order the policy was trained with (metadata ``env.window_order``;
        ``attained`` for a policy exported without it)."""
        from jigsaw_env.actions import WINDOW_ORDERS
        return self._env_choice("window_order", WINDOW_ORDERS, "attained")

    @property
    def pause(self) -> str:
        """What a pause did in the env the policy was trained in (metadata ``env.pause``;
        ``leave`` for a policy exported without it)."""
        from jigsaw_env.actions import PAUSE_MODES
        return self._env_choice("pause", PAUSE_MODES, "leave")

    @property
    def spill(self) -> bool:
        """Whether the env the policy was trained in spilled waiting jobs onto shared GPUs on
        advance (metadata ``env.spill``; false for a policy exported without it)."""
        value = (self.metadata["env"] or {}).get("spill", False)
        if not isinstance(value, bool):
            raise ValueError(f"{self.path}: bad jigsaw policy metadata (env.spill expected true or false, "
                             f"got {value!r})")
        return value

    @property
    def config(self) -> dict:
        """The parts of the run's config.json a scheduler needs (``env``, ``spaces``, ``algo``),
        the same shape as ``LearnedAgent.config``."""
        env = dict(self.metadata["env"] or {})
        env["observe_remaining"] = self.observe_remaining
        env["obs_features"] = list(self.obs_features)
        return {"algo": self.metadata.get("algo"), "env": env, "spaces": dict(self.metadata["spaces"])}

    def check_compatible(self, obs_size: Any = None, n_actions: int | None = None, window_k: int | None = None,
                         spb_levels: int | None = None, spb_slots: int | None = None, *,
                         placement_options: list | None = None, level_pattern_combos: list | None = None,
                         job_features: int | None = None, cluster_features: int | None = None,
                         observe_remaining: bool | None = None) -> None:
        """Raise ValueError (one line: expected vs found) unless the policy fits a deployment with
        these values; ``None`` means not checked.

        ``obs_size`` may instead be an ``agents.rl.EvalSpaces`` (window K or None for the policy's
        own, SPB levels, SPB slots): then every field is compared with what this code's encoder and
        action codec produce for that layout (what ``LearnedScheduler`` calls)."""
        if obs_size is not None and hasattr(obs_size, "spb_levels"):
            sp = obs_size
            return self.check_layout(sp.spb_levels, sp.spb_slots, sp.window_k)
        given = dict(obs_size=obs_size, n_actions=n_actions, window_k=window_k, spb_levels=spb_levels,
                     spb_slots=spb_slots, placement_options=placement_options,
                     level_pattern_combos=level_pattern_combos, job_features=job_features,
                     cluster_features=cluster_features, observe_remaining=observe_remaining)
        for kw, key, label in _CHECKS:
            want = given[kw]
            if want is None:
                continue
            have = self.metadata[key]
            if isinstance(want, (tuple, list)):
                want, ok = list(want), list(want) == list(have)
            elif isinstance(want, (bool, np.bool_)):
                ok = bool(want) == bool(have)
            else:
                ok = int(want) == int(have)
            if not ok:
                raise ValueError(f"{self.path} does not fit the deployment: {label} expected {want}, "
                                 f"found {have} in the ONNX policy")
        return None

    def check_layout(self, spb_levels: int, spb_slots: int, window_k: int | None = None) -> None:
        """Every field against this code's encoder and action codec for (K, levels, slots)."""
        from agents.rl import spaces_signature
        k = self.window_k if window_k is None else int(window_k)
        want = spaces_signature(k, int(spb_levels), int(spb_slots), self.obs_features)
        groups = f" (feature groups {','.join(self.obs_features)})"
        for key, label in (("observation_size", "observation size"), ("job_features", "per-job features")):
            if int(want[key]) != int(self.metadata[key]):  # these depend on the feature groups: name them
                raise ValueError(f"{self.path} does not fit the deployment: {label} expected {want[key]}{groups}, "
                                 f"found {self.metadata[key]} in the ONNX policy")
        self.check_compatible(want["observation_size"], want["n_actions"], want["window_k"], want["spb_levels"],
                              want["spb_slots"], placement_options=want["placement_options"],
                              level_pattern_combos=want["level_pattern_combos"], job_features=want["job_features"],
                              cluster_features=want["cluster_features"])

    # ------------------------------------------------------------------ acting
    def act(self, obs: np.ndarray, mask: np.ndarray) -> int:
        """The feasible action with the highest logit for one observation (raw encoder output)."""
        o = np.asarray(obs, dtype=np.float32)
        m = np.asarray(mask, dtype=bool)
        if o.size != self.observation_size or m.size != self.n_actions:
            raise ValueError(f"{self.path}: expected an observation of {self.observation_size} values and a mask of "
                             f"{self.n_actions}, got {o.shape} and {m.shape}")
        if not m.any():
            raise ValueError("the mask has no feasible action")
        if not np.isfinite(o).all():
            raise ValueError("the observation has a non-finite value")
        return int(self._session.run(self._out, {"obs": o.reshape(1, -1), "mask": m.reshape(1, -1)})[0][0])

    def act_batch(self, obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Actions (int64 [N]) for N observations [N, D] and masks [N, A]."""
        o = np.ascontiguousarray(obs, dtype=np.float32)
        m = np.ascontiguousarray(mask, dtype=bool)
        if o.ndim != 2 or m.ndim != 2 or o.shape != (len(o), self.observation_size) \
                or m.shape != (len(o), self.n_actions):
            raise ValueError(f"{self.path}: expected obs [N, {self.observation_size}] and mask [N, {self.n_actions}], "
                             f"got {o.shape} and {m.shape}")
        if not m.any(axis=1).all():
            raise ValueError(f"mask row {int(np.flatnonzero(~m.any(axis=1))[0])} has no feasible action")
        if not np.isfinite(o).all():
            raise ValueError("an observation has a non-finite value")
        return self._session.run(self._out, {"obs": o, "mask": m})[0].astype(np.int64, copy=False)

    def logits(self, obs: np.ndarray) -> np.ndarray:
        """The policy's logits (float32 [N, A], before masking) for observations [N, D] or [D]."""
        o = np.ascontiguousarray(np.atleast_2d(obs), dtype=np.float32)
        m = np.ones((len(o), self.n_actions), dtype=bool)
        return self._session.run(["logits"], {"obs": o, "mask": m})[0]

    def __call__(self, obs: np.ndarray, mask: np.ndarray) -> int:
        return self.act(obs, mask)

    def benchmark(self, n: int = 2000, warmup: int = 100, seed: int = 0) -> dict:
        """Latency of :meth:`act` on one observation (ms): median, p99, mean over ``n`` calls on
        random observations and masks (input checks included, as a deployment calls it)."""
        rng = np.random.default_rng(seed)
        m = max(1, min(int(n), 256))
        obs = rng.uniform(0.0, 1.0, size=(m, self.observation_size)).astype(np.float32)
        mask = rng.random((m, self.n_actions)) < 0.3
        mask[:, -1] = True
        for i in range(int(warmup)):
            self.act(obs[i % m], mask[i % m])
        t = np.empty(int(n))
        for i in range(int(n)):
            t0 = time.perf_counter()
            self.act(obs[i % m], mask[i % m])
            t[i] = time.perf_counter() - t0
        t *= 1000.0
        return {"n": int(n), "median_ms": round(float(np.median(t)), 4), "p99_ms": round(float(np.percentile(t, 99)), 4),
                "mean_ms": round(float(t.mean()), 4)}

    def __repr__(self) -> str:
        return (f"OnnxPolicy({str(self.path)!r}, obs={self.observation_size}, actions={self.n_actions}, "
                f"K={self.window_k}, L={self.spb_levels}, slots={self.spb_slots}, algo={self.metadata.get('algo')})")


def make_scheduler(policy: str | Path | OnnxPolicy, *, spb=None, name: str = "onnx"):
    """A round-by-round :class:`~agents.base.Scheduler` driven by an exported policy: the same
    ``agents.rl.LearnedScheduler`` that runs a RUN_DIR (observation encoder, exact masks, one
    action per step until *advance*), with this policy's ``act``. With ``spb`` (an
    ``SPBConfig``) the layout is checked now, before any job starts; otherwise at the first
    round."""
    from agents.rl import EvalSpaces, LearnedScheduler

    pol = policy if isinstance(policy, OnnxPolicy) else OnnxPolicy(policy)
    if spb is not None:
        pol.check_compatible(EvalSpaces(None, spb.max_level, spb.num_slots))
    sched = LearnedScheduler(agent=pol)  # duck-typed: window_k, config["env"], check_compatible, act
    sched.name = name
    return sched
