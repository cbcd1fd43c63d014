"""GPU tables that take their per-group split from a GPU measurement (docs/cost_tables.md section 3a,
eqs. S1 and S2): the noise rule on hand-made numbers, the split replacement on a toy table, and the
shipped tables of the switched and unswitched models against the measured JSON files."""
from __future__ import annotations

import json

import numpy as np
import pytest

from data_helpers import require_data
from jigsaw_env import gpu_split
from jigsaw_env.calibrate import SHIPPED, derive_gavel_batches, gpu_splits
from jigsaw_env.cost_table import TABLES_DIR, CostTable, LayerGroup, table_filename

GPUS = ("k80", "p100", "v100")
SWITCHED = ("lstm_lm", "recommendation")
UNSWITCHED = ("resnet18", "resnet50", "transformer_small")


def _toy(times, optimizer_s, device="cpu") -> CostTable:
    groups = tuple(LayerGroup(f"g{i}", 10, 100 + i, f, w, x) for i, (f, w, x) in enumerate(times))
    return CostTable(model="toy", batch_size=4, device=device, groups=groups, optimizer_s=optimizer_s,
                     fixed_memory_bytes=1000, meta={"processor": "Toy GPU", "command": "measure toy"})


# ------------------------------------------------------------------------------- eq. S1 on numbers
def test_noise_is_the_largest_gpu_pair_plus_the_largest_cpu_pair():
    noise = gpu_split.SplitNoise.from_pairs({"h200 vs h100": 2.5, "h200 vs h200": 4.0}, {"cpu twice": 6.0})
    assert (noise.gpu_pts, noise.gpu_pair, noise.cpu_pts, noise.cpu_pair) == (4.0, "h200 vs h200", 6.0, "cpu twice")
    assert noise.threshold_pts == 10.0
    assert not noise.exceeds(10.0) and not noise.exceeds(3.0)
    assert noise.exceeds(10.01)


def test_noise_needs_pairs_on_both_sides_and_differences_in_points():
    with pytest.raises(ValueError, match="no pair of repeated GPU measurements"):
        gpu_split.SplitNoise.from_pairs({}, {"c": 1.0})
    with pytest.raises(ValueError, match="no pair of repeated cpu measurements"):
        gpu_split.SplitNoise.from_pairs({"g": 1.0}, {})
    with pytest.raises(ValueError, match="cpu pair 'c' has difference -1.0; expected points >= 0"):
        gpu_split.SplitNoise.from_pairs({"g": 1.0}, {"c": -1.0})


def test_share_diff_is_the_largest_saved_share_difference_in_points():
    # a: compute_s = (10, 7, 5) -> saved (0, 30 %, 50 %); b: (10, 8, 6) -> (0, 20 %, 40 %)
    a = _toy([(1, 2, 0), (1, 1, 1), (1, 1, 1)], 1.0)
    b = _toy([(1, 1, 0), (1, 2, 1), (1, 2, 0)], 1.0)
    assert [a.compute_s(s) for s in range(3)] == [10, 7, 5] and [b.compute_s(s) for s in range(3)] == [10, 8, 6]
    assert gpu_split.share_diff_pts(a, b) == pytest.approx(10.0)
    assert gpu_split.share_diff_pts(b, a) == pytest.approx(10.0)
    with pytest.raises(ValueError, match="3 groups against 2"):
        gpu_split.share_diff_pts(a, _toy([(1, 1, 0), (1, 1, 1)], 1.0))


# ------------------------------------------------------------------------------- the replacement
def test_with_gpu_shares_keeps_the_total_and_bytes_and_takes_the_gpu_proportions():
    cpu = _toy([(2, 2, 0), (2, 2, 1)], 1.0)                          # compute_s(0) = 10
    gpu = _toy([(1, 3, 0), (2, 1, 1)], 2.0, device="cuda")           # 10: groups 8, optimizer 2
    split = gpu_split.GpuSplit(gpu, "dir/toy-bs4-cuda.json", 30.0, gpu_split.SplitNoise(1.0, "g", 2.0, "c"))
    assert split.optimizer_share == pytest.approx(0.2)
    same = gpu_split.with_gpu_shares(cpu, split, split.optimizer_share)
    assert [(g.forward_s, g.backward_weight_s, g.backward_input_s) for g in same.groups] == \
        [pytest.approx((1, 3, 0)), pytest.approx((2, 1, 1))]
    assert same.optimizer_s == pytest.approx(2.0) and same.compute_s(0) == pytest.approx(10.0)
    # the optimizer at half the share: the groups share the other 0.9 of 10 s as 1:3:0:2:1:1 of 8
    half = gpu_split.with_gpu_shares(cpu, split, 0.1)
    assert half.optimizer_s == pytest.approx(1.0)
    assert [g.forward_s for g in half.groups] == [pytest.approx(9 / 8), pytest.approx(18 / 8)]
    assert [g.activation_bytes for g in half.groups] == [100, 101] and half.fixed_memory_bytes == 1000
    assert "dir/toy-bs4-cuda.json" in half.sources["forward_s"] and half.meta["split_from"]["optimizer_share"] == 0.1
    with pytest.raises(ValueError, match="optimizer share must be in"):
        gpu_split.with_gpu_shares(cpu, split, 1.0)


# ------------------------------------------------------------------------------- the shipped tables
def _raw_shares(path) -> tuple[np.ndarray, float]:
    """Every group's (forward, weight-gradient, input-gradient) time and the optimizer step over
    their sum, read straight from a table's JSON."""
    d = json.loads(path.read_text())
    times = np.array([[g["forward_s"], g["backward_weight_s"], g["backward_input_s"]] for g in d["groups"]])
    total = times.sum() + d["optimizer_s"]
    return times / total, d["optimizer_s"] / total


def _shipped(model, batch, device):
    return TABLES_DIR / table_filename(model, batch, device)


def test_the_noise_and_the_switched_models_of_the_repository():
    noise = gpu_split.measured_noise(TABLES_DIR)
    assert noise.gpu_pts == pytest.approx(9.93, abs=0.01) and "resnet18-bs64" in noise.gpu_pair
    assert noise.cpu_pts == pytest.approx(10.52, abs=0.01) and "recommendation-bs1024" in noise.cpu_pair
    cpu = {m: CostTable.load(_shipped(m, SHIPPED[m], "cpu")) for m in SWITCHED + UNSWITCHED}
    assert sorted(gpu_splits(cpu, TABLES_DIR)) == sorted(SWITCHED)


@pytest.mark.parametrize("model", SWITCHED)
def test_a_switched_model_takes_the_gpu_measured_shares_at_its_reference_batch(model):
    want, want_opt = _raw_shares(gpu_split.GPU_SPLIT_DIR / table_filename(model, SHIPPED[model], "cuda"))
    cpu = CostTable.load(_shipped(model, SHIPPED[model], "cpu"))
    for gpu in GPUS:
        got, got_opt = _raw_shares(_shipped(model, SHIPPED[model], gpu))
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-15)
        assert got_opt == pytest.approx(want_opt, rel=1e-9)
        t = CostTable.load(_shipped(model, SHIPPED[model], gpu))
        assert t.meta["split_from"]["file"] == f"bench/results/cuda_check/{model}-bs{SHIPPED[model]}-cuda.json"
        assert "bench/results/cuda_check/" in t.sources["backward_weight_s"] and "../shared" not in json.dumps(t.sources)
        assert [g.activation_bytes for g in t.groups] == [g.activation_bytes for g in cpu.groups]


@pytest.mark.parametrize("model", SWITCHED)
def test_a_switched_model_at_other_batches_keeps_the_optimizer_time_and_the_group_proportions(model):
    """Eq. S2: the optimizer step takes the reference batch's time on the same GPU type, the
    groups split the rest of Gavel's iteration in the GPU measurement's proportions."""
    want, _ = _raw_shares(gpu_split.GPU_SPLIT_DIR / table_filename(model, SHIPPED[model], "cuda"))
    want = want / want.sum()
    for gpu in GPUS:
        ref = CostTable.load(_shipped(model, SHIPPED[model], gpu))
        for f in sorted(TABLES_DIR.glob(f"{model}-bs*-{gpu}.json")):
            t = CostTable.load(f)
            assert t.optimizer_s == pytest.approx(ref.optimizer_s, rel=1e-9), f.name
            got, _ = _raw_shares(f)
            np.testing.assert_allclose(got / got.sum(), want, rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("model", UNSWITCHED)
def test_an_unswitched_model_keeps_the_cpu_shares(model):
    want, want_opt = _raw_shares(_shipped(model, SHIPPED[model], "cpu"))
    for gpu in GPUS:
        got, got_opt = _raw_shares(_shipped(model, SHIPPED[model], gpu))
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-15)
        assert got_opt == pytest.approx(want_opt, rel=1e-9)
        assert "split_from" not in CostTable.load(_shipped(model, SHIPPED[model], gpu)).meta


@pytest.mark.data
def test_deriving_the_gavel_batches_reproduces_the_shipped_tables():
    require_data("gavel/simulation_throughputs.json")
    for t in derive_gavel_batches(list(SWITCHED), TABLES_DIR):
        assert t.to_dict() == CostTable.load(_shipped(t.model, t.batch_size, t.device)).to_dict(), \
            (t.model, t.batch_size, t.device)


def test_choose_gpu_split_switches_only_above_the_noise_and_where_a_measurement_exists(tmp_path):
    cpu = _toy([(1, 2, 0), (1, 1, 1), (1, 1, 1)], 1.0)                   # saved (0, 30 %, 50 %)
    gpu = _toy([(1, 1, 0), (1, 2, 1), (1, 2, 0)], 1.0, device="cuda")   # saved (0, 20 %, 40 %): D = 10
    gpu.save(tmp_path / table_filename("toy", 4, "cuda"))
    above = gpu_split.choose_gpu_split(cpu, gpu_split.SplitNoise(4.0, "g", 5.0, "c"), tmp_path)
    assert above is not None and above.diff_pts == pytest.approx(10.0) and above.file.endswith("toy-bs4-cuda.json")
    assert gpu_split.choose_gpu_split(cpu, gpu_split.SplitNoise(5.5, "g", 5.0, "c"), tmp_path) is None  # D < noise
    assert gpu_split.choose_gpu_split(cpu, gpu_split.SplitNoise(0.0, "g", 0.0, "c"), tmp_path / "none") is None


def test_with_gpu_shares_refuses_a_measurement_cut_into_other_groups():
    cpu = _toy([(2, 2, 0), (2, 2, 1)], 1.0)
    gpu = _toy([(1, 3, 0), (2, 1, 1), (1, 1, 1)], 2.0, device="cuda")
    split = gpu_split.GpuSplit(gpu, "dir/toy-bs4-cuda.json", 30.0, gpu_split.SplitNoise(1.0, "g", 2.0, "c"))
    with pytest.raises(ValueError, match="dir/toy-bs4-cuda.json: 3 groups against 2 in the cpu table"):
        gpu_split.with_gpu_shares(cpu, split, 0.2)


@pytest.mark.data
def test_an_optimizer_step_that_does_not_fit_in_gavels_iteration_is_an_error():
    """Eq. S2 at recommendation bs 512 on V100: Gavel's iteration is 1.755x shorter than at 1024,
    so an optimizer share of 0.9 at 1024 would be 1.58 of it."""
    from jigsaw_env.calibrate import _batch_optimizer_share

    require_data("gavel/simulation_throughputs.json")
    gpu = _toy([(1, 0, 0)], 9.0, device="cuda")
    split = gpu_split.GpuSplit(gpu, "f", 30.0, gpu_split.SplitNoise(1.0, "g", 2.0, "c"))
    assert split.optimizer_share == pytest.approx(0.9)
    with pytest.raises(ValueError, match="Recommendation bs 512 on v100: the reference batch's optimizer step"):
        _batch_optimizer_share(split, "Recommendation", 1024, 512, "v100", None)
    assert _batch_optimizer_share(split, "Recommendation", 1024, 2048, "v100", None) == \
        pytest.approx(0.9 * 0.07529 / 0.1339, rel=1e-3)
