"""bench.table_split: the SPB-relevant shape of a measured table against a shipped one, on
hand-built tables whose answers are computed by hand (eq. C1)."""
from __future__ import annotations

import json

import pytest

from bench.table_split import compare, main, saved_share
from jigsaw_env.cluster import GiB
from jigsaw_env.cost_table import CostTable, LayerGroup


def table(bw_input: float, *, device: str = "cuda", groups: int = 4, act: int = GiB) -> CostTable:
    gs = tuple(LayerGroup(f"g{i}", 1000, act, 1.0, 1.0, bw_input) for i in range(groups))
    return CostTable("_t_split", 8, device, gs, optimizer_s=0.0, fixed_memory_bytes=0)


def test_saved_share_is_one_minus_compute_ratio():
    # fwd 4 + weight grads of groups >= s (4 - s) + input grads of groups > s (3 - s): 11 - 2s
    assert saved_share(table(1.0)).tolist() == pytest.approx([0, 2 / 11, 4 / 11, 6 / 11])
    # no input-gradient time: 8 - s
    assert saved_share(table(0.0)).tolist() == pytest.approx([0, 1 / 8, 2 / 8, 3 / 8])


def test_compare_reports_deepest_start_mean_over_slots_and_byte_ratios():
    r = compare(table(1.0), table(0.0, device="v100", act=2 * GiB))
    assert r["deepest_start"] == 3  # level 3 of 3 on 4 groups: floor(3 * 4 / 4)
    assert r["saved_deepest_measured"] == pytest.approx(6 / 11)
    assert r["saved_deepest_shipped"] == pytest.approx(3 / 8)
    assert r["saved_mean_l3_measured"] == pytest.approx((0 + 2 + 4 + 6) / 11 / 4)  # slots 0, 1, 2, 3
    assert r["max_abs_diff"] == pytest.approx(3 * (2 / 11 - 1 / 8))  # grows with s: largest at s = 3
    assert r["activation_ratio"] == pytest.approx(0.5) and r["param_ratio"] == 1.0
    assert r["iteration_ms_measured"] == pytest.approx(11e3) and r["iteration_ms_shipped"] == pytest.approx(8e3)


def test_bad_inputs_name_the_file(tmp_path, capsys):
    with pytest.raises(ValueError, match="4 groups measured vs 3 shipped"):
        compare(table(1.0), table(1.0, groups=3))
    measured = tmp_path / "m.json"
    table(1.0).save(measured)
    with pytest.raises(SystemExit) as ei:
        main([str(measured), "--tables-dir", str(tmp_path)])
    assert ei.value.code == 2
    assert f"{measured}: no shipped table _t_split-bs8-v100.json in {tmp_path}" in capsys.readouterr().err
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"model": "x"}))
    with pytest.raises(SystemExit):
        main([str(broken)])
    assert str(broken) in capsys.readouterr().err


def test_markdown_row_from_the_command(tmp_path, capsys):
    table(1.0).save(tmp_path / "m.json")
    table(0.0, device="v100").save(tmp_path / "_t_split-bs8-v100.json")
    assert main([str(tmp_path / "m.json"), "--tables-dir", str(tmp_path), "--out", str(tmp_path / "o.md")]) == 0
    out = capsys.readouterr().out
    assert "| _t_split (8) | 4 | 11000.00 / 8000.00 | 54.5 % / 37.5 % (s=3) | 27.3 % / 18.8 % | 17.0 pts |" in out
    assert (tmp_path / "o.md").read_text() == out
