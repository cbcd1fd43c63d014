"""Models the executor can train, and exact byte tables for them.

:func:`build_executor_model` builds any :mod:`jigsaw_env.zoo` model, plus ``tiny_bn_cnn``: a tiny
digit CNN with BatchNorm, which the zoo's tiny models lack, so that the executor's BatchNorm-buffer
handling is exercised on the CPU (tests, benchmark).

:func:`exact_bytes_table` builds a :class:`~jigsaw_env.cost_table.CostTable` with the exact
parameter and activation bytes of a model at a batch size (counted on the module with
:mod:`jigsaw_env.table_builder`) and all times set to zero: enough for
``jigsaw_env.spb.iteration_cost(...).bytes`` and ``CostTable.activation_peak_bytes`` predictions,
not for time predictions.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from jigsaw_env.cost_table import CostTable, LayerGroup
from jigsaw_env.table_builder import activation_bytes_per_group, param_bytes_per_group
from jigsaw_env.zoo import MODELS, ZooModel, build_model


class _Reshape(nn.Module):
    def __init__(self, *shape: int) -> None:
        super().__init__()
        self.shape = shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], *self.shape)


class TinyBNCNN(ZooModel):
    """Tiny CNN with BatchNorm for 8x8 digits (executor tests and benchmark only; no cost table).

    Input: float ``[B, 64]``; targets: int64 ``[B]`` in ``0..9``.
    Groups (4): ``conv1`` (1->8 3x3 + BN + ReLU), ``conv2`` (8->16 3x3/2 + BN + ReLU -> 4x4),
    ``fc1`` (flatten + 256->32 + BN1d + ReLU), ``fc2`` (32->10). Optimizer: SGD, momentum 0.9.
    """

    name = "tiny_bn_cnn"
    lr = 0.05
    num_classes = 10

    def __init__(self) -> None:
        super().__init__()
        self.add_group("conv1", nn.Sequential(_Reshape(1, 8, 8), nn.Conv2d(1, 8, 3, padding=1, bias=False),
                                              nn.BatchNorm2d(8), nn.ReLU()))
        self.add_group("conv2", nn.Sequential(nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False),
                                              nn.BatchNorm2d(16), nn.ReLU()))
        self.add_group("fc1", nn.Sequential(nn.Flatten(), nn.Linear(16 * 4 * 4, 32), nn.BatchNorm1d(32), nn.ReLU()))
        self.add_group("fc2", nn.Sequential(nn.Linear(32, 10)))

    def make_batch(self, batch_size, generator=None, device=None):
        x = torch.rand(batch_size, 64, generator=generator)
        y = torch.randint(0, self.num_classes, (batch_size,), generator=generator)
        return (x.to(device), y.to(device)) if device else (x, y)


EXECUTOR_MODELS = {"tiny_bn_cnn": TinyBNCNN}


def executor_model_names() -> list[str]:
    return sorted(set(MODELS) | set(EXECUTOR_MODELS))


def build_executor_model(name: str, **kw) -> ZooModel:
    """A zoo model by name, or one of :data:`EXECUTOR_MODELS`. ValueError names the allowed ones."""
    if name in EXECUTOR_MODELS:
        return EXECUTOR_MODELS[name](**kw)
    if name in MODELS:
        return build_model(name, **kw)
    raise ValueError(f"unknown model {name!r}; allowed: {executor_model_names()}")


def exact_bytes_table(model: ZooModel, batch_size: int, *, seed: int = 0, with_activations: bool = True,
                      device: str = "cpu") -> CostTable:
    """A CostTable with ``model``'s exact per-group parameter (and activation) bytes; times are 0.

    Activation bytes are counted on a copy-free training forward of one synthetic batch of
    ``batch_size`` (``jigsaw_env.table_builder.activation_bytes_per_group``), on the device that
    holds ``model``'s parameters: what autograd saves depends on the kernels (a CUDA forward of
    tiny_transformer saves 13 % more than the CPU's, measured on an H200); BatchNorm running
    statistics are saved and restored around it, so the model is left unchanged. ``device``
    only labels the table.
    """
    pbytes = param_bytes_per_group(model)
    if with_activations:
        gen = torch.Generator().manual_seed(seed)
        x, y = model.make_batch(batch_size, generator=gen)
        on = next(model.parameters()).device
        x, y = x.to(on), y.to(on)
        buffers = {k: v.detach().clone() for k, v in model.named_buffers()}
        was_training = model.training
        model.train()
        try:
            abytes = activation_bytes_per_group(model, x, y)
        finally:
            with torch.no_grad():
                for k, v in model.named_buffers():
                    v.copy_(buffers[k])
            model.train(was_training)
    else:
        abytes = [0] * model.num_groups
    names = list(getattr(model, "group_names", [f"g{i}" for i in range(model.num_groups)]))
    groups = tuple(LayerGroup(names[i], int(pbytes[i]), int(abytes[i]), 0.0, 0.0, 0.0)
                   for i in range(model.num_groups))
    return CostTable(
        model=getattr(model, "name", type(model).__name__), batch_size=int(batch_size), device=device,
        groups=groups, optimizer_s=0.0, fixed_memory_bytes=0,
        sources={"param_bytes": "exact: jigsaw_env.table_builder.param_bytes_per_group on the module",
                 "activation_bytes": ("exact: jigsaw_env.table_builder.activation_bytes_per_group, one training "
                                      f"forward at batch {batch_size}" if with_activations else "not counted (0)"),
                 "times": "not measured: all times are 0 (a bytes-only table for executor checks)"},
        meta={"kind": "exact_bytes"})
