"""tools/ship_policy.py: the shipped model.zip keeps the trained weights exactly and leaves out the
optimizer's running moments (most of the file)."""
from __future__ import annotations

import zipfile

import pytest

torch = pytest.importorskip("torch")
sb3_contrib = pytest.importorskip("sb3_contrib")

import gymnasium as gym  # noqa: E402

from tools.ship_policy import _copy_without_optimizer_moments  # noqa: E402


def test_the_shipped_copy_keeps_the_weights_and_drops_the_adam_moments(tmp_path):
    torch.set_num_threads(1)
    model = sb3_contrib.MaskablePPO("MlpPolicy", gym.make("CartPole-v1"), device="cpu", seed=0)
    opt = model.policy.optimizer
    loss = sum(p.sum() for p in model.policy.parameters())
    loss.backward()
    opt.step()  # Adam now holds two moments per parameter
    assert len(opt.state) > 0
    src, dest = tmp_path / "trained.zip", tmp_path / "shipped.zip"
    model.save(str(src))
    _copy_without_optimizer_moments(src, dest, "maskable_ppo")
    shipped = sb3_contrib.MaskablePPO.load(str(dest), device="cpu")
    trained = model.policy.state_dict()
    assert all(torch.equal(trained[k], v) for k, v in shipped.policy.state_dict().items())
    assert len(shipped.policy.optimizer.state) == 0
    assert shipped.policy.optimizer.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    sizes = {z: {i.filename: i.file_size for i in zipfile.ZipFile(z).infolist()} for z in (src, dest)}
    assert sizes[dest]["policy.pth"] == sizes[src]["policy.pth"]
    assert sizes[dest]["policy.optimizer.pth"] < sizes[src]["policy.optimizer.pth"] / 10
