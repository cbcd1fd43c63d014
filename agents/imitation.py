"""Imitation warm start: a heuristic's round decisions as env actions, and behaviour cloning.

A MaskablePPO policy that starts from random weights spends its first hundreds of thousands of
steps learning what any heuristic knows (start the jobs that fit, do not share GPUs needlessly,
do not pause running jobs). This module lets training start from a heuristic instead:

1. :class:`HeuristicExpert` turns a registered heuristic (``tiresias``, ``jigsaw``, ...) into a
   policy over the env's actions. At the first step of each round it asks the heuristic for its
   :class:`~jigsaw_env.state.Decision` on the env's simulator state (the heuristic sees the same
   state it sees in ``jigsaw simulate``), then emits one action per step to build that decision
   with the env's action codec. In an env with ``pause="requeue"`` it first searches for an order
   of actions that builds exactly that decision (:func:`exact_plan`: placements that land exactly
   where the decision puts a job, pauses of the running jobs it leaves out, and releases: pauses
   of running jobs that move, whose GPUs another job needs first, placed again when they show in
   the window). Where none exists, and where a pause leaves the round, it acts greedily
   (:func:`expert_action`): the exact placements,
   then the pauses, then the other jobs it runs, each with the SPB level and pattern the
   heuristic chose and the placement option whose GPUs come closest to the heuristic's (the same
   GPUs, else the same GPU set, else the same nodes, else the option of the same kind: exclusive
   or shared), then *advance*. A co-location is rebuilt with the pair-with-host options
   (``host:r`` names the host). The codec sees only the window of K jobs and its menu of
   placement options, not arbitrary GPU lists, so the translated policy can only approximate a
   heuristic whose choices fall outside them; :func:`play_expert` measures how closely
   (``python -m bench.expert_ceiling``: with ``pause="requeue"``, Jigsaw's decisions in every
   round of the 12 held-out study windows).
2. :func:`collect` plays the expert on training episodes and records raw observations, masks,
   actions, rewards and episode ends.
3. :func:`behaviour_clone` fits an SB3 policy to those actions (masked cross-entropy) and its value
   head to the discounted returns of the normalised rewards, and fills VecNormalize's observation
   and return statistics from the same data, so PPO fine-tuning starts from a policy that acts like
   the heuristic and a critic that already predicts its returns (``train_agent.py --warm-start``).

Units: rewards as the env pays them (``-(jobs in system x s) / reward_scale``); time in seconds.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np
from tqdm import tqdm

from jigsaw_env.actions import RoundBuilder
from jigsaw_env.spb import Pattern
from jigsaw_env.state import Decision, JobDecision

from .base import Scheduler, available_schedulers, make_scheduler


# ----------------------------------------------------------------------------------------- expert
def _shares(decision: Decision, jid: int, jd: JobDecision) -> bool:
    """Whether a job's GPUs in ``decision`` hold another job's worker too."""
    mine = set(jd.gpus)
    return any(other != jid and mine.intersection(o.gpus) for other, o in decision.items())


def _closeness(cand: JobDecision, target: JobDecision, gpn: int) -> tuple:
    """Sort key, smaller = closer: same GPUs in order, same GPU set, same nodes, GPU overlap."""
    same_order = cand.gpus == target.gpus
    same_set = set(cand.gpus) == set(target.gpus)
    same_nodes = {g // gpn for g in cand.gpus} == {g // gpn for g in target.gpus}
    overlap = len(set(cand.gpus) & set(target.gpus))
    return (not same_order, not same_set, not same_nodes, -overlap)


def _run_action(b: RoundBuilder, slot: int, target: JobDecision, shared: bool, gpn: int) -> int | None:
    """The run action for ``slot`` that comes closest to ``target`` (None if nothing is feasible).

    Levels are tried nearest first to the target's level (an SPB level the codec cannot place is
    replaced by the closest one that fits); within a level, the option whose GPUs come closest
    wins, ties broken towards the same kind of placement (packed when the heuristic shares GPUs,
    exclusive otherwise) and then by the menu's order."""
    codec = b.codec
    combos = codec.combos
    levels = sorted({lv for lv, _ in combos}, key=lambda lv: (abs(lv - target.level), lv))
    kind_rank = {"keep": 0, "consolidated": 1, "spread": 2, "packed": 1 if shared else 3, "paired": 1 if shared else 4}
    for option in codec.options[codec.n_menu:]:  # the pair-with-host options: shared placements
        kind_rank[option] = 1 if shared else 5
    for level in levels:
        pats = [p for lv, p in combos if lv == level]
        pats.sort(key=lambda p: p is not target.pattern)
        best = None
        for pattern in pats:
            for option in codec.options:
                jd = b.candidate(slot, option, level, pattern)
                if jd is None:
                    continue
                key = (_closeness(jd, target, gpn), kind_rank[option])
                if best is None or key < best[0]:
                    best = (key, codec.encode(slot, option, level, pattern))
        if best is not None:
            return best[1]
    return None


def _exact_action(b: RoundBuilder, slot: int, target: JobDecision) -> int | None:
    """A run action for ``slot`` whose JobDecision is ``target`` (its GPUs in order, level and
    pattern), or None when no option gives it."""
    level = target.level
    pattern = target.pattern if level > 0 else Pattern.ROTATING
    if (level, pattern) not in b.codec.combos:
        return None
    for option in b.codec.options:
        jd = b.candidate(slot, option, level, pattern)
        if jd is not None and jd.gpus == target.gpus:
            return b.codec.encode(slot, option, level, pattern)
    return None


def _jobs_to_place(b: RoundBuilder, target: Decision, order: str) -> tuple[dict[int, int], list[int]]:
    """The window's undecided jobs (id -> slot), and those of them ``target`` runs other than
    as the decision being built has them, in the expert's order: the jobs that move first (their
    GPUs are what the new ones are placed around), then the new ones; within each group larger
    first, then by slot (``order="slot"``), or as ``target`` lists them (``"heuristic"``)."""
    slot_of = {jid: s for s, jid in enumerate(b.window) if jid not in b.acted}
    current = b.ledger.decision
    todo = [jid for jid in target if jid in slot_of and current.get(jid) != target[jid]]
    if order == "slot":
        todo.sort(key=lambda jid: (jid not in current, -b.state.jobs[jid].num_gpus, slot_of[jid]))
    else:
        todo.sort(key=lambda jid: jid not in current)
    return slot_of, todo


def _exact_moves(b: RoundBuilder, target: Decision, slot_of: dict[int, int], todo: list[int]) -> Iterator[int]:
    """The actions that place a job of ``todo`` exactly as ``target`` does, in that order, then
    the pauses of the window's running jobs ``target`` leaves out (``slot_of``, ``todo``: of
    :func:`_jobs_to_place`)."""
    for jid in todo:
        a = _exact_action(b, slot_of[jid], target[jid])
        if a is not None:
            yield a
    current = b.ledger.decision
    for jid, slot in slot_of.items():
        if jid in current and jid not in target:
            yield b.codec.encode(slot, None)


def expert_action(b: RoundBuilder, target: Decision, gpus_per_node: int, order: str = "slot") -> int:
    """The next action that moves the builder's decision towards ``target`` (module docstring):
    an action that places a job exactly as ``target`` does (the jobs that move, then the new
    ones), else a pause, else the closest placement of the jobs left, else advance. Within each
    group jobs go larger first, then by window slot (``order="slot"``: a canonical order a policy
    can learn from the observation, which holds each slot's GPU count) or in the heuristic's own order
    (``order="heuristic"``, which reproduces the heuristic's placements more often with a menu
    that cannot express them all; on the 11 training-split tuning windows of bench/ppo_study's
    setup, with the four-option menu, the two give 2.527 and 2.533 h mean JCT for Jigsaw, so the
    learnable one is the default)."""
    if order not in ("slot", "heuristic"):
        raise ValueError(f"order must be 'slot' or 'heuristic', got {order!r}")
    codec = b.codec
    current = b.ledger.decision
    slot_of, todo = _jobs_to_place(b, target, order)
    # every action that lands exactly where the heuristic puts a job first (the GPUs in force
    # that it avoids are still held: an option's choice among the free ones is then the
    # heuristic's more often), then the pauses, which free the GPUs the new decision uses
    a = next(_exact_moves(b, target, slot_of, todo), None)
    if a is not None:
        return a
    # the closest placements: first every action that lands on the heuristic's GPU set (a job
    # that cannot land yet may be able to once another one has moved: the paired option's host
    # choice depends on which hosts are left), then the fallbacks for the rest
    fallback: list[int] = []
    for jid in todo:
        slot, tjd = slot_of[jid], target[jid]
        a = _run_action(b, slot, tjd, _shares(target, jid, tjd), gpus_per_node)
        cur = current.get(jid)
        if cur is not None and set(cur.gpus) != set(tjd.gpus):
            # a migration the codec cannot reproduce exactly costs a restart and lands elsewhere:
            # stay on the GPUs in force (at the heuristic's level) when that fits
            landed = a is not None and set(b.candidate(slot, *codec.decode(a)[2:]).gpus) == set(tjd.gpus)
            if not landed:
                stay = _run_action(b, slot, JobDecision(cur.gpus, tjd.level, tjd.pattern), False, gpus_per_node)
                if stay is not None and codec.decode(stay)[2] == "keep":
                    a = stay
                if a is not None:
                    fallback.append(a)
                continue
        elif cur is None and a is not None and _shares(target, jid, tjd):
            # a co-location the codec cannot reproduce would time-slice with some other job:
            # leave the job waiting instead
            landed = set(b.candidate(slot, *codec.decode(a)[2:]).gpus) == set(tjd.gpus)
            if not landed:
                a = None
        if a is not None:
            return a
    return fallback[0] if fallback else codec.advance


#: the most points of a round :func:`exact_plan` visits before it gives up (on the 12 held-out
#: study windows and 20 training episodes at 16 and 64 GPUs, a plan found took at most 60)
PLAN_MAX_BUILDERS = 100


def _round_point(b: RoundBuilder) -> tuple:
    """Where a builder stands in its round: its decision, window and decided jobs."""
    return (frozenset(b.ledger.decision.items()), tuple(b.window), frozenset(b.acted))


def _plan_moves(b: RoundBuilder, target: Decision, order: str) -> Iterator[int]:
    """The actions :func:`exact_plan` tries from ``b``, in the order :func:`expert_action` would
    (made one at a time: the search usually needs only the first): every action that places a
    job exactly as ``target`` does (the jobs that move first, then in ``order``), the pauses of
    running jobs ``target`` leaves out; while jobs wait behind the window, the actions that
    decide a window job as it already is in the decision (usually ``keep``: the window slides
    and shows a job behind it, say one that ``target`` pauses); then, where a paused job can be
    placed again (``pause="requeue"``), the releases (pauses) of jobs that move, held on GPUs
    another job of ``target`` is to use."""
    codec = b.codec
    current = b.ledger.decision
    slot_of, todo = _jobs_to_place(b, target, order)
    yield from _exact_moves(b, target, slot_of, todo)
    if b.behind_window:
        for jid, slot in slot_of.items():
            if jid in target and current.get(jid) == target[jid]:
                a = _exact_action(b, slot, target[jid])
                if a is not None:
                    yield a
    if b.pause != "requeue":
        return
    for jid in todo:
        held = current.get(jid)
        if held is not None and any(set(held.gpus) & set(jd.gpus) for k, jd in target.items() if k != jid):
            yield codec.encode(slot_of[jid], None)


def _plan_steps(b: RoundBuilder, target: Decision, order: str, max_builders: int) -> list[tuple[tuple, int]] | None:
    """:func:`exact_plan`'s search: its actions, each with the point of the round it is taken
    from (:func:`_round_point`), then advance from the point where the decision is ``target``."""
    seen: set = set()

    def search(x: RoundBuilder) -> list[tuple[tuple, int]] | None:
        point = _round_point(x)
        if x.ledger.decision == target:
            return [(point, x.codec.advance)]
        if point in seen or len(seen) >= max_builders:
            return None
        seen.add(point)
        for a in _plan_moves(x, target, order):
            y = x.copy()
            y.apply(a)
            rest = search(y)
            if rest is not None:
                return [(point, a)] + rest
        return None

    return search(b)


def exact_plan(b: RoundBuilder, target: Decision, order: str = "slot",
               max_builders: int | None = None) -> list[int] | None:
    """Actions that turn ``b``'s decision into exactly ``target`` (advance not included), or None
    when none is found. Placing one job can depend on another having moved first (a new job
    placed around a running one needs the GPUs a third job holds, which that job leaves only for
    GPUs the new job's placement decides), so the order is searched: depth first over
    :func:`_plan_moves` on copies of the builder (jobs tried in ``order``, as
    :func:`expert_action` takes it), each point of the round visited once, at most
    ``max_builders`` of them (default :data:`PLAN_MAX_BUILDERS`; the search then gives up)."""
    steps = _plan_steps(b, target, order, PLAN_MAX_BUILDERS if max_builders is None else max_builders)
    return None if steps is None else [a for _, a in steps[:-1]]


class HeuristicExpert:
    """A heuristic scheduler as a policy over a :class:`~jigsaw_env.env.JigsawClusterEnv`'s actions.

    ``act(env)`` returns the next action; the heuristic is asked once per round (when the env's
    round builder changes), exactly as the simulator asks it, and :meth:`reset` is called at
    each new episode (also detected by the simulator object changing).

    ``use_proposal=True``: the env's round proposal (its ``proposer``, the ``proposal`` feature
    group) is this heuristic's decision, made by a scheduler of the same name and arguments, so
    the expert reads ``env.proposal`` as its target instead of asking its own copy each round
    (the same decisions, one heuristic call per round instead of two). ValueError at the first
    ``act`` when the env's proposer is another scheduler."""

    def __init__(self, name: str | Scheduler, order: str = "slot", use_proposal: bool = False, **kwargs: Any):
        self.scheduler = make_scheduler(name, **kwargs) if isinstance(name, str) else name
        self.order = order
        self.name = self.scheduler.name
        self.use_proposal = use_proposal
        self._builder = None
        self._sim = None
        self._target: Decision = Decision()
        self._plan: list[tuple[tuple, int]] = []  # (the builder's point, the action to take there)
        self._unplanned: tuple | None = None      # a point from which no exact plan was found

    def act(self, env) -> int:
        if env.sim is not self._sim:
            self._sim = env.sim
            if self.use_proposal:
                proposer = getattr(env, "proposer", None)
                if getattr(proposer, "name", None) != self.name:
                    raise ValueError(f"expert {self.name!r} reads the env's proposal, but the env's proposer is "
                                     f"{getattr(proposer, 'name', proposer)!r}")
            else:
                self.scheduler.reset()
        b = env.builder
        if b is not self._builder:
            self._builder = b
            self._target = env.proposal if self.use_proposal else self.scheduler.schedule(env.sim.state)
            self._plan = []
            self._unplanned = None
        a = self._planned_action(b)
        if a is None:
            a = expert_action(b, self._target, env.cluster.gpus_per_node, self.order)
        mask = env.action_masks()
        if a == env.codec.advance and not mask[a]:
            a = work_conserving_action(b, self._target, mask, env.cluster.gpus_per_node)
        if not mask[a]:  # cannot happen: candidates apply cleanly
            raise AssertionError(f"expert chose masked action {a}")
        return a

    @property
    def target(self) -> Decision:
        """The heuristic's decision for the round being built (empty before the first ``act``)."""
        return self._target

    def _planned_action(self, b: RoundBuilder) -> int | None:
        """The next action of :func:`exact_plan` for the round's target (advance once the decision
        is built), searched again whenever the builder is not where the plan left it (another
        policy acted, as in DAgger); None where no exact plan exists, and in an env where a pause
        leaves the round (``pause="leave"``: there the greedy :func:`expert_action` makes the same
        decisions on the study windows and on training episodes, faster: 7.2 s against 10.5 s for
        ``python -m bench.translation_gap --seeds 0-9 --cluster-sizes 16 --orders attained``)."""
        if b.pause != "requeue":
            return None
        point = _round_point(b)
        if self._plan and self._plan[0][0] == point:
            return self._plan.pop(0)[1]
        if point == self._unplanned:
            return None
        steps = _plan_steps(b, self._target, self.order, PLAN_MAX_BUILDERS)
        if steps is None:
            self._unplanned = point
            self._plan = []
            return None
        self._plan = steps
        return self._plan.pop(0)[1]


def work_conserving_action(b: RoundBuilder, target: Decision, mask: np.ndarray, gpus_per_node: int) -> int:
    """The expert's action where work-conserving masks forbid its advance (its translated
    decision runs nothing while a window job could start: the heuristic's co-locations that the
    codec cannot place leave their jobs waiting): the closest placement of a job of ``target``,
    in window order, else the first feasible action (the window's first startable job)."""
    for slot, jid in enumerate(b.window):
        if jid in target and jid not in b.acted:
            a = _run_action(b, slot, target[jid], False, gpus_per_node)
            if a is not None:
                return a
    return int(np.flatnonzero(mask)[0])


def play_expert(env, expert: HeuristicExpert, jobs, seed: int = 0):
    """Play one episode of ``env`` on the job table ``jobs`` with the expert; returns the Simulator."""
    env.reset(seed=seed, options={"jobs": jobs})
    while True:
        _, _, term, trunc, _ = env.step(expert.act(env))
        if term or trunc:
            return env.sim


# ----------------------------------------------------------------------------------------- data
@dataclass
class Demonstrations:
    """Expert transitions, in the order played. ``obs``: raw env observations (float32, before any
    normalisation); ``masks``: the action masks the expert acted under; ``rewards``: the env's
    rewards; ``dones``: True on the last step of an episode; ``widths``: the GPU count of the
    widest job in the window still undecided in that state (0 when none is)."""

    obs: np.ndarray
    masks: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    dones: np.ndarray
    widths: np.ndarray
    episodes: list[dict] = field(default_factory=list)  # per episode: steps, avg_jct_s, wall_s
    #: simulated seconds of each step (``info["dt_s"]``; zeros when not given)
    dt_s: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.dt_s is None:
            self.dt_s = np.zeros(self.actions.shape, dtype=np.float64)

    def __len__(self) -> int:
        return int(self.actions.size)


def _state_width(env) -> int:
    """GPUs of the widest job in ``env``'s window not yet decided this round (0 when none is)."""
    b = env.builder
    jobs = env.sim.state.jobs
    return max((jobs[j].num_gpus for j in b.window if j not in b.acted), default=0)


class _Recorder:
    """The growing lists behind a :class:`Demonstrations`."""

    def __init__(self) -> None:
        self.obs, self.masks, self.actions, self.rewards, self.dones, self.widths = [], [], [], [], [], []
        self.dt_s: list[float] = []
        self.episodes: list[dict] = []

    def play_episode(self, env, base, expert: HeuristicExpert, seed: int,
                     act: Callable[[np.ndarray, np.ndarray], int] | None = None,
                     deadline: float | None = None) -> None:
        """One episode reset with ``seed``; every state is labelled with the expert's action, and
        the action played is the expert's (``act`` None) or ``act(raw_obs, mask)``'s. The episode
        is cut (marked done, ``truncated``) once ``time.perf_counter()`` passes ``deadline``."""
        t_ep = time.perf_counter()
        obs, _ = env.reset(seed=seed)
        n = 0
        while True:
            mask = base.action_masks()
            label = expert.act(base)
            self.obs.append(np.asarray(obs, dtype=np.float32))
            self.masks.append(mask.copy())
            self.actions.append(label)
            self.widths.append(_state_width(base))
            obs, r, term, trunc, info = env.step(label if act is None else act(obs, mask))
            self.rewards.append(float(r))
            self.dt_s.append(float(info.get("dt_s", 0.0)))
            n += 1
            cut = deadline is not None and time.perf_counter() >= deadline
            self.dones.append(bool(term or trunc or cut))
            if term or trunc or cut:
                m = info.get("episode_metrics") or {}
                self.episodes.append({"steps": n, "avg_jct_s": m.get("avg_jct_s"),
                                      "wall_s": time.perf_counter() - t_ep, "truncated": not term})
                return

    def result(self, who: str) -> Demonstrations:
        if not self.actions:
            raise ValueError(f"{who}: no demonstration recorded (a zero budget?)")
        return Demonstrations(np.stack(self.obs), np.stack(self.masks), np.asarray(self.actions, dtype=np.int64),
                              np.asarray(self.rewards, dtype=np.float64), np.asarray(self.dones, dtype=bool),
                              np.asarray(self.widths, dtype=np.int64), self.episodes,
                              np.asarray(self.dt_s, dtype=np.float64))


def collect(make_env: Callable[[], Any], expert: HeuristicExpert, *, episodes: int | None = None,
            max_steps: int | None = None, max_wall_s: float | None = None, seed: int = 0,
            progress: bool = False) -> Demonstrations:
    """Play the expert on ``make_env()``'s episodes (reset with seeds ``seed, seed + 1, ...``) until
    ``episodes`` episodes, ``max_steps`` steps or ``max_wall_s`` seconds (whichever first; an
    episode in progress is finished). At least one bound is required."""
    if episodes is None and max_steps is None and max_wall_s is None:
        raise ValueError("collect: give episodes, max_steps or max_wall_s")
    env = make_env()
    base = getattr(env, "unwrapped", env)
    rec = _Recorder()
    t0 = time.perf_counter()
    bar = None
    if progress:
        bar = tqdm(total=episodes, desc=f"demonstrations ({expert.name})", unit="episode")
    ep = 0
    try:
        while True:
            if episodes is not None and ep >= episodes:
                break
            if max_steps is not None and len(rec.actions) >= max_steps:
                break
            if max_wall_s is not None and time.perf_counter() - t0 >= max_wall_s:
                break
            rec.play_episode(env, base, expert, seed + ep)
            ep += 1
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        env.close()
    return rec.result("collect")


def concat(parts: Sequence[Demonstrations]) -> Demonstrations:
    """The transitions of several recordings, one after the other (episode ends kept)."""
    return Demonstrations(np.concatenate([p.obs for p in parts]), np.concatenate([p.masks for p in parts]),
                          np.concatenate([p.actions for p in parts]), np.concatenate([p.rewards for p in parts]),
                          np.concatenate([p.dones for p in parts]), np.concatenate([p.widths for p in parts]),
                          [e for p in parts for e in p.episodes], np.concatenate([p.dt_s for p in parts]))


def collect_on_policy(make_env: Callable[[], Any], expert: HeuristicExpert, act: Callable[[np.ndarray, np.ndarray], int],
                      *, max_wall_s: float, seed: int = 0, max_stalled_rounds: int = 200) -> Demonstrations:
    """DAgger's data: play the *learner* (``act(raw_obs, mask) -> action``) on ``make_env()``'s
    episodes for ``max_wall_s`` seconds and label every visited state with the expert's action
    (the expert is asked on the learner's state, so it says how to recover from the learner's
    mistakes). Rewards are the learner's. An episode where the learner runs nothing for
    ``max_stalled_rounds`` rounds is cut there (marked done), and so is one still going after
    ``3 * max_wall_s``."""
    env = make_env()
    base = getattr(env, "unwrapped", env)
    base.max_stalled_rounds = max_stalled_rounds
    rec = _Recorder()
    t0 = time.perf_counter()
    ep = 0
    try:
        while time.perf_counter() - t0 < max_wall_s:
            rec.play_episode(env, base, expert, seed + ep, act=act, deadline=t0 + 3 * max_wall_s)
            ep += 1
    finally:
        env.close()
    return rec.result("collect_on_policy")


def episode_seed_base(run_seed: int, stage: int) -> int:
    """The first reset seed of one warm-start stage's episodes (stage 0: the expert's recording;
    stage r: DAgger round r), played with seeds ``base, base + 1, ...`` by :func:`collect` and
    :func:`collect_on_policy`. Drawn from ``numpy.random.SeedSequence([run_seed, stage])``, a
    32-bit number: different training seeds and stages get unrelated episodes (``run_seed + ep``
    would give seeds 0 and 1 the same episodes but one)."""
    if run_seed < 0 or stage < 0:
        raise ValueError(f"episode_seed_base: run_seed and stage must be >= 0, got {run_seed} and {stage}")
    return int(np.random.SeedSequence([int(run_seed), int(stage)]).generate_state(1, dtype=np.uint32)[0])


def policy_actor(model, venv=None) -> Callable[[np.ndarray, np.ndarray], int]:
    """``act(raw_obs, mask)``: the policy's feasible action with the highest logit, on observations
    normalised with ``venv``'s statistics (as :class:`agents.rl.LearnedAgent` acts)."""
    import torch

    policy = model.policy

    def act(obs: np.ndarray, mask: np.ndarray) -> int:
        o = np.asarray(obs, dtype=np.float32)
        if venv is not None and venv.norm_obs:
            o = np.clip((o - venv.obs_rms.mean) / np.sqrt(venv.obs_rms.var + venv.epsilon),
                        -venv.clip_obs, venv.clip_obs).astype(np.float32)
        with torch.no_grad():
            logits = policy.get_distribution(torch.as_tensor(o[None])).distribution.logits[0].numpy()
        logits = np.where(mask, logits, -np.inf)
        return int(np.argmax(logits))

    return act


def discounted_returns(rewards: np.ndarray, dones: np.ndarray, gamma) -> np.ndarray:
    """G_t = r_t + gamma_t G_{t+1}, restarting after every done (the last, unfinished episode is cut
    where the data ends); ``gamma`` is one discount or one per step (semi-MDP, agents/semi_mdp.py)."""
    out = np.empty_like(rewards, dtype=np.float64)
    gam = np.broadcast_to(np.asarray(gamma, dtype=np.float64), rewards.shape)
    g = 0.0
    for t in range(rewards.size - 1, -1, -1):
        if dones[t]:
            g = 0.0
        g = rewards[t] + gam[t] * g
        out[t] = g
    return out


def vecnormalize_reward_scale(rewards: np.ndarray, dones: np.ndarray, gamma: float, ret_rms) -> float:
    """Feed the running discounted return through ``ret_rms`` (a RunningMeanStd) exactly as
    VecNormalize does for one env, and return the divisor it would then apply to rewards."""
    ret = 0.0
    for r, d in zip(rewards, dones):
        ret = ret * gamma + r
        ret_rms.update(np.array([ret]))
        if d:
            ret = 0.0
    return float(np.sqrt(ret_rms.var + 1e-8))


def behaviour_clone(model, demos: Demonstrations, *, venv=None, epochs: int = 10, batch_size: int = 256,
                    learning_rate: float = 1e-3, value_coef: float = 0.5, gamma: float = 0.99,
                    seed: int = 0, max_wall_s: float | None = None, progress: bool = False,
                    fit_stats: bool = True, stats_sample: int = 32_768, act_weight: float = 1.0,
                    width_power: float = 0.0, gamma_per_hour: float | None = None) -> list[dict]:
    """Fit ``model.policy`` (an SB3 ActorCriticPolicy, masks supported) to the demonstrations.

    If ``venv`` (a VecNormalize) is given, its observation statistics are set from the
    demonstrations' observations and its return statistics from their rewards first (unless
    ``fit_stats`` is False: later DAgger rounds keep the statistics of the first), and the
    policy learns on observations normalised and rewards scaled exactly as PPO will see them.
    Loss per minibatch: ``-weighted mean log pi(a_expert | s, mask) + value_coef x MSE(V(s), G)``,
    with ``G`` the discounted return of the scaled rewards (``gamma`` per step, or with
    ``gamma_per_hour`` each step's ``gamma_per_hour ** (dt_s / 3600)``) and weight ``act_weight`` on the steps
    where the expert acts (1 where it advances): most steps are advances, and a policy that
    advances where the expert would still start a job leaves that job waiting a whole round. With
    ``width_power`` p > 0 every step also weighs ``g^p``, g the GPUs of the widest job still
    undecided in its state (``Demonstrations.widths``): wide jobs are rare in the data (2.3 % of
    Philly's jobs ask for 8 GPUs or more, 0.09 % for 32 or more) but a wrong decision about one
    idles or blocks many GPUs for hours. The factor belongs to the state, not to the action, so
    within a state the expert's actions keep their relative weights and the argmax is not pulled
    towards acting on wide jobs (weighting each action by its own job's width did that: a
    1-GPU/4-GPU tie became 0.2/0.8). Returns one row per epoch: loss, accuracy
    (argmax over feasible actions = the expert's action) and value MSE, on a fixed random sample
    of ``stats_sample`` transitions after each epoch and on all the data after the last."""
    import torch
    from stable_baselines3.common.running_mean_std import RunningMeanStd

    obs = demos.obs
    rewards = demos.rewards.copy()
    if venv is not None:
        if venv.norm_obs:
            if fit_stats:
                venv.obs_rms = observation_statistics(obs, RunningMeanStd(shape=venv.obs_rms.mean.shape))
            obs = normalized_observations(obs, venv.obs_rms.mean, venv.obs_rms.var, venv.epsilon, venv.clip_obs)
        if venv.norm_reward:
            if fit_stats:
                venv.ret_rms = RunningMeanStd(shape=())
                scale = vecnormalize_reward_scale(demos.rewards, demos.dones, gamma, venv.ret_rms)
            else:
                scale = float(np.sqrt(venv.ret_rms.var + 1e-8))
            rewards = np.clip(rewards / scale, -venv.clip_reward, venv.clip_reward)
    if gamma_per_hour is not None:
        from .semi_mdp import step_discounts
        returns = discounted_returns(rewards, demos.dones, step_discounts(demos.dt_s, gamma_per_hour))
    else:
        returns = discounted_returns(rewards, demos.dones, gamma)
    policy = model.policy
    policy.set_training_mode(True)
    opt = torch.optim.Adam(policy.parameters(), lr=learning_rate)
    o_t = torch.as_tensor(np.asarray(obs, dtype=np.float32))
    a_t = torch.as_tensor(demos.actions)
    m_np = demos.masks
    g_t = torch.as_tensor(returns, dtype=torch.float32)
    if width_power < 0:
        raise ValueError(f"width_power must be >= 0, got {width_power!r}")
    state_w = torch.as_tensor(np.maximum(demos.widths, 1), dtype=torch.float32) ** float(width_power)
    w_t = torch.where(a_t == m_np.shape[1] - 1, 1.0, float(act_weight)) * state_w  # the advance action is the last
    n = len(demos)
    rng = np.random.default_rng(seed)
    stats_idx = np.sort(rng.choice(n, size=min(n, stats_sample), replace=False))
    history = []
    t0 = time.perf_counter()
    bar = None
    if progress:
        bar = tqdm(total=epochs, desc="behaviour cloning", unit="epoch")
    try:
        for epoch in range(epochs):
            perm = rng.permutation(n)
            for start in range(0, n, batch_size):
                idx = perm[start:start + batch_size]
                values, log_prob, _ = policy.evaluate_actions(o_t[idx], a_t[idx], action_masks=m_np[idx])
                w = w_t[idx]
                loss = -(w * log_prob).sum() / w.sum() + value_coef * torch.nn.functional.mse_loss(values.flatten(), g_t[idx])
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(policy.parameters(), 0.5)
                opt.step()
            last = epoch == epochs - 1 or (max_wall_s is not None and time.perf_counter() - t0 >= max_wall_s)
            ev = slice(None) if last or n <= stats_sample else stats_idx
            history.append({"epoch": epoch + 1, **_fit_stats(policy, o_t[ev], a_t[ev], m_np[ev], g_t[ev], value_coef),
                            "wall_s": time.perf_counter() - t0})
            if bar is not None:
                bar.update(1)
                bar.set_postfix(acc=f"{history[-1]['accuracy']:.3f}")
            if last:
                break
    finally:
        if bar is not None:
            bar.close()
    policy.set_training_mode(False)
    return history


#: transitions per chunk when the observations are scanned for their statistics and normalized:
#: bounds the float64 temporaries at this many rows (a million 658-feature observations are 2.6 GB
#: in float32 and twice that in float64, so whole-array float64 copies of them do not fit in memory)
OBS_CHUNK = 16_384


def observation_statistics(obs: np.ndarray, rms, chunk: int = OBS_CHUNK):
    """``rms`` (an SB3 ``RunningMeanStd``) updated with the observations ``obs`` (n x d), ``chunk``
    rows at a time in float64 (Chan's parallel combination, as ``RunningMeanStd.update`` merges
    batches): the mean and variance of all of them, up to rounding, without a float64 copy of the
    whole array. Returns ``rms``."""
    for start in range(0, len(obs), chunk):
        rms.update(np.asarray(obs[start:start + chunk], dtype=np.float64))
    return rms


def normalized_observations(obs: np.ndarray, mean: np.ndarray, var: np.ndarray, epsilon: float, clip: float,
                            chunk: int = OBS_CHUNK) -> np.ndarray:
    """``clip((obs - mean) / sqrt(var + epsilon), -clip, clip)`` as float32 (VecNormalize's
    normalization, computed in float64 ``chunk`` rows at a time, each row rounded to float32 once
    as the policy reads it)."""
    out = np.empty(obs.shape, dtype=np.float32)
    scale = np.sqrt(var + epsilon)
    for start in range(0, len(obs), chunk):
        part = np.asarray(obs[start:start + chunk], dtype=np.float64)
        out[start:start + chunk] = np.clip((part - mean) / scale, -clip, clip)
    return out


def _fit_stats(policy, o_t, a_t, masks: np.ndarray, g_t, value_coef: float, chunk: int = 4096) -> dict:
    import torch
    nll = mse = 0.0
    hits = 0
    n = int(a_t.shape[0])
    with torch.no_grad():
        for s in range(0, n, chunk):
            sl = slice(s, s + chunk)
            values, log_prob, _ = policy.evaluate_actions(o_t[sl], a_t[sl], action_masks=masks[sl])
            nll -= float(log_prob.sum())
            mse += float(((values.flatten() - g_t[sl]) ** 2).sum())
            logits = policy.get_distribution(o_t[sl]).distribution.logits.clone()
            logits[~torch.as_tensor(masks[sl])] = -math.inf
            hits += int((logits.argmax(dim=1) == a_t[sl]).sum())
    return {"loss": (nll + value_coef * mse) / n, "nll": nll / n, "accuracy": hits / n, "value_mse": mse / n}


def expert_names() -> Sequence[str]:
    return [n for n in available_schedulers() if n not in ("random", "learned")]
