"""The env's per-step fast paths change no result.

Whole episodes of a random masked policy are replayed while, at every step, the env's masks,
observation, placements, decision and reward are checked against from-scratch recomputations
that share none of the fast paths' caches or shortcuts:

* masks: every action tried on a copy of the ledger (every fifth step), the plain vectorised algorithm (a RoundBuilder.masks without
  the fast paths, kept verbatim in tests/reference/env_step.py, with no cache), and a RoundBuilder made fresh each round with its own empty
  caches, fed the same actions (its masks also recomputed with emptied caches);
* the observation: the plain encoder (no per-round or per-step cache), then np.clip, bit for bit;
* placements: plain numpy implementations of consolidated / spread / packed, for every
  option and level of the action about to be applied;
* rewards and episode metrics: a second Simulator fed the fresh builder's decisions.

Nothing is read from a stored file, so regenerating one cannot hide a change.
"""
from __future__ import annotations

import numpy as np
import pytest
from reference.env_step import RefLAS, ref_encode, ref_masks, ref_place

from jigsaw_env.actions import RoundBuilder, masks_by_trying
from jigsaw_env.encoder import ObservationEncoder
from jigsaw_env.env import JigsawClusterEnv
from jigsaw_env.placement import PLACEMENT_OPTIONS
from jigsaw_env.sim_validation import validate_diff
from jigsaw_env.simulator import Simulator


# ---------------------------------------------------------------- the replay
def _ledger_key(led):
    # the worker-count histogram the ledger keeps equals counting the list
    counts = [led._wl.count(w) for w in range(len(led._wc))]
    assert led._wc == counts and sum(counts) == len(led._wl), (led._wc, counts)
    return list(led.decision.items()), led._ml, led._wl, led.mem.tolist(), led.workers.tolist(), led._wc


def replay(env: JigsawClusterEnv, seed: int, policy_seed: int, max_steps: int | None = None) -> int:
    rng = np.random.default_rng(policy_seed)
    obs, _ = env.reset(seed=seed)
    ref_sim = Simulator(env.cluster, env.sim._initial_jobs, env.sim_config)
    ref_enc = ObservationEncoder(env.encoder.window_k, env.encoder.observe_remaining)
    ref_las = RefLAS()
    ref_las.observe(ref_sim.state)
    ref_b = RoundBuilder(ref_sim.state, env.codec, ref_sim.in_force_ledger(), priority=ref_las.rank(ref_sim.state),
                         pause=env.pause)
    steps = 0
    while True:
        b = env.builder
        # the observation the env returned (for the state before this step)
        ref_las.observe(env.sim.state)
        want = ref_encode(ref_enc, env.sim.state, b.window, b.ledger, b.acted, env._steps_in_round, ref_las)
        assert obs.dtype == np.float32 and obs.tobytes() == want.tobytes(), f"observation differs at step {steps}"
        # masks: the env's, the plain algorithm's, and a fresh builder's with emptied caches
        mask = env.action_masks()
        assert mask.dtype == bool and mask.shape == (env.codec.n,)
        np.testing.assert_array_equal(mask, ref_masks(b, ref_las.rank(env.sim.state)),
                                      err_msg=f"masks differ at step {steps}")
        assert ref_b.window == b.window and ref_b.acted == b.acted
        assert _ledger_key(ref_b.ledger) == _ledger_key(b.ledger)
        ref_b._need_cache = {}
        np.testing.assert_array_equal(mask, ref_b.masks(), err_msg=f"fresh builder masks differ at step {steps}")
        if steps % 5 == 0:  # and by trying every action (candidate() on a copy of the ledger)
            base = np.zeros(env.codec.n, dtype=bool)
            base[env.codec.advance] = True
            np.testing.assert_array_equal(mask, masks_by_trying(b, base), err_msg=f"exhaustive masks differ at step {steps}")
        a = int(rng.choice(np.flatnonzero(mask)))
        kind, slot, option, level, pattern = env.codec.decode(a)
        # the GPUs each option picks, as the ledger places a job with it taken out: for the job
        # about to act at its level, and every fifth step for every window job at every level
        todo = [(slot, [(level, pattern)])] if kind == "run" else []
        if steps % 5 == 0:
            todo = [(s_, env.codec.combos) for s_, jid in enumerate(b.window) if jid not in b.acted]
        for s_, combos in todo:
            led = b.ledger.copy()
            job = env.sim.state.jobs[b.window[s_]]
            if job.job_id in led.decision:
                led.remove(job.job_id)
            for lv, pt in combos:
                for opt in PLACEMENT_OPTIONS[1:]:
                    if opt in ("packed", "paired"):
                        got = getattr(led, f"_{opt}")(job, lv, pt)
                    else:
                        got = getattr(led, f"_{opt}")(job.num_gpus)
                    assert got == ref_place(led, job, opt, lv, pt), (steps, opt)
        obs, reward, term, trunc, info = env.step(a)
        steps += 1
        # the same action on the fresh builder; the reference simulator advances with its decision
        if kind != "advance":
            ref_b.apply(a)
        if "round" in info:
            r = ref_sim.step(ref_b.ledger.decision)
            assert reward == -r.job_seconds / env.reward_scale, f"reward differs at step {steps}"
            assert info["finished"] == r.finished
            if not ref_sim.done:
                ref_las.observe(ref_sim.state)
                ref_b = RoundBuilder(ref_sim.state, env.codec, ref_sim.in_force_ledger(),
                                     priority=ref_las.rank(ref_sim.state), pause=env.pause)
        else:
            assert reward == 0.0
        if term or trunc:
            got = dict(info["episode_metrics"])
            want_m = ref_sim.metrics()
            for m in (got, want_m):
                m.pop("wall_s", None)
            assert got.keys() == want_m.keys()
            for key in got:
                assert got[key] == want_m[key] or (got[key] != got[key] and want_m[key] != want_m[key]), key
            return steps
        if max_steps is not None and steps >= max_steps:
            return steps


@pytest.mark.parametrize("gpus,window_k,max_jobs,load,extra,seed", [
    (64, 16, 30, 1.0, {}, 0),
    (64, 16, 30, 1.5, {}, 1),
    (512, 16, 30, 1.0, {}, 2),
    (16, 8, 40, 2.0, {}, 3),                               # a crowded cluster: jobs wait for GPUs
    (16, 8, 40, 1.5, {"max_workers_per_gpu": 3}, 4),       # three workers per GPU
    (32, 4, 40, 1.5, {"gpus_per_node": 4, "observe_remaining": False}, 5),
    (16, 8, 40, 2.0, {"pause": "requeue"}, 6),              # paused jobs come back to be placed
])
@pytest.mark.slow
def test_fast_paths_equal_from_scratch_recomputation(gpus, window_k, max_jobs, load, extra, seed):
    env = JigsawClusterEnv(gpus=gpus, window_k=window_k, max_jobs=max_jobs, load=load, **extra)
    steps = replay(env, seed=seed, policy_seed=100 + seed)
    assert steps > 100
    # a second episode on the same env (caches are per episode; job ids repeat)
    replay(env, seed=seed + 10, policy_seed=200 + seed, max_steps=300)


def test_an_infeasible_apply_leaves_the_ledger_exactly_as_it_was():
    # apply() takes a running job out of the ledger itself to place it; when the placement is
    # infeasible it must put back the exact bytes, worker counts and decision order
    from jigsaw_env.actions import InvalidAction

    env = JigsawClusterEnv(gpus=16, window_k=8, max_jobs=40, load=2.0)
    env.reset(seed=3)
    rng = np.random.default_rng(0)
    tried = 0
    for _ in range(3000):
        b = env.builder
        mask = env.action_masks()
        for slot, jid in enumerate(b.window):
            if jid in b.acted or jid not in b.ledger.decision:
                continue
            off = slot * env.codec.per_job
            for a in range(off, off + env.codec.n_opt * env.codec.n_lp):
                if mask[a]:
                    continue
                before = _ledger_key(b.ledger)
                with pytest.raises(InvalidAction):
                    b.apply(a)
                assert _ledger_key(b.ledger) == before
                assert jid not in b.acted
                tried += 1
        _, _, term, trunc, _ = env.step(int(rng.choice(np.flatnonzero(env.action_masks()))))
        if term or trunc or tried > 200:
            break
    assert tried > 20


def test_the_builders_ledger_is_taken_over_only_when_validation_would_build_the_same():
    """Simulator.step(decision, ledger=builder.ledger): at every round of random play the ledger
    taken over equals, byte for byte and in job order, the one validation builds; a job re-added
    with an unchanged JobDecision (validation keeps its place) and a ledger of an earlier round
    are validated instead."""
    from jigsaw_env.state import JobDecision

    env = JigsawClusterEnv(gpus=32, window_k=8, max_jobs=40, load=1.5)
    env.reset(seed=7)
    rng = np.random.default_rng(7)
    adopted = fallback = 0
    calls = []
    orig = env.sim._adopt
    env.sim._adopt = lambda led: (calls.append(1), orig(led))[1]
    for _ in range(4000):
        b = env.builder
        mask = env.action_masks()
        a = int(rng.choice(np.flatnonzero(mask)))
        if a == env.codec.advance:
            sim = env.sim
            got = sim._adopt(b.ledger)
            led, removed, added = validate_diff(sim._in_force, b.ledger.decision)
            if got is None:
                fallback += 1
                # the order differs: some job came back with the JobDecision in force
                cd = sim._in_force.decision
                assert any(b.ledger.decision.get(j) == jd for j, jd in cd.items())
            else:
                adopted += 1
                assert got[0] is b.ledger and (got[1], got[2]) == (removed, added)
                assert _ledger_key(got[0]) == _ledger_key(led)
        n_calls = len(calls)
        _, _, term, trunc, info = env.step(a)
        if a == env.codec.advance:
            assert len(calls) == n_calls + 1  # the env hands its builder's ledger over every round
        if term or trunc:
            break
    assert adopted > 50 and fallback > 0, (adopted, fallback)
    # a ledger handed out before the last step is of an earlier round: validated, not taken over
    env.reset(seed=9)
    sim = env.sim
    sim._adopt = lambda led: (calls.append(1), Simulator._adopt(sim, led))[1]
    stale = sim.in_force_ledger()
    sim.step(None)
    if not sim.done:
        n_calls = len(calls)
        sim.step(stale.decision, ledger=stale)
        assert len(calls) == n_calls
    # and a ledger from elsewhere never bypasses validation: an infeasible decision is refused
    from jigsaw_env.placement import GpuLedger, InfeasibleDecision
    env.reset(seed=8)
    sim = env.sim
    while not sim.state.active_ids:
        sim.step(None)
    jid = sim.state.active_ids[0]
    foreign = GpuLedger(sim.state)
    foreign.decision[jid] = JobDecision(tuple(range(sim.state.jobs[jid].num_gpus + 1)), 0)  # one GPU too many
    with pytest.raises(InfeasibleDecision):
        sim.step(foreign.decision, ledger=foreign)


def test_the_env_keeps_its_cost_model_across_episodes():
    from jigsaw_env.simulator import SimConfig

    env = JigsawClusterEnv(gpus=16, window_k=4, max_jobs=10)
    env.reset(seed=1)
    costs = env.sim.costs
    assert env.sim.live.tables is costs.step_tables
    env.reset(seed=2)
    assert env.sim.costs is costs and env.sim.live.tables is costs.step_tables
    env.sim_config = SimConfig(round_s=env.sim_config.round_s, eta_scale=0.8)  # other settings: a new one
    env.reset(seed=3)
    assert env.sim.costs is not costs and env.sim.costs.eta_scale == 0.8
    with pytest.raises(ValueError, match=r"costs: a CostModel made for another eta_scale \(0.8, expected 1.0\)"):
        Simulator(env.cluster, env.sim._initial_jobs, SimConfig(), costs=env.sim.costs)
