"""Schedulers' plain-data state (``Scheduler.state_dict`` / ``load_state_dict``), in the simulator.

Known answers: a state survives a JSON round trip unchanged (the state after loading equals the
state before), and a scheduler restarted from its JSON state at every round of a toy run takes the
decisions of the same scheduler run uninterrupted (what ``jigsaw deploy --resume`` relies on).
"""
from __future__ import annotations

import json

import pytest

from conftest import toy_cluster
from test_agents import ALL, _toy_trace
from agents import make_scheduler
from agents.base import STATE_VERSION
from jigsaw_env.simulator import SimConfig, Simulator

# low thresholds and a short starvation guard: the LAS queues move and promote within the toy run
KWARGS = {"tiresias": {"thresholds": (120.0,), "starve_factor": 2.0},
          "jigsaw": {"thresholds": (120.0,), "starve_factor": 2.0},
          "tiresias+spb": {"thresholds": (120.0,), "starve_factor": 2.0}}


def _sim() -> Simulator:
    return Simulator(toy_cluster(8, 4, gpu_memory_gib=8), _toy_trace(24, seed=5), SimConfig(round_s=60.0, restart_s=10.0))


def _key(decision) -> dict:
    return {jid: (tuple(jd.gpus), jd.level, str(jd.pattern)) for jid, jd in decision.items()}


def _through_json(d: dict) -> dict:
    return json.loads(json.dumps(d))


def run(name: str, restart_every_round: bool, max_rounds: int = 5000):
    """The decisions of ``name`` on the toy run, and the states it carried (after each round)."""
    sim = _sim()
    agent = make_scheduler(name, **KWARGS.get(name, {}))
    agent.reset()
    decisions, states = [], []
    for _ in range(max_rounds):
        if sim.done:
            return decisions, states
        if restart_every_round:  # a restarted scheduler: rebuilt from its name, arguments and JSON state
            fresh = make_scheduler(name, **KWARGS.get(name, {}))
            fresh.load_state_dict(_through_json(agent.state_dict()))
            agent = fresh
        d = agent.schedule(sim.state)
        decisions.append(_key(d))
        states.append(agent.state_dict())
        sim.step(d)
    raise AssertionError(f"{name} did not finish in {max_rounds} rounds")


@pytest.mark.parametrize("name", ALL)
def test_state_is_json_and_round_trips(name):
    _, states = run(name, restart_every_round=False)
    for st in states[:: max(1, len(states) // 20)]:
        assert st["version"] == STATE_VERSION and st["scheduler"] == name
        again = make_scheduler(name, **KWARGS.get(name, {}))
        again.load_state_dict(_through_json(st))
        assert again.state_dict() == _through_json(st)


@pytest.mark.parametrize("name", ["tiresias", "jigsaw", "gandiva", "random", "tiresias+spb"])
def test_restarted_every_round_decides_as_uninterrupted(name):
    straight, states = run(name, restart_every_round=False)
    restarted, _ = run(name, restart_every_round=True)
    assert restarted == straight
    if name in ("tiresias", "jigsaw"):  # the state carried something: runs, waits and promotions
        assert any(s["las"]["promotions"] > 0 for s in states)
        assert any(s["las"]["wait_since"] for s in states)
    if name in ("jigsaw", "gandiva"):
        assert any(s["host_of"] for s in states)  # pairs were running across rounds


def test_a_fresh_scheduler_would_decide_otherwise():
    """The known answer has teeth: forgetting the state (a fresh Tiresias each round) changes the
    decisions of the toy run."""
    straight, _ = run("tiresias", restart_every_round=False)
    sim = _sim()
    forgetful = []
    while not sim.done and len(forgetful) < 5000:
        d = make_scheduler("tiresias", **KWARGS["tiresias"]).schedule(sim.state)
        forgetful.append(_key(d))
        sim.step(d)
    assert forgetful != straight


@pytest.mark.parametrize("bad, field", [
    ({"version": 99, "scheduler": "tiresias"}, "version"),
    ({"version": STATE_VERSION, "scheduler": "fifo"}, "scheduler"),
    ({"version": STATE_VERSION, "scheduler": "tiresias", "las": {"run_since": [[1, "x"]]}}, "run_since"),
    ({"version": STATE_VERSION, "scheduler": "tiresias", "las": {"promotions": "many"}}, "promotions"),
    ([1, 2], "JSON object"),
])
def test_a_state_that_does_not_fit_is_one_line_naming_the_field(bad, field):
    with pytest.raises(ValueError) as e:
        make_scheduler("tiresias").load_state_dict(bad)
    assert field in str(e.value) and "\n" not in str(e.value)


def test_jigsaw_host_of_is_checked():
    st = make_scheduler("jigsaw").state_dict()
    st["host_of"] = {"1": 2}
    with pytest.raises(ValueError, match="'host_of': expected a list of"):
        make_scheduler("jigsaw").load_state_dict(st)
