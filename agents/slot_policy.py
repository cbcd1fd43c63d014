"""A policy network that scores every window slot with the same weights (``jigsaw train --policy slots``).

The env's observation is K blocks of ``JOB_FEATURES`` per window slot followed by H blocks for
the host slots and ``CLUSTER_FEATURES`` cluster features, and its action space is K blocks of
``per_job`` actions (placement option x SPB level/pattern, and pause; the options include one
pair-with-host option per host slot) followed by one advance action (:mod:`jigsaw_env.encoder`,
:mod:`jigsaw_env.actions`). Here the host blocks and the cluster features together are the
*context* every slot reads (``cluster`` below): a slot's ``host:r`` logits come from its own
latent, which sees host ``r``'s features through that context. SB3's ``MlpPolicy`` reads the flat vector
and maps it to the flat logits with separate weights for every slot, so what it learns about an
8-GPU job in slot 3 does not carry over to slot 11. Wide jobs are rare (2.3 % of Philly's jobs ask
for 8 GPUs or more) and the slot a job lands in varies, so each slot of a flat MLP sees few of
them: the clones of the PPO study mishandled windows with wide jobs (README, PPO study).

Here the slots share their weights, as in the per-item scoring networks of Decima (Mao et al.,
SIGCOMM 2019) and of Deep Sets (Zaheer et al., NeurIPS 2017):

    s_k   = [job features of slot k, cluster features, one-hot(k)]      slot k's input
    h_k   = tanh(W1 s_k + b1)                                           shared layer 1
    p     = [mean_k h_k, max_k h_k]                                     what the other slots hold
    z_k   = tanh(W2 [h_k, p] + b2)                                      shared layer 2 (in context)
    g     = tanh(Wg [p, cluster features] + bg)                         the window as a whole
    logits[k * per_job : (k + 1) * per_job] = A z_k + a                 shared output head
    logits[K * per_job] (advance)           = v . g + c

The one-hot slot index keeps the window's order visible (waiting jobs are shown by least
attained service, so the slot is a priority rank); without it (``slot_position=False``) the
logits are exactly permutation-equivariant in the slots. The value function is SB3's own MLP on
the flat observation (``net_arch``'s ``vf``), so only the actor changes.

The policy exposes SB3's usual parts (``mlp_extractor.forward_actor`` -> ``action_net``), so
training, behaviour cloning, saving, loading and the ONNX export work on it unchanged. All
operations are linear layers, tanh, mean/max and reshapes: ONNX-exportable.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Sequence

import numpy as np
import torch as th
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from stable_baselines3.common.policies import ActorCriticPolicy
from torch import nn

from agents.rl import POLICIES
from jigsaw_env.encoder import CLUSTER_FEATURES, HOST_SLOTS, JOB_FEATURES, PROPOSAL_GROUP, check_features
from jigsaw_env.proposal import proposal_slot_features

#: what every slot reads besides its own block: the host slots' blocks and the cluster features
CONTEXT_FEATURES = HOST_SLOTS * JOB_FEATURES + CLUSTER_FEATURES


def slot_proposal_features(env_config: dict) -> int:
    """The proposal values per slot of a run's observation (its config's ``env.obs_features``):
    the block's per-slot width with the ``proposal`` group, else 0."""
    groups = check_features(env_config.get("obs_features"), "field 'env.obs_features'")
    return proposal_slot_features(HOST_SLOTS) if PROPOSAL_GROUP in groups else 0


def slot_layout(obs_dim: int, n_actions: int, proposal_features: int = 0) -> tuple[int, int]:
    """(K, per_job) of an env whose observation has ``obs_dim`` values (with a proposal block of
    ``proposal_features`` values per slot, or none) and whose action space has ``n_actions``
    actions; ValueError when the spaces are not the env's slot layout."""
    p = proposal_features
    k, rest = divmod(obs_dim - CONTEXT_FEATURES - HOST_SLOTS * p, JOB_FEATURES + p)
    if obs_dim <= CONTEXT_FEATURES + HOST_SLOTS * p or rest:
        block = f" + (K + {HOST_SLOTS}) x {p} proposal features" if p else ""
        raise ValueError(f"the slot policy needs an observation of K x {JOB_FEATURES} job features + "
                         f"{HOST_SLOTS} x {JOB_FEATURES} host-slot features + {CLUSTER_FEATURES} cluster features"
                         f"{block}, got {obs_dim} values")
    per_job, rest = divmod(n_actions - 1, k)
    if n_actions < 2 or rest:
        raise ValueError(f"the slot policy needs K x per_job + 1 actions for K = {k} window slots, got {n_actions}")
    return k, per_job


class SlotActor(nn.Module):
    """The shared per-slot layers: flat observation features (N, K*F + C) -> latent (N, (K+1)*H):
    every slot's ``z_k`` (N, K, H) flattened, then the window's ``g`` (N, H).

    A linear layer on a concatenation is the sum of linear layers on its parts, so the parts that
    are the same for every slot (the cluster features, the pooled context) are multiplied once
    per observation, not once per slot, and the one-hot slot index is a learned per-slot bias.

    With a proposal block (``proposal_features`` P > 0 values per slot after the cluster
    features, :mod:`jigsaw_env.proposal`), slot k's input also holds its own P proposal values,
    and the context the host slots' proposal values."""

    def __init__(self, k: int, hidden: int, slot_position: bool = True, proposal_features: int = 0):
        super().__init__()
        self.k, self.hidden, self.slot_position = k, hidden, slot_position
        self.proposal_features = p = proposal_features
        f, c = JOB_FEATURES + p, CONTEXT_FEATURES + HOST_SLOTS * p
        self.job_in = nn.Linear(f, hidden)                       # W1's job-feature columns, and b1
        self.cluster_in = nn.Linear(c, hidden, bias=False)       # W1's cluster-feature columns
        # W1's one-hot columns: a bias per slot (zero at the start: every slot alike)
        self.position = nn.Parameter(th.zeros(k, hidden), requires_grad=slot_position)
        self.own = nn.Linear(hidden, hidden)                     # W2's h_k columns, and b2
        self.context = nn.Linear(2 * hidden, hidden, bias=False)  # W2's pooled columns
        self.window = nn.Linear(2 * hidden + c, hidden)

    def forward(self, x: th.Tensor) -> th.Tensor:
        k, f, h = self.k, JOB_FEATURES, self.hidden
        slots = x[:, : k * f].reshape(-1, k, f)
        p = self.proposal_features
        if p:
            start = k * f + CONTEXT_FEATURES  # the proposal block: K window slots, then H host slots
            slots = th.cat([slots, x[:, start:start + k * p].reshape(-1, k, p)], dim=2)
            cluster = th.cat([x[:, k * f:start], x[:, start + k * p:]], dim=1)
        else:
            cluster = x[:, k * f:]
        pre = self.job_in(slots) + self.cluster_in(cluster).unsqueeze(1)
        if self.slot_position:
            pre = pre + self.position
        h1 = th.tanh(pre)                                                    # (N, K, H)
        pool = th.cat([h1.mean(dim=1), h1.max(dim=1).values], dim=1)          # (N, 2H)
        z = th.tanh(self.own(h1) + self.context(pool).unsqueeze(1))          # (N, K, H)
        g = th.tanh(self.window(th.cat([pool, cluster], dim=1)))             # (N, H)
        return th.cat([z.reshape(-1, k * h), g], dim=1)


class SlotHead(nn.Module):
    """Latent (N, (K+1)*H) -> logits (N, K*per_job + 1): one shared head for the slots, one for advance."""

    def __init__(self, k: int, hidden: int, per_job: int):
        super().__init__()
        self.k, self.hidden, self.per_job = k, hidden, per_job
        self.slot = nn.Linear(hidden, per_job)
        self.advance = nn.Linear(hidden, 1)

    def forward(self, latent: th.Tensor) -> th.Tensor:
        k, h = self.k, self.hidden
        z = latent[:, : k * h].reshape(-1, k, h)
        return th.cat([self.slot(z).reshape(-1, k * self.per_job), self.advance(latent[:, k * h:])], dim=1)


class SlotExtractor(nn.Module):
    """SB3's ``mlp_extractor`` for the slot policy: ``policy_net`` the shared slot layers,
    ``value_net`` an MLP on the flat features (``vf_arch`` hidden sizes, tanh)."""

    def __init__(self, features_dim: int, k: int, hidden: int, vf_arch: Sequence[int], slot_position: bool = True,
                 activation_fn: type[nn.Module] = nn.Tanh, proposal_features: int = 0):
        super().__init__()
        self.policy_net = SlotActor(k, hidden, slot_position, proposal_features)
        layers: list[nn.Module] = []
        last = features_dim
        for width in vf_arch:
            layers += [nn.Linear(last, width), activation_fn()]
            last = width
        self.value_net = nn.Sequential(*layers)
        self.latent_dim_pi = (k + 1) * hidden
        self.latent_dim_vf = last

    def forward(self, features: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        return self.forward_actor(features), self.forward_critic(features)

    def forward_actor(self, features: th.Tensor) -> th.Tensor:
        return self.policy_net(features)

    def forward_critic(self, features: th.Tensor) -> th.Tensor:
        return self.value_net(features)


def _vf_arch(net_arch: Any) -> list[int]:
    """The value network's hidden sizes from SB3's ``net_arch`` (a list, or a dict with ``vf``)."""
    if net_arch is None:
        return [64, 64]
    if isinstance(net_arch, dict):
        return [int(x) for x in net_arch.get("vf", [])]
    return [int(x) for x in net_arch]


class _SlotMixin:
    """The slot actor on an SB3 or sb3-contrib actor-critic policy class (put before it in the bases)."""

    def __init__(self, observation_space, action_space, lr_schedule, *args: Any, slot_hidden: int = 64,
                 slot_position: bool = True, proposal_features: int = 0, **kwargs: Any):
        self.proposal_features = int(proposal_features)
        self.window_k, self.per_job = slot_layout(int(np.prod(observation_space.shape)), int(action_space.n),
                                                  self.proposal_features)
        if int(slot_hidden) < 1:
            raise ValueError(f"slot_hidden must be at least 1, got {slot_hidden}")
        self.slot_hidden, self.slot_position = int(slot_hidden), bool(slot_position)
        super().__init__(observation_space, action_space, lr_schedule, *args, **kwargs)

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data.update(slot_hidden=self.slot_hidden, slot_position=self.slot_position,
                    proposal_features=self.proposal_features)
        return data

    def _build_mlp_extractor(self) -> None:
        self.mlp_extractor = SlotExtractor(self.features_dim, self.window_k, self.slot_hidden,
                                           _vf_arch(self.net_arch), self.slot_position, self.activation_fn,
                                           self.proposal_features)

    def _build(self, lr_schedule) -> None:
        super()._build(lr_schedule)
        # the base made a Linear(latent_dim_pi, n) head: replace it by the shared slot head,
        # initialised as SB3 initialises its head (orthogonal, gain 0.01), and rebuild the
        # optimizer over the new parameters
        self.action_net = SlotHead(self.window_k, self.slot_hidden, self.per_job)
        if self.ortho_init:
            self.action_net.apply(partial(self.init_weights, gain=0.01))
        self.optimizer = self.optimizer_class(self.parameters(), lr=lr_schedule(1), **self.optimizer_kwargs)


class MaskableSlotPolicy(_SlotMixin, MaskableActorCriticPolicy):
    """The slot policy for MaskablePPO (module docstring)."""


class SlotActorCriticPolicy(_SlotMixin, ActorCriticPolicy):
    """The slot policy for PPO and A2C (module docstring)."""


def policy_for(name: str, algo: str):
    """The SB3 ``policy`` argument for a ``--policy`` name (or config.json's ``policy``:
    ``MlpPolicy`` or ``slots``) and an algorithm name."""
    if name in ("mlp", "MlpPolicy"):
        return "MlpPolicy"
    if name == "slots":
        return MaskableSlotPolicy if algo == "maskable_ppo" else SlotActorCriticPolicy
    raise ValueError(f"unknown policy {name!r}; allowed: {list(POLICIES)}")
