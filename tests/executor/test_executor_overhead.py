"""The live executor's per-iteration overhead as part of the cost model (docs/spb_model.md eq. C1,
docs/deploy.md section 5), the calibrated link file, and the worker count of measured eta.

* ``CostTable.executor_overhead_s`` round-trips through save/load; 0 (every shipped table) is
  not written, so the JSON and digest are those of a table without the field, and every iteration
  time is eq. C1 without the overhead term;
* a hand-computed case with overhead > 0 (per start, per phase with sync, and through the
  simulator);
* bad values (negative, not a number) fail in one line naming the file and the field;
* the link fit (eq. X2) and ``link.json`` reading;
* eta keyed by worker count (``"<level>/<pattern>/w<W>"``) and tables without it;
* ``jigsaw calibrate --device cpu --executor`` on tiny_mlp writes the field and ``link.json``
  (slow: starts Ray).
"""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import BS, TOY_INTRA, make_toy4, toy_cluster
from jigsaw_env.cost_table import TABLES_DIR, CostTable, register_table, register_tables_dir, table_files, \
    unregister_table
from jigsaw_env.network import LINK_FILE, Link, fit_executor_alpha, load_link, save_link
from jigsaw_env.spb import Pattern, SPBConfig, eta_for, eta_key, eta_measured_workers, job_profile

ROOT = Path(__file__).resolve().parents[2]


def _c1_without_overhead(t: CostTable) -> np.ndarray:
    """eq. C1 without the overhead term."""
    a = t.arrays()
    fwd = a["forward_s"].sum()
    bw_w_suffix = np.cumsum(a["backward_weight_s"][::-1])[::-1]
    bw_i = a["backward_input_s"]
    bw_i_above = np.concatenate([np.cumsum(bw_i[::-1])[::-1][1:], [0.0]])
    return fwd + bw_w_suffix + bw_i_above + t.optimizer_s


# ----------------------------------------------------------------------------------- the field
def test_overhead_round_trips_through_save_and_load(tmp_path):
    t = dataclasses.replace(make_toy4("_t_ovh_rt"), executor_overhead_s=0.0015)
    t.save(tmp_path / "t.json")
    d = json.loads((tmp_path / "t.json").read_text())
    assert d["executor_overhead_s"] == 0.0015
    back = CostTable.load(tmp_path / "t.json")
    assert back == t and back.executor_overhead_s == 0.0015 and back.digest() == t.digest()
    # overhead 0 is not written: the JSON (and digest) of a plain-loop table are those without the field
    z = make_toy4("_t_ovh_rt0")
    z.save(tmp_path / "z.json")
    assert "executor_overhead_s" not in json.loads((tmp_path / "z.json").read_text())
    assert CostTable.load(tmp_path / "z.json").executor_overhead_s == 0.0


def test_shipped_tables_have_no_overhead_and_unchanged_times_and_digests():
    for f in table_files(TABLES_DIR):
        raw = json.loads(f.read_text())
        t = CostTable.load(f)
        assert t.executor_overhead_s == 0.0 and "executor_overhead_s" not in raw, f.name
        assert t.to_dict() == raw, f.name  # same JSON, so the digest of a table without the field
        # bit-for-bit eq. C1 without the overhead term (no "+ 0.0" rounding either)
        assert np.array_equal(t.compute_by_start(), _c1_without_overhead(t)), f.name
        assert t.iteration_time_s() == float(_c1_without_overhead(t)[0])


def test_overhead_zero_gives_eq_c1_without_the_term():
    t = make_toy4("_t_ovh_zero")
    assert t.compute_by_start().tolist() == [11.0, 9.0, 7.0, 5.0]
    assert np.array_equal(t.compute_by_start(), _c1_without_overhead(t))
    # two workers, level 3 rotating: phase k starts the workers at (k, k + 1) mod 4, so they
    # compute the plain start times; sync (toy link, 1000 B/s, 1000 B per group) is 1 s per group
    # with a contributor: 4, 3, 2 and 4 groups
    p = job_profile(t, 3, Pattern.ROTATING, 2, TOY_INTRA)
    assert p.compute_s.tolist() == [[11.0, 9.0], [9.0, 7.0], [7.0, 5.0], [5.0, 11.0]]
    assert p.comm_s.tolist() == [4.0, 3.0, 2.0, 4.0]


def test_overhead_hand_computed():
    """TOY4 (compute by start 11, 9, 7, 5 s) with 0.5 s of executor overhead per iteration:
    every start pays it, 11.5, 9.5, 7.5, 5.5 s. Two workers, level 3 rotating, phase 0 starts
    (0, 1): slowest worker 11.5 s; sync on the toy link (alpha 0, 1000 B/s, 1000 B per group):
    group 0 has one contributor (reduce+broadcast, 1 message: 1 s), groups 1-3 two (ring,
    2 x 500 B: 1 s each), 4 s in all: the dedicated iteration is 15.5 s (15 s without overhead)."""
    t = dataclasses.replace(make_toy4("_t_ovh_hand"), executor_overhead_s=0.5)
    assert t.compute_by_start().tolist() == [11.5, 9.5, 7.5, 5.5]
    assert t.plain_compute_s(0) == 11.0 and t.iteration_time_s() == 11.5
    p = job_profile(t, 3, Pattern.ROTATING, 2, TOY_INTRA)
    assert p.compute_s[0].tolist() == [11.5, 9.5]
    assert p.comm_s[0] == pytest.approx(4.0)
    assert p.dedicated_iteration_s()[0] == pytest.approx(15.5)
    assert p.eta == job_profile(make_toy4("_t_ovh_hand"), 3, Pattern.ROTATING, 2, TOY_INTRA).eta


def test_simulator_charges_the_overhead_per_iteration():
    """10 iterations of a 1-GPU level-0 job alone: 10 x (11 + 0.5) = 115 s."""
    from jigsaw_env.simulator import SimConfig, Simulator
    from jigsaw_env.state import Decision, JobDecision, JobState

    t = dataclasses.replace(make_toy4("_t_ovh_sim"), executor_overhead_s=0.5)
    register_table(t)
    try:
        sim = Simulator(toy_cluster(), [JobState(1, 0.0, 1, t.model, BS, 10)], SimConfig(round_s=1000.0))
        while not sim.done:
            sim.step(Decision({j: JobDecision((0,), 0, Pattern.ROTATING) for j in sim.state.active_ids}))
        assert sim.jobs_frame().set_index("job_id").loc[1, "finish_s"] == pytest.approx(115.0)
    finally:
        unregister_table(t.model, t.batch_size, t.device)


def test_anchoring_ignores_the_executor_overhead():
    """A GPU table derived from a CPU table never inherits the live CPU executor's overhead."""
    from jigsaw_env.table_builder import scale_table

    t = dataclasses.replace(make_toy4("_t_ovh_anchor", device="cpu"), executor_overhead_s=0.5)
    g = scale_table(t, 2.0, device="v100", fixed_memory_bytes=1, sources={}, meta={})
    assert g.executor_overhead_s == 0.0 and g.compute_s(0) == 22.0


# ----------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("value", [-0.001, "2ms", None, True, float("nan")])
def test_bad_overhead_in_a_file_is_one_line_naming_file_and_field(tmp_path, value):
    d = make_toy4("_t_ovh_bad").to_dict()
    d["executor_overhead_s"] = value
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(d))  # NaN is written as the JSON extension NaN, which json reads back
    with pytest.raises(ValueError) as e:
        CostTable.load(f)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{f}: field executor_overhead_s must be a finite number >= 0"), msg


@pytest.mark.parametrize("value", [-1.0, "x", float("inf")])
def test_bad_overhead_in_the_constructor(value):
    with pytest.raises(ValueError, match=r"cost table _t_ovh_c: field executor_overhead_s must be a finite number >= 0"):
        dataclasses.replace(make_toy4("_t_ovh_c"), executor_overhead_s=value)


def test_bad_link_file_names_the_file_and_field(tmp_path):
    f = tmp_path / LINK_FILE
    save_link(f, Link(1e-3, 7.67e9), "hand-written test link")
    assert load_link(f) == Link(1e-3, 7.67e9)
    for field, value in (("alpha_s", -1.0), ("alpha_s", "1ms"), ("bandwidth_Bps", 0)):
        d = json.loads(f.read_text())
        d[field] = value
        bad = tmp_path / f"bad-{field}.json"
        bad.write_text(json.dumps(d))
        with pytest.raises(ValueError, match=rf"^{bad}: field {field} must be a finite number"):
            load_link(bad)
    with pytest.raises(FileNotFoundError, match="link file not found"):
        load_link(tmp_path / "missing.json")


# ----------------------------------------------------------------------------------- the link
def test_link_fit_hand_computed():
    # no bytes: alpha = sum n c / sum n^2 = (8 x 8 ms + 10 x 10 ms) / (64 + 100) = 1 ms
    assert fit_executor_alpha([(8, 0, 0.008), (10, 0, 0.010)], 7.67e9) == pytest.approx(1e-3)
    # 2 messages, 1000 B at 1000 B/s: comm 3 s = 2 alpha + 1 s -> alpha = 1 s
    assert fit_executor_alpha([(2, 1000, 3.0)], 1000.0) == pytest.approx(1.0)
    assert fit_executor_alpha([(2, 0, -1.0)], 1000.0) == 1e-6  # clipped
    with pytest.raises(ValueError, match="at least one 2-slot"):
        fit_executor_alpha([], 1000.0)


def test_tables_folder_with_a_link_file_registers_only_tables(tmp_path):
    t = dataclasses.replace(make_toy4("_t_ovh_dir", device="cpu"), executor_overhead_s=0.25)
    t.save(tmp_path / "_t_ovh_dir-bs8-cpu.json")
    save_link(tmp_path / LINK_FILE, Link(1e-3, 7.67e9), "test")
    try:
        assert register_tables_dir(tmp_path) == 1
    finally:
        unregister_table(t.model, t.batch_size, t.device)


# ----------------------------------------------------------------------------------- eta and W
def test_eta_keyed_by_workers_and_tables_without_workers():
    base = make_toy4("_t_eta_w")
    spb = SPBConfig()
    slots = spb.start_slots(3, 4)
    no_w = dataclasses.replace(base, meta={"eta": {"3/rotating": 0.9}})  # a table with no W anywhere
    assert eta_measured_workers(no_w) is None
    for w in (1, 2, 4, 8):
        assert eta_for(no_w, 3, Pattern.ROTATING, spb, slots, w) == 0.9
    with_w = dataclasses.replace(base, meta={"eta": {"3/rotating": 0.9, eta_key(3, "rotating", 2): 0.6},
                                          "eta_source": {"workers": 4}})
    assert eta_key(3, "rotating", 2) == "3/rotating/w2" and eta_key(3, Pattern.STATIC) == "3/static"
    assert eta_measured_workers(with_w) == 4
    assert eta_for(with_w, 3, Pattern.ROTATING, spb, slots, 2) == 0.6   # measured at the job's W
    assert eta_for(with_w, 3, Pattern.ROTATING, spb, slots, 4) == 0.9   # the default (measured at 4)
    assert eta_for(with_w, 3, Pattern.ROTATING, spb, slots, 3) == 0.9   # no W = 3 value: the default
    assert eta_for(with_w, 0, Pattern.ROTATING, spb, slots, 2) == 1.0
    # no key at all: the eq. E1 prior (W = 1 static never skips: 1.0)
    assert eta_for(with_w, 3, Pattern.STATIC, spb, slots, 1) == 1.0


def test_bench_eta_writes_worker_keyed_values(tmp_path):
    bench_eta = pytest.importorskip("bench.eta")
    src = ROOT / "bench" / "results" / "eta" / "w2" / "eta.json"
    if not src.exists():
        pytest.skip("no bench/results/eta/w2/eta.json")
    doc = json.loads(src.read_text())
    tables = tmp_path / "tables"
    tables.mkdir()
    for f in TABLES_DIR.glob("tiny_*-bs32-cpu.json"):
        shutil.copy(f, tables / f.name)
    before = {f.name: CostTable.load(f) for f in table_files(tables)}
    written = bench_eta.write_tables(doc, tables, by_workers=True)
    assert written
    for f in written:
        t, orig = CostTable.load(f), before[f.name]
        w = doc["setup"]["world"]
        for k, v in orig.meta.get("eta", {}).items():  # the defaults are kept
            assert t.meta["eta"][k] == v
        added = {k: v for k, v in t.meta["eta"].items() if k.endswith(f"/w{w}")}
        assert added == {f"{k}/w{w}": v for k, v in bench_eta.table_eta_values(doc, t.model).items()}
        assert t.meta["eta_source"][f"w{w}"]["workers"] == w
        assert eta_measured_workers(t) == orig.meta.get("eta_source", {}).get("workers")
        for k, v in added.items():
            lvl, pat, _ = k.split("/")
            assert job_profile(t, int(lvl), pat, w, Link(1e-5, 1e9)).eta == v
        assert dataclasses.replace(t, meta={}, sources={}) == dataclasses.replace(orig, meta={}, sources={})


# ----------------------------------------------------------------------------------- the command
@pytest.mark.slow
def test_calibrate_executor_command_writes_overhead_and_link(tmp_path):
    pytest.importorskip("ray")
    from jigsaw_env.cli import main

    out = tmp_path / "cal"
    rc = main(["calibrate", "--device", "cpu", "--executor", "--model", "tiny_mlp", "--base-tables", str(TABLES_DIR),
               "--executor-repeats", "3", "--executor-iterations", "20", "--out", str(out)])
    assert rc == 0
    f = out / "tiny_mlp-bs32-cpu.json"
    t = CostTable.load(f)
    shipped = CostTable.load(TABLES_DIR / "tiny_mlp-bs32-cpu.json")
    cal = t.meta["executor_calibration"]
    assert "executor_overhead_s" in json.loads(f.read_text())
    assert t.executor_overhead_s == pytest.approx(max(0.0, cal["one_slot_iter_s"] - shipped.compute_s(0)))
    # 3 runs x 2 slots: the model once on each slot per run, the median over all six
    assert len(cal["one_slot_iter_s_runs"]) == 6 and cal["one_slot_iter_s"] == pytest.approx(
        float(np.median(cal["one_slot_iter_s_runs"])))
    # the table's level-0 iteration is the executor's either way (eq. X1)
    assert t.compute_s(0) == pytest.approx(max(cal["one_slot_iter_s"], shipped.compute_s(0)) * cal["plain_scale"])
    assert t.compute_s(0) == pytest.approx(cal["one_slot_iter_s"]) or cal["plain_scale"] == 1.0
    if cal["plain_scale"] == 1.0:
        assert t.groups == shipped.groups and t.optimizer_s == shipped.optimizer_s  # only the overhead is added
    else:  # a disturbed plain loop (slower than the executor): scaled to the executor's iteration
        assert t.executor_overhead_s == 0.0 and cal["plain_scale"] < 1.0
    assert "jigsaw calibrate --device cpu --executor" in t.sources["executor_overhead_s"]
    link = load_link(out / LINK_FILE)
    assert link.alpha_s >= 1e-6 and "2-slot" in json.loads((out / LINK_FILE).read_text())["source"]
    assert cal["comm_s"] == pytest.approx(cal["two_slot_iter_s"] - cal["one_slot_iter_s"])
    # eq. X3: one model -> the pair of two tiny_mlp jobs on one slot in lockstep
    from jigsaw_executor.lockstep import LOCKSTEP_FILE, load_lockstep

    lk = json.loads((out / LOCKSTEP_FILE).read_text())
    (pt,) = lk["points"]
    assert pt["models"] == ["tiny_mlp", "tiny_mlp"] and len(pt["pair_step_s_runs"]) == 3
    assert pt["alone_iter_s"] == [cal["one_slot_iter_s"]] * 2
    assert load_lockstep(out / LOCKSTEP_FILE) == pytest.approx(max(0.0, pt["pair_step_s"] - 2 * cal["one_slot_iter_s"]))
    assert [f.name for f in table_files(out)] == ["tiny_mlp-bs32-cpu.json"]
