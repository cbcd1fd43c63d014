"""`jigsaw tables list|show`: the numbers the simulator reads, with known answers from the tables."""
from __future__ import annotations

import json

import pytest

from jigsaw_env.cli import main
from jigsaw_env.cost_table import available_tables, get_table


def test_list_names_every_table(capsys):
    assert main(["tables", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {(r["model"], r["batch_size"], r["gpu_type"]) for r in rows} == set(available_tables())
    r18 = next(r for r in rows if (r["model"], r["batch_size"], r["gpu_type"]) == ("resnet18", 64, "v100"))
    assert r18["iteration_s"] == get_table("resnet18", 64, "v100").compute_s(0)


def test_show_is_anchored_and_spb_rows_follow_the_model(capsys):
    assert main(["tables", "show", "resnet18", "--batch-size", "64", "--gpu-type", "v100", "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)
    t = get_table("resnet18", 64, "v100")
    # anchored: full backprop alone is 1 / Gavel's measured throughput at this batch size
    assert rec["iteration_s"] == pytest.approx(1.0 / t.meta["gavel_throughput_it_s"], rel=1e-9)
    assert rec["process_peak_bytes_full"] == t.fixed_memory_bytes + sum(g.activation_bytes for g in t.groups)
    one, four = rec["spb"]["1"], rec["spb"]["4"]
    assert (one[0]["level"], one[0]["pattern"], one[0]["relative_to_full"]) == (0, "rotating", 1.0)
    # one worker: level 3 rotating cycles through lighter starts (shorter mean iteration); static
    # keeps the single worker at slot 0 (full depth)
    l3 = {r["pattern"]: r for r in one if r["level"] == 3}
    assert l3["rotating"]["relative_to_full"] < 1.0 and l3["static"]["relative_to_full"] == 1.0
    # four workers static at level 3: the lightest worker's peak is below the full-depth peak
    s3 = next(r for r in four if (r["level"], r["pattern"]) == (3, "static"))
    assert s3["peak_bytes_min"] < s3["peak_bytes_max"] == rec["process_peak_bytes_full"]
    assert set(rec["sources"]) >= {"forward_s", "anchor", "fixed_memory_bytes"}


@pytest.mark.parametrize("argv,message", [
    (["resnet18", "--batch-size", "7", "--gpu-type", "v100"],
     "no cost table for model 'resnet18' at batch size 7 on v100; allowed: [16, 32, 64, 128, 256]"),
    (["resnet18", "--batch-size", "64", "--gpu-type", "a100"],
     "no cost table for model 'resnet18' on 'a100'; allowed GPU types: ['cpu', 'k80', 'p100', 'v100']"),
])
def test_show_bad_inputs_are_one_line(argv, message, capsys):
    assert main(["tables", "show", *argv]) == 2
    assert capsys.readouterr().err.strip() == f"jigsaw tables: error: {message}"
