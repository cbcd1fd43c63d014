"""bench.eta (measured statistical efficiency of SPB) and how the simulator reads a measured eta.

* ``python -m bench.eta --quick`` (2 gloo workers, 1 seed, a few iterations of tiny_cnn): the output
  structure, and ``--write-tables`` on a temporary copy of the shipped tables changes exactly
  ``meta["eta"]`` / ``meta["eta_source"]`` of the measured model's tables and nothing else;
* the simulator uses a table's ``meta["eta"]["<level>/<pattern>"]`` instead of the eq. E1 prior;
* the shipped tables carry what ``bench/results/eta/eta.json`` (default keys) and ``w1/``, ``w2/eta.json``
  (``/w1``, ``/w2`` keys) say (measured models only).
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path

import pytest

from conftest import BS, make_toy4, toy_cluster
from jigsaw_env.cost_table import CostTable, register_table, unregister_table
from jigsaw_env.network import INTRA_NODE
from jigsaw_env.simulator import SimConfig, Simulator
from jigsaw_env.spb import Pattern, SPBConfig, job_profile
from jigsaw_env.state import Decision, JobDecision, JobState

bench_eta = pytest.importorskip("bench.eta")

ROOT = Path(__file__).resolve().parents[2]
TABLES = ROOT / "jigsaw_env" / "tables"
RESULTS = ROOT / "bench" / "results" / "eta" / "eta.json"
ETA_KEYS = ("eta", "eta_source")


def _strip(d: dict) -> dict:
    d = json.loads(json.dumps(d))
    for k in ETA_KEYS:
        d.get("meta", {}).pop(k, None)
    return d


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    pytest.importorskip("sklearn")
    root = tmp_path_factory.mktemp("eta")
    tables = root / "tables"
    shutil.copytree(TABLES, tables)
    before = {p.name: p.read_text() for p in sorted(tables.glob("*.json"))}
    t0 = time.perf_counter()
    rc = bench_eta.main(["--quick", "--out", str(root / "out"), "--write-tables", "--tables-dir", str(tables),
                         "--no-progress"])
    wall = time.perf_counter() - t0
    doc = json.loads((root / "out" / "eta.json").read_text())
    return {"rc": rc, "wall": wall, "doc": doc, "root": root, "tables": tables, "before": before}


@pytest.mark.slow
def test_quick_run_output_structure(quick):
    assert quick["rc"] == 0
    doc = quick["doc"]
    for k in ("command", "date_utc", "wall_s", "setup", "summary", "runs"):
        assert k in doc
    s = doc["setup"]
    assert (s["world"], s["seeds"], s["models"], s["configs"]) == (2, [0], ["tiny_cnn"], ["2/rotating"])
    assert s["lr"] == {"tiny_cnn": bench_eta.DEFAULT_LR["tiny_cnn"]}
    assert [(r["config"], r["seed"]) for r in doc["runs"]] == [("0/rotating", 0), ("2/rotating", 0)]
    for r in doc["runs"]:
        assert 1 <= r["iterations"] <= s["max_iterations"]
        assert r["curve"] and all(0.0 <= acc <= 1.0 for _, acc, _ in r["curve"])
        assert r["curve"][-1][0] == r["iterations"]
        assert r["reached"] == (r["curve"][-1][1] >= s["target"])
    m = doc["summary"]["tiny_cnn"]
    assert m["num_groups"] == 4 and m["full_backprop"]["iterations"] == [doc["runs"][0]["iterations"]]
    c = m["configs"]["2/rotating"]
    assert (c["level"], c["pattern"], c["slots"]) == (2, "rotating", [0, 1, 2])
    # eq. E1 prior at W = 2: starts (0,1), (1,2), (2,0): mean 1 of B = 4 -> 1 - 0.5 / 4
    assert c["prior_eta"] == pytest.approx(0.875)
    (e,) = c["per_seed"]
    full_run, spb_run = doc["runs"]
    assert (e["iterations_full"], e["iterations_spb"]) == (full_run["iterations"], spb_run["iterations"])
    assert (e["full_reached"], e["spb_reached"]) == (full_run["reached"], spb_run["reached"])
    # eta = full / SPB iterations to the target; a run that hits the cap bounds it from one side
    cap = s["max_iterations"]
    want = {(True, True): ("exact", e["iterations_full"] / e["iterations_spb"]),
            (True, False): ("upper_bound", e["iterations_full"] / cap),
            (False, True): ("lower_bound", cap / e["iterations_spb"]),
            (False, False): ("undefined", None)}[(e["full_reached"], e["spb_reached"])]
    assert e["kind"] == want[0]
    if want[1] is None:
        assert e["eta"] is None and c["mean"] is None and c["n"] == 0
    else:
        assert e["eta"] == pytest.approx(want[1])
        usable = e["kind"] in ("exact", "upper_bound")
        assert c["n"] == int(usable) and (c["mean"] == pytest.approx(e["eta"]) if usable else c["mean"] is None)
    assert c["censored_seeds"] == ([] if e["kind"] == "exact" else [0])
    assert c["ci95_t"] is None  # one seed: no interval
    md = (quick["root"] / "out" / "eta.md").read_text()
    assert "| tiny_cnn |" in md and "2/rotating" in md


def test_write_tables_changes_only_the_measured_models_eta(quick):
    doc = quick["doc"]
    expected = bench_eta.table_eta_values(doc, "tiny_cnn")
    changed = []
    for name, old_text in quick["before"].items():
        new_text = (quick["tables"] / name).read_text()
        old, new = json.loads(old_text), json.loads(new_text)
        if old["model"] != "tiny_cnn":
            assert new_text == old_text, f"{name}: a table of another model changed"
            continue
        changed.append(name)
        assert _strip(new) == _strip(old), f"{name}: more than meta['eta'] / meta['eta_source'] changed"
        assert new["meta"]["eta"] == expected
        src = new["meta"]["eta_source"]
        assert src["seeds"] == [0] and src["workers"] == 2 and "bench.eta" in src["command"]
        assert "accuracy" in src["target"]
        # the simulator's reader picks the written value up
        t = CostTable.load(quick["tables"] / name)
        for key, val in expected.items():
            lvl, pat = key.split("/")
            assert job_profile(t, int(lvl), pat, 4, INTRA_NODE).eta == pytest.approx(val)
    assert sorted(changed) == sorted(f"tiny_cnn-bs32-{d}.json" for d in ("cpu", "k80", "p100", "v100"))


def test_write_tables_from_json_is_idempotent(quick, tmp_path):
    tables = tmp_path / "t"
    shutil.copytree(quick["tables"], tables)
    before = {p.name: p.read_text() for p in tables.glob("*.json")}
    assert bench_eta.main(["--from-json", str(quick["root"] / "out" / "eta.json"), "--write-tables",
                           "--tables-dir", str(tables)]) == 0
    assert {p.name: p.read_text() for p in tables.glob("*.json")} == before


def test_bad_config_is_rejected():
    with pytest.raises(ValueError, match="level"):
        bench_eta.parse_config("7/rotating")
    with pytest.raises(ValueError, match="baseline"):
        bench_eta.parse_config("0/static")
    with pytest.raises(ValueError, match="pattern"):
        bench_eta.parse_config("2/diagonal")


def test_simulator_uses_measured_eta_from_table_meta():
    """TOY4 (compute by start 11, 9, 7, 5 s), one worker at level 3 rotating, 6.5 iterations to go.
    Prior (eq. E1): eta = 1 - 0.5 * 1.5 / 4 = 0.8125 -> 8 raw iterations. With meta['eta']['3/rotating']
    = 0.5 the job needs 13 raw iterations: 3 cycles (96 s) + 11 s = 107 s."""
    def finish(table: CostTable):
        register_table(table)
        try:
            job = JobState(1, 0.0, 1, table.model, BS, 6.5)
            sim = Simulator(toy_cluster(), [job], SimConfig(round_s=1000.0))
            while not sim.done:
                sim.step(Decision({j: JobDecision((0,), 3, Pattern.ROTATING) for j in sim.state.active_ids}))
            return sim.jobs_frame().set_index("job_id").loc[1]
        finally:
            unregister_table(table.model, table.batch_size, table.device)

    prior = finish(make_toy4("_t_eta_prior"))
    assert prior["raw_iterations"] == 8
    measured = dataclasses.replace(make_toy4("_t_eta_measured"), meta={"eta": {"3/rotating": 0.5, "2/static": 0.9}})
    assert job_profile(measured, 3, "rotating", 1, INTRA_NODE).eta == 0.5
    assert job_profile(measured, 3, "static", 1, INTRA_NODE).eta == 1.0  # no key: prior (W = 1 static = full)
    assert job_profile(measured, 0, "rotating", 1, INTRA_NODE).eta == 1.0  # level 0 is always 1
    row = finish(measured)
    assert row["raw_iterations"] == 13 and row["finish_s"] == pytest.approx(107.0)


@pytest.mark.skipif(not RESULTS.exists(), reason="no bench/results/eta/eta.json")
def test_shipped_tables_carry_the_measured_eta():
    """Default keys: the W = 4 measurement (eta.json); ``/w1`` and ``/w2`` keys: the W = 1 and W = 2
    measurements (w1/eta.json, w2/eta.json), each read by eq. E1 for jobs of exactly that size."""
    doc = json.loads(RESULTS.read_text())
    by_w = {w: json.loads((RESULTS.parent / f"w{w}" / "eta.json").read_text()) for w in (1, 2)}
    measured = set(doc["summary"])
    seen = set()
    for path in sorted(TABLES.glob("*.json")):
        t = CostTable.load(path)
        if t.model in measured:
            seen.add(t.model)
            want = dict(bench_eta.table_eta_values(doc, t.model))
            for w, d in by_w.items():
                want.update({f"{k}/w{w}": v for k, v in bench_eta.table_eta_values(d, t.model).items()})
            assert t.meta.get("eta") == want, path.name
            assert t.meta["eta_source"]["seeds"] == doc["setup"]["seeds"]
            assert [t.meta["eta_source"][f"w{w}"]["workers"] for w in (1, 2)] == [1, 2]
            for key, val in t.meta["eta"].items():
                lvl, pat, *w = key.split("/")
                assert 0 < val <= 1
                world = int(w[0][1:]) if w else doc["setup"]["world"]
                assert job_profile(t, int(lvl), pat, world, INTRA_NODE, SPBConfig()).eta == val
        else:
            assert "eta" not in t.meta and "eta_source" not in t.meta, f"{path.name}: eta written for an unmeasured model"
    assert seen == measured


def test_eta_by_worker_count_in_the_shipped_tables():
    """Known values (bench/results/eta/{w1,w2,}/eta.md, means capped at 1): tiny_mlp at level 2
    rotating measured 0.333 at W = 1 (every seed hit the cap: an upper bound), 0.634 at W = 2 and
    0.882 at W = 4; W = 3 has no measurement and takes the default (W = 4) value; W = 1 static is
    full backprop, eta exactly 1."""
    from jigsaw_env.cost_table import get_table

    t = get_table("tiny_mlp", 32, "v100")
    eta = {w: job_profile(t, 2, "rotating", w, INTRA_NODE).eta for w in (1, 2, 3, 4)}
    assert eta == {1: 0.3333, 2: 0.6337, 3: 0.8817, 4: 0.8817}
    assert job_profile(t, 3, "static", 1, INTRA_NODE).eta == 1.0
    assert job_profile(get_table("tiny_cnn", 32, "cpu"), 3, "rotating", 1, INTRA_NODE).eta == 0.6739
