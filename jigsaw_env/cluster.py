"""The cluster's hardware: nodes x GPUs, GPU types and memory, and the links between them."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .cost_table import DEVICE_TYPES
from .network import CROSS_NODE, INTRA_NODE, Link

GiB = 1 << 30

# Memory per GPU (bytes). k80: 12 GiB per GK210 die (a K80 board is two GPUs); p100 and v100: the
# 16 GiB models Gavel's measurements were taken on (Narayanan et al., OSDI 2020, section 7).
# cpu: one CPU "slot" of this machine as used by the live executor (assumed budget, configurable).
DEFAULT_GPU_MEMORY = {"k80": 12 * GiB, "p100": 16 * GiB, "v100": 16 * GiB, "cpu": 8 * GiB}


@dataclass(frozen=True)
class ClusterSpec:
    """A homogeneous-node cluster; nodes may differ in GPU type.

    num_nodes: number of nodes (servers).
    gpus_per_node: GPUs per node. GPU ``g`` sits on node ``g // gpus_per_node``.
    gpu_types: GPU type of each node (``k80``, ``p100``, ``v100`` or ``cpu``); one entry per node.
    gpu_memory_bytes: memory of each GPU type, bytes.
    intra, cross: alpha-beta links within a node and across nodes.
    """

    num_nodes: int
    gpus_per_node: int
    gpu_types: tuple[str, ...]
    gpu_memory_bytes: dict = field(default_factory=lambda: dict(DEFAULT_GPU_MEMORY))
    intra: Link = INTRA_NODE
    cross: Link = CROSS_NODE

    def __post_init__(self) -> None:
        for name in ("num_nodes", "gpus_per_node"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"cluster {name} must be an integer >= 1, got {v!r}")
        if len(self.gpu_types) != self.num_nodes:
            raise ValueError(f"cluster gpu_types must list one type per node ({self.num_nodes}), got {len(self.gpu_types)}")
        for t in self.gpu_types:
            if t not in DEVICE_TYPES:
                raise ValueError(f"cluster gpu type {t!r} is unknown; allowed: {list(DEVICE_TYPES)}")
            mem = self.gpu_memory_bytes.get(t)
            if mem is None or mem <= 0:
                raise ValueError(f"cluster gpu_memory_bytes[{t!r}] must be > 0 bytes, got {mem!r}")

    @classmethod
    def from_gpus(cls, num_gpus: int, gpus_per_node: int = 8, gpu_type: str = "v100",
                  gpu_memory_gib: float | None = None, **kw) -> "ClusterSpec":
        """``num_gpus`` GPUs of one type in nodes of ``gpus_per_node`` (the last node may not be
        smaller: ``num_gpus`` must be a multiple of ``gpus_per_node`` or smaller than it)."""
        if not isinstance(num_gpus, int) or isinstance(num_gpus, bool) or num_gpus < 1:
            raise ValueError(f"gpus must be an integer >= 1, got {num_gpus!r}")
        if not isinstance(gpus_per_node, int) or gpus_per_node < 1:
            raise ValueError(f"gpus_per_node must be an integer >= 1, got {gpus_per_node!r}")
        per_node = min(gpus_per_node, num_gpus)
        if num_gpus % per_node:
            raise ValueError(f"gpus ({num_gpus}) must be a multiple of gpus_per_node ({gpus_per_node})")
        mem = dict(DEFAULT_GPU_MEMORY)
        if gpu_memory_gib is not None:
            if not gpu_memory_gib > 0:
                raise ValueError(f"gpu_memory_gib must be > 0, got {gpu_memory_gib!r}")
            mem[gpu_type] = int(gpu_memory_gib * GiB)
        return cls(num_nodes=num_gpus // per_node, gpus_per_node=per_node,
                   gpu_types=(gpu_type,) * (num_gpus // per_node), gpu_memory_bytes=mem, **kw)

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    def node_of(self, gpu: int) -> int:
        return gpu // self.gpus_per_node

    def gpu_type(self, gpu: int) -> str:
        return self.gpu_types[gpu // self.gpus_per_node]

    def memory_of(self, gpu: int) -> int:
        return int(self.gpu_memory_bytes[self.gpu_type(gpu)])

    @property
    def main_gpu_type(self) -> str:
        """The most common GPU type (used for isolated-throughput references)."""
        return max(set(self.gpu_types), key=self.gpu_types.count)

    def memory_array(self) -> np.ndarray:
        """(num_gpus,) memory of every GPU in bytes (float64, read-only, cached)."""
        arr = self.__dict__.get("_memory_array")
        if arr is None:
            arr = np.array([self.memory_of(g) for g in range(self.num_gpus)], dtype=np.float64)
            arr.setflags(write=False)
            object.__setattr__(self, "_memory_array", arr)
        return arr

    def link_for(self, gpus) -> Link:
        """Intra-node link if every GPU is on one node, else the cross-node link."""
        nodes = {g // self.gpus_per_node for g in gpus}
        return self.intra if len(nodes) <= 1 else self.cross
