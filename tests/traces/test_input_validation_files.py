"""Bad input files get one clear line naming the file, the line or field, and what was expected;
valid files load exactly as before.

Covers: cost tables under ``--tables`` (jigsaw_env/cost_table.py), job ids and other integer
columns of trace files read exactly (traces/_io.py, traces/canonical.py, traces/_loader.py,
traces/schema.py), trace file I/O (duplicate header columns, corrupt .gz, a UTF-8 byte-order
mark), ``jigsaw deploy --jobs`` and ``--resume`` (jigsaw_executor/deploy.py, live.py) and
``jigsaw export``'s ``--opset`` and path checks (jigsaw_executor/export.py).
"""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from jigsaw_env.cli import main
from jigsaw_env.cost_table import (TABLES_DIR, CostTable, LayerGroup, available_tables, get_table,
                                   register_tables_dir)
from traces import load_trace
from traces.schema import TraceFormatError, validate_jobs

try:
    from data_helpers import require_data
except ImportError:  # pragma: no cover - when tests/ is a package
    from tests.data_helpers import require_data

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "traces"
SHIPPED = TABLES_DIR / "tiny_mlp-bs32-v100.json"
SKIP_HINT = " [--skip-bad-rows skips such rows]"


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse usage errors
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(argv: list[str], capsys) -> str:
    """Run the CLI; require exit status 2 and one line on stderr with no traceback; return the message."""
    rc, _, err = run_cli(argv, capsys)
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    command = argv[0]
    prefix = f"jigsaw {command}: error: "
    assert lines[0].startswith(prefix), lines[0]
    return lines[0][len(prefix):]


# ================================================================================================ cost tables
def _edited(mut=None, raw: str | None = None) -> str:
    if raw is not None:
        return raw
    d = json.loads(SHIPPED.read_text())
    mut(d)
    return json.dumps(d)


def _all_zero(d):
    d["optimizer_s"] = 0.0
    for g in d["groups"]:
        g.update(forward_s=0.0, backward_weight_s=0.0, backward_input_s=0.0)


# name -> (file text, the message after "FILE: ")
BAD_TABLES = {
    "forward_text": (lambda d: d["groups"][2].update(forward_s="abc"),
                     "groups[2].forward_s must be a finite number >= 0, got 'abc'"),
    "groups_int": (lambda d: d.update(groups=5),
                   "field groups must be a non-empty list of layer groups (objects with fields ['name', 'param_bytes', "
                   "'activation_bytes', 'forward_s', 'backward_weight_s', 'backward_input_s']), got 5"),
    "groups_empty": (lambda d: d.update(groups=[]),
                     "field groups must be a non-empty list of layer groups (objects with fields ['name', "
                     "'param_bytes', 'activation_bytes', 'forward_s', 'backward_weight_s', 'backward_input_s']), "
                     "got []"),
    "file_int": ("5", "expected a JSON object (a cost table), got int"),
    "file_list": ("[1, 2]", "expected a JSON object (a cost table), got list"),
    "meta_list": (lambda d: d.update(meta=[1, 2]), "field meta must be a JSON object, got list"),
    "sources_text": (lambda d: d.update(sources="measured"), "field sources must be a JSON object, got str"),
    "batch_text": (lambda d: d.update(batch_size="abc"), "field batch_size must be an integer >= 1, got 'abc'"),
    "batch_fraction": (lambda d: d.update(batch_size=1.5), "field batch_size must be an integer >= 1, got 1.5"),
    "batch_zero": (lambda d: d.update(batch_size=0), "field batch_size must be an integer >= 1, got 0"),
    "batch_bool": (lambda d: d.update(batch_size=True), "field batch_size must be an integer >= 1, got True"),
    "optimizer_text": (lambda d: d.update(optimizer_s="abc"),
                       "field optimizer_s must be a finite number >= 0, got 'abc'"),
    "optimizer_negative": (lambda d: d.update(optimizer_s=-1),
                           "field optimizer_s must be a finite number >= 0, got -1"),
    "optimizer_nan": ('{"model": "tiny_mlp", "batch_size": 32, "device": "v100", "groups": [], "optimizer_s": NaN, '
                      '"fixed_memory_bytes": 0}', "field optimizer_s must be a finite number >= 0, got nan"),
    "memory_negative": (lambda d: d.update(fixed_memory_bytes=-10 ** 12),
                        "field fixed_memory_bytes must be an integer >= 0, got -1000000000000"),
    "memory_huge_int": (lambda d: d.update(fixed_memory_bytes=10 ** 400),
                        "field fixed_memory_bytes must be an integer >= 0, got 1" + "0" * 76 + "..."),
    "model_number": (lambda d: d.update(model=7), "field model must be a non-empty string, got 7"),
    "device_empty": (lambda d: d.update(device=""), "field device must be a non-empty string, got ''"),
    "device_path": (lambda d: d.update(device="../v100"),
                    "field device must be a name of letters, digits, '_', '.' and '-', not starting with '.' or '-' "
                    "(it names the table's file, "
                    "<model>-bs<N>-<device>.json), got '../v100'"),
    "model_space": (lambda d: d.update(model="tiny mlp"),
                    "field model must be a name of letters, digits, '_', '.' and '-', not starting with '.' or '-' "
                    "(it names the table's file, "
                    "<model>-bs<N>-<device>.json), got 'tiny mlp'"),
    "eta_list": (lambda d: d["meta"].update(eta=[0.9]),
                 'field meta.eta must be a JSON object of "<level>/<pattern>" keys to numbers in (0, 1], got list'),
    "eta_bad_key": (lambda d: d["meta"]["eta"].update({"2/diagonal": 0.9}),
                    "field meta.eta has key '2/diagonal'; expected \"<level>/<pattern>\" or "
                    "\"<level>/<pattern>/w<workers>\" with level >= 1 and pattern rotating or static (e.g. "
                    "\"2/rotating\")"),
    "eta_level_zero": (lambda d: d["meta"]["eta"].update({"0/static": 1.0}),
                       "field meta.eta has key '0/static'; expected \"<level>/<pattern>\" or "
                       "\"<level>/<pattern>/w<workers>\" with level >= 1 and pattern rotating or static (e.g. "
                       "\"2/rotating\")"),
    "eta_above_one": (lambda d: d["meta"]["eta"].update({"1/static": 1.2}),
                      "field meta.eta['1/static'] must be a number in (0, 1] (statistical efficiency relative to "
                      "full backprop), got 1.2"),
    "eta_zero": (lambda d: d["meta"]["eta"].update({"3/rotating/w8": 0}),
                 "field meta.eta['3/rotating/w8'] must be a number in (0, 1] (statistical efficiency relative to "
                 "full backprop), got 0"),
    "eta_text": (lambda d: d["meta"]["eta"].update({"2/rotating": "0.9"}),
                 "field meta.eta['2/rotating'] must be a number in (0, 1] (statistical efficiency relative to "
                 "full backprop), got '0.9'"),
    "eta_workers_zero": (lambda d: d["meta"]["eta_source"].update(workers=0),
                         "field meta.eta_source.workers must be an integer >= 1, got 0"),
    "overhead_negative": (lambda d: d.update(executor_overhead_s=-0.5),
                          "field executor_overhead_s must be a finite number >= 0 (seconds per iteration), got -0.5"),
    "group_not_object": (lambda d: d["groups"].__setitem__(1, [1, 2]),
                         "groups[1] must be a JSON object with fields ['name', 'param_bytes', 'activation_bytes', "
                         "'forward_s', 'backward_weight_s', 'backward_input_s'], got list"),
    "group_missing_field": (lambda d: d["groups"][3].pop("backward_input_s"),
                            "groups[3] is missing field(s) ['backward_input_s']; expected fields ['name', "
                            "'param_bytes', 'activation_bytes', 'forward_s', 'backward_weight_s', "
                            "'backward_input_s']"),
    "group_unknown_field": (lambda d: d["groups"][0].update(flops=3),
                            "groups[0] has unknown field(s) ['flops']; expected fields ['name', 'param_bytes', "
                            "'activation_bytes', 'forward_s', 'backward_weight_s', 'backward_input_s']"),
    "group_name_number": (lambda d: d["groups"][0].update(name=3), "groups[0].name must be a string, got 3"),
    "group_bytes_fraction": (lambda d: d["groups"][4].update(param_bytes=10.5),
                             "groups[4].param_bytes must be an integer >= 0, got 10.5"),
    "group_bytes_negative": (lambda d: d["groups"][0].update(activation_bytes=-1),
                             "groups[0].activation_bytes must be an integer >= 0, got -1"),
    "group_time_bool": (lambda d: d["groups"][0].update(backward_weight_s=False),
                        "groups[0].backward_weight_s must be a finite number >= 0, got False"),
    "group_time_negative": (lambda d: d["groups"][1].update(backward_input_s=-1e-6),
                            "groups[1].backward_input_s must be a finite number >= 0, got -1e-06"),
    "all_times_zero": (_all_zero,
                       "a full-backprop iteration takes 0 seconds (forward_s and backward_weight_s of every group, "
                       "backward_input_s of groups >= 1, optimizer_s and executor_overhead_s are all 0); expected "
                       "times whose sum is > 0"),
}


@pytest.fixture
def no_registered_tables():
    """Leave the registry of tables as the test found it."""
    from jigsaw_env import cost_table

    before = dict(cost_table._REGISTERED)
    yield
    cost_table._REGISTERED.clear()
    cost_table._REGISTERED.update(before)
    get_table.cache_clear()


@pytest.mark.parametrize("name", sorted(BAD_TABLES))
def test_bad_cost_table_names_file_field_and_expectation(name, tmp_path, no_registered_tables):
    edit, message = BAD_TABLES[name]
    f = tmp_path / "tables" / SHIPPED.name
    f.parent.mkdir()
    f.write_text(_edited(raw=edit) if isinstance(edit, str) else _edited(edit))
    with pytest.raises(ValueError) as e:
        register_tables_dir(f.parent)
    assert str(e.value) == f"{f}: {message}"


def test_valid_eta_forms_load_and_are_read(tmp_path, no_registered_tables):
    """The meta.eta checks refuse only what eta_for cannot use: a per-worker-count key, eta = 1
    and a dotted device name load, and the simulator's lookup reads the per-W value."""
    from jigsaw_env.spb import Pattern, SPBConfig, eta_for

    d = json.loads(SHIPPED.read_text())
    d["meta"]["eta"].update({"2/rotating/w8": 0.5, "1/static": 1})
    d["device"] = "v100.sxm2"
    f = tmp_path / "t.json"
    f.write_text(json.dumps(d))
    t = CostTable.load(f)
    assert t.device == "v100.sxm2"
    spb = SPBConfig()
    slots = spb.start_slots(2, t.num_groups)
    assert eta_for(t, 2, Pattern.ROTATING, spb, slots, 8) == 0.5
    assert eta_for(t, 2, Pattern.ROTATING, spb, slots, 4) == d["meta"]["eta"]["2/rotating"]
    assert eta_for(t, 1, Pattern.STATIC, spb, spb.start_slots(1, t.num_groups), 4) == 1.0


@pytest.mark.parametrize("name", ["forward_text", "optimizer_negative", "all_times_zero", "file_int"])
def test_bad_cost_table_on_the_command_line(name, tmp_path, capsys, no_registered_tables):
    edit, message = BAD_TABLES[name]
    d = tmp_path / "tables"
    d.mkdir()
    (d / SHIPPED.name).write_text(_edited(raw=edit) if isinstance(edit, str) else _edited(edit))
    got = one_line_error(["simulate", "--tables", str(d), "--trace", "synthetic:jobs=4,models=tiny_mlp", "--gpus", "8"],
                         capsys)
    assert got == f"{d / SHIPPED.name}: {message}"


def test_tables_path_that_is_a_file(tmp_path, capsys):
    f = tmp_path / "tables.json"
    f.write_text(SHIPPED.read_text())
    got = one_line_error(["simulate", "--tables", str(f), "--max-jobs", "3"], capsys)
    assert got == f"cost-table folder is a file, not a folder: {f} (expected a folder of *.json cost tables)"
    with pytest.raises(NotADirectoryError):
        register_tables_dir(f)
    missing = tmp_path / "missing"
    with pytest.raises(FileNotFoundError, match=f"^cost-table folder not found: {missing}$"):
        register_tables_dir(missing)


def test_table_file_that_is_a_folder_or_not_text(tmp_path, no_registered_tables):
    d = tmp_path / "tables"
    (d / "sub.json").mkdir(parents=True)
    with pytest.raises(IsADirectoryError) as e:
        register_tables_dir(d)
    assert str(e.value) == f"cost table file is a folder, expected a JSON file: {d / 'sub.json'}"
    (d / "sub.json").rmdir()
    (d / "bin.json").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ValueError) as e:
        register_tables_dir(d)
    assert str(e.value) == f"{d / 'bin.json'}: not valid JSON (not UTF-8 text: invalid start byte at byte 0)"


def test_a_bad_table_registers_nothing(tmp_path, no_registered_tables):
    """Tables are all loaded before any is registered: a folder with one bad file changes nothing."""
    d = tmp_path / "tables"
    d.mkdir()
    good = json.loads(SHIPPED.read_text())
    good["model"] = "_t_valid_other"
    (d / "a_good.json").write_text(json.dumps(good))
    (d / "b_bad.json").write_text(_edited(lambda t: t.update(optimizer_s=-1)))
    before = available_tables()
    with pytest.raises(ValueError, match="b_bad.json: field optimizer_s"):
        register_tables_dir(d)
    assert available_tables() == before
    (d / "b_bad.json").unlink()
    assert register_tables_dir(d) == 1
    assert ("_t_valid_other", 32, "v100") in available_tables()


def test_shipped_tables_load_unchanged(tmp_path, no_registered_tables):
    """Every shipped table: its JSON is exactly what the loaded table writes back (so the digest
    is the one of the file), and registering a copy of the folder gives the same digests."""
    files = sorted(TABLES_DIR.glob("*.json"))
    assert len(files) == 110  # 40 reference tables + 57 GPU and 13 cpu tables at Gavel's other batch sizes
    for f in files:
        raw = json.loads(f.read_text())
        t = CostTable.load(f)
        assert t.to_dict() == raw, f
        for a, b in zip(t.to_dict()["groups"], raw["groups"]):
            assert [type(v) for v in a.values()] == [type(v) for v in b.values()], f
    shutil.copytree(TABLES_DIR, tmp_path / "copy")
    digests = {f.name: CostTable.load(f).digest() for f in files}
    assert register_tables_dir(tmp_path / "copy") == 110
    for f in files:
        model, rest = f.stem.rsplit("-bs", 1)
        bs, device = rest.split("-", 1)
        assert get_table(model, int(bs), device).digest() == digests[f.name]


def test_hand_built_tables_still_allowed_and_bad_ones_refused():
    """The Python constructor: a bytes-only table (all times 0) is still allowed (the executor
    builds such tables); a text or negative value is a ValueError naming the field, not a TypeError."""
    t = CostTable("x", 1, "cpu", tuple(LayerGroup(f"g{i}", 10, 0, 0, 0, 0) for i in range(3)), 0.0, 0)
    assert t.compute_s(0) == 0.0
    with pytest.raises(ValueError, match=r"^cost table x: group 'g' field forward_s must be a finite number >= 0, "
                                         r"got 'abc'$"):
        CostTable("x", 1, "cpu", (LayerGroup("g", 1, 1, "abc", 0, 0),), 0.0, 0)
    with pytest.raises(ValueError, match=r"^cost table x: field optimizer_s must be a finite number >= 0, got -1$"):
        CostTable("x", 1, "cpu", (LayerGroup("g", 1, 1, 1.0, 0, 0),), -1, 0)
    with pytest.raises(ValueError, match=r"^cost table x: field fixed_memory_bytes must be a finite number >= 0"):
        CostTable("x", 1, "cpu", (LayerGroup("g", 1, 1, 1.0, 0, 0),), 0.0, -5)
    with pytest.raises(ValueError, match=r"^cost table x: batch_size must be an integer > 0, got 'abc'$"):
        CostTable("x", "abc", "cpu", (LayerGroup("g", 1, 1, 1.0, 0, 0),), 0.0, 0)
    with pytest.raises(ValueError, match=r"^<dict>: expected a JSON object \(a cost table\), got list$"):
        CostTable.from_dict([1, 2])


# ================================================================================================ trace files
def _csv(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


HEAD = "job_id,arrival_s,num_gpus,duration_s\n"


def test_large_job_ids_are_kept_exactly(tmp_path, capsys):
    p = _csv(tmp_path, "big.csv", HEAD + "9007199254740993,0,1,100\n9007199254740992,5,1,100\n"
             "9223372036854775807,6,1,100\n-9223372036854775808,7,1,100\n")
    tr = load_trace(f"csv:{p}", map_models=False)
    assert tr.jobs["job_id"].tolist() == [9007199254740993, 9007199254740992, 9223372036854775807,
                                          -9223372036854775808]
    assert tr.jobs["job_id"].dtype == np.int64
    out = tmp_path / "out.csv"
    rc, _, err = run_cli(["traces", "convert", f"csv:{p}", str(out)], capsys)
    assert rc == 0, err
    assert [line.split(",")[0] for line in out.read_text().splitlines()[1:]] == [
        "9007199254740993", "9007199254740992", "9223372036854775807", "-9223372036854775808"]
    # and back: the converted file reads to the same ids
    assert load_trace(f"csv:{out}", map_models=False).jobs["job_id"].tolist() == tr.jobs["job_id"].tolist()


@pytest.mark.parametrize("value, line_text, reason", [
    ("99999999999999999999", "99999999999999999999,0,1,100", "integer out of range"),
    ("9223372036854775808", "9223372036854775808,0,1,100", "integer out of range"),
    ("-9223372036854775809", "-9223372036854775809,0,1,100", "integer out of range"),
    ("1e30", "1e30,0,1,100", "integer out of range"),
    ("9007199254740993.5", "9007199254740993.5,0,1,100", "non-integer job_id"),
    ("5.0000000000000001", "5.0000000000000001,0,1,100", "non-integer job_id"),
])
def test_bad_job_id_names_line_and_value(value, line_text, reason, tmp_path, capsys):
    p = _csv(tmp_path, "jobs.csv", HEAD + "1,0,1,100\n" + line_text + "\n")
    want = f"{p}: line 3: field 'job_id': {reason} (got '{value}')" + SKIP_HINT
    with pytest.raises(TraceFormatError) as e:
        load_trace(f"csv:{p}", map_models=False)
    assert str(e.value) == want
    assert one_line_error(["traces", "convert", f"csv:{p}", str(tmp_path / "o.csv")], capsys) == want
    assert not (tmp_path / "o.csv").exists()
    # skipped and counted under --skip-bad-rows: the other job is kept
    tr = load_trace(f"csv:{p}", map_models=False, skip_bad_rows=True)
    assert tr.jobs["job_id"].tolist() == [1]
    assert tr.summary["bad_rows_skipped"] == {reason: 1}


def test_distinct_large_ids_are_no_duplicates_but_equal_values_are(tmp_path):
    p = _csv(tmp_path, "dup.csv", HEAD + "1,0,1,100\n\n1.0,5,1,100\n")
    with pytest.raises(TraceFormatError) as e:
        load_trace(f"csv:{p}", map_models=False)
    assert str(e.value) == f"{p}: line 4: field 'job_id': duplicate job_id (got '1.0')" + SKIP_HINT
    p = _csv(tmp_path, "dup2.csv", HEAD + "9007199254740993,0,1,100\n9007199254740993,5,1,100\n")
    with pytest.raises(TraceFormatError, match="line 3: field 'job_id': duplicate job_id"):
        load_trace(f"csv:{p}", map_models=False)


def test_huge_gpu_count_is_out_of_range_not_wrapped(tmp_path):
    p = _csv(tmp_path, "g.csv", HEAD + "1,0,99999999999999999999,100\n")
    with pytest.raises(TraceFormatError) as e:
        load_trace(f"csv:{p}", map_models=False)
    assert str(e.value) == f"{p}: line 2: field 'num_gpus': integer out of range (got '99999999999999999999')" + SKIP_HINT
    p = _csv(tmp_path, "philly.csv", "timestamp,duration,num_gpus\n2017-10-01 00:00:00,100,1e19\n")
    with pytest.raises(TraceFormatError, match="line 2: field 'num_gpus': integer out of range"):
        load_trace(f"philly:{p}", map_models=False)


def test_validate_jobs_refuses_ids_beyond_int64():
    df = pd.DataFrame({"job_id": [1.0, 1e20], "arrival_s": [0.0, 1.0], "num_gpus": [1, 1], "duration_s": [1.0, 1.0]})
    with pytest.raises(ValueError) as e:
        validate_jobs(df, origin="api")
    assert str(e.value) == ("api: column 'job_id': job_id 1e+20: integer out of range (expected -2**63 .. 2**63-1), "
                            "got 1e+20")
    df = pd.DataFrame({"job_id": [1, 2], "arrival_s": [0.0, 1.0], "num_gpus": [1.0, 1e19], "duration_s": [1.0, 1.0]})
    with pytest.raises(ValueError, match="column 'num_gpus': job_id 2: must be an integer >= 1"):
        validate_jobs(df, origin="api")
    # valid input: exact int64 ids kept, as before
    ok = pd.DataFrame({"job_id": np.array([2 ** 62 + 1, 2 ** 63 - 1], dtype=np.int64), "arrival_s": [0.0, 1.0],
                       "num_gpus": [1, 2], "duration_s": [1.0, 1.0]})
    assert validate_jobs(ok)["job_id"].tolist() == [2 ** 62 + 1, 2 ** 63 - 1]


def test_duplicate_header_column(tmp_path, capsys):
    p = _csv(tmp_path, "dup.csv", "job_id,arrival_s,num_gpus,duration_s,arrival_s\n1,0,1,100,5\n")
    want = (f"{p}: line 1: field 'arrival_s': column appears twice in the header (columns 2 and 5); expected each "
            f"column once; the header has ['job_id', 'arrival_s', 'num_gpus', 'duration_s', 'arrival_s']")
    assert one_line_error(["simulate", "--trace", f"csv:{p}"], capsys) == want
    p = _csv(tmp_path, "philly.csv", "\n\ntimestamp,duration,num_gpus,duration\n2017-10-01 00:00:00,100,1,5\n")
    with pytest.raises(TraceFormatError, match=r"line 3: field 'duration': column appears twice in the header "
                                               r"\(columns 2 and 4\)"):
        load_trace(f"philly:{p}", map_models=False)


def test_corrupt_gzip_names_the_file(tmp_path, capsys):
    bad = tmp_path / "jobs.csv.gz"
    bad.write_bytes(b"not gzip at all")
    want = (f"{bad}: not a valid gzip file (Not a gzipped file (b'no')); expected gzip-compressed text (or drop the "
            f".gz suffix for plain text)")
    assert one_line_error(["traces", "describe", f"csv:{bad}"], capsys) == want
    cut = tmp_path / "cut.csv.gz"
    cut.write_bytes(gzip.compress((HEAD + "1,0,1,100\n" * 50).encode())[:30])
    with pytest.raises(ValueError, match=rf"^{cut}: not a valid gzip file \(Compressed file ended before the "
                                         r"end-of-stream marker was reached\)"):
        load_trace(f"csv:{cut}", map_models=False)


def test_gzip_and_bom_files_load_like_the_plain_file(tmp_path):
    for spec_kind, src in (("csv", FIX / "canonical_jobs.csv"), ("philly", FIX / "philly_small.csv"),
                           ("helios", FIX / "helios_cluster_log.csv")):
        plain = load_trace(f"{spec_kind}:{src}", map_models=False)
        gz = tmp_path / f"{src.stem}.csv.gz"
        gz.write_bytes(gzip.compress(src.read_bytes()))
        bom = tmp_path / f"{src.stem}-bom.csv"
        bom.write_bytes(b"\xef\xbb\xbf" + src.read_bytes())
        assert load_trace(f"{spec_kind}:{gz}", map_models=False).digest() == plain.digest()
        assert load_trace(f"{spec_kind}:{bom}", map_models=False).digest() == plain.digest()
        bomgz = tmp_path / f"{src.stem}-bom.csv.gz"
        bomgz.write_bytes(gzip.compress(bom.read_bytes()))
        assert load_trace(f"{spec_kind}:{bomgz}", map_models=False).digest() == plain.digest()


# parse-only reference digests of the fixtures (the loaders of 7caa73b)
FIXTURE_DIGESTS = {
    "philly:philly_small.csv": "41d0fbf2196d35de",
    "csv:canonical_jobs.csv": "a9a0bbe4fb38e6cd",
    "helios:helios_cluster_log.csv": "49d7af4859c06089",
    "alibaba2020:alibaba2020": "3d0545c68c4809c1",
    "alibaba2023:alibaba2023_pods.csv": "24aa6142458a87c6",
    "gavel:gavel_10col.trace": "b2fc66c788bc2451",
    "gavel:gavel_7col.trace": "3275c1cb23774f7e",
    "philly-json:philly_cluster_job_log.json": "3098aba7d8ceeeb6",
}


@pytest.mark.parametrize("spec", sorted(FIXTURE_DIGESTS))
def test_valid_fixtures_load_identically(spec):
    kind, name = spec.split(":", 1)
    assert load_trace(f"{kind}:{FIX / name}", map_models=False).digest() == FIXTURE_DIGESTS[spec]


@pytest.mark.data
def test_whole_philly_and_its_canonical_csv_load_identically(tmp_path):
    path = require_data("philly/philly.csv")
    tr = load_trace(f"philly:{path}", map_models=False)
    assert len(tr) == 82247 and tr.digest() == "01b444432f51b9cc"
    mapped = load_trace(f"philly:{path}")
    assert mapped.digest() == "824f632c15f0763b"
    out = mapped.to_csv(tmp_path / "philly.csv")
    assert load_trace(f"csv:{out}", map_models=False).digest() == "824f632c15f0763b"


# ================================================================================================ jigsaw deploy
LIVE = "job_id,model,num_gpus,iterations\n"
DEPLOY = ["deploy", "--policy", "fifo", "--slots", "2", "--allow-oversubscribe"]


@pytest.mark.parametrize("body, want", [
    ("0,tiny_mlp,1.5,20\n", "line 2: column 'num_gpus' must be an integer, got '1.5'"),
    ("0,tiny_mlp,1,20\n1.9,tiny_mlp,1,20\n", "line 3: column 'job_id' must be an integer, got '1.9'"),
    ("\n0,tiny_mlp,1,20\n\n1,tiny_mlp,x,20\n", "line 5: column 'num_gpus' must be an integer, got 'x'"),
    ("0,tiny_mlp,1,20\n\n\n1,tiny_mlp,1,abc\n", "line 5: column 'iterations' must be a number, got 'abc'"),
    ("0,tiny_mlp,1,20,7\n", "line 2: expected 4 fields (job_id, model, num_gpus, iterations), got 5"),
    ("0,tiny_mlp,inf,20\n", "line 2: column 'num_gpus' must be an integer, got 'inf'"),
])
def test_deploy_job_list_names_the_real_line(body, want, tmp_path, capsys):
    f = _csv(tmp_path, "jobs.csv", LIVE + body)
    got = one_line_error(DEPLOY + ["--jobs", str(f), "--out", str(tmp_path / "out")], capsys)
    assert got == f"{f}: {want}"
    assert not (tmp_path / "out").exists()


def test_deploy_job_list_json_names_the_record(tmp_path):
    from jigsaw_executor.deploy import _read_jobs

    f = tmp_path / "jobs.json"
    f.write_text(json.dumps([{"job_id": 0, "model": "tiny_mlp", "num_gpus": 1, "iterations": 20},
                             {"job_id": 1, "model": "tiny_mlp", "num_gpus": 1.5, "iterations": 20}]))
    with pytest.raises(ValueError) as e:
        _read_jobs(str(f))
    assert str(e.value) == f"{f}: record 2: column 'num_gpus' must be an integer, got 1.5"


def test_deploy_job_list_duplicate_header_and_folder(tmp_path):
    from jigsaw_executor.deploy import _read_jobs

    f = _csv(tmp_path, "jobs.csv", "job_id,model,num_gpus,iterations,model\n0,tiny_mlp,1,20,x\n")
    with pytest.raises(ValueError) as e:
        _read_jobs(str(f))
    assert str(e.value) == f"{f}: line 1: column 'model' appears twice in the header; expected each column once"
    with pytest.raises(IsADirectoryError) as e:
        _read_jobs(str(tmp_path))
    assert str(e.value) == f"job list is a folder, expected a CSV or JSON file: {tmp_path}"


def test_deploy_job_list_valid_files_read_as_before(tmp_path):
    from jigsaw_executor.deploy import _read_jobs
    from jigsaw_executor.live import LiveJob

    f = _csv(tmp_path, "jobs.csv", "\ufeffjob_id,model,num_gpus,iterations,arrival_s,batch_size,seed,lr,data\n\n"
                                    "0,tiny_mlp,1,20,,16,3,0.01,digits\n1,tiny_cnn,2,1e2,5.5,,,,\n"
                                    "2.0,tiny_mlp,2.0,7.5,1,8.0,1,0.1,digits\n9007199254740993,tiny_mlp,1,5,0,,,,\n")
    jobs = _read_jobs(str(f))
    assert jobs == [LiveJob(0, "tiny_mlp", 1, 20.0, arrival_s=0.0, batch_size=16, data="digits", seed=3, lr=0.01),
                    LiveJob(1, "tiny_cnn", 2, 100.0, arrival_s=5.5),
                    LiveJob(2, "tiny_mlp", 2, 7.5, arrival_s=1.0, batch_size=8, data="digits", seed=1, lr=0.1),
                    LiveJob(9007199254740993, "tiny_mlp", 1, 5.0)]
    assert all(type(j.job_id) is int and type(j.num_gpus) is int and type(j.iterations) is float for j in jobs)
    j = tmp_path / "jobs.json"
    j.write_text(json.dumps([{"job_id": 0, "model": "tiny_mlp", "num_gpus": 1, "iterations": 20, "arrival_s": 3},
                             {"job_id": 1, "model": "tiny_cnn", "num_gpus": 2, "iterations": 10}]))
    assert _read_jobs(str(j)) == [LiveJob(0, "tiny_mlp", 1, 20.0, arrival_s=3.0), LiveJob(1, "tiny_cnn", 2, 10.0)]


@pytest.mark.parametrize("content, want", [
    ('{"format": "jigsaw-live', "not valid JSON (Unterminated string starting at: line 1 column 12 (char 11))"),
    ("[1, 2]", "expected a JSON object (a jigsaw live state), got list"),
    ("null", "expected a JSON object (a jigsaw live state), got null"),
])
def test_deploy_resume_damaged_state(content, want, tmp_path, capsys):
    pytest.importorskip("ray")
    run = tmp_path / "run"
    run.mkdir()
    (run / "scheduler_state.json").write_text(content)
    assert one_line_error(["deploy", "--resume", str(run)], capsys) == f"{run / 'scheduler_state.json'}: {want}"


# ================================================================================================ jigsaw export
def test_export_opset_range(tmp_path, capsys):
    pytest.importorskip("onnx")
    from jigsaw_executor.export import MIN_OPSET, max_opset

    top = max_opset()
    assert MIN_OPSET < 17 <= top  # the default opset is in range
    for bad in (99, top + 1):
        got = one_line_error(["export", str(tmp_path / "missing_run"), "--opset", str(bad)], capsys)
        assert got == (f"--opset must be between 13 and {top}, got {bad} ({top}: the highest opset the installed "
                       f"torch and onnx export)")
    assert one_line_error(["export", str(tmp_path / "missing_run"), "--opset", "9"], capsys) == \
        "--opset must be >= 13, got 9"
    # an opset in range passes the check and goes on to the run directory (missing here)
    got = one_line_error(["export", str(tmp_path / "missing_run"), "--opset", str(top)], capsys)
    assert "--opset" not in got and str(tmp_path / "missing_run") in got


def test_export_paths_that_are_files(tmp_path, capsys):
    pytest.importorskip("onnx")
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    got = one_line_error(["export", str(a_file)], capsys)
    assert got == (f"RUN_DIR {a_file} is a file, not a directory: expected a training run folder (config.json, "
                   f"model.zip and vecnormalize.npz, written by `jigsaw train`)")
    for out in (a_file / "p.onnx", a_file / "sub" / "p.onnx"):
        got = one_line_error(["export", str(tmp_path / "missing_run"), "--out", str(out)], capsys)
        assert got == f"--out {out}: {a_file} is a file, not a directory; give a path in a folder"
    assert one_line_error(["export", str(tmp_path / "missing_run"), "--out", str(tmp_path)], capsys) == \
        f"--out {tmp_path} is a directory; give a file name such as {tmp_path / 'policy.onnx'}"
