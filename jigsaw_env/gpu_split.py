"""Which GPU tables take their per-group split from a GPU measurement (docs/cost_tables.md section 3a).

An anchored K80/P100/V100 table (:func:`jigsaw_env.table_builder.anchor_table`) splits Gavel's
measured iteration time over the layer groups. The split comes from the model's cpu table unless
the split measured on a GPU (``bench/results/cuda_check/<model>-bs<B>-cuda.json``, one H200)
differs from it by more than the noise of the comparison:

    D(m)     = max over start groups s of |saved_gpu(s) - saved_cpu(s)|      (points)
    N_gpu    = largest D between two GPU measurements of one model and batch size
               (H200 against H100, H200 against H200 on another day)
    N_cpu    = largest D between two cpu measurements of one model and batch size
               (``bench/results/batch_split/*-cpu.json`` against the shipped cpu table)
    switch   iff D(m) > N_gpu + N_cpu                                             (S1)

with ``saved(s) = 1 - compute_s(s) / compute_s(0)``, the share of an iteration a worker starting
backprop at group ``s`` saves (eq. C1): all SPB takes from a table. A switched model's tables keep
every byte of the cpu table and take their times from :func:`with_gpu_shares`.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping

import numpy as np

from jigsaw_env.cost_table import CostTable, table_filename
from jigsaw_env.gavel_data import PROJECT_ROOT

#: the GPU measurement a switched table takes its split from (one NVIDIA H200, every zoo model)
GPU_SPLIT_DIR = PROJECT_ROOT / "bench" / "results" / "cuda_check"
#: further GPU measurements of the same models and batch sizes: the GPU side of the noise
GPU_REPEAT_DIRS = (PROJECT_ROOT / "bench" / "results" / "cuda_check_h100",
                   PROJECT_ROOT / "bench" / "results" / "cuda_check_20261127")
#: cpu tables measured again at the shipped batch size: the cpu side of the noise
CPU_REPEAT_DIR = PROJECT_ROOT / "bench" / "results" / "batch_split"


def saved_share(table: CostTable) -> np.ndarray:
    """Per start group s: ``1 - compute_s(s) / compute_s(0)`` without executor overhead (fraction)."""
    c = np.array([table.plain_compute_s(s) for s in range(table.num_groups)])
    return 1.0 - c / c[0]


def share_diff_pts(a: CostTable, b: CostTable) -> float:
    """``D``: the largest difference of the saved share over start groups, in percentage points."""
    if a.num_groups != b.num_groups:
        raise ValueError(f"{a.model}: {a.num_groups} groups against {b.num_groups}; the tables cut the model "
                         "differently")
    return float(100.0 * np.abs(saved_share(a) - saved_share(b)).max())


@dataclass(frozen=True)
class SplitNoise:
    """The noise of eq. S1 in percentage points, with the pair that set each side."""

    gpu_pts: float
    gpu_pair: str
    cpu_pts: float
    cpu_pair: str

    @property
    def threshold_pts(self) -> float:
        """``N_gpu + N_cpu``: a GPU split differing from the cpu one by more than this is switched to."""
        return self.gpu_pts + self.cpu_pts

    @classmethod
    def from_pairs(cls, gpu_diffs: Mapping[str, float], cpu_diffs: Mapping[str, float]) -> "SplitNoise":
        """The largest difference on each side; ``*_diffs`` map a pair's label to its ``D`` (points)."""
        for side, diffs in (("GPU", gpu_diffs), ("cpu", cpu_diffs)):
            if not diffs:
                raise ValueError(f"split noise: no pair of repeated {side} measurements to take the noise from")
            for label, d in diffs.items():
                if not (isinstance(d, (int, float)) and np.isfinite(d) and d >= 0):
                    raise ValueError(f"split noise: {side} pair {label!r} has difference {d!r}; expected points >= 0")
        g = max(gpu_diffs, key=gpu_diffs.get)
        c = max(cpu_diffs, key=cpu_diffs.get)
        return cls(float(gpu_diffs[g]), g, float(cpu_diffs[c]), c)

    def exceeds(self, diff_pts: float) -> bool:
        """Eq. S1: does a GPU-against-cpu difference of ``diff_pts`` exceed the noise?"""
        return diff_pts > self.threshold_pts


def _rel(p: Path) -> str:
    return str(p.relative_to(PROJECT_ROOT)) if p.is_relative_to(PROJECT_ROOT) else str(p)


def measured_noise(tables_dir: Path, gpu_dirs: tuple[Path, ...] = (GPU_SPLIT_DIR, *GPU_REPEAT_DIRS),
                   cpu_repeat_dir: Path = CPU_REPEAT_DIR) -> SplitNoise:
    """:class:`SplitNoise` of the repository's repeated measurements: every pair of GPU tables of one
    (model, batch size) over ``gpu_dirs``, and every cpu table in ``cpu_repeat_dir`` against the cpu
    table of the same model and batch size in ``tables_dir``."""
    by_key: dict[str, list[Path]] = {}
    for d in gpu_dirs:
        for f in sorted(Path(d).glob("*-cuda.json")):
            by_key.setdefault(f.name, []).append(f)
    gpu = {}
    for files in by_key.values():
        for fa, fb in itertools.combinations(files, 2):
            gpu[f"{_rel(fa)} vs {_rel(fb)}"] = share_diff_pts(CostTable.load(fa), CostTable.load(fb))
    cpu = {}
    for f in sorted(Path(cpu_repeat_dir).glob("*-cpu.json")):
        again = CostTable.load(f)
        shipped = Path(tables_dir) / table_filename(again.model, again.batch_size, "cpu")
        if shipped.is_file():
            cpu[f"{_rel(f)} vs shipped {shipped.name}"] = share_diff_pts(again, CostTable.load(shipped))
    return SplitNoise.from_pairs(gpu, cpu)


@dataclass(frozen=True)
class GpuSplit:
    """A switched model's GPU measurement and why it is switched to (eq. S1)."""

    table: CostTable
    file: str
    diff_pts: float
    noise: SplitNoise

    @property
    def optimizer_share(self) -> float:
        """Optimizer step over the whole iteration on the measuring GPU (fraction)."""
        return self.table.optimizer_s / self.table.plain_compute_s(0)


def choose_gpu_split(cpu_table: CostTable, noise: SplitNoise, gpu_dir: Path = GPU_SPLIT_DIR) -> GpuSplit | None:
    """The GPU measurement of ``cpu_table``'s model and batch size in ``gpu_dir`` when eq. S1 switches
    to it; ``None`` when there is none or it is within the noise."""
    f = Path(gpu_dir) / table_filename(cpu_table.model, cpu_table.batch_size, "cuda")
    if not f.is_file():
        return None
    measured = CostTable.load(f)
    d = share_diff_pts(measured, cpu_table)
    return GpuSplit(measured, _rel(f), d, noise) if noise.exceeds(d) else None


def with_gpu_shares(base: CostTable, split: GpuSplit, optimizer_share: float) -> CostTable:
    """``base`` (a cpu table) with its times replaced, keeping ``compute_s(0)`` and every byte:
    the optimizer step takes ``optimizer_share`` of the iteration, and the rest is split over the
    groups' forward, weight-gradient and input-gradient times in the GPU measurement's proportions.
    With ``optimizer_share = split.optimizer_share`` every share equals the GPU measurement's."""
    if not 0.0 <= optimizer_share < 1.0:
        raise ValueError(f"{base.model} bs {base.batch_size}: optimizer share must be in [0, 1), got "
                         f"{optimizer_share!r}")
    gpu = split.table
    if gpu.num_groups != base.num_groups:
        raise ValueError(f"{split.file}: {gpu.num_groups} groups against {base.num_groups} in the cpu table")
    total = base.plain_compute_s(0)
    k = (1.0 - optimizer_share) * total / (gpu.plain_compute_s(0) - gpu.optimizer_s)
    groups = tuple(replace(g, forward_s=m.forward_s * k, backward_weight_s=m.backward_weight_s * k,
                           backward_input_s=m.backward_input_s * k) for g, m in zip(base.groups, gpu.groups))
    on = gpu.meta.get("processor", "a GPU")
    text = (f"share of the iteration measured on {on} ({split.file}, `{gpu.meta.get('command')}`; its split differs "
            f"from the {base.device}-measured one by {split.diff_pts:.1f} points of saved share, more than the noise "
            f"{split.noise.threshold_pts:.1f} points, docs/cost_tables.md eq. S1)")
    sources = dict(base.sources)
    for name in ("forward_s", "backward_weight_s", "backward_input_s"):
        sources[name] = f"{text}, of the {1 - optimizer_share:.4g} of the iteration the groups take"
    sources["optimizer_s"] = f"{optimizer_share:.4g} of the iteration; at the measured batch size the {text}"
    meta = dict(base.meta, split_from={
        "file": split.file, "measured_on": on, "command": gpu.meta.get("command"),
        "gpu_optimizer_share": split.optimizer_share, "optimizer_share": optimizer_share,
        "diff_vs_cpu_pts": split.diff_pts, "noise_pts": split.noise.threshold_pts})
    return replace(base, groups=groups, optimizer_s=optimizer_share * total, sources=sources, meta=meta)
