"""The lockstep barrier of co-located steps (docs/spb_model.md eq. K3, docs/deploy.md eq. X3) and the
measured eta that recalibrated tables keep.

* engine and simulator, hand-computed: a component of two jobs pays the barrier once per step, a
  job alone never does, and 0 (the default) is exactly the step without a barrier (eq. K2);
* ``SimConfig.lockstep_s`` and ``lockstep.json``: bad values are one line naming the field/file;
* the fit of eq. X3, the file round trip, and ``table_files`` leaving the file out;
* the decision-log replay of a real co-located live run (``tests/data/colocated_decision_log.jsonl``,
  from ``python -m bench.sim_vs_real``) picks ``tables/lockstep.json`` up and charges it on
  co-located rounds only;
* the calibration's pinned-groups scheduler;
* ``jigsaw calibrate`` keeps the shipped table's measured eta (``carry_measured_eta``).
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from conftest import BS, DEV, TOY4C, TOY_INTRA, toy_cluster
from jigsaw_env.cost_table import LOCKSTEP_FILE, TABLES_DIR, CostTable, get_table, table_files
from jigsaw_env.engine import Component, Member
from jigsaw_env.simulator import SimConfig, Simulator
from jigsaw_env.spb import Pattern, job_profile
from jigsaw_env.state import Decision, JobDecision, JobState
from jigsaw_executor.lockstep import fit_lockstep, load_lockstep, save_lockstep

LOG = Path(__file__).resolve().parents[1] / "data" / "colocated_decision_log.jsonl"


def prof(level: int):
    return job_profile(get_table(TOY4C, BS, DEV), level, "rotating", 1, TOY_INTRA)


# ----------------------------------------------------------------------------------- engine
def test_barrier_is_added_to_every_co_located_step_only():
    # X level 0 (11 s), Y level 3 rotating (11, 9, 7, 5) on GPU 0: K2 steps 22, 20, 18, 16 (test_engine);
    # with a 0.5 s barrier (K3): 22.5, 20.5, 18.5, 16.5, cycle 76 + 4 x 0.5 = 78
    members = [Member(1, prof(0), (0,), 0), Member(2, prof(3), (0,), 0)]
    comp = Component(members, ready_s=0.0, barrier_s=0.5)
    np.testing.assert_allclose(comp.step, [22.5, 20.5, 18.5, 16.5], rtol=1e-12)
    assert comp.cycle == pytest.approx(78.0, rel=1e-12)
    # the compute within a step is unchanged (the barrier is idle time)
    np.testing.assert_allclose(comp.loads, Component(members, ready_s=0.0).loads, rtol=0)
    # a job alone never waits at a barrier
    alone = Component([Member(1, prof(3), (0,), 0)], ready_s=0.0, barrier_s=0.5)
    np.testing.assert_allclose(alone.step, [11, 9, 7, 5], rtol=1e-12)
    # barrier 0 is bit-for-bit the step without a barrier
    assert np.array_equal(Component(members, 0.0, barrier_s=0.0).step, Component(members, 0.0).step)


def test_shared_step_tables_are_not_mixed_across_barriers():
    cache: dict = {}
    members = [Member(1, prof(0), (0,), 0), Member(2, prof(0), (0,), 0)]
    a = Component(members, 0.0, cache, barrier_s=0.0)
    b = Component(members, 0.0, cache, barrier_s=1.0)
    assert a.step.tolist() == [22.0] and b.step.tolist() == [23.0]


def _pair_finish(lockstep_s: float) -> dict[int, float]:
    """Two 1-GPU level-0 jobs of 10 iterations (11 s each alone) co-located on GPU 0, time-sliced (eq. K1)."""
    jobs = [JobState(1, 0.0, 1, TOY4C, BS, 10), JobState(2, 0.0, 1, TOY4C, BS, 10)]
    sim = Simulator(toy_cluster(), jobs, SimConfig(round_s=1000.0, restart_s=0.0, lockstep_s=lockstep_s, sharing="timeslice",
                                                   pace="lockstep"))
    while not sim.done:
        sim.step(Decision({j: JobDecision((0,), 0, Pattern.ROTATING) for j in sim.state.active_ids}))
    return sim.jobs_frame().set_index("job_id")["finish_s"].to_dict()


def test_simulator_charges_the_barrier_per_co_located_step():
    # 10 lockstep steps of 11 + 11 = 22 s: 220 s; with 0.25 s at every barrier: 10 x 22.25 = 222.5 s
    assert _pair_finish(0.0) == {1: pytest.approx(220.0), 2: pytest.approx(220.0)}
    assert _pair_finish(0.25) == {1: pytest.approx(222.5), 2: pytest.approx(222.5)}


def test_free_pace_has_no_barrier():
    # each job at its own pace, time-sliced: 11 s / (1/2) = 22 s an iteration, no barrier charged
    jobs = [JobState(1, 0.0, 1, TOY4C, BS, 10), JobState(2, 0.0, 1, TOY4C, BS, 10)]
    sim = Simulator(toy_cluster(), jobs, SimConfig(round_s=1000.0, restart_s=0.0, lockstep_s=0.25, sharing="timeslice"))
    while not sim.done:
        sim.step(Decision({j: JobDecision((0,), 0, Pattern.ROTATING) for j in sim.state.active_ids}))
    assert sim.jobs_frame().set_index("job_id")["finish_s"].to_dict() == {1: pytest.approx(220.0),
                                                                          2: pytest.approx(220.0)}


def test_executor_segments_follow_the_pace():
    from jigsaw_executor.live import segments_of

    d = {1: JobDecision((0,), 0), 2: JobDecision((0, 1), 0), 3: JobDecision((2,), 0)}
    assert segments_of(d, "lockstep") == [[1, 2], [3]]
    assert segments_of(d, "free") == [[1], [2], [3]]
    with pytest.raises(ValueError, match="pace must be one of free, lockstep, got 'async'"):
        segments_of(d, "async")


def test_replay_runs_the_pace_the_log_records(tmp_path):
    import json

    from jigsaw_executor.decision_log import replay_decision_log

    lines = LOG.read_text().splitlines()
    header = json.loads(lines[0])
    assert "pace" not in header["sim"]  # the fixture's run stepped its pairs in lockstep
    header["sim"]["pace"] = "free"
    free_log = tmp_path / "decision_log.jsonl"
    free_log.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    from jigsaw_executor.decision_log import _tables_registered

    tables = _tables_with_lockstep(tmp_path, 0.002, "barred")
    # the scheduler re-runs on the registered tables: those of the logged run (W = 4 eta only)
    with _tables_registered(_tables_with_lockstep(tmp_path, None, "logged")):
        lock = replay_decision_log(LOG, tables=tables)
        free = replay_decision_log(free_log, tables=tables)
    assert any(n == "pace: lockstep (as the live run)" for n in lock.notes)
    assert any(n == "pace: free (as the live run)" for n in free.notes)
    assert lock.decisions_match and free.decisions_match
    # a co-located job of the first round: free, it does not wait for its partner at a barrier
    lr = {(x["round"], x["job_id"]): x for x in lock.rounds}
    differ = [x for x in free.rounds if x["round"] == 0 and x["sim_iter_s"] != lr[(0, x["job_id"])]["sim_iter_s"]]
    assert differ


def test_simulator_job_alone_ignores_the_barrier():
    sim = Simulator(toy_cluster(), [JobState(1, 0.0, 1, TOY4C, BS, 10)], SimConfig(round_s=1000.0, lockstep_s=3.0))
    while not sim.done:
        sim.step(Decision({1: JobDecision((0,), 0, Pattern.ROTATING)}))
    assert sim.jobs_frame().set_index("job_id").loc[1, "finish_s"] == pytest.approx(110.0)


@pytest.mark.parametrize("value", [-0.1, float("nan"), float("inf"), True, "1"])
def test_bad_lockstep_in_the_config(value):
    with pytest.raises(ValueError, match="lockstep_s must be a finite number of seconds >= 0"):
        SimConfig(lockstep_s=value)


# ----------------------------------------------------------------------------------- eq. X3 and the file
def test_fit_hand_computed():
    # pairs: 10 - 3 - 4 = 3 ms and 6 - 2 - 3 = 1 ms -> mean 2 ms
    assert fit_lockstep([(0.010, 0.003, 0.004), (0.006, 0.002, 0.003)]) == pytest.approx(0.002)
    assert fit_lockstep([(0.004, 0.003, 0.002)]) == 0.0  # faster than the two alone: clipped at 0
    with pytest.raises(ValueError, match="at least one co-located pair"):
        fit_lockstep([])
    with pytest.raises(ValueError, match=r"\(T_pair, T1_a, T1_b\)"):
        fit_lockstep([(0.01, float("nan"), 0.0)])


def test_file_round_trip_and_table_files_skip_it(tmp_path):
    save_lockstep(tmp_path / LOCKSTEP_FILE, 0.0015, "hand-written", {"points": []})
    assert load_lockstep(tmp_path / LOCKSTEP_FILE) == 0.0015
    d = json.loads((tmp_path / LOCKSTEP_FILE).read_text())
    assert d["lockstep_ms"] == pytest.approx(1.5) and d["source"] == "hand-written"
    get_table(TOY4C, BS, DEV).save(tmp_path / "t.json")
    assert [f.name for f in table_files(tmp_path)] == ["t.json"]


@pytest.mark.parametrize("content, what", [("{", "not valid JSON"), ("[1]", "expected a JSON object"),
                                           ('{"lockstep_s": -1}', "field lockstep_s must be a finite number >= 0"),
                                           ('{"lockstep_s": "1"}', "field lockstep_s must be a finite number >= 0"),
                                           ("{}", "field lockstep_s")])
def test_bad_lockstep_file_names_the_file_and_field(tmp_path, content, what):
    f = tmp_path / LOCKSTEP_FILE
    f.write_text(content)
    with pytest.raises(ValueError, match=what) as e:
        load_lockstep(f)
    assert str(f) in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(FileNotFoundError, match="lockstep file not found"):
        load_lockstep(tmp_path / "missing.json")


# ----------------------------------------------------------------------------------- the replay
def _tables_with_lockstep(tmp_path: Path, lockstep_s: float | None, name: str) -> Path:
    """The CPU tables of the logged jobs, with eta as the logged run's tables held it: measured at
    4 workers only (no ``/w<W>`` keys, which change the policy's decisions for its 1- and 2-slot
    jobs), and ``lockstep.json`` when ``lockstep_s`` is given."""
    d = tmp_path / name
    d.mkdir()
    for m in ("tiny_cnn", "tiny_mlp", "tiny_transformer"):
        t = json.loads((TABLES_DIR / f"{m}-bs32-cpu.json").read_text())
        meta = t.get("meta", {})
        if "eta" in meta:
            meta["eta"] = {k: v for k, v in meta["eta"].items() if "/w" not in k}
            meta["eta_source"] = {k: v for k, v in meta["eta_source"].items() if not k.startswith("w")}
        (d / f"{m}-bs32-cpu.json").write_text(json.dumps(t, indent=1) + "\n")
    if lockstep_s is not None:
        save_lockstep(d / LOCKSTEP_FILE, lockstep_s, "test")
    return d


def test_replay_picks_up_lockstep_json_and_charges_co_located_rounds_only(tmp_path):
    from jigsaw_executor.decision_log import _tables_registered, read_decision_log, replay_decision_log

    b = 0.002
    # the scheduler re-runs on the registered tables: those of the logged run (W = 4 eta only)
    with _tables_registered(_tables_with_lockstep(tmp_path, None, "logged")):
        plain = replay_decision_log(LOG, tables=_tables_with_lockstep(tmp_path, None, "plain"))
        barred = replay_decision_log(LOG, tables=_tables_with_lockstep(tmp_path, b, "barred"))
        explicit = replay_decision_log(LOG, tables=_tables_with_lockstep(tmp_path, None, "explicit"), lockstep_s=b)
    assert plain.decisions_match and barred.decisions_match
    assert barred.jobs == explicit.jobs and barred.rounds == explicit.rounds
    assert any("lockstep barrier: 2.000 ms" in n for n in barred.notes)
    assert not any("lockstep barrier" in n for n in plain.notes)
    _, rounds, _ = read_decision_log(LOG)
    shared = {}  # round -> jobs sharing a slot in that round's decision
    for r in rounds:
        on = {}
        for jid, jd in r["decision"].items():
            for g in jd["gpus"]:
                on.setdefault(g, []).append(int(jid))
        shared[int(r["round"])] = {j for js in on.values() if len(js) > 1 for j in js}
    assert any(shared.values()), "the fixture must hold a co-located round"
    assert shared[0] and shared[1], "the fixture's first two rounds hold co-located jobs"
    p = {(x["round"], x["job_id"]): x for x in plain.rounds}
    seen = 0
    for x in barred.rounds:
        if x["round"] > 1:  # later rounds differ as jobs finish at other times
            continue
        y = p[(x["round"], x["job_id"])]
        if x["job_id"] in shared[x["round"]]:
            # every lockstep step is b longer, so the same round holds fewer steps of mean length + b
            assert x["sim_steps"] < y["sim_steps"]
            assert x["sim_iter_s"] == pytest.approx(y["sim_iter_s"] + b, rel=0.02)
            seen += 1
    assert seen >= 2
    # the first round's lone job (slot 1) steps exactly as without the barrier
    first = [x for x in barred.rounds if x["round"] == 0 and x["job_id"] not in shared[0]]
    assert first and all(x == p[(0, x["job_id"])] for x in first)


# ----------------------------------------------------------------------------------- calibration scheduler
def test_pinned_groups_share_their_gpus_and_wait_for_earlier_groups():
    from jigsaw_executor.calibrate_executor import PinnedGroups, _pairs

    jobs = [JobState(j, 0.0, 1, TOY4C, BS, 10) for j in (300, 301, 302, 303, 304, 305)]
    sim = Simulator(toy_cluster(2, 2), jobs, SimConfig(round_s=1000.0, restart_s=0.0))
    s = PinnedGroups([((300, 301), (0,)), ((302, 303), (1,)), ((304, 305), (0,))])
    d = s.schedule(sim.state)
    assert {j: jd.gpus for j, jd in d.items()} == {300: (0,), 301: (0,), 302: (1,), 303: (1,)}
    sim.step(d)
    assert sim.state.jobs[300].finish_s is not None  # 10 steps of 22 s within the 1000 s round
    d = s.schedule(sim.state)
    assert {j: jd.gpus for j, jd in d.items()} == {304: (0,), 305: (0,)}
    assert _pairs(["a"]) == [("a", "a")]
    assert _pairs(["a", "b", "c"]) == [("a", "b"), ("a", "c"), ("b", "c")]


# ----------------------------------------------------------------------------------- measured eta kept
def test_recalibrated_table_keeps_the_shipped_measured_eta(tmp_path):
    from jigsaw_env.calibrate import calibrate, carry_measured_eta

    shipped = CostTable.load(TABLES_DIR / "tiny_mlp-bs32-cpu.json")
    assert shipped.meta.get("eta")
    t = calibrate("tiny_mlp", 32, "cpu", repeats=2)
    assert t.meta["eta"] == shipped.meta["eta"]
    assert t.meta["eta_source"]["carried_from"].startswith(f"tiny_mlp-bs32-cpu.json (digest {shipped.digest()})")
    assert t.meta["eta_source"]["command"] == shipped.meta["eta_source"]["command"]
    # what the simulator then uses at level 3: the measured value, not the eq. E1 prior
    from jigsaw_env.spb import SPBConfig, eta_for

    assert eta_for(t, 3, Pattern.ROTATING, SPBConfig(), (0, 1, 2, 3), 4) == shipped.meta["eta"]["3/rotating"]
    bare = calibrate("tiny_mlp", 32, "cpu", repeats=2, eta_from=None)
    assert "eta" not in bare.meta
    # a table with eta of its own keeps it; a folder without the model lends nothing
    own = dataclasses.replace(bare, meta=dict(bare.meta, eta={"3/rotating": 0.5}))
    assert carry_measured_eta(own) is own
    assert carry_measured_eta(bare, tmp_path) is bare
    # tiny_transformer has no measured eta in the shipped tables: nothing to carry
    tt = CostTable.load(TABLES_DIR / "tiny_transformer-bs32-cpu.json")
    assert "eta" not in tt.meta and carry_measured_eta(dataclasses.replace(tt, meta={})).meta == {}
    assert math.isfinite(t.compute_s(0))


def test_calibration_refuses_a_one_worker_pool_before_measuring(tmp_path):
    from jigsaw_executor.calibrate_executor import calibrate_executor

    class OneWorkerPool:
        cap = 1

    base = {"tiny_mlp": CostTable.load(TABLES_DIR / "tiny_mlp-bs32-cpu.json")}
    with pytest.raises(ValueError, match="lockstep pairs need 2 workers per slot but the given slot pool holds 1"):
        calibrate_executor(["tiny_mlp"], {"tiny_mlp": 32}, tmp_path / "cal", base_tables=base, pool=OneWorkerPool())
    assert not (tmp_path / "cal").exists()  # refused before anything was written
