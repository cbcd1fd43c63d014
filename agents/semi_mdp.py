"""Discounting per simulated second (semi-MDP) for PPO / A2C: ``jigsaw train --gamma-per-hour G``.

A round of the env takes 1 to 2K + 2 decision steps (and one more per job behind the window) that
take no simulated time, then one *advance* step that runs ``round_s`` seconds. A per-step discount
``gamma`` therefore discounts a round by ``gamma`` to the power of its number of decisions, which
has nothing to do with time: a round that starts a burst of 30 jobs is discounted as much as 30
rounds of one decision. With ``G`` per hour, the step that takes ``dt`` simulated seconds
(``info["dt_s"]``: the round's length on an advance step, 0 on a decision step) is discounted by

    gamma_t = G ** (dt_t / 3600)

so decision steps are not discounted at all and a round of 300 s is discounted by G ** (1/12),
however many decisions it holds. GAE becomes

    delta_t = r_t + gamma_t * V(s_{t+1}) * (1 - done_t) - V(s_t)
    A_t     = delta_t + gamma_t * lambda * (1 - done_t) * A_{t+1}

(:func:`semi_mdp_gae`; lambda stays per step). It is done with a rollout buffer
(:class:`SemiMDPRolloutBuffer` over SB3's, :class:`SemiMDPMaskableRolloutBuffer` over
sb3-contrib's, given to the algorithm as ``rollout_buffer_class``, so a saved model keeps it) that keeps each step's ``dt`` beside
its reward, and a callback (:class:`RecordStepDurations`) that writes them: SB3 calls the
callbacks after ``env.step`` and before ``rollout_buffer.add``, so the callback sees the step's
``infos`` and the buffer's position of that step. The rewards are left as they are, so the
episode return that Monitor and eval.csv report is still ``-(sum of JCT) / reward_scale``.

Where SB3 uses its one scalar ``gamma`` besides GAE -- the value bootstrap of a truncated episode
and VecNormalize's running return for reward scaling -- the trainer sets it to one round's
discount ``G ** (round_s / 3600)``: episodes are truncated on an advance step (``max_time_s`` or a
stalled policy), whose ``dt`` is ``round_s``.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback

SECONDS_PER_HOUR = 3600.0


def step_discounts(dt_s: np.ndarray, gamma_per_hour: float) -> np.ndarray:
    """``gamma_per_hour ** (dt_s / 3600)`` elementwise (float64): each step's discount."""
    return np.power(float(gamma_per_hour), np.asarray(dt_s, dtype=np.float64) / SECONDS_PER_HOUR)


def round_discount(gamma_per_hour: float, round_s: float | None) -> float:
    """One round's discount (what SB3's scalar ``gamma`` is set to); a round of iteration
    granularity (``round_s`` None) counts as the env's default 300 s."""
    return float(gamma_per_hour) ** ((300.0 if round_s is None else float(round_s)) / SECONDS_PER_HOUR)


def semi_mdp_gae(rewards: np.ndarray, values: np.ndarray, episode_starts: np.ndarray, discounts: np.ndarray,
                 last_values: np.ndarray, dones: np.ndarray, gae_lambda: float) -> tuple[np.ndarray, np.ndarray]:
    """(advantages, returns) of a rollout of shape [steps, envs] with a discount per step
    (module docstring); ``episode_starts[t]`` marks a step that begins an episode (SB3's
    convention), ``dones`` the envs whose last step ended one."""
    n = rewards.shape[0]
    adv = np.zeros_like(np.asarray(rewards, dtype=np.float64))
    last = np.zeros(rewards.shape[1:], dtype=np.float64)
    for t in reversed(range(n)):
        if t == n - 1:
            non_terminal = 1.0 - np.asarray(dones, dtype=np.float64)
            next_values = np.asarray(last_values, dtype=np.float64)
        else:
            non_terminal = 1.0 - np.asarray(episode_starts[t + 1], dtype=np.float64)
            next_values = np.asarray(values[t + 1], dtype=np.float64)
        g = discounts[t]
        delta = rewards[t] + g * next_values * non_terminal - values[t]
        last = delta + g * gae_lambda * non_terminal * last
        adv[t] = last
    return adv, adv + values


class _SemiMDPMixin:
    """A rollout buffer with a per-step duration array ``dt_s`` and GAE discounted per simulated
    second (module docstring); ``gamma_per_hour`` comes through SB3's ``rollout_buffer_kwargs``."""

    def __init__(self, *args, gamma_per_hour: float = 1.0, **kwargs):
        self.gamma_per_hour = float(gamma_per_hour)
        super().__init__(*args, **kwargs)

    def reset(self) -> None:
        super().reset()
        self.dt_s = np.zeros((self.buffer_size, self.n_envs), dtype=np.float64)

    def compute_returns_and_advantage(self, last_values, dones: np.ndarray) -> None:
        lv = last_values.clone().cpu().numpy().flatten()
        adv, ret = semi_mdp_gae(self.rewards, self.values, self.episode_starts,
                                step_discounts(self.dt_s, self.gamma_per_hour), lv, dones, self.gae_lambda)
        self.advantages = adv.astype(np.float32)
        self.returns = ret.astype(np.float32)


def buffer_class_for(algo: str) -> type:
    """The semi-MDP rollout buffer class of an algorithm name (``maskable_ppo``, ``ppo``, ``a2c``)."""
    if algo == "maskable_ppo":
        return SemiMDPMaskableRolloutBuffer
    return SemiMDPRolloutBuffer


try:  # the buffers exist where stable-baselines3 / sb3-contrib are installed
    from stable_baselines3.common.buffers import RolloutBuffer as _RolloutBuffer

    class SemiMDPRolloutBuffer(_SemiMDPMixin, _RolloutBuffer):
        """SB3's RolloutBuffer, discounted per simulated second (PPO, A2C)."""
except ImportError:  # pragma: no cover
    pass
try:
    from sb3_contrib.common.maskable.buffers import MaskableRolloutBuffer as _MaskableRolloutBuffer

    class SemiMDPMaskableRolloutBuffer(_SemiMDPMixin, _MaskableRolloutBuffer):
        """sb3-contrib's MaskableRolloutBuffer, discounted per simulated second (MaskablePPO)."""
except ImportError:  # pragma: no cover
    pass


def record_step_durations_callback():
    """A callback that writes each step's ``info["dt_s"]`` into the semi-MDP buffer at the
    position the step's transition is about to take (module docstring)."""
    class RecordStepDurations(BaseCallback):
        def _on_step(self) -> bool:
            buf: Any = self.model.rollout_buffer
            dt = getattr(buf, "dt_s", None)
            if dt is not None and buf.pos < buf.buffer_size:
                infos = self.locals.get("infos") or ()
                dt[buf.pos] = [float(i.get("dt_s", 0.0)) for i in infos]
            return True

    return RecordStepDurations()
