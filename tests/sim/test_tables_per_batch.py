"""Cost tables at every batch size Gavel measured, eq. B1 for the others, the GPU-ratio tables of
vgg16 and bert_base, Gavel's A3C and CycleGAN jobs, and a Gavel trace with several batch sizes
simulated end to end (docs/cost_tables.md sections 4 and 9, docs/traces.md eq. G2)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from data_helpers import require_data
from jigsaw_env import table_builder as tb
from jigsaw_env.calibrate import MEASURED_BATCHES, SHIPPED, derive_gpu_ratio
from jigsaw_env.cli import main
from jigsaw_env.cost_table import (MAX_BATCH_RATIO, TABLES_DIR, CostTable, LayerGroup, batch_exponent, get_table,
                                   nearest_batch_size, scale_to_batch, table_filename)
from jigsaw_env.zoo import MODELS

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "traces"
GAVEL_MODELS = sorted(m for m in SHIPPED if MODELS[m].gavel_job)
GPUS = ("k80", "p100", "v100")
SWITCHED = ("lstm_lm", "recommendation")  # GPU-measured split (docs/cost_tables.md section 3a)


def _shipped(model, bs, device) -> CostTable:
    return CostTable.load(TABLES_DIR / table_filename(model, bs, device))


def _gavel():
    return json.loads(require_data("gavel/simulation_throughputs.json").read_text())


def _gavel_entries():
    """(model, batch size, GPU type, throughput) of every zoo job type Gavel measured alone."""
    data = _gavel()
    out = []
    for m in GAVEL_MODELS:
        job = MODELS[m].gavel_job
        for g in GPUS:
            for key, entry in data[g].items():
                name, sf = eval(key)  # noqa: S307 -- Gavel's keys are Python tuple literals
                if sf == 1 and name.startswith(f"{job} (batch size ") and entry.get("null"):
                    out.append((m, int(name.rsplit(" ", 1)[1].rstrip(")")), g, float(entry["null"])))
    return out


# ---------------------------------------------------------------------------------------- anchoring
@pytest.mark.data
def test_every_gavel_model_batch_and_type_is_anchored_exactly():
    entries = _gavel_entries()
    # ResNet-18 16-256 (5), ResNet-50 16-128 (4), Transformer 16-256 (5), LM 5-80 (5),
    # Recommendation 512-8192 (5): 24 (model, batch) pairs on 3 GPU types
    assert len(entries) == 24 * 3
    assert {(m, b) for m, b, _, _ in entries} >= {("resnet18", 16), ("resnet18", 256), ("resnet50", 128),
                                                  ("transformer_small", 256), ("lstm_lm", 5), ("lstm_lm", 80),
                                                  ("recommendation", 8192)}
    for m, b, g, thr in entries:
        t = _shipped(m, b, g)
        assert t.meta["kind"] == "anchored" and t.meta["gavel_throughput_it_s"] == thr
        assert t.compute_s(0) == pytest.approx(1.0 / thr, rel=1e-12), (m, b, g)


@pytest.mark.data
def test_tables_show_gives_gavels_iteration_time_for_every_measured_batch(capsys):
    for m, b, g, thr in _gavel_entries()[::7]:  # a spread of the 72 (the test above checks every file)
        assert main(["tables", "show", m, "--batch-size", str(b), "--gpu-type", g, "--json"]) == 0
        rec = json.loads(capsys.readouterr().out)
        assert rec["iteration_s"] == pytest.approx(1.0 / thr, rel=1e-12)


def _shares(t: CostTable) -> np.ndarray:
    return np.array([t.plain_compute_s(s) for s in range(t.num_groups)]) / t.plain_compute_s(0)


@pytest.mark.data
def test_gpu_split_is_the_cpu_table_measured_at_that_batch_or_eq_b1_of_the_nearest():
    """Models whose GPU-measured split is switched to (eq. S1) are checked in test_gpu_split.py."""
    for m, b, g, _ in _gavel_entries():
        if m in SWITCHED:
            continue
        measured = (SHIPPED[m], *MEASURED_BATCHES.get(m, ()))
        if b in measured:
            base = _shipped(m, b, "cpu")
            assert "batch_scaling" not in _shipped(m, b, g).sources
        else:
            near = nearest_batch_size(b, list(measured))
            base = scale_to_batch(_shipped(m, near, "cpu"), b, 1.0)
            assert f"at batch {near} to {b}" in _shipped(m, b, g).sources["batch_scaling"]
        t = _shipped(m, b, g)
        np.testing.assert_allclose(_shares(t), _shares(base), rtol=1e-9)
        assert [x.activation_bytes for x in t.groups] == [x.activation_bytes for x in base.groups]
        assert [x.param_bytes for x in t.groups] == [x.param_bytes for x in base.groups]


def test_activation_bytes_per_sample_do_not_depend_on_the_batch():
    """The exact counts of the cpu tables measured at several batch sizes: bytes per sample equal
    the reference batch size's to 0.2 % in total and 1 % per group (what eq. B1 assumes for
    activations; the rest is per-channel state such as batch-norm statistics and LSTM states)."""
    for m, sizes in MEASURED_BATCHES.items():
        ref = _shipped(m, SHIPPED[m], "cpu")
        per = np.array([g.activation_bytes for g in ref.groups]) / ref.batch_size
        for b in sizes:
            got = np.array([g.activation_bytes for g in _shipped(m, b, "cpu").groups]) / b
            np.testing.assert_allclose(got, per, rtol=1e-2)
            assert got.sum() == pytest.approx(per.sum(), rel=2e-3)


# ---------------------------------------------------------------------------------------- eq. B1
def _toy(bs=8) -> CostTable:
    return CostTable(model="toy", batch_size=bs, device="v100", optimizer_s=0.5, fixed_memory_bytes=1000,
                     groups=(LayerGroup("a", 40, 100, 1.0, 2.0, 0.0), LayerGroup("b", 60, 7, 0.25, 0.5, 0.125)))


def test_eq_b1_scales_times_by_r_to_the_alpha_and_activations_by_r():
    t = scale_to_batch(_toy(8), 32, 0.5)  # r = 4, r^alpha = 2
    assert t.batch_size == 32 and t.meta["kind"] == "batch-scaled" and t.meta["batch_ratio"] == 4.0
    assert [(g.forward_s, g.backward_weight_s, g.backward_input_s) for g in t.groups] == \
        [(2.0, 4.0, 0.0), (0.5, 1.0, 0.25)]
    assert t.optimizer_s == 1.0 and t.compute_s(0) == pytest.approx(2 * _toy(8).compute_s(0))
    assert [g.activation_bytes for g in t.groups] == [400, 28]
    assert [g.param_bytes for g in t.groups] == [40, 60] and t.fixed_memory_bytes == 1000
    assert scale_to_batch(_toy(8), 12).compute_s(0) == pytest.approx(1.5 * _toy(8).compute_s(0))  # alpha 1
    assert [g.activation_bytes for g in scale_to_batch(_toy(8), 12).groups] == [150, 10]   # round(7 * 1.5)
    with pytest.raises(ValueError, match="batch exponent must be a finite number, got nan"):
        scale_to_batch(_toy(8), 12, float("nan"))


def test_batch_exponent_comes_from_the_bracketing_pair():
    times = {16: 1.0, 32: 1.5, 64: 3.0, 128: 6.0}
    assert batch_exponent(48, times) == (pytest.approx(1.0), (32, 64))          # ln(3/1.5)/ln 2
    assert batch_exponent(20, times) == (pytest.approx(math.log(1.5) / math.log(2)), (16, 32))
    assert batch_exponent(8, times)[1] == (16, 32) and batch_exponent(512, times)[1] == (64, 128)
    assert batch_exponent(48, {64: 3.0}) == (1.0, None)


def test_nearest_batch_size_is_nearest_in_ratio_ties_to_the_larger():
    assert nearest_batch_size(48, [16, 32, 64, 128]) == 64     # 64/48 = 1.33 < 48/32 = 1.5
    assert nearest_batch_size(40, [16, 32, 64, 128]) == 32     # 40/32 = 1.25 < 64/40 = 1.6
    assert nearest_batch_size(32, [16, 64]) == 64              # a tie (2x either way): the larger
    assert nearest_batch_size(3, [5, 10]) == 5 and nearest_batch_size(1000, [5, 10]) == 10


def test_a_trace_batch_without_a_table_gets_the_nearest_scaled():
    t = get_table("resnet18", 48, "v100", nearest=True)
    t32, t64 = get_table("resnet18", 32, "v100"), get_table("resnet18", 64, "v100")
    alpha = math.log(t64.compute_s(0) / t32.compute_s(0)) / math.log(2)
    assert t.meta["scaled_from_batch_size"] == 64 and t.batch_size == 48
    assert t.meta["batch_exponent"] == pytest.approx(alpha, rel=1e-12)
    assert t.compute_s(0) == pytest.approx(t64.compute_s(0) * 0.75 ** alpha, rel=1e-12)
    np.testing.assert_allclose(_shares(t), _shares(t64), rtol=1e-9)
    assert t.activation_peak_bytes(0) == pytest.approx(0.75 * t64.activation_peak_bytes(0), abs=len(t.groups))
    with pytest.raises(ValueError) as e:                      # strict lookups still name the sizes
        get_table("resnet18", 48, "v100")
    assert str(e.value) == "no cost table for model 'resnet18' at batch_size 48; allowed: [16, 32, 64, 128, 256]"
    with pytest.raises(ValueError) as e:                      # beyond MAX_BATCH_RATIO: an error
        get_table("resnet18", 1024 + 1, "v100", nearest=True)
    assert str(e.value) == ("no cost table for model 'resnet18' at batch_size 1025 on v100, and the nearest batch "
                            f"size with one (256) is more than {MAX_BATCH_RATIO:g}x away; allowed: batch sizes "
                            "[16, 32, 64, 128, 256] and those within 4x of them")
    assert get_table("resnet18", 1024, "v100", nearest=True).meta["batch_ratio"] == 4.0


# ---------------------------------------------------------------------------------------- vgg16, bert_base
@pytest.mark.data
@pytest.mark.parametrize("model,family", sorted(tb.GPU_RATIO_FAMILY.items()))
def test_vgg16_and_bert_are_their_gpu_measurement_times_the_family_ratio(model, family):
    data = _gavel()
    measured = CostTable.load(tb.GPU_MEASURED_DIR / table_filename(model, SHIPPED[model], "cuda"))
    for g in GPUS:
        ratios = []
        for r in family:
            ref = CostTable.load(tb.GPU_MEASURED_DIR / table_filename(r, SHIPPED[r], "cuda"))
            thr = data[g][str((f"{MODELS[r].gavel_job} (batch size {SHIPPED[r]})", 1))]["null"]
            ratios.append((1.0 / thr) / ref.compute_s(0))
        k = math.exp(np.mean(np.log(ratios)))
        t = _shipped(model, SHIPPED[model], g)
        assert t.meta["kind"] == "gpu-ratio" and t.meta["anchor_scale"] == pytest.approx(k, rel=1e-12)
        assert t.compute_s(0) == pytest.approx(k * measured.compute_s(0), rel=1e-12)
        np.testing.assert_allclose(_shares(t), _shares(measured), rtol=1e-9)    # the GPU-measured split
        assert [x.activation_bytes for x in t.groups] == [x.activation_bytes for x in measured.groups]
        assert "bench/results/cuda_check/" in t.sources["anchor"]
    # the files are what derive_gpu_ratio writes
    for t in derive_gpu_ratio([model]):
        assert t.to_dict() == _shipped(model, SHIPPED[model], t.device).to_dict()


@pytest.mark.data
def test_vgg16_v100_table_known_answer():
    # H200: vgg16 bs 32 26.72 ms; resnet18 bs 64 8.41 ms and resnet50 bs 32 19.03 ms against Gavel's
    # V100 41.51 ms and 128.4 ms: k = sqrt(4.934 * 6.749) = 5.771, so 154.2 ms
    assert _shipped("vgg16", 32, "v100").compute_s(0) == pytest.approx(0.1542, rel=1e-3)
    assert _shipped("bert_base", 8, "v100").compute_s(0) == pytest.approx(0.1686, rel=1e-3)


# ---------------------------------------------------------------------------------------- a Gavel trace
def _load(spec, **kw):
    from traces import load_trace
    return load_trace(spec, **kw)


@pytest.mark.data
def test_gavel_fixture_maps_every_job_and_counts_batch_scaled_ones():
    from traces.describe import describe_trace
    data = _gavel()
    tr = _load(f"gavel:{FIX / 'gavel_batches.trace'}")
    j = tr.jobs
    assert len(j) == 12 and (j["model"] != "").all()
    assert j["batch_size"].tolist() == [16, 256, 128, 128, 16, 80, 5, 8192, 512, 20, 16, 48]
    assert tr.summary["gavel_stand_ins"] == {"A3C": 1, "CycleGAN": 1} and tr.summary["models_mapped"] == 0
    a3c, cyc = j.iloc[9], j.iloc[10]
    assert (a3c["model"], cyc["model"]) == ("lstm_lm", "resnet50")
    v = data["v100"]
    assert a3c["iterations"] == round(2000 * v["('LM (batch size 20)', 1)"]["null"] / v["('A3C', 1)"]["null"])
    assert cyc["iterations"] == round(500 * v["('ResNet-50 (batch size 16)', 1)"]["null"] / v["('CycleGAN', 1)"]["null"])
    d = describe_trace(tr, 16)
    assert d["jobs_batch_scaled"] == 1 and d["batch_scaled"] == {"resnet18-bs48-v100": 1}


@pytest.mark.data
@pytest.mark.parametrize("agent", ["tiresias", "jigsaw"])
def test_gavel_fixture_with_several_batch_sizes_simulates_end_to_end(agent, capsys):
    from jigsaw_env.spb import isolated_throughput
    spec = f"gavel:{FIX / 'gavel_batches.trace'}"
    assert main(["simulate", "--trace", spec, "--agent", agent, "--gpus", "16", "--json", "--no-progress"]) == 0
    out = json.loads(capsys.readouterr().out)
    j = _load(spec, cluster_gpus=16).jobs
    # every job completes, and the useful work is each job's iterations at its table's isolated
    # throughput (its own batch size's table; eq. B1 for the batch-48 job) times its GPUs
    useful = sum(r.iterations * r.num_gpus / isolated_throughput(r.model, int(r.batch_size), int(r.num_gpus), "v100")
                 for r in j.itertuples())
    assert out["jobs_total"] == out["jobs_completed"] == 12
    assert out["useful_gpu_s"] == pytest.approx(useful, rel=1e-9)


def test_stand_ins_without_gavels_file_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("JIGSAW_DATA", str(tmp_path))
    spec = f"gavel:{FIX / 'gavel_batches.trace'}"
    with pytest.raises(ValueError) as e:
        _load(spec)
    assert str(e.value) == (f"{spec}: A3C and CycleGAN jobs are mapped with Gavel's measured throughputs, which could "
                            f"not be read from {tmp_path}/gavel/simulation_throughputs.json (FileNotFoundError); set "
                            f"JIGSAW_DATA to the folder holding gavel/simulation_throughputs.json")
    assert len(_load(spec, map_models=False)) == 12                # the loader alone needs no data


def test_describe_counts_only_jobs_that_get_a_batch_scaled_table():
    import pandas as pd

    from traces.describe import batch_scaled_jobs
    jobs = pd.DataFrame({"model": ["resnet18", "resnet18", "resnet18", "lstm_lm", "", "resnet18"],
                         "batch_size": pd.array([48, 48, 64, 30, pd.NA, 48], dtype="Int64"),
                         "gpu_type": ["v100", "v100", "v100", "k80", "v100", "a100"]})
    # 64 has a table; a model-less job is not counted; a100 has no tables at all (an error, not scaled)
    assert batch_scaled_jobs(jobs) == {"lstm_lm-bs30-k80": 1, "resnet18-bs48-v100": 2}


def test_stand_ins_with_a_throughput_missing_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "gavel").mkdir()
    (tmp_path / "gavel" / "simulation_throughputs.json").write_text(json.dumps(
        {"v100": {"('LM (batch size 20)', 1)": {"null": 64.7}, "('A3C', 1)": {"null": 0}}}))
    monkeypatch.setenv("JIGSAW_DATA", str(tmp_path))
    spec = f"gavel:{FIX / 'gavel_batches.trace'}"
    with pytest.raises(ValueError) as e:
        _load(spec)
    assert str(e.value) == (f"{spec}: {tmp_path}/gavel/simulation_throughputs.json has no alone throughput "
                            f"['v100'][\"('A3C', 1)\"]['null'] to map A3C jobs")


@pytest.mark.data
def test_eq_b1_against_gavel_each_batch_left_out():
    """docs/cost_tables.md section 9: 72 predictions, median |error| 10.3 % (18.5 % with alpha 1)."""
    from bench.batch_split import rule_rows
    require_data("gavel/simulation_throughputs.json")
    rows = rule_rows()
    assert len(rows) == 72
    assert np.median(np.abs([r["error"] for r in rows])) == pytest.approx(0.103, abs=5e-4)
    assert np.median(np.abs([r["linear_error"] for r in rows])) == pytest.approx(0.185, abs=5e-4)
    worst = max(rows, key=lambda r: abs(r["error"]))
    assert (worst["model"], worst["gpu"], worst["to"]) == ("resnet18", "k80", 64)


def test_batch_split_rows_against_the_reference():
    from bench.batch_split import split_rows
    ref = _shipped("lstm_lm", 20, "cpu")
    same = scale_to_batch(ref, 40, 1.0)          # eq. B1 keeps the split and the bytes per sample
    (r,) = split_rows([same])
    assert r["max_abs_diff"] == pytest.approx(0.0, abs=1e-12) and r["reference_batch_size"] == 20
    assert r["activation_per_sample_ratio"] == pytest.approx(1.0, abs=1e-6)
