"""Evaluation sweeps and training rollouts on a real two-node Ray cluster on this machine
(``ray.cluster_utils.Cluster``: a head and one worker node, one CPU each), docs/scale.md.

* ``jigsaw evaluate --ray ADDRESS`` gives the metrics.csv (every column but the runs' own wall
  time) and the per-run logs of the same evaluation run locally, with runs on both nodes, and the
  cost tables of ``--tables`` (which no worker registers from the folder) shipped with their digests;
* ``jigsaw train --ray ADDRESS --num-envs 2`` writes model.zip, with its two env actors on the two
  nodes, and trains the very model the same options give with ``--vec subproc``;
* :class:`agents.ray_vec_env.RayVecEnv` gives the same rollouts (observations, rewards, dones,
  infos, action masks) as SubprocVecEnv over the same env factories;
* a node removed while a run is on it: the run is rerun on the other node, the sweep completes
  with the local metrics, and metadata.json, report.html and stderr say which run was rerun.

One Ray cluster for the whole module; the node removal runs last.
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from jigsaw_env.cli import main
from train_helpers import toy_tables_fixture

ray = pytest.importorskip("ray")
pytest.importorskip("sb3_contrib")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TRACE = "synthetic:models=rsA+rsB"
tables_dir = toy_tables_fixture("rsA", "rsB")


@pytest.fixture(scope="module")
def gate(tmp_path_factory):
    return tmp_path_factory.mktemp("gate")


@pytest.fixture(scope="module")
def cluster(gate):
    """A head and a worker node, one CPU each; this process is the driver. The workers find the
    test plug-in (tests/) on PYTHONPATH and the gate folder in JIGSAW_TEST_GATE."""
    from ray.cluster_utils import Cluster

    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "JIGSAW_TEST_GATE")}
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests")])
    os.environ["JIGSAW_TEST_GATE"] = str(gate)
    c = Cluster(initialize_head=True, connect=False,
                head_node_args={"num_cpus": 1, "include_dashboard": False,
                                "_system_config": {"health_check_period_ms": 500,
                                                   "health_check_failure_threshold": 4}})
    worker = c.add_node(num_cpus=1)
    c.wait_for_nodes()
    ray.init(address=c.address, namespace="jigsaw", logging_level="WARNING", log_to_driver=False)
    c.worker_node = worker
    yield c
    ray.shutdown()
    c.shutdown()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _node_ids() -> set[str]:
    return {n["NodeID"][:12] for n in ray.nodes() if n["Alive"]}


TRAIN = ["train", "--trace", TRACE, "--gpus", "8", "--window-k", "4", "--max-jobs", "6", "--num-envs", "2",
         "--timesteps", "128", "--n-steps", "64", "--n-epochs", "1", "--batch-size", "64", "--eval-freq", "100000",
         "--no-tensorboard", "--no-progress", "--seed", "5"]


@pytest.fixture(scope="module")
def ray_run(cluster, tables_dir, tmp_path_factory):
    run = tmp_path_factory.mktemp("runs") / "mppo"
    assert main([*TRAIN, "--tables", tables_dir, "--ray", cluster.address, "--run-dir", str(run)]) == 0
    return run


def test_train_on_ray_writes_the_model_subproc_vec_env_trains(ray_run, tables_dir, tmp_path):
    from sb3_contrib import MaskablePPO

    assert (ray_run / "model.zip").is_file()
    cfg = json.loads((ray_run / "config.json").read_text())
    assert cfg["vec"] == "ray" and len(cfg["ray"]["nodes"]) == 2 and sorted(cfg["ray"]["env_nodes"]) == [0, 1]
    local = tmp_path / "subproc"
    assert main([*TRAIN, "--tables", tables_dir, "--vec", "subproc", "--run-dir", str(local)]) == 0
    a = MaskablePPO.load(str(ray_run / "model.zip"), device="cpu").policy.state_dict()
    b = MaskablePPO.load(str(local / "model.zip"), device="cpu").policy.state_dict()
    assert a.keys() == b.keys() and all(np.array_equal(a[k].numpy(), b[k].numpy()) for k in a)
    sa, sb = np.load(ray_run / "vecnormalize.npz"), np.load(local / "vecnormalize.npz")
    assert all(np.array_equal(sa[k], sb[k]) for k in sa.files)


# wall-clock readings in an env's infos: the episode's own wall time and Monitor's elapsed time
CLOCKS = {"wall_s", "t"}


def _same(x, y) -> bool:
    """Equal values, dicts compared key by key without the wall-clock readings."""
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_same(x[k], y[k]) for k in x if k not in CLOCKS)
    return np.array_equal(np.asarray(x), np.asarray(y))


def test_ray_vec_env_gives_the_rollouts_of_subproc_vec_env(cluster, tables_dir):
    from stable_baselines3.common.vec_env import SubprocVecEnv

    from agents.ray_vec_env import RayVecEnv
    from agents.rl_env import make_env_fn

    kw = dict(gpus=8, trace=TRACE, max_jobs=6, window_k=4)
    fns = [make_env_fn(kw, split="train", rank=i, seed=11, tables=tables_dir) for i in range(2)]
    rv, sv = RayVecEnv(fns), SubprocVecEnv(fns)
    try:
        assert len({p["node"] for p in rv.placement}) == 2  # one env actor per node
        rng = np.random.default_rng(0)
        assert np.array_equal(rv.reset(), sv.reset())
        dones = 0
        for _ in range(60):
            ma, ms = np.stack(rv.env_method("action_masks")), np.stack(sv.env_method("action_masks"))
            assert np.array_equal(ma, ms)
            acts = np.array([rng.choice(np.flatnonzero(m)) for m in ma])
            (oa, ra, da, ia), (os_, rs, ds, is_) = rv.step(acts), sv.step(acts)
            assert np.array_equal(oa, os_) and np.array_equal(ra, rs) and np.array_equal(da, ds)
            for x, y in zip(ia, is_):
                assert x.keys() == y.keys()
                for k in x:
                    assert _same(x[k], y[k]), k
            dones += int(da.sum())
        assert dones >= 1  # an episode ended and was reset inside both
        assert rv.get_attr("difficulty") == sv.get_attr("difficulty")
    finally:
        rv.close()
        sv.close()


EVAL = ["evaluate", "--trace", TRACE, "--gpus", "8", "--max-jobs", "6", "--no-progress", "--workers", "1"]


def _same_outputs(a: Path, b: Path) -> None:
    assert (a / "metrics.csv").read_bytes() == (b / "metrics.csv").read_bytes()
    ta, tb = pd.read_csv(a / "timings.csv"), pd.read_csv(b / "timings.csv")
    assert ta.drop(columns="wall_s").equals(tb.drop(columns="wall_s")) and (ta["wall_s"] > 0).all()
    for f in sorted((a / "runs").rglob("*.csv")):
        assert f.read_bytes() == (b / f.relative_to(a)).read_bytes(), f


def test_sweep_on_two_nodes_matches_the_local_run(cluster, ray_run, tables_dir, tmp_path, capsys):
    agents = f"fifo,srtf,{ray_run}"
    common = [*EVAL, "--agents", agents, "--seeds", "1", "--load", "0.8,1.5", "--tables", tables_dir]
    assert main([*common, "--out", str(tmp_path / "local")]) == 0
    assert main([*common, "--out", str(tmp_path / "ray"), "--ray", cluster.address]) == 0
    capsys.readouterr()
    _same_outputs(tmp_path / "local", tmp_path / "ray")
    meta = json.loads((tmp_path / "ray" / "metadata.json").read_text())
    info = meta["ray"]
    assert set(info["runs_per_node"]) == _node_ids() and len(info["runs_per_node"]) == 2  # both nodes ran some
    assert sum(info["runs_per_node"].values()) == 6 and not info["rerun"]
    assert set(info["shipped"]["cost_tables"]) == {"rsA-bs8-v100", "rsB-bs8-v100"}  # the runs' models' tables
    assert all(info["shipped"]["cost_tables"][k] == v for k, v in meta["cost_tables"].items())
    assert sorted(info["shipped"]["job_sets"]) == sorted(j["digest"] for j in meta["trace"]["job_sets"])
    from jigsaw_env.digest import file_sha256
    assert info["shipped"]["run_dirs"][str(ray_run)]["model.zip"] == file_sha256(ray_run / "model.zip")[:16]


def test_a_run_that_raises_is_a_failed_run_as_in_the_local_evaluation(cluster, tables_dir, tmp_path, capsys):
    common = [*EVAL, "--agents", "fifo,ray_gate_scheduler:FailsAtFirstRound", "--seeds", "2", "--tables", tables_dir]
    assert main([*common, "--out", str(tmp_path / "local")]) == 2
    local_err = capsys.readouterr().err.strip()
    assert main([*common, "--out", str(tmp_path / "ray"), "--ray", cluster.address]) == 2
    ray_err = capsys.readouterr().err.strip()
    assert ray_err == local_err.replace(str(tmp_path / "local"), str(tmp_path / "ray"))
    assert local_err.startswith("jigsaw evaluate: error: 2 of 4 runs failed (agent ray_gate_scheduler:FailsAtFirstRound)")
    failed = [json.loads((tmp_path / d / "metadata.json").read_text())["failed_runs"] for d in ("local", "ray")]
    assert [(f["seed"], f["error"], f["error_type"]) for f in failed[0]] == \
        [(f["seed"], f["error"], f["error_type"]) for f in failed[1]]
    info = json.loads((tmp_path / "ray" / "metadata.json").read_text())["ray"]
    assert all(t["attempts"] == 1 for t in info["tasks"])  # a run that raises is not retried
    _same_outputs(tmp_path / "local", tmp_path / "ray")


def test_workers_import_the_drivers_source_tree_or_their_own_install(monkeypatch):
    import jigsaw_env
    from jigsaw_executor.cluster_ray import code_runtime_env

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/opt/extra", str(ROOT)]))
    monkeypatch.setattr(jigsaw_env, "__file__", str(ROOT / "jigsaw_env" / "__init__.py"))  # a checkout
    assert code_runtime_env() == {"env_vars": {"PYTHONPATH": os.pathsep.join([str(ROOT), "/opt/extra"])}}
    monkeypatch.setattr(jigsaw_env, "__file__", "/usr/lib/python3/site-packages/jigsaw_env/__init__.py")
    assert code_runtime_env() == {}


@pytest.mark.timeout(30)  # a hang guard, not a speed target
def test_unreachable_address_is_one_line_within_a_bounded_wait(tmp_path, capsys):
    rc = main([*EVAL, "--agents", "fifo", "--seeds", "1", "--out", str(tmp_path / "o"), "--ray", "127.0.0.1:1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "127.0.0.1:1" in err[0]
    assert not (tmp_path / "o").exists()


@pytest.mark.timeout(300)  # a hang guard (waiting for a run to start on the worker node), not a speed target
def test_a_node_removed_mid_sweep_has_its_runs_rerun(cluster, gate, tables_dir, tmp_path, capsys):
    common = [*EVAL, "--agents", "ray_gate_scheduler:GatedFifo", "--seeds", "3", "--tables", tables_dir]
    (gate / "open").touch()
    assert main([*common, "--out", str(tmp_path / "local")]) == 0
    (gate / "open").unlink()
    worker_id = cluster.worker_node.node_id
    result: dict = {}

    def sweep():
        result["rc"] = main([*common, "--out", str(tmp_path / "ray"), "--ray", cluster.address])

    th = threading.Thread(target=sweep)
    th.start()
    while not list(gate.glob(f"started-{worker_id}-*")):  # a run has started on the worker node
        assert th.is_alive(), "the sweep ended before any run started on the worker node"
        time.sleep(0.1)
    cluster.remove_node(cluster.worker_node, allow_graceful=False)
    (gate / "open").touch()
    th.join(timeout=120)
    assert not th.is_alive() and result["rc"] == 0
    err = capsys.readouterr().err
    _same_outputs(tmp_path / "local", tmp_path / "ray")
    info = json.loads((tmp_path / "ray" / "metadata.json").read_text())["ray"]
    assert info["nodes_lost"] == [worker_id[:12]]
    assert len(info["rerun"]) >= 1 and all(r["lost_on"] == [worker_id[:12]] for r in info["rerun"])
    assert all(r["finished_on"] != worker_id[:12] for r in info["rerun"])
    assert f"lost with node {worker_id[:12]} and rerun (ray_gate_scheduler:GatedFifo seed" in err
    assert "lost with their node or worker process and rerun" in (tmp_path / "ray" / "report.html").read_text()
