"""The deploy demo's calibration cache (jigsaw_executor.demo_calibration): measured once per
machine key, reused by the next demo without measuring, measured again on --recalibrate or for
another key, never read when incomplete; and `jigsaw deploy --demo` runs with the cached tables
(registered for the scheduler, given to the replay, recorded for --resume). The measurement itself
is `jigsaw calibrate --executor`'s (tests/executor/test_executor_overhead.py); here a stand-in
writes a known table so that what the demo uses can be checked exactly. docs/deploy.md section 2."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from jigsaw_env.cost_table import TABLES_DIR, CostTable, get_table, table_filename  # noqa: E402
from jigsaw_env.network import LINK_FILE, Link, save_link  # noqa: E402
from jigsaw_executor import demo_calibration as dc  # noqa: E402

OVERHEAD_S = 0.00123  # a value no measurement here gives: the table the demo uses is the stand-in's


class StandIn:
    """A measurement that writes the shipped tiny tables with a known overhead and a known link,
    and counts its calls."""

    def __init__(self, fail: bool = False):
        self.calls: list[dict] = []
        self.fail = fail

    def __call__(self, folder: Path, key: dict, log) -> dict:
        self.calls.append(key)
        folder.mkdir()
        for m in key["models"]:
            t = CostTable.load(TABLES_DIR / table_filename(m, 32, "cpu"))
            t = dataclasses.replace(t, executor_overhead_s=OVERHEAD_S)
            t.save(folder / table_filename(m, 32, "cpu"))
            if self.fail:
                raise KeyboardInterrupt  # interrupted half-way
        save_link(folder / LINK_FILE, Link(alpha_s=0.0011, bandwidth_Bps=7.67e9), "stand-in")
        return {"models": list(key["models"])}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(dc.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache" / "demo-calibration"


def test_measured_once_then_reused(cache):
    m = StandIn()
    folder, measured = dc.demo_calibration(2, measure=m, log=lambda s: None)
    assert measured and len(m.calls) == 1 and folder.parent.parent == cache and folder.name == dc.TABLES
    again, measured_again = dc.demo_calibration(2, measure=m, log=lambda s: None)
    assert again == folder and not measured_again and len(m.calls) == 1  # the cache, no measurement
    key = json.loads((folder.parent / dc.KEY_FILE).read_text())
    assert key == dc.machine_key(2, False) and folder.parent.name == dc.key_digest(key)
    assert json.loads((folder.parent / dc.SUMMARY_FILE).read_text()) == {"models": list(dc.DEMO_MODELS)}
    assert key["slots"] == 2 and set(key["models"]) == set(dc.DEMO_MODELS)
    assert CostTable.load(folder / table_filename("tiny_cnn", 32, "cpu")).executor_overhead_s == OVERHEAD_S


def test_recalibrate_and_another_key_measure_again(cache):
    m = StandIn()
    folder, _ = dc.demo_calibration(2, measure=m, log=lambda s: None)
    again, measured = dc.demo_calibration(2, recalibrate=True, measure=m, log=lambda s: None)
    assert measured and again == folder and len(m.calls) == 2
    one_slot, measured = dc.demo_calibration(1, measure=m, log=lambda s: None)
    assert measured and one_slot != folder and m.calls[-1]["slots"] == 1
    locked, measured = dc.demo_calibration(2, lockstep=True, measure=m, log=lambda s: None)
    assert measured and locked not in (folder, one_slot) and m.calls[-1]["lockstep"] is True
    assert len(m.calls) == 4 and len(list(cache.iterdir())) == 3  # no temporary folder left


def test_an_interrupted_or_foreign_folder_is_not_read(cache):
    with pytest.raises(KeyboardInterrupt):
        dc.demo_calibration(2, measure=StandIn(fail=True), log=lambda s: None)
    assert list(cache.iterdir()) == []  # nothing half-written stays
    key = dc.machine_key(2, False)
    folder = cache / dc.key_digest(key)
    folder.mkdir(parents=True)
    (folder / dc.KEY_FILE).write_text(json.dumps({**key, "cpu": "another machine"}))
    assert dc.cached_calibration(key) is None
    (folder / dc.KEY_FILE).write_text("{not json")
    assert dc.cached_calibration(key) is None
    m = StandIn()
    got, measured = dc.demo_calibration(2, measure=m, log=lambda s: None)
    assert measured and got == folder / dc.TABLES and dc.cached_calibration(key) == got


def test_the_key_names_this_machine_and_the_models():
    key = dc.machine_key(8, False)
    assert key["slots"] == 2  # the calibration runs on at most 2 slots whatever the demo's count
    assert key["cpu"] and key["physical_cores"] >= 1 and key["torch"]
    assert dc.key_digest(key) == dc.key_digest(json.loads(json.dumps(key)))  # stable through JSON
    assert dc.machine_key(1, False)["slots"] == 1


def test_deploy_demo_runs_with_the_cached_tables(cache, monkeypatch, tmp_path):
    """The CLI: the second demo finds the cache, registers its tables and link, hands the folder to
    deploy() (replay and --resume); --no-calibrate keeps the shipped tables."""
    import jigsaw_executor.deploy as dep
    from jigsaw_env.cli import main

    m = StandIn()
    monkeypatch.setattr(dc, "_measure", m)
    seen: list[dict] = []

    def fake_deploy(policy, jobs, **kw):
        seen.append({**kw, "overhead": get_table("tiny_mlp", 32, "cpu").executor_overhead_s})
        return {"jobs": {}, "failed_jobs": []}, None

    monkeypatch.setattr(dep, "deploy", fake_deploy)
    monkeypatch.setattr(dep, "print_summary", lambda *a, **k: None)
    argv = ["deploy", "--policy", "jigsaw", "--demo", "--slots", "2", "--allow-oversubscribe", "--no-replay"]
    try:
        assert main(argv + ["--out", str(tmp_path / "a")]) == 0
        assert main(argv + ["--out", str(tmp_path / "b")]) == 0
        assert len(m.calls) == 1  # measured by the first demo only
        folder = dc.cached_calibration(dc.machine_key(2, False))
        assert [Path(s["tables"]) for s in seen] == [folder, folder]
        assert [s["overhead"] for s in seen] == [OVERHEAD_S, OVERHEAD_S]
        assert seen[-1]["link_alpha_us"] == pytest.approx(1100.0)
        from jigsaw_env.cost_table import unregister_table

        for mod in dc.DEMO_MODELS:
            unregister_table(mod, 32, "cpu")
        assert main(argv + ["--no-calibrate", "--out", str(tmp_path / "c")]) == 0
        assert seen[-1]["tables"] is None and seen[-1]["overhead"] == 0.0 and len(m.calls) == 1
    finally:
        from jigsaw_env.cost_table import unregister_table

        for mod in dc.DEMO_MODELS:
            unregister_table(mod, 32, "cpu")


@pytest.mark.parametrize("extra, message", [
    (["--recalibrate", "--no-calibrate"], "not both"),
    (["--recalibrate", "--tables", "."], "--tables DIR replaces the demo's calibration"),
])
def test_bad_calibration_flags_are_one_line(extra, message, capsys):
    from jigsaw_env.cli import main

    assert main(["deploy", "--policy", "jigsaw", "--demo", "--slots", "2"] + extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_calibration_flags_without_the_demo_are_refused(capsys, tmp_path):
    from jigsaw_env.cli import main

    jobs = tmp_path / "jobs.csv"
    jobs.write_text("job_id,model,num_gpus,iterations\n0,tiny_mlp,1,10\n")
    assert main(["deploy", "--policy", "jigsaw", "--jobs", str(jobs), "--recalibrate"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "apply to --demo only" in err[0], err


def test_resume_with_the_recorded_tables_folder_gone_is_one_line(tmp_path, capsys):
    from jigsaw_env.cli import main
    from jigsaw_executor.deploy import RUN_TABLES_FILE

    (tmp_path / RUN_TABLES_FILE).write_text(json.dumps({"tables": str(tmp_path / "gone")}))
    assert main(["deploy", "--resume", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tables folder" in err[0] and "gone is gone; give --tables DIR" in err[0], err
    (tmp_path / RUN_TABLES_FILE).write_text("[1]")
    assert main(["deploy", "--resume", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 'tables.json: expected {"tables": FOLDER}' in err[0], err
