"""Deterministic per-rank data for the live executor.

Two sources, both pure functions of ``(seed, iteration, rank, world_size, batch_size)`` so that a
paused job resumes on exactly the batches it would have seen (the checkpoint only needs the
iteration counter) and a single-process reference can rebuild any rank's batch:

* ``"digits"``: scikit-learn's ``load_digits`` (1,797 8x8 images shipped with scikit-learn, no
  download), scaled to [0, 1] and flattened to ``[64]`` floats: the input of the zoo's tiny models.
  A fixed, seeded 80/20 split gives a training set and a held-out set (:meth:`DigitsData.accuracy`).
  Sampler: every epoch is a fresh seeded permutation of the training indices; iteration ``t`` takes
  the global batch of ``world_size * batch_size`` samples at position ``t mod iterations_per_epoch``
  of epoch ``t // iterations_per_epoch`` (the last partial global batch is dropped), and rank ``r``
  takes its ``r``-th slice. The ranks' shards are disjoint within an iteration.
* ``"synthetic"``: the model's own ``make_batch`` (random tensors of the right shape) from a
  generator seeded by ``(seed, rank, iteration)``; for zoo models whose inputs are not digits.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

DATA_SOURCES = ("digits", "synthetic")
DIGITS_MODELS = ("tiny_cnn", "tiny_mlp", "tiny_transformer", "tiny_bn_cnn")


def mix_seed(*parts: int) -> int:
    """A 63-bit seed from integers (numpy SeedSequence: no collisions between nearby tuples)."""
    return int(np.random.SeedSequence([int(p) & 0xFFFFFFFF for p in parts]).generate_state(2, np.uint64)[0]
               & 0x7FFF_FFFF_FFFF_FFFF)


@lru_cache(maxsize=1)
def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """sklearn's digits: (1,797 x 64 float32 pixels scaled to [0, 1], int64 labels 0-9), loaded once."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return (d.data / 16.0).astype(np.float32), d.target.astype(np.int64)


@dataclass(frozen=True)
class DigitsData:
    """sklearn digits with a seeded train/held-out split and a deterministic per-rank sampler."""

    seed: int = 0
    holdout_fraction: float = 0.2

    def __post_init__(self) -> None:
        if not 0.0 < self.holdout_fraction < 1.0:
            raise ValueError(f"holdout_fraction must be in (0, 1), got {self.holdout_fraction!r}")

    def split(self) -> tuple[np.ndarray, np.ndarray]:
        """(training rows, held-out rows): sorted indices into :func:`digits_arrays`, the split
        drawn from the seed."""
        x, _ = digits_arrays()
        perm = np.random.default_rng(mix_seed(self.seed, 0xD161)).permutation(len(x))
        n_hold = int(round(len(x) * self.holdout_fraction))
        return np.sort(perm[n_hold:]), np.sort(perm[:n_hold])

    @property
    def train_size(self) -> int:
        return len(self.split()[0])

    def iterations_per_epoch(self, world_size: int, batch_size: int) -> int:
        per_iter = world_size * batch_size
        n = self.train_size // per_iter
        if n < 1:
            raise ValueError(f"a global batch of {world_size} x {batch_size} = {per_iter} samples is larger than "
                             f"the {self.train_size} training digits")
        return n

    def indices(self, iteration: int, rank: int, world_size: int, batch_size: int) -> np.ndarray:
        """Training-set row indices of rank ``rank``'s batch at ``iteration``."""
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank}")
        if iteration < 0 or batch_size < 1:
            raise ValueError(f"need iteration >= 0 and batch_size >= 1, got {iteration}, {batch_size}")
        train, _ = self.split()
        ipe = self.iterations_per_epoch(world_size, batch_size)
        epoch, pos = divmod(int(iteration), ipe)
        perm = np.random.default_rng(mix_seed(self.seed, 0xE90C, epoch)).permutation(len(train))
        start = pos * world_size * batch_size + rank * batch_size
        return train[perm[start:start + batch_size]]

    def batch(self, iteration: int, rank: int, world_size: int, batch_size: int,
              device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = digits_arrays()
        idx = self.indices(iteration, rank, world_size, batch_size)
        xb, yb = torch.from_numpy(x[idx]), torch.from_numpy(y[idx])
        return (xb.to(device), yb.to(device)) if device is not None else (xb, yb)

    def holdout(self, device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = digits_arrays()
        _, hold = self.split()
        xb, yb = torch.from_numpy(x[hold]), torch.from_numpy(y[hold])
        return (xb.to(device), yb.to(device)) if device is not None else (xb, yb)

    @torch.no_grad()
    def accuracy(self, model: torch.nn.Module, device: torch.device | str | None = None) -> float:
        """Held-out accuracy of ``model`` (evaluated in eval mode, mode restored afterwards)."""
        was_training = model.training
        model.eval()
        try:
            x, y = self.holdout(device)
            return float((model(x).argmax(dim=-1) == y).float().mean().item())
        finally:
            model.train(was_training)


def synthetic_batch(model, iteration: int, rank: int, batch_size: int, seed: int = 0,
                    device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``model.make_batch`` from a generator seeded by ``(seed, rank, iteration)``."""
    gen = torch.Generator().manual_seed(mix_seed(seed, 0x5E7, rank, iteration))
    x, y = model.make_batch(batch_size, generator=gen)
    return (x.to(device), y.to(device)) if device is not None else (x, y)


def default_source(model_name: str) -> str:
    """``"digits"`` for the tiny digit models, ``"synthetic"`` otherwise."""
    return "digits" if model_name in DIGITS_MODELS else "synthetic"


def make_batch_fn(source: str, model, seed: int, world_size: int, batch_size: int,
                  device: torch.device | str | None = None):
    """A function ``(iteration, rank) -> (inputs, targets)`` for ``source``."""
    if source == "digits":
        data = DigitsData(seed=seed)
        data.iterations_per_epoch(world_size, batch_size)  # validate the batch size early
        return lambda t, r: data.batch(t, r, world_size, batch_size, device)
    if source == "synthetic":
        return lambda t, r: synthetic_batch(model, t, r, batch_size, seed, device)
    raise ValueError(f"unknown data source {source!r}; allowed: {list(DATA_SOURCES)}")
