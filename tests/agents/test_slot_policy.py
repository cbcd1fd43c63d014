"""The slot policy (agents/slot_policy.py, ``jigsaw train --policy slots``): its layout, its
formulas against a plain re-implementation of the module docstring, weight sharing across slots
(exact permutation equivariance without the slot bias), no leakage between slots other than
through the pooled context, and a run that trains, reloads, plays and exports to ONNX."""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sb3_contrib")

import gymnasium as gym  # noqa: E402

from agents.slot_policy import MaskableSlotPolicy, SlotActorCriticPolicy, policy_for, slot_layout  # noqa: E402
from jigsaw_env.cli import main  # noqa: E402
from train_helpers import assert_acts_masked, tables_dir, tiny_args  # noqa: E402,F401  (module-scoped toy cost tables fixture)

torch.set_num_threads(1)
F = 27
C = 8 * F + 10  # the context every slot reads: the H = 8 host slots' features and the cluster features


def _policy(k: int, per_job: int, cls=MaskableSlotPolicy, **kw):
    obs = gym.spaces.Box(-1.0, 10.0, (k * F + C,), np.float32)
    return cls(obs, gym.spaces.Discrete(k * per_job + 1), lambda _: 1e-3, **kw)


def _logits(policy, x: np.ndarray) -> np.ndarray:
    """The policy's raw logits (SB3's path: features -> mlp_extractor.forward_actor -> action_net;
    the distribution would subtract each row's logsumexp)."""
    with torch.no_grad():
        t = torch.as_tensor(x, dtype=torch.float32)
        return policy.action_net(policy.mlp_extractor.forward_actor(policy.extract_features(t))).numpy()


def test_slot_layout_known_answers_and_bad_spaces():
    # the env's default: K=16 window and 8 host slots; (5 menu options + 8 host options) x 7 combos + pause
    assert slot_layout((16 + 8) * 27 + 10, 16 * 92 + 1) == (16, 92)
    assert slot_layout((4 + 8) * 27 + 10, 4 * 92 + 1) == (4, 92)
    with pytest.raises(ValueError, match="K x 27 job features \\+ 8 x 27 host-slot features \\+ 10 cluster"):
        slot_layout(4 * 27 + 10, 4 * 36 + 1)  # a layout without host slots
    with pytest.raises(ValueError, match="K x per_job \\+ 1 actions for K = 4"):
        slot_layout((4 + 8) * 27 + 10, 4 * 92)
    with pytest.raises(ValueError, match="slot_hidden"):
        _policy(2, 3, slot_hidden=0)
    assert policy_for("mlp", "maskable_ppo") == "MlpPolicy" and policy_for("MlpPolicy", "ppo") == "MlpPolicy"
    assert policy_for("slots", "maskable_ppo") is MaskableSlotPolicy
    assert policy_for("slots", "a2c") is SlotActorCriticPolicy
    with pytest.raises(ValueError, match="unknown policy 'cnn'"):
        policy_for("cnn", "ppo")


def _reference_logits(policy, x: np.ndarray) -> np.ndarray:
    """The module docstring's formulas, with the concatenations written out (numpy, float64)."""
    a = policy.mlp_extractor.policy_net
    head = policy.action_net
    w = {n: p.detach().double().numpy() for n, p in list(a.named_parameters()) + list(head.named_parameters())}
    k, h = policy.window_k, policy.slot_hidden
    # W1 acting on [job features, cluster features, one-hot(k)]
    W1 = np.concatenate([w["job_in.weight"], w["cluster_in.weight"], w["position"].T], axis=1)
    W2 = np.concatenate([w["own.weight"], w["context.weight"]], axis=1)
    out = []
    for row in x.astype(np.float64):
        cl = row[k * F:]
        h1 = np.stack([np.tanh(W1 @ np.concatenate([row[i * F:(i + 1) * F], cl, np.eye(k)[i]]) + w["job_in.bias"])
                       for i in range(k)])
        p = np.concatenate([h1.mean(axis=0), h1.max(axis=0)])
        z = np.stack([np.tanh(W2 @ np.concatenate([h1[i], p]) + w["own.bias"]) for i in range(k)])
        g = np.tanh(w["window.weight"] @ np.concatenate([p, cl]) + w["window.bias"])
        logits = [w["slot.weight"] @ z[i] + w["slot.bias"] for i in range(k)]
        out.append(np.concatenate(logits + [w["advance.weight"] @ g + w["advance.bias"]]))
    assert out[0].shape == (k * policy.per_job + 1,) and h == z.shape[1]
    return np.stack(out)


def test_logits_follow_the_documented_formulas():
    pol = _policy(3, 5, slot_hidden=6)
    with torch.no_grad():  # a non-zero slot bias, so the one-hot columns are exercised too
        pol.mlp_extractor.policy_net.position.normal_(0.0, 0.5)
        for p in pol.action_net.parameters():
            p.normal_(0.0, 0.5)
    x = np.random.default_rng(0).normal(size=(4, 3 * F + C))
    np.testing.assert_allclose(_logits(pol, x), _reference_logits(pol, x), rtol=1e-5, atol=1e-5)


def test_without_the_slot_bias_permuting_slots_permutes_the_logits():
    k, per = 4, 7
    pol = _policy(k, per, slot_position=False, slot_hidden=8)
    with torch.no_grad():
        for p in pol.action_net.parameters():
            p.normal_(0.0, 0.5)
    x = np.random.default_rng(1).normal(size=(5, k * F + C)).astype(np.float32)
    perm = np.array([2, 0, 3, 1])
    xp = x.copy()
    xp[:, :k * F] = x[:, :k * F].reshape(5, k, F)[:, perm].reshape(5, k * F)
    lx, lp = _logits(pol, x), _logits(pol, xp)
    np.testing.assert_allclose(lp[:, :k * per].reshape(5, k, per), lx[:, :k * per].reshape(5, k, per)[:, perm],
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lp[:, -1], lx[:, -1], rtol=1e-5, atol=1e-6)  # advance: a function of the set
    # with the learned slot bias the window's order matters (waiting jobs are shown by priority)
    pos = _policy(k, per, slot_hidden=8)
    pos.load_state_dict(pol.state_dict())
    with torch.no_grad():
        pos.mlp_extractor.policy_net.position.normal_(0.0, 1.0)
    a, b = _logits(pos, x), _logits(pos, xp)
    assert not np.allclose(b[:, :k * per].reshape(5, k, per), a[:, :k * per].reshape(5, k, per)[:, perm], atol=1e-4)


def test_slots_meet_only_through_the_pooled_context():
    k, per = 4, 5
    pol = _policy(k, per, slot_hidden=8)
    with torch.no_grad():
        for p in pol.action_net.parameters():
            p.normal_(0.0, 0.5)
    x = np.random.default_rng(2).normal(size=(3, k * F + C)).astype(np.float32)
    y = x.copy()
    y[:, 2 * F:3 * F] += 1.5  # only slot 2's job changes
    lx, ly = _logits(pol, x), _logits(pol, y)
    changed = ~np.isclose(lx, ly, atol=1e-7)
    assert changed[:, 2 * per:3 * per].any() and changed[:, :2 * per].any()  # the context carries it
    with torch.no_grad():
        pol.mlp_extractor.policy_net.context.weight.zero_()  # cut the context
    lx, ly = _logits(pol, x), _logits(pol, y)
    same = np.isclose(lx, ly, atol=1e-7)
    assert same[:, :2 * per].all() and same[:, 3 * per:k * per].all()
    assert not same[:, 2 * per:3 * per].all()
    assert not same[:, -1].all()  # advance reads the pooled window directly


P = 15  # proposal values per slot (jigsaw_env.proposal: 7 + the 8 host slots' columns)


def _proposal_policy(k: int, per_job: int, **kw):
    obs = gym.spaces.Box(-1.0, 10.0, (k * F + C + (k + 8) * P,), np.float32)
    return MaskableSlotPolicy(obs, gym.spaces.Discrete(k * per_job + 1), lambda _: 1e-3, proposal_features=P, **kw)


def test_with_a_proposal_block_each_slot_reads_its_own_proposal():
    """Layout [K x 27 | 8 x 27 | 10 | K x P | 8 x P]: slot k's input is its job block and its
    proposal row, the context the hosts' blocks, the cluster features and the hosts' proposal
    rows. Checked against the formulas with those inputs, and by moving slots with their rows."""
    k, per = 3, 5
    assert slot_layout(k * F + C + (k + 8) * P, k * per + 1, P) == (k, per)
    with pytest.raises(ValueError, match=r"\+ \(K \+ 8\) x 15 proposal features, got 100 values"):
        slot_layout(100, k * per + 1, P)
    pol = _proposal_policy(k, per, slot_hidden=6)
    with torch.no_grad():
        pol.mlp_extractor.policy_net.position.normal_(0.0, 0.5)
        for p in pol.action_net.parameters():
            p.normal_(0.0, 0.5)
    x = np.random.default_rng(3).normal(size=(4, k * F + C + (k + 8) * P))
    start = k * F + C
    # the same rows laid out as a policy without the block reads them: job + proposal per slot,
    # context + hosts' proposals, through the reference formulas with F + P and C + 8 P columns
    a = pol.mlp_extractor.policy_net
    head = pol.action_net
    w = {n: q.detach().double().numpy() for n, q in list(a.named_parameters()) + list(head.named_parameters())}
    W1 = np.concatenate([w["job_in.weight"], w["cluster_in.weight"], w["position"].T], axis=1)
    W2 = np.concatenate([w["own.weight"], w["context.weight"]], axis=1)
    want = []
    for row in x:
        cl = np.concatenate([row[k * F:start], row[start + k * P:]])
        slots = [np.concatenate([row[i * F:(i + 1) * F], row[start + i * P:start + (i + 1) * P]]) for i in range(k)]
        h1 = np.stack([np.tanh(W1 @ np.concatenate([slots[i], cl, np.eye(k)[i]]) + w["job_in.bias"])
                       for i in range(k)])
        pool = np.concatenate([h1.mean(axis=0), h1.max(axis=0)])
        z = np.stack([np.tanh(W2 @ np.concatenate([h1[i], pool]) + w["own.bias"]) for i in range(k)])
        g = np.tanh(w["window.weight"] @ np.concatenate([pool, cl]) + w["window.bias"])
        want.append(np.concatenate([w["slot.weight"] @ z[i] + w["slot.bias"] for i in range(k)]
                                   + [w["advance.weight"] @ g + w["advance.bias"]]))
    np.testing.assert_allclose(_logits(pol, x), np.stack(want), rtol=1e-5, atol=1e-5)
    # without the slot bias: moving slots with their proposal rows moves their logits
    eq = _proposal_policy(k, per, slot_hidden=6, slot_position=False)
    eq.load_state_dict({n: v for n, v in pol.state_dict().items() if "position" not in n}, strict=False)
    perm = np.array([2, 0, 1])
    xp = x.copy()
    xp[:, :k * F] = x[:, :k * F].reshape(4, k, F)[:, perm].reshape(4, k * F)
    xp[:, start:start + k * P] = x[:, start:start + k * P].reshape(4, k, P)[:, perm].reshape(4, k * P)
    lx, lp = _logits(eq, x), _logits(eq, xp)
    np.testing.assert_allclose(lp[:, :k * per].reshape(4, k, per), lx[:, :k * per].reshape(4, k, per)[:, perm],
                               rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_slot_run_trains_reloads_plays_and_exports(tables_dir, tmp_path):  # noqa: F811
    from agents.rl import LearnedAgent
    from jigsaw_executor.export import random_inputs
    from jigsaw_executor.onnx_policy import OnnxPolicy

    run = tmp_path / "slots"
    # a short clone of FIFO first: behaviour cloning and DAgger act through the slot policy too
    assert main(tiny_args(tables_dir, run, "--policy", "slots", "--slot-hidden", "16", "--vec", "dummy",
                          "--n-envs", "1", "--timesteps", "256", "--eval-freq", "128", "--checkpoint-freq", "128",
                          "--no-tensorboard", "--seed", "2", "--warm-start", "fifo", "--warm-start-s", "1",
                          "--bc-epochs", "2", "--dagger-rounds", "1", "--dagger-s", "0.5")) == 0
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["policy"] == "slots" and cfg["hyperparameters"]["slot_hidden"] == 16
    assert cfg["warm_start"]["total_steps"] > 0 and len(cfg["warm_start"]["dagger"]) == 1
    agent = LearnedAgent(run)
    pol = agent.model.policy
    assert isinstance(pol, MaskableSlotPolicy) and (pol.window_k, pol.per_job, pol.slot_hidden) == (4, 92, 16)
    assert isinstance(LearnedAgent(run / "warm_start").model.policy, MaskableSlotPolicy)
    # it acts with masks: every action it picks in 300 steps is feasible
    assert_acts_masked(agent)
    # the exported graph picks the same actions as the loaded model
    out = tmp_path / "slots.onnx"
    assert main(["export", str(run), "--out", str(out)]) == 0
    onnx_policy = OnnxPolicy(out)
    obs, mask = random_inputs(4 * F + C, 4 * 92 + 1, 200, np.random.default_rng(3))
    want = np.array([agent.act(o, m) for o, m in zip(obs, mask)])
    got = onnx_policy.act_batch(obs, mask)
    # the same action, or one whose logit ties the model's within float rounding: the model acts on
    # one observation at a time and the graph on the batch, whose kernels round differently
    for i in np.flatnonzero(got != want):
        logits = _agent_logits(agent, obs[i])
        assert mask[i][got[i]] and abs(logits[got[i]] - logits[want[i]]) <= 1e-5 * max(1.0, abs(logits[want[i]])), \
            (i, got[i], want[i], logits[got[i]], logits[want[i]])
    assert np.count_nonzero(got != want) <= 2


def _agent_logits(agent, obs) -> np.ndarray:
    """The policy's logits over all actions for one raw observation (normalized as the agent does)."""
    import torch

    with torch.no_grad():
        t, _ = agent.model.policy.obs_to_tensor(agent.normalize(np.asarray(obs, dtype=np.float32)))
        return agent.model.policy.get_distribution(t).distribution.logits.numpy()[0]


@pytest.mark.slow
def test_slot_policy_with_plain_a2c(tables_dir, tmp_path):  # noqa: F811
    from agents.rl import LearnedAgent

    run = tmp_path / "a2c"
    assert main(tiny_args(tables_dir, run, "--algo", "a2c", "--policy", "slots", "--slot-hidden", "8", "--n-steps", "8",
                          "--vec", "dummy", "--n-envs", "1", "--timesteps", "64", "--eval-freq", "100000",
                          "--no-tensorboard")) == 0
    assert isinstance(LearnedAgent(run).model.policy, SlotActorCriticPolicy)
