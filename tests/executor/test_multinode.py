"""The live executor on a real multi-node Ray cluster on one machine (``ray.cluster_utils.Cluster``:
a head node holding slot 0 and a second node holding slot 1, one CPU each), and its control store
probed from the second node without the run's token (docs/security.md, docs/deploy.md section 1).

The hub's store is bound to the node address Ray uses (not loopback), as on a cluster of several
machines, so the second node's workers reach it over that address. Known answers: a 2-rank tiny
MLP runs with one rank on each node and both ranks end with the same weights; a 1-slot job runs
after it on the second node; a client without the token reads only sealed bytes and every record
it writes is refused.
"""
from __future__ import annotations

import json

import pytest

pytest.importorskip("ray")
pytestmark = pytest.mark.slow

from jigsaw_env.spb import Pattern  # noqa: E402
from jigsaw_env.state import ClusterState, Decision, JobDecision  # noqa: E402
from jigsaw_executor.live import LiveConfig, LiveExecutor, LiveJob  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    import ray
    from ray.cluster_utils import Cluster

    from jigsaw_executor.cluster_ray import NAMESPACE, slot_resource

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {slot_resource(0): 1},
                                                      "include_dashboard": False})
    second = c.add_node(num_cpus=1, resources={slot_resource(1): 1})
    try:
        c.wait_for_nodes()
        ray.init(address=c.address, namespace=NAMESPACE, logging_level="WARNING", log_to_driver=False)
        nodes = {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}
        assert len(nodes) == 2
        head = next(k for k, n in nodes.items() if n["Resources"].get(slot_resource(0)))
        other = next(k for k, n in nodes.items() if n["Resources"].get(slot_resource(1)))
        yield {"address": c.address, "head": head, "other": other, "ip": nodes[other]["NodeManagerAddress"]}
    finally:
        ray.shutdown()
        c.remove_node(second)
        c.shutdown()


def _fifo_by_hand(state: ClusterState) -> Decision:
    """Job 0 on both slots until it is done, then job 1 on slot 1."""
    if 0 in state.active_ids:
        return Decision({0: JobDecision((0, 1), 0, Pattern.ROTATING)})
    return Decision({1: JobDecision((1,), 0, Pattern.ROTATING)} if 1 in state.active_ids else {})


def test_a_deploy_runs_with_workers_on_both_nodes(cluster, tmp_path):
    import ray

    from jigsaw_executor.cluster_ray import get_or_create_hub, kill_actor, store_host

    # both nodes are this machine (one address): by default the store would bind to loopback, which
    # both reach; bound here to the node address Ray uses instead, as on a cluster of several machines
    assert store_host() == "127.0.0.1"
    hub = get_or_create_hub("test-mn-hub", advertise_host=cluster["ip"])
    try:
        host, _ = ray.get(hub.address.remote())
        assert host == cluster["ip"]
        jobs = [LiveJob(0, "tiny_mlp", 2, 120, seed=3, lr=0.02), LiveJob(1, "tiny_mlp", 1, 60, seed=4, lr=0.02)]
        cfg = LiveConfig(slots=2, steps_per_round=60, max_workers_per_gpu=1, pin=False, timeout_s=30.0,
                         checkpoint_every=0)
        ex = LiveExecutor(jobs, _fifo_by_hand, cfg, tmp_path, hub=hub, address=cluster["address"])
        try:
            summary = ex.run()
        finally:
            ex.close()
    finally:
        kill_actor(hub)
    a, b = summary["jobs"][0], summary["jobs"][1]
    assert a["status"] == b["status"] == "done" and summary["failed_jobs"] == []
    assert a["final_iteration"] == 120 and b["final_iteration"] == 60 and a["failures"] == b["failures"] == 0
    assert len(a["rank_hashes"]) == 2 and a["rank_hashes"][0] == a["rank_hashes"][1]
    ev = [json.loads(x) for x in (tmp_path / "run_log.jsonl").read_text().splitlines()]
    hosts = next(e for e in ev if e["event"] == "start")["hosts"]
    where = {name: h["node_id"] for name, h in hosts.items()}
    launches = {e["job"]: [where[n] for n in e["hosts"]] for e in ev if e["event"] == "launch"}
    assert launches[0] == [cluster["head"], cluster["other"]]  # rank 0 on the head node, rank 1 on the other
    assert launches[1] == [cluster["other"]]


def test_a_client_on_the_other_node_without_the_token_is_refused(cluster):
    """From a task on the second node: the store at its advertised address is reachable; with the
    run's token a decision record opens; without it the record is sealed bytes, a guessed token
    opens nothing, and a record the client writes is refused by the workers' reader."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from jigsaw_executor.cluster_ray import get_or_create_hub, kill_actor
    from jigsaw_executor.store_seal import new_token

    hub = get_or_create_hub("test-mn-hub2", advertise_host=cluster["ip"])
    run, token = "test-mn-auth", new_token()
    try:
        ray.get(hub.open_run.remote(run, token))
        rec = {"action": "run", "gpus": [0], "level": 1, "pattern": "rotating", "round": 2}
        ray.get(hub.publish.remote(run, {0: rec}))
        host, port = ray.get(hub.address.remote())

        @ray.remote(num_cpus=0)
        def probe(host: str, port: int, run: str, token: str) -> dict:
            import json as _json

            from jigsaw_executor.control import Keys, connect_store, read_record
            from jigsaw_executor.store_seal import ForgedRecord, RecordSeal, new_token as _new

            out = {"node": ray.get_runtime_context().get_node_id()}
            st = connect_store(host, port, run, 10.0)
            raw = st.get(Keys.ctl(0))
            out["plain_visible"] = any(w in raw for w in (b"rotating", b"gpus", b'"action"'))
            out["with_token"] = read_record(st, Keys.ctl(0), RecordSeal(token))
            try:
                read_record(st, Keys.ctl(0), RecordSeal(_new()))
                out["guessed"] = "opened"
            except ForgedRecord:
                out["guessed"] = "refused"
            st.set(Keys.ctl(0), _json.dumps({"action": "stop", "gpus": [], "seq": 99, "v": 99, "job": 0}))
            try:
                read_record(st, Keys.ctl(0), RecordSeal(token))
                out["forged"] = "accepted"
            except ForgedRecord as e:
                out["forged"] = str(e)
            return out

        strategy = NodeAffinitySchedulingStrategy(node_id=cluster["other"], soft=False)
        got = ray.get(probe.options(scheduling_strategy=strategy).remote(host, port, run, token), timeout=120)
        assert got["node"] == cluster["other"]
        assert not got["plain_visible"] and got["guessed"] == "refused"
        assert {k: got["with_token"][k] for k in rec} == rec
        assert "not a record sealed with this run's token" in got["forged"]
        assert ray.get(hub.decision.remote(run, 0))["action"] == "run"  # the hub's own record is untouched
    finally:
        kill_actor(hub)
