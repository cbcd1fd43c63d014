"""Discounting per simulated second (agents/semi_mdp.py, `jigsaw train --gamma-per-hour`):
``info["dt_s"]``, GAE on a hand-computed rollout, agreement with SB3's buffer when every step has
the same discount, and a short MaskablePPO run that fills the buffer's durations."""
from __future__ import annotations

import math

import numpy as np
import pytest

from agents.semi_mdp import round_discount, semi_mdp_gae, step_discounts
from jigsaw_env.env import JigsawClusterEnv


def test_dt_s_sums_to_the_simulated_time():
    env = JigsawClusterEnv(gpus=16, max_jobs=10, window_k=4)
    _, info = env.reset(seed=1)
    t0 = env.sim.state.time_s
    total, rng = 0.0, np.random.default_rng(1)
    advances = 0
    while True:
        a = int(rng.choice(np.flatnonzero(env.action_masks())))
        before = env.sim.state.time_s
        _, _, term, trunc, info = env.step(a)
        # an advance: the simulated seconds it ran; a decision step: none
        assert info["dt_s"] == (env.sim.state.time_s - before if "round" in info else 0.0)
        advances += "round" in info
        total += info["dt_s"]
        if term or trunc:
            break
    assert advances > 1 and total == pytest.approx(env.sim.state.time_s - t0, rel=1e-12)


def test_gae_by_hand():
    """G = 0.5 per hour, lambda 0.5, one env, four steps: a decision, a 1-hour round, a decision,
    a half-hour round, then the rollout ends mid-episode (bootstrap V = 5)."""
    rewards = np.array([[0.0], [-1.0], [0.0], [-2.0]])
    values = np.array([[1.0], [2.0], [3.0], [4.0]])
    starts = np.array([[1.0], [0.0], [0.0], [0.0]])
    disc = step_discounts(np.array([[0.0], [3600.0], [0.0], [1800.0]]), 0.5)
    assert disc[:, 0].tolist() == [1.0, 0.5, 1.0, pytest.approx(math.sqrt(0.5))]
    adv, ret = semi_mdp_gae(rewards, values, starts, disc, np.array([5.0]), np.array([False]), 0.5)
    # delta3 = -2 + sqrt(.5)*5 - 4; A3 = delta3
    a3 = -2 + math.sqrt(0.5) * 5 - 4
    a2 = (0 + 4 - 3) + 1.0 * 0.5 * a3          # delta2 = 1, gamma 1 (a decision)
    a1 = (-1 + 0.5 * 3 - 2) + 0.5 * 0.5 * a2   # delta1 = -1.5, gamma 0.5 (one hour)
    a0 = (0 + 2 - 1) + 1.0 * 0.5 * a1          # delta0 = 1
    assert adv[:, 0] == pytest.approx([a0, a1, a2, a3], rel=1e-12)
    assert adv[:, 0] == pytest.approx([0.22097087, -1.55805826, -0.23223305, -2.46446609], abs=1e-8)
    assert ret[:, 0] == pytest.approx(adv[:, 0] + values[:, 0])
    # an episode that ended on the last step: no bootstrap
    adv2, _ = semi_mdp_gae(rewards, values, starts, disc, np.array([5.0]), np.array([True]), 0.5)
    assert adv2[3, 0] == pytest.approx(-2 - 4)
    # a new episode starting at step 2 cuts the trace there
    starts2 = starts.copy()
    starts2[2, 0] = 1.0
    adv3, _ = semi_mdp_gae(rewards, values, starts2, disc, np.array([5.0]), np.array([False]), 0.5)
    assert adv3[1, 0] == pytest.approx(-1 - 2)


def test_one_discount_everywhere_is_sb3s_gae():
    """With every step lasting one round, the buffer's GAE is SB3's with gamma = one round's discount."""
    import torch
    from gymnasium import spaces
    from stable_baselines3.common.buffers import RolloutBuffer

    from agents.semi_mdp import SemiMDPRolloutBuffer

    G, round_s, n, envs = 0.8, 300.0, 16, 3
    gamma = round_discount(G, round_s)
    assert gamma == pytest.approx(0.8 ** (1 / 12))
    rng = np.random.default_rng(0)
    obs_space, act_space = spaces.Box(-1, 1, (2,)), spaces.Discrete(3)
    ref = RolloutBuffer(n, obs_space, act_space, gamma=gamma, gae_lambda=0.9, n_envs=envs)
    smdp = SemiMDPRolloutBuffer(n, obs_space, act_space, gamma=0.123, gae_lambda=0.9, n_envs=envs, gamma_per_hour=G)
    for t in range(n):
        o = rng.standard_normal((envs, 2)).astype(np.float32)
        a = rng.integers(0, 3, (envs, 1))
        r = rng.standard_normal(envs).astype(np.float32)
        start = (rng.random(envs) < 0.2).astype(np.float32)
        v = torch.as_tensor(rng.standard_normal(envs).astype(np.float32))
        lp = torch.zeros(envs)
        for b in (ref, smdp):
            b.add(o, a, r, start, v, lp)
        smdp.dt_s[t] = round_s
    last = torch.as_tensor(rng.standard_normal(envs).astype(np.float32))
    dones = np.array([False, True, False])
    ref.compute_returns_and_advantage(last, dones)
    smdp.compute_returns_and_advantage(last, dones)
    np.testing.assert_allclose(smdp.advantages, ref.advantages, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(smdp.returns, ref.returns, rtol=1e-5, atol=1e-6)


def test_maskable_ppo_fills_the_durations():
    """A short MaskablePPO run with the semi-MDP buffer and the recording callback: the buffer's
    durations are the env's dt_s (0 on decisions, a round's 300 s on advances) and its advantages
    are semi_mdp_gae's of them."""
    import torch
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    from agents.semi_mdp import SemiMDPMaskableRolloutBuffer, record_step_durations_callback

    torch.set_num_threads(1)
    venv = DummyVecEnv([lambda: JigsawClusterEnv(gpus=8, max_jobs=6, window_k=4)])
    model = MaskablePPO("MlpPolicy", venv, n_steps=64, batch_size=32, n_epochs=1, seed=0, device="cpu",
                        gamma=round_discount(0.9, 300.0), rollout_buffer_class=SemiMDPMaskableRolloutBuffer,
                        rollout_buffer_kwargs={"gamma_per_hour": 0.9})
    model.learn(64, callback=record_step_durations_callback())
    buf = model.rollout_buffer
    assert (buf.dt_s == 0.0).any() and (buf.dt_s == 300.0).any()
    assert ((buf.dt_s >= 0.0) & (buf.dt_s <= 300.0)).all()  # a round that ends the episode may be shorter
    # the advantages were computed from those durations (PPO's update leaves them): recomputed
    # over the first steps, bootstrapped from the last step's value
    adv, _ = semi_mdp_gae(buf.rewards[:-1], buf.values[:-1], buf.episode_starts[:-1], step_discounts(buf.dt_s[:-1], 0.9),
                          buf.values[-1], buf.episode_starts[-1].astype(bool), buf.gae_lambda)
    a_last = buf.advantages[-1]
    disc = step_discounts(buf.dt_s[:-1], 0.9)
    # A_{T-2} = delta + gamma lambda (1 - start_{T-1}) A_{T-1}: the tail adds to the recomputed head
    expect = adv[-1] + disc[-1] * buf.gae_lambda * (1 - buf.episode_starts[-1]) * a_last
    np.testing.assert_allclose(buf.advantages[-2], expect, rtol=1e-4, atol=1e-5)
