"""Shared fixtures: hand-built toy cost tables (never the shipped ones) and a toy cluster.

TOY4  4 equal groups: forward 1 s, weight-grad 1 s, input-grad 1 s each, optimizer 0, so
      compute_s(start) = 4 + (4 - s) + (3 - s) = 11 - 2s -> [11, 9, 7, 5] s (eq. C1).
      param_bytes 1000 per group; activations 1 GiB per group, fixed memory 1 GiB, so a
      full-depth process peaks at 5 GiB and one starting at group 3 at 2 GiB (eq. M1).
TOY4C TOY4 with no parameters (param_bytes 0): no communication, compute only (engine tests).
TOY3  3 groups with distinct costs, to catch off-by-one errors (numbers in tests/sim/test_spb_model.py).

The toy cluster links are alpha = 0, 1000 B/s inside a node and 100 B/s across nodes, so a
1000-byte tensor takes 1 s on an intra-node link.
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import pytest

from jigsaw_env.cluster import GiB, ClusterSpec
from jigsaw_env.cost_table import CostTable, LayerGroup, register_table, unregister_table
from jigsaw_env.network import Link

BS = 8
DEV = "v100"
TOY4, TOY4C, TOY3 = "_t_toy4", "_t_toy4c", "_t_toy3"
TOY_INTRA = Link(alpha_s=0.0, bandwidth_Bps=1000.0)
TOY_CROSS = Link(alpha_s=0.0, bandwidth_Bps=100.0)


def make_toy4(name: str = TOY4, param_bytes: int = 1000, device: str = DEV) -> CostTable:
    groups = tuple(LayerGroup(f"g{i}", param_bytes, GiB, 1.0, 1.0, 1.0) for i in range(4))
    return CostTable(name, BS, device, groups, optimizer_s=0.0, fixed_memory_bytes=GiB,
                     sources={"all": "hand-built test table"})


def make_toy3() -> CostTable:
    groups = (
        LayerGroup("g0", 1000, 4000, 0.1, 0.2, 0.4),
        LayerGroup("g1", 100, 2000, 0.2, 0.3, 0.5),
        LayerGroup("g2", 10, 1000, 0.3, 0.6, 0.7),
    )
    return CostTable(TOY3, BS, DEV, groups, optimizer_s=0.05, fixed_memory_bytes=100_000,
                     sources={"all": "hand-built test table"})


@pytest.fixture(scope="session", autouse=True)
def toy_tables():
    tables = {TOY4: make_toy4(), TOY4C: make_toy4(TOY4C, param_bytes=0), TOY3: make_toy3()}
    for t in tables.values():
        register_table(t)
    yield tables
    for t in tables.values():
        unregister_table(t.model, t.batch_size, t.device)


@pytest.fixture(scope="session", autouse=True)
def sb3_log_folder(tmp_path_factory):
    """SB3's ``learn()`` without a logger of its own makes an empty ``$TMPDIR/SB3-<timestamp>``
    folder unless ``SB3_LOGDIR`` names one: the tests' go under pytest's temporary folder."""
    os.environ["SB3_LOGDIR"] = str(tmp_path_factory.mktemp("sb3"))
    yield
    os.environ.pop("SB3_LOGDIR", None)


def toy_cluster(num_gpus: int = 4, gpus_per_node: int = 4, **kw) -> ClusterSpec:
    """Toy cluster with the hand-computable links above (v100 nodes, 16 GiB unless overridden)."""
    return ClusterSpec.from_gpus(num_gpus, gpus_per_node=gpus_per_node, intra=TOY_INTRA, cross=TOY_CROSS, **kw)


# `make test` runs pytest-xdist with --dist loadfile, which hands out whole files in collection
# order: a long file collected late runs alone at the end while the other worker idles. The files
# that take longest on 2 cores (pytest --durations=0) are collected first, longest first; every
# other file, and the tests inside each file, keep their order.
LONGEST_FILES_FIRST = (
    "tests/executor/test_fault_tolerance.py",
    "tests/app/test_bench.py",
    "tests/agents/test_train_resume.py",
    "tests/executor/test_deploy.py",
    "tests/app/test_ray_scale.py",
    "tests/env/test_env_speed_parity.py",
    "tests/sim/test_perf.py",
    "tests/sim/test_accel.py",
)


def pytest_collection_modifyitems(config, items):
    first = {path: i for i, path in enumerate(LONGEST_FILES_FIRST)}
    items.sort(key=lambda item: first.get(item.nodeid.split("::", 1)[0], len(first)))  # a stable sort
