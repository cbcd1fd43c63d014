"""Toy cost tables and helpers shared by the training, export and observation tests.

The toy cost tables are written to a folder and passed with --tables, because SubprocVecEnv
workers are separate processes and do not see tables registered in the test process.
"""
from __future__ import annotations

import pytest

from jigsaw_env.cost_table import CostTable, LayerGroup, register_table, unregister_table

GiB = 1 << 30
TOY_MODELS = ("rlA", "rlB")


def _toy(name: str, groups: int, fixed_gib: float, act_gib: float, t: float) -> CostTable:
    gs = tuple(LayerGroup(f"g{i}", 4_000_000 * (i + 1), int(act_gib * GiB), t, t, t) for i in range(groups))
    return CostTable(name, 8, "v100", gs, 0.01, int(fixed_gib * GiB), {"all": "hand-built test table"})


def registered_toy_tables(small: str, large: str):
    """A module-scoped autouse fixture: the two toy tables (``small``: 4 groups, full peak 5 + 4 x
    0.5 = 7 GiB, two fit on a 16 GiB GPU; ``large``: 6 groups, 6 + 6 x 1 = 12 GiB; batch 8,
    v100) registered in the test process for the module's tests, dropped after."""
    @pytest.fixture(scope="module", autouse=True)
    def toy_tables():
        tables = [_toy(small, 4, 5.0, 0.5, 0.05), _toy(large, 6, 6.0, 1.0, 0.08)]
        for t in tables:
            register_table(t)
        yield
        for t in tables:
            unregister_table(t.model, t.batch_size, t.device)
    return toy_tables


def toy_tables_fixture(small: str, large: str):
    """A module-scoped fixture: a folder with two toy tables (``small``: 4 groups, ``large``: 6
    groups; batch 8, v100) written as files, for --tables; their registrations are dropped after."""
    @pytest.fixture(scope="module")
    def tables_dir(tmp_path_factory):
        d = tmp_path_factory.mktemp("tables")
        _toy(small, 4, 5.0, 0.5, 0.05).save(d / f"{small}-bs8-v100.json")
        _toy(large, 6, 6.0, 1.0, 0.08).save(d / f"{large}-bs8-v100.json")
        yield str(d)
        for m in (small, large):
            unregister_table(m, 8, "v100")
    return tables_dir


tables_dir = toy_tables_fixture(*TOY_MODELS)


def tiny_args(tables: str, run_dir, *extra: str) -> list[str]:
    return ["train", "--tables", tables, "--trace", "synthetic:models=rlA+rlB", "--gpus", "8",
            "--window-k", "4", "--max-jobs", "8", "--n-steps", "128", "--batch-size", "64", "--n-epochs", "2",
            "--eval-episodes", "1", "--no-progress", "--run-dir", str(run_dir), *extra]


def assert_acts_masked(agent, steps: int = 300) -> None:
    """``agent`` (a loaded RUN_DIR) plays ``steps`` env steps of 6 toy jobs on 8 GPUs, and every
    action it picks is feasible under the mask (the env, built with invalid_action="raise",
    would raise on an infeasible one too)."""
    from jigsaw_env.simulator import SimConfig
    from traces import load_trace

    env = agent.make_env(cluster_kwargs=dict(num_gpus=8, gpus_per_node=8, gpu_type="v100", gpu_memory_gib=None),
                         sim_config=SimConfig())
    jobs = load_trace("synthetic:models=rlA+rlB,jobs=6,seed=2", cluster_gpus=8).jobs
    obs, _ = env.reset(seed=0, options={"jobs": jobs})
    for _ in range(steps):
        mask = env.action_masks()
        a = agent.act(obs, mask)
        assert mask[a]
        obs, _, term, trunc, _ = env.step(a)
        if term or trunc:
            break
