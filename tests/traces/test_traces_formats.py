"""Every trace format: hand-built fixtures (tests/fixtures/traces/, written from each trace's
documented schema), their edge cases, malformed rows, and round-trips through the canonical CSV."""
from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from traces import Trace, TraceFormatError, ZOO_MODELS, load_trace

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "traces"


def tput(model: str, batch_size: int, num_gpus: int, gpu_type: str) -> float:
    return 5.0 * num_gpus


def load(spec: str, **kw) -> Trace:
    kw.setdefault("throughput_fn", tput)
    kw.setdefault("batch_size_fn", lambda m: 32)
    return load_trace(spec, **kw)


def accounted(tr: Trace) -> bool:
    s = tr.summary
    return s["jobs_read"] == s["kept"] + sum(s["filtered"].values()) and s["kept"] == len(tr.jobs)


def edited(tmp_path: Path, name: str, edit) -> Path:
    """A copy of fixture ``name`` in tmp_path with ``edit(text) -> text`` applied."""
    src = FIX / name
    dst = tmp_path / src.name
    dst.write_text(edit(src.read_text()))
    return dst


def line_of(path: Path, needle: str) -> int:
    text = path.read_text()
    return text[: text.index(needle)].count("\n") + 1


def raises_at(spec: str, file_name: str, line: int, field: str, reason: str):
    with pytest.raises(TraceFormatError) as ei:
        load(spec)
    e = ei.value
    msg = str(e)
    assert file_name in msg and f"line {line}:" in msg and f"field '{field}'" in msg and reason in msg, msg
    assert (e.line, e.field, e.reason) == (line, field, reason)
    return e


SPECS = {
    "philly": f"philly:{FIX / 'philly_small.csv'}",
    "philly-json": f"philly-json:{FIX / 'philly_cluster_job_log.json'}",
    "alibaba2020": f"alibaba2020:{FIX / 'alibaba2020'}",
    "alibaba2023": f"alibaba2023:{FIX / 'alibaba2023_pods.csv'}",
    "helios": f"helios:{FIX / 'helios_cluster_log.csv'}",
    "gavel7": f"gavel:{FIX / 'gavel_7col.trace'}",
    "gavel10": f"gavel:{FIX / 'gavel_10col.trace'}",
    "csv": f"csv:{FIX / 'canonical_jobs.csv'}",
    "synthetic": "synthetic:jobs=40,seed=5",
}


# ------------------------------------------------------------------------------------------------
# round trips


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("map_models", [True, False])
def test_round_trip_through_canonical_csv(name, map_models, tmp_path):
    tr = load(SPECS[name], map_models=map_models)
    assert accounted(tr) and len(tr) > 0
    out = tr.to_csv(tmp_path / "jobs.csv")
    back = load(f"csv:{out}", map_models=map_models)
    pd.testing.assert_frame_equal(back.jobs, tr.jobs)
    assert back.digest() == tr.digest()
    assert back.summary["filtered"] == {} and back.summary["models_mapped"] == 0


# ------------------------------------------------------------------------------------------------
# philly-json


def test_philly_json_edge_cases():
    tr = load(SPECS["philly-json"], map_models=False)
    j = tr.jobs
    assert j["status"].tolist() == ["killed", "completed", "failed"]
    assert j["num_gpus"].tolist() == [4, 8, 1]            # 2 machines x 2 GPUs; the first attempt's 8
    assert j["duration_s"].tolist() == [1800.0, 74.0 + 390.0, 30.0]   # summed over attempts
    assert j["arrival_s"].tolist() == [0.0, 3999.0, 6840.0]
    assert j["vc"].tolist() == ["11cb48", "ee9e8c", "ee9e8c"]
    assert j["philly_attempts"].tolist() == ["1", "2", "1"]
    assert j["philly_first_start"].iloc[1] == "2017-10-07 01:12:09" and j["philly_last_end"].iloc[1] == "2017-10-07 01:20:00"
    assert tr.summary["filtered"] == {"never_started": 1, "missing_start_time": 1, "missing_end_time": 1,
                                      "no_gpus": 1, "zero_duration": 1}
    assert accounted(tr) and tr.summary["rows_read"] == 8
    assert load(SPECS["philly-json"], map_models=False, status=["completed", "failed"]).jobs["status"].tolist() == \
        ["completed", "failed"]
    assert len(load(SPECS["philly-json"], map_models=False, vc=["ee9e8c"])) == 2


def test_philly_json_bad_rows(tmp_path):
    p = edited(tmp_path, "philly_cluster_job_log.json",
               lambda t: t.replace('"status": "Failed",\n    "vc": "ee9e8c"', '"status": "Exploded",\n    "vc": "ee9e8c"'))
    rec_line = line_of(p, '"status": "Exploded"') - 1        # the record's opening brace
    raises_at(f"philly-json:{p}", p.name, rec_line, "status", "unknown status")

    p = edited(tmp_path, "philly_cluster_job_log.json",
               lambda t: t.replace('"end_time": "2017-10-07 00:40:00"', '"end_time": "2017-10-06 00:40:00"'))
    rec_line = line_of(p, '"status": "Killed"')
    raises_at(f"philly-json:{p}", p.name, rec_line - 1, "attempts[0].end_time", "end before start")

    p = edited(tmp_path, "philly_cluster_job_log.json",
               lambda t: t.replace('"submitted_time": "2017-10-07 01:59:00"', '"submitted_time": "yesterday"'))
    tr = load(f"philly-json:{p}", skip_bad_rows=True, map_models=False)
    assert tr.summary["bad_rows_skipped"] == {"bad time submitted_time": 1} and len(tr) == 2
    assert tr.summary["rows_read"] == tr.summary["jobs_read"] + 1

    p = edited(tmp_path, "philly_cluster_job_log.json", lambda t: t.replace('"user": "aa11bb"\n  },', '"user": "aa11bb"\n  ,'))
    with pytest.raises(TraceFormatError, match="malformed JSON"):
        load(f"philly-json:{p}")


def test_philly_json_lines_layout(tmp_path):
    import json
    recs = json.loads((FIX / "philly_cluster_job_log.json").read_text())
    p = tmp_path / "log.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    a = load(f"philly-json:{p}", map_models=False)
    b = load(SPECS["philly-json"], map_models=False)
    pd.testing.assert_frame_equal(a.jobs, b.jobs)
    recs[6]["status"] = "Bogus"
    p.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    raises_at(f"philly-json:{p}", "log.jsonl", 7, "status", "unknown status")


# ------------------------------------------------------------------------------------------------
# philly csv


def test_philly_csv_bad_rows(tmp_path):
    def spoil(t):
        lines = t.splitlines()
        lines[2] = lines[2] + ",extra"                                         # line 3: too many fields
        lines[4] = "2017-10-09 06:13:36,2759.0,2"                              # line 5: too few
        lines[6] = lines[6].replace("3600.0", "3600s")                         # line 7: non-numeric duration
        lines[7] = lines[7].replace("2017-10-05", "2017-13-05")                # line 8: bad timestamp
        return "\n".join(lines) + "\n"

    p = edited(tmp_path, "philly_small.csv", spoil)
    e = raises_at(f"philly:{p}", "philly_small.csv", 3, "#6 (extra field)", "wrong column count")
    assert "6 fields, expected 5" in str(e)
    tr = load(f"philly:{p}", skip_bad_rows=True, map_models=False)
    assert tr.summary["bad_rows_skipped"] == {"wrong column count": 2, "non-numeric duration": 1,
                                              "bad time timestamp": 1}
    assert len(tr) == 4 and tr.summary["rows_read"] == 8 and accounted(tr)
    assert len(tr.summary["bad_row_examples"]) == 4 and tr.summary["bad_row_examples"][0].startswith("line 3:")

    p = edited(tmp_path, "philly_small.csv", lambda t: t.replace("2951.0,1,", "2951.0,1,\n", 1).replace(
        "2017-10-09 06:13:36,2759.0,2,5518.0", "2017-10-09 06:13:36,nan,2,5518.0"))
    raises_at(f"philly:{p}", "philly_small.csv", 3, "cluster", "wrong column count")
    p = edited(tmp_path, "philly_small.csv", lambda t: t.replace("66.0,1,66.0", "abc,1,66.0"))
    raises_at(f"philly:{p}", "philly_small.csv", 2, "duration", "non-numeric duration")
    p = edited(tmp_path, "philly_small.csv", lambda t: t.replace("66.0,1,66.0", "-66.0,1,66.0"))
    raises_at(f"philly:{p}", "philly_small.csv", 2, "duration", "negative duration")
    p = edited(tmp_path, "philly_small.csv", lambda t: t.replace("2759.0,2,", "2759.0,2.5,"))
    raises_at(f"philly:{p}", "philly_small.csv", 5, "num_gpus", "non-integer num_gpus")
    p = edited(tmp_path, "philly_small.csv", lambda t: t.replace("timestamp,", "time,"))
    raises_at(f"philly:{p}", "philly_small.csv", 1, "timestamp", "missing column in the header")


def test_blank_lines_and_crlf_keep_line_numbers(tmp_path):
    p = edited(tmp_path, "philly_small.csv", lambda t: t.replace("\n", "\r\n").replace(
        "2017-10-09 06:13:03,2951.0", "\r\n2017-10-09 06:13:03,2951.0").replace("860662.0", "x"))
    tr = load(f"philly:{p}", skip_bad_rows=True, map_models=False)
    assert tr.summary["rows_read"] == 8 and tr.summary["bad_rows_skipped"] == {"non-numeric duration": 1}
    assert tr.summary["bad_row_examples"] == ["line 5: field 'duration': non-numeric duration (got 'x')"]


def test_zero_gpu_and_zero_duration_rows_are_counted(tmp_path):
    p = edited(tmp_path, "philly_small.csv", lambda t: t.replace("66.0,1,66.0", "66.0,0,0.0").replace(
        "45.0,1,45.0", "0.0,1,0.0"))
    tr = load(f"philly:{p}", map_models=False)
    assert tr.summary["filtered"] == {"no_gpus": 1, "zero_duration": 1} and len(tr) == 6 and accounted(tr)


# ------------------------------------------------------------------------------------------------
# alibaba 2020


def test_alibaba2020_edge_cases():
    tr = load(SPECS["alibaba2020"], map_models=False)
    j = tr.jobs
    assert j["ali20_job_name"].tolist() == ["j6_quarter_gpus", "j2_half_gpu", "j1_two_workers_and_ps"]
    assert j["arrival_s"].tolist() == [0.0, 40.0, 90.0]
    assert j["num_gpus"].tolist() == [1, 1, 2]                 # 4 x 25% = 1; 50% rounds up to 1
    assert j["ali20_gpu_request"].tolist() == ["1", "0.5", "2"]
    assert j["duration_s"].tolist() == [70.0, 240.0, 390.0]    # last task end - first task start
    assert j["status"].tolist() == ["completed", "failed", "completed"]
    assert j["gpu_type"].tolist() == ["k80", "p100", "v100"]   # MISC, T4, V100
    assert j["ali20_tasks"].tolist() == ["1", "1", "2"]
    assert tr.summary["filtered"] == {"missing_submit_time": 1, "no_tasks": 1, "never_started": 1,
                                      "missing_end_time": 1, "no_gpus": 1}
    assert tr.summary["notes"]["orphan_task_rows"] == 1 and accounted(tr)
    assert set(load(SPECS["alibaba2020"], map_models=False, gpu_type="v100").jobs["gpu_type"]) == {"v100"}
    # the job table itself works as the path too
    same = load(f"alibaba2020:{FIX / 'alibaba2020' / 'pai_job_table.csv'}", map_models=False)
    pd.testing.assert_frame_equal(same.jobs, j)
    with pytest.raises(ValueError, match="no virtual clusters"):
        load(SPECS["alibaba2020"], vc=["x"])
    assert load(SPECS["alibaba2020"], map_models=False, status=["failed"]).jobs["ali20_job_name"].tolist() == ["j2_half_gpu"]


def test_alibaba2020_bad_rows(tmp_path):
    d = tmp_path / "pai"
    shutil.copytree(FIX / "alibaba2020", d)
    job, task = d / "pai_job_table.csv", d / "pai_task_table.csv"
    task.write_text(task.read_text().replace("j2_half_gpu,tensorflow,1.0,Failed,60.0,300.0",
                                             "j2_half_gpu,tensorflow,1.0,Failed,360.0,300.0"))
    raises_at(f"alibaba2020:{d}", "pai_task_table.csv", 3, "end_time", "end before start")
    tr = load(f"alibaba2020:{d}", skip_bad_rows=True, map_models=False)
    assert tr.summary["bad_rows_skipped"] == {"task table: end before start": 1}
    assert tr.summary["filtered"]["bad_task_row"] == 1 and "j2_half_gpu" not in set(tr.jobs["ali20_job_name"])
    shutil.copy(FIX / "alibaba2020" / "pai_task_table.csv", task)
    job.write_text(job.read_text().replace("u2,Failed,", "u2,Exploded,"))
    raises_at(f"alibaba2020:{d}", "pai_job_table.csv", 2, "status", "unknown status")
    job.write_text(job.read_text().replace("u2,Exploded,50.0", "u2,Failed,fifty"))
    raises_at(f"alibaba2020:{d}", "pai_job_table.csv", 2, "start_time", "non-numeric start_time")
    job.write_text(job.read_text().replace("u2,Failed,fifty,300.0", "u2,Failed,50.0"))
    raises_at(f"alibaba2020:{d}", "pai_job_table.csv", 2, "end_time", "wrong column count")
    with pytest.raises(FileNotFoundError, match="task table"):
        task.unlink()
        load(f"alibaba2020:{d}")


# ------------------------------------------------------------------------------------------------
# alibaba 2023


def test_alibaba2023_edge_cases():
    tr = load(SPECS["alibaba2023"], map_models=False)
    j = tr.jobs
    assert j["ali23_name"].tolist() == ["openb-pod-0001", "openb-pod-0002", "openb-pod-0003", "openb-pod-0005"]
    assert j["num_gpus"].tolist() == [8, 1, 1, 2]
    assert j["ali23_gpu_milli"].tolist() == ["1000", "220", "1000", "1000"]     # a fractional (shared) GPU
    assert j["duration_s"].tolist() == [4000.0, 95.0, 290.0, 300.0]           # deletion - scheduled
    assert j["status"].tolist() == ["completed", "running", "running", "failed"]
    assert j["gpu_type"].tolist() == ["v100", "v100", "v100", "p100"]
    assert tr.summary["filtered"] == {"never_started": 1, "missing_end_time": 1, "no_gpus": 1, "zero_duration": 1}
    # the window counts from the trace start (the first pod, a CPU pod, at 900)
    w = load(SPECS["alibaba2023"], map_models=False, window=(0, 250))
    assert w.jobs["ali23_name"].tolist() == ["openb-pod-0001", "openb-pod-0002"]
    assert w.summary["filtered"]["outside_window"] == 2 and accounted(w)
    s = load(SPECS["alibaba2023"], map_models=False, status=["completed", "failed"])
    assert s.jobs["status"].tolist() == ["completed", "failed"] and s.summary["filtered"]["status_not_selected"] == 2


def test_alibaba2023_bad_rows(tmp_path):
    p = edited(tmp_path, "alibaba2023_pods.csv", lambda t: t.replace("1400,1700,1400", "1400,1300,1400"))
    raises_at(f"alibaba2023:{p}", p.name, 7, "deletion_time", "end before start")
    p = edited(tmp_path, "alibaba2023_pods.csv", lambda t: t.replace("BE,Running", "BE,Evicted"))
    raises_at(f"alibaba2023:{p}", p.name, 4, "pod_phase", "unknown status")
    p = edited(tmp_path, "alibaba2023_pods.csv", lambda t: t.replace("32768,1,1000", "32768,one,1000"))
    raises_at(f"alibaba2023:{p}", p.name, 5, "num_gpu", "non-numeric num_gpu")
    tr = load(f"alibaba2023:{p}", skip_bad_rows=True, map_models=False)
    assert tr.summary["bad_rows_skipped"] == {"non-numeric num_gpu": 1} and len(tr) == 3


# ------------------------------------------------------------------------------------------------
# helios


def test_helios_edge_cases():
    tr = load(SPECS["helios"], map_models=False)
    j = tr.jobs
    assert j["helios_job_id"].tolist() == ["1425511", "1425512", "1425513", "1425516", "1425517"]
    assert j["status"].tolist() == ["completed", "failed", "killed", "failed", "failed"]   # TIMEOUT, NODE_FAIL
    assert j["duration_s"].tolist() == [36848.0, 249.0, 675233.0, 86400.0, 3600.0]        # last: end - start
    assert j["vc"].tolist() == ["vcJkd", "vchbv", "vcpDC", "vchbv", "vcJkd"]
    assert j["arrival_s"].tolist() == [0.0, 26.0, 27.0, 179.0, 239.0]
    assert tr.summary["filtered"] == {"never_started": 1, "no_gpus": 1, "zero_duration": 1}
    assert tr.summary["trace_start"] == "2020-06-09 18:41:01"
    v = load(SPECS["helios"], map_models=False, vc=["vcJkd", "vcpDC"], status=["killed", "completed"])
    assert v.jobs["helios_job_id"].tolist() == ["1425511", "1425513"]
    assert v.summary["filtered"] == {"never_started": 1, "no_gpus": 1, "zero_duration": 1,
                                     "vc_not_selected": 2, "status_not_selected": 1}


def test_helios_bad_rows(tmp_path):
    p = edited(tmp_path, "helios_cluster_log.csv", lambda t: t.replace(",249,0", ",249s,0"))
    raises_at(f"helios:{p}", p.name, 2, "duration", "non-numeric duration")
    p = edited(tmp_path, "helios_cluster_log.csv", lambda t: t.replace("TIMEOUT", "EXPLODED"))
    raises_at(f"helios:{p}", p.name, 7, "state", "unknown status")
    p = edited(tmp_path, "helios_cluster_log.csv",
               lambda t: t.replace("2020-06-09 18:45:30,2020-06-09 19:45:30", "2020-06-09 18:45:30,2020-06-09 17:45:30"))
    raises_at(f"helios:{p}", p.name, 8, "end_time", "end before start")
    p = edited(tmp_path, "helios_cluster_log.csv", lambda t: t.replace(",duration,", ",runtime,"))
    raises_at(f"helios:{p}", p.name, 1, "duration", "missing column in the header")
    p = edited(tmp_path, "helios_cluster_log.csv", lambda t: t.replace("TIMEOUT", "EXPLODED").replace(",249,0", ",x,0"))
    tr = load(f"helios:{p}", skip_bad_rows=True, map_models=False)
    assert tr.summary["bad_rows_skipped"] == {"non-numeric duration": 1, "unknown status": 1}
    assert len(tr) == 3 and accounted(tr)


# ------------------------------------------------------------------------------------------------
# gavel


def test_gavel_layouts():
    t7 = load(SPECS["gavel7"], map_models=False)
    j = t7.jobs
    assert j["model"].tolist() == ["resnet18", "lstm_lm", "transformer_small", "", ""]   # CycleGAN, A3C unmapped
    assert j["batch_size"].tolist()[:3] == [32, 10, 128]
    assert j["iterations"].tolist() == [4803268.0, 5083850.0, 112521.0, 21356.0, 123092.0]
    assert j["num_gpus"].tolist() == [1, 1, 4, 1, 4] and j["duration_s"].isna().all()
    assert j["gavel_job_type"].tolist()[3:] == ["CycleGAN", "A3C"]
    assert t7.summary["filtered"] == {"zero_duration": 1} and t7.summary["notes"]["layout_fields"] == 7
    t10 = load(SPECS["gavel10"], map_models=False)
    j = t10.jobs
    assert j["model"].tolist() == ["resnet50", "", "recommendation"]
    assert j["arrival_s"].tolist() == [0.0, 12.5, 30.0] and j["num_gpus"].tolist() == [1, 8, 2]
    assert j["gavel_working_directory"].iloc[0].endswith("imagenet") and j["gavel_slo"].tolist() == ["-1.000000"] * 2 + ["1.200000"]


@pytest.mark.data
def test_gavel_mapping_keeps_iterations_and_load_uses_throughput():
    import json

    from data_helpers import require_data
    v100 = json.loads(require_data("gavel/simulation_throughputs.json").read_text())["v100"]
    tr = load(SPECS["gavel7"], seed=1)
    j = tr.jobs
    # zoo job types keep Gavel's steps; CycleGAN and A3C get their stand-ins (resnet50 at 16,
    # lstm_lm at 20) and the steps that keep their time alone on a V100 (docs/traces.md eq. G2)
    assert j["model"].tolist() == ["resnet18", "lstm_lm", "transformer_small", "resnet50", "lstm_lm"]
    assert j["iterations"].tolist() == [
        4803268.0, 5083850.0, 112521.0,
        round(21356 * v100["('ResNet-50 (batch size 16)', 1)"]["null"] / v100["('CycleGAN', 1)"]["null"]),
        round(123092 * v100["('LM (batch size 20)', 1)"]["null"] / v100["('A3C', 1)"]["null"])]
    assert j["batch_size"].tolist() == [32, 10, 128, 16, 20] and tr.summary["models_mapped"] == 0
    assert tr.summary["gavel_stand_ins"] == {"A3C": 1, "CycleGAN": 1}
    assert tr.summary["iterations_computed"] == 0
    sc = load(SPECS["gavel7"], seed=1, cluster_gpus=4, load_scale=1.0)
    d = sc.jobs["iterations"] / (5.0 * sc.jobs["num_gpus"])
    from traces import offered_load
    assert offered_load(sc.jobs, 4, d.to_numpy()) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no duration"):
        load(SPECS["gavel7"], map_models=False, cluster_gpus=4, load_scale=1.0)


def test_gavel_bad_rows(tmp_path):
    p = edited(tmp_path, "gavel_7col.trace", lambda t: t.replace("\t2721260.000000\t1\n", "\t2721260.000000\t1\textra\n"))
    e = raises_at(f"gavel:{p}", p.name, 3, "#8 (extra field)", "wrong column count")
    assert "layouts: [6, 7, 9, 10]" in str(e)
    p = edited(tmp_path, "gavel_7col.trace", lambda t: t.replace("\t112521\t", "\tmany\t"))
    raises_at(f"gavel:{p}", p.name, 4, "total_steps", "non-numeric total_steps")
    p = edited(tmp_path, "gavel_10col.trace", lambda t: t.replace("\t205707\t1\t", "\t205707\t0\t"))
    raises_at(f"gavel:{p}", p.name, 2, "scale_factor", "scale_factor must be >= 1")
    tr = load(f"gavel:{p}", skip_bad_rows=True, map_models=False)
    assert tr.summary["bad_rows_skipped"] == {"scale_factor must be >= 1": 1} and len(tr) == 2


# ------------------------------------------------------------------------------------------------
# canonical csv


def test_canonical_csv_fixture():
    tr = load(SPECS["csv"], map_models=False)
    j = tr.jobs
    assert j["job_id"].tolist() == [5, 10, 7, 3]                 # ids kept, rows sorted by arrival
    assert j["src_note"].tolist() == ["second by file", "first by file", "", "quoted, with comma"]
    assert j["gpu_type"].tolist() == ["v100", "v100", "k80", "p100"]   # empty -> the csv default
    m = load(SPECS["csv"], seed=0).jobs
    assert m.loc[m["job_id"] == 5, "iterations"].item() == 5000.0             # kept
    assert m.loc[m["job_id"] == 10, "iterations"].item() == round(100.0 * 5.0)  # model + duration -> computed
    assert m.loc[m["job_id"] == 10, "batch_size"].item() == 32
    assert m.loc[m["job_id"] == 7, "model"].item() in ZOO_MODELS               # mapped


def test_canonical_csv_bad_rows(tmp_path):
    p = edited(tmp_path, "canonical_jobs.csv", lambda t: t.replace("src_note", "note"))
    raises_at(f"csv:{p}", p.name, 1, "note", "unknown column")
    p = edited(tmp_path, "canonical_jobs.csv", lambda t: t.replace("7,5.0,4", "10,5.0,4"))
    raises_at(f"csv:{p}", p.name, 4, "job_id", "duplicate job_id")
    p = edited(tmp_path, "canonical_jobs.csv", lambda t: t.replace(",completed,", ",done,"))
    raises_at(f"csv:{p}", p.name, 2, "status", "unknown status")
    p = edited(tmp_path, "canonical_jobs.csv", lambda t: t.replace("5.0,4,3600.5,,", "5.0,4,,,"))
    raises_at(f"csv:{p}", p.name, 4, "duration_s", "missing duration_s and iterations")
    p = edited(tmp_path, "canonical_jobs.csv", lambda t: t.replace("job_id,arrival_s,num_gpus,duration_s,iterations",
                                                                   "job_id,arrival_s,num_gpus,dur,iters"))
    with pytest.raises(TraceFormatError, match="unknown column"):
        load(f"csv:{p}")


def test_missing_files_and_unknown_kinds(tmp_path):
    for kind in ("philly", "philly-json", "alibaba2023", "helios", "gavel", "csv"):
        with pytest.raises(FileNotFoundError, match="not found"):
            load(f"{kind}:{tmp_path / 'nope.txt'}")
    with pytest.raises(FileNotFoundError, match="job table"):
        load(f"alibaba2020:{tmp_path}")
    with pytest.raises(ValueError, match="unknown trace kind"):
        load(f"parquet:{tmp_path}")


@pytest.mark.data
def test_describe_estimates_gavel_durations_from_throughput():
    from data_helpers import require_data
    from traces.describe import describe_trace, render_description
    require_data("gavel/simulation_throughputs.json")          # the A3C job's stand-in (eq. G2)
    tr = load(SPECS["gavel10"], seed=0)                        # mapped: every job has a model
    d = describe_trace(tr, 8, tput)
    est = tr.jobs["iterations"] / (5.0 * tr.jobs["num_gpus"])
    assert d["durations_estimated_from_iterations"] == 3 and d["duration_s"] is None
    assert d["offered_load"] == pytest.approx(float((tr.jobs["num_gpus"] * est).sum()) / (8 * 30.0))

    def broken(*a):
        raise ValueError("no table")
    d = describe_trace(tr, 8, broken)
    assert d["offered_load"] is None and "no table" in d["duration_estimate_error"]
    assert "offered load vs 8 GPUs: n/a" in render_description(d)
