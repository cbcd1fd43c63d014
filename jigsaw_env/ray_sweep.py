"""``jigsaw evaluate --ray [ADDRESS]``: the runs of an evaluation as Ray tasks.

Each (agent, seed, load, eta) run is one Ray task (:func:`run_on_ray`), scheduled with Ray's
``SPREAD`` strategy over the nodes of the cluster. ``--ray`` alone starts an embedded Ray in this
process with ``--workers`` CPUs; ``--ray auto`` joins the cluster started on this machine with
``ray start``, ``--ray HOST:PORT`` the one at that address
(:func:`jigsaw_executor.cluster_ray.connect`: an address that does not answer within a few seconds
is one line naming it).

What a task needs reaches it through Ray's object store, so a worker node needs jigsaw's code and
nothing else (no ``JIGSAW_DATA``, no ``--tables`` folder, no copy of a RUN_DIR):

* each job set (one per load and seed) is put once, and each task gets its own;
* one bundle holds the cost tables of the runs' models (the shipped ones and those of ``--tables``), the
  files of each learned agent's RUN_DIR (config.json, the model, the observation statistics, an
  exported policy.onnx) and, when gandiva is evaluated, Gavel's co-location measurements;
  :func:`shipped_digests` lists what was shipped with its SHA-256 digests (metadata.json ``ray``).

A task returns its metrics row and its logs (jobs.csv, rounds.csv, cluster.csv), which the driver
writes under OUT/runs/ as a local run does. A task lost with its node (or its worker process) is
rerun by Ray on another node, up to :data:`MAX_RETRIES` times; every attempt's node is recorded by a
small actor on the driver's node, so the report can say which runs were rerun and where. A run whose
attempts are all lost is a failed run (metadata.json ``failed_runs``), never dropped.
"""
from __future__ import annotations

import hashlib
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

import agents.gandiva as gandiva
from agents.rl import LearnedAgent

from . import evaluate as ev
from .cost_table import CostTable, available_tables, get_table, register_table, unregister_table
from .gavel_data import gavel_throughputs

#: times Ray reruns a task whose worker or node was lost (Ray's ``max_retries``)
MAX_RETRIES = 3

#: the files of a RUN_DIR a learned agent reads (agents/rl.py)
RUN_DIR_FILES = ("config.json", "model.zip", "vecnormalize.npz", "policy.onnx")

LOG_FILES = ("jobs.csv", "rounds.csv", "cluster.csv")

#: seconds to wait, after a sweep with reruns, for Ray to report the nodes the lost attempts ran on
#: as dead (metadata.json ``ray.nodes_lost``); a node still alive then lost a worker process only
NODE_DEATH_WAIT_S = 15.0


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ----------------------------------------------------------------------------------------------- the bundle
def build_bundle(tasks, cluster) -> dict[str, Any]:
    """What every task shares, read here once: cost tables (as dicts), RUN_DIR files, Gavel data.

    The tables are every table of the job sets' models on the cluster's GPU types, at every batch
    size, shipped or registered (``--tables``): a job whose batch size has no table of its own gets
    one scaled from them (eq. B1, ``cost_table.get_table(nearest=True)``), so a worker computes the
    same scaled tables from the same set."""
    models = {str(m) for t in tasks for m in t.jobs["model"].unique()}
    gtypes = set(cluster.gpu_types)
    tables: dict[str, dict] = {f"{m}-bs{b}-{d}": get_table(m, b, d).to_dict()
                               for m, b, d in available_tables() if m in models and d in gtypes}
    run_dirs: dict[str, dict[str, bytes]] = {}
    for t in tasks:
        if t.agent.kind == "learned" and t.agent.ref not in run_dirs:
            d = Path(t.agent.ref)
            run_dirs[t.agent.ref] = {f: (d / f).read_bytes() for f in RUN_DIR_FILES if (d / f).is_file()}
    gavel = None
    if any(t.agent.kind == "heuristic" and "gandiva" in t.agent.ref for t in tasks):
        try:
            gavel = gavel_throughputs()
        except (FileNotFoundError, ValueError):
            gavel = {}
    return {"tables": tables, "run_dirs": run_dirs, "gavel": gavel}


def shipped_digests(bundle: dict, job_sets: dict[str, Any]) -> dict[str, Any]:
    """SHA-256 digests (first 16 hex digits) of what went through the object store."""
    return {
        "job_sets": sorted(job_sets),
        "cost_tables": {k: CostTable.from_dict(v, origin=k).digest() for k, v in sorted(bundle["tables"].items())},
        "run_dirs": {ref: {f: _sha256(b)[:16] for f, b in files.items()} for ref, files in bundle["run_dirs"].items()},
        "gavel": None if bundle["gavel"] is None else _sha256(json.dumps(bundle["gavel"], sort_keys=True).encode())[:16],
    }


_INSTALLED: dict[str, Any] = {}


def _install(bundle: dict, key: str) -> None:
    """Make the bundle's tables, agents and Gavel data this worker's (once per bundle)."""
    if _INSTALLED.get("bundle") == key:
        return
    ev.init_worker(None)
    for k in _INSTALLED.pop("tables", []):  # a worker reused by another evaluation: its tables only
        unregister_table(*k)
    tables = [CostTable.from_dict(d, origin=name) for name, d in bundle["tables"].items()]
    for t in tables:
        register_table(t)
    _INSTALLED["tables"] = [(t.model, t.batch_size, t.device) for t in tables]
    if bundle["gavel"] is not None:
        gandiva.use_gavel_throughputs(bundle["gavel"])
    if bundle["run_dirs"]:
        base = Path(tempfile.mkdtemp(prefix="jigsaw-runs-"))
        for i, (ref, files) in enumerate(bundle["run_dirs"].items()):
            d = base / f"{i}-{Path(ref).name}"
            d.mkdir()
            for f, data in files.items():
                (d / f).write_bytes(data)
            agent = LearnedAgent(d)
            agent.run_dir = Path(ref)  # its messages name the user's RUN_DIR
            ev.keep_learned_agent(ref, agent)
    _INSTALLED["bundle"] = key


def _run_remote(task, jobs, bundle, key: str, index: int, ledger) -> dict[str, Any]:
    """The body of one Ray task: record the attempt, run, return the row and the logs' bytes."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    ray.get(ledger.started.remote(index, node))
    _install(bundle, key)
    with tempfile.TemporaryDirectory(prefix="jigsaw-run-") as tmp:
        row = ev.run_task(replace(task, jobs=jobs, out_dir=tmp, tables=None))
        logs = {f: (Path(tmp) / f).read_bytes() for f in LOG_FILES if (Path(tmp) / f).is_file()}
    return {"row": row, "logs": logs, "node": node}


class _Ledger:
    """Every task attempt's node (an actor on the driver's node, so it outlives the others)."""

    def __init__(self):
        self.starts: dict[int, list[str]] = {}

    def started(self, index: int, node: str) -> None:
        self.starts.setdefault(int(index), []).append(node)

    def all(self) -> dict[int, list[str]]:
        return self.starts


# ----------------------------------------------------------------------------------------------- driver
def _nodes() -> dict[str, dict]:
    import ray
    return {n["NodeID"]: {"address": n.get("NodeManagerAddress"), "cpus": n.get("Resources", {}).get("CPU", 0)}
            for n in ray.nodes() if n.get("Alive")}


def _cause(e: BaseException) -> BaseException:
    """A task's own exception inside Ray's wrapper (RayTaskError), else ``e``."""
    import ray
    if isinstance(e, ray.exceptions.RayTaskError):
        cause = getattr(e, "cause", None)
        if isinstance(cause, BaseException):
            return cause
    return e


def run_on_ray(tasks, cluster, address: str | None, owned: bool, progress: bool) -> tuple[list, dict]:
    """Every task's metrics row (its logs written to ``task.out_dir``) or its RunFailure, and the
    ``ray`` section of metadata.json (module docstring). Ray is connected
    (:func:`jigsaw_executor.cluster_ray.connect`); ``owned``: shut it down at the end."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from jigsaw_executor.cluster_ray import code_runtime_env

    t0 = time.perf_counter()
    try:
        nodes_before = _nodes()
        renv = code_runtime_env()
        bundle = build_bundle(tasks, cluster)
        key = hashlib.sha256(repr(sorted(shipped_digests(bundle, {}).items())).encode()).hexdigest()[:16]
        bundle_ref = ray.put(bundle)
        job_refs: dict[str, Any] = {}
        for t in tasks:
            if t.trace_digest not in job_refs:
                job_refs[t.trace_digest] = ray.put(t.jobs)
        here = ray.get_runtime_context().get_node_id()
        ledger = ray.remote(_Ledger).options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False),
                                             runtime_env=renv).remote()
        fn = ray.remote(_run_remote).options(num_cpus=1, max_retries=MAX_RETRIES, retry_exceptions=False,
                                             scheduling_strategy="SPREAD", runtime_env=renv)
        refs = {fn.remote(replace(t, jobs=None, tables=None), job_refs[t.trace_digest], bundle_ref, key, i, ledger): i
                for i, t in enumerate(tasks)}
        rows: list[Any] = [None] * len(tasks)
        done_on: list[str | None] = [None] * len(tasks)
        show_load = len({t.load for t in tasks}) > 1
        bar = tqdm(total=len(tasks), unit="run", desc=f"evaluating on Ray ({len(nodes_before)} nodes)",
                   disable=not progress, file=sys.stderr)
        pending = list(refs)
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                for ref in ready:
                    i = refs[ref]
                    try:
                        out = ray.get(ref)
                    except ray.exceptions.RayTaskError as e:  # the run raised: a failed run, like a local one
                        rows[i] = ev.run_failure(tasks[i], _cause(e), show_load)
                    except ray.exceptions.RayError as e:  # lost with its node or worker MAX_RETRIES + 1 times
                        t = tasks[i]
                        rows[i] = ev.RunFailure(
                            t.agent.label, t.agent.ref, t.seed, t.load, t.eta,
                            f"agent {t.agent.label}, seed {t.seed}: lost with its node or worker process on all "
                            f"{MAX_RETRIES + 1} attempts ({type(e).__name__})", type(e).__name__, None)
                    else:
                        d = Path(tasks[i].out_dir)
                        d.mkdir(parents=True, exist_ok=True)
                        for f, data in out["logs"].items():
                            (d / f).write_bytes(data)
                        rows[i] = out["row"]
                        done_on[i] = out["node"]
                    bar.update(1)
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
        finally:
            bar.close()
        starts = ray.get(ledger.all.remote())
        ray.kill(ledger)
        nodes_after = _nodes()
        lost_on = {n for att in starts.values() if len(att) > 1 for n in att[:-1]}
        deadline = time.perf_counter() + NODE_DEATH_WAIT_S
        while lost_on & set(nodes_after) and time.perf_counter() < deadline:
            time.sleep(0.5)  # Ray's health checks mark a vanished node dead a few seconds later
            nodes_after = _nodes()
        info = _ray_info(tasks, address, nodes_before, nodes_after, starts, done_on,
                         shipped_digests(bundle, job_refs), time.perf_counter() - t0)
    finally:
        if owned:
            ray.shutdown()
    return rows, info


def _ray_info(tasks, address, before: dict, after: dict, starts: dict, done_on: list, shipped: dict,
              wall_s: float) -> dict[str, Any]:
    """metadata.json ``ray``: where each run ran, which were rerun after losing their node."""
    every = {**before, **after}
    short = {n: n[:12] for n in every}
    reruns = []
    per_task = []
    for i, t in enumerate(tasks):
        attempts = starts.get(i, [])
        who = {"agent": t.agent.label, "seed": t.seed, "load": t.load, "eta": t.eta}
        per_task.append({**who, "node": short.get(done_on[i], done_on[i]), "attempts": len(attempts)})
        if len(attempts) > 1:
            reruns.append({**who, "attempt_nodes": [short.get(n, n) for n in attempts],
                           "lost_on": [short.get(n, n) for n in attempts[:-1]],
                           "finished_on": short.get(done_on[i], done_on[i])})
    counts: dict[str, int] = {}
    for n in done_on:
        if n is not None:
            counts[short.get(n, n)] = counts.get(short.get(n, n), 0) + 1
    return {
        "address": "local (embedded)" if address in (None, "local") else address,
        "nodes": [{"node": short[n], **v, "alive_at_end": n in after} for n, v in before.items()]
                 + [{"node": short[n], **v, "alive_at_end": True, "joined": True} for n, v in after.items() if n not in before],
        "nodes_lost": [short[n] for n in before if n not in after],
        "runs_per_node": counts,
        "max_retries": MAX_RETRIES,
        "rerun": reruns,
        "tasks": per_task,
        "shipped": shipped,
        "wall_s": wall_s,
    }


def rerun_note(info: dict) -> str | None:
    """One line on the runs Ray reran after losing their node (stderr and the report), or None."""
    rr = info.get("rerun") or []
    if not rr:
        return None
    lost = sorted({n for r in rr for n in r["lost_on"]})
    names = ", ".join(f"{r['agent']} seed {r['seed']}" for r in rr[:4]) + (", ..." if len(rr) > 4 else "")
    gone = set(info.get("nodes_lost") or [])
    what = ("lost with node" if lost and set(lost) <= gone else "lost with their worker process on node")
    return (f"{len(rr)} run{'s were' if len(rr) != 1 else ' was'} {what}{'s' if len(lost) > 1 else ''} "
            f"{', '.join(lost)} and rerun ({names}); metadata.json ray.rerun lists them")

