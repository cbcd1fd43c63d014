"""Compare the SPB-relevant shape of measured cost tables with the shipped ones.

The shipped GPU tables (k80 / p100 / v100) are a measured per-group split of forward,
weight-gradient and input-gradient time (the CPU's, or the GPU's where the two differ by more than
the noise: docs/cost_tables.md section 3a), scaled to Gavel's measured whole-iteration throughput.
SPB's speed-up depends only on that split: a worker starting backprop at group ``s`` takes
``compute_s(s) / compute_s(0)`` of a full iteration (eq. C1). A table measured on a real GPU
(``jigsaw calibrate --device cuda``) tests whether the shipped split carries over.

For every pair (measured table, shipped table of the same model and batch size on ``--against``)
this prints, per model:

* ``saved@s``: the share of a full iteration's compute a worker saves at the deepest start of
  SPB level 3, ``1 - compute_s(s) / compute_s(0)``, measured vs shipped (percentage points);
* ``max |d|``: the largest difference of that share over every start group (points);
* ``mean@L3``: the mean share saved over level 3's start slots (the rotating pattern's average);
* activation and parameter bytes of the measured table over the shipped (ratios; 1.000 = equal).

Usage::

    python -m bench.table_split bench/results/cuda_check/*.json [--against v100] [--out FILE.md]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from jigsaw_env.cost_table import TABLES_DIR, CostTable, table_filename
from jigsaw_env.gpu_split import saved_share
from jigsaw_env.spb import SPBConfig


def compare(measured: CostTable, shipped: CostTable, spb: SPBConfig = SPBConfig()) -> dict:
    """One row of the comparison (shares as fractions, byte ratios measured / shipped)."""
    if measured.num_groups != shipped.num_groups:
        raise ValueError(f"{measured.model}: {measured.num_groups} groups measured vs {shipped.num_groups} shipped; "
                         "the tables cut the model differently")
    a, b = saved_share(measured), saved_share(shipped)
    slots = spb.start_slots(spb.max_level, measured.num_groups)
    deepest = slots[-1]
    am, bm = measured.arrays(), shipped.arrays()
    return {
        "model": measured.model, "batch_size": measured.batch_size, "groups": measured.num_groups,
        "measured_on": measured.meta.get("processor", measured.device), "against": shipped.device,
        "iteration_ms_measured": 1e3 * float(measured.plain_compute_s(0)),
        "iteration_ms_shipped": 1e3 * float(shipped.plain_compute_s(0)),
        "deepest_start": int(deepest),
        "saved_deepest_measured": float(a[deepest]), "saved_deepest_shipped": float(b[deepest]),
        "saved_mean_l3_measured": float(a[list(slots)].mean()), "saved_mean_l3_shipped": float(b[list(slots)].mean()),
        "max_abs_diff": float(np.abs(a - b).max()),
        "activation_ratio": float(am["activation_bytes"].sum() / bm["activation_bytes"].sum()),
        "param_ratio": float(am["param_bytes"].sum() / bm["param_bytes"].sum()),
    }


def to_markdown(rows: list[dict]) -> str:
    head = ("| model (batch) | groups | iteration ms: measured / shipped | saved at level 3's deepest start: "
            "measured / shipped | mean over level-3 slots: measured / shipped | max abs diff over starts | "
            "activation bytes ratio | param bytes ratio |\n|---|---|---|---|---|---|---|---|\n")
    lines = [f"| {r['model']} ({r['batch_size']}) | {r['groups']} | {r['iteration_ms_measured']:.2f} / "
             f"{r['iteration_ms_shipped']:.2f} | {100 * r['saved_deepest_measured']:.1f} % / "
             f"{100 * r['saved_deepest_shipped']:.1f} % (s={r['deepest_start']}) | "
             f"{100 * r['saved_mean_l3_measured']:.1f} % / {100 * r['saved_mean_l3_shipped']:.1f} % | "
             f"{100 * r['max_abs_diff']:.1f} pts | {r['activation_ratio']:.3f} | {r['param_ratio']:.3f} |"
             for r in rows]
    return head + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.table_split", description=__doc__.split("\n\n")[0])
    p.add_argument("tables", nargs="+", help="measured cost-table JSON files")
    p.add_argument("--against", default="v100", help="device of the shipped tables to compare with (default v100)")
    p.add_argument("--tables-dir", default=str(TABLES_DIR), help="folder of the shipped tables")
    p.add_argument("--out", default=None, help="also write the markdown table here")
    a = p.parse_args(argv)
    rows = []
    for f in a.tables:
        try:
            m = CostTable.load(f)
        except (OSError, ValueError) as e:
            p.error(f"{f}: {e}")
        ref = Path(a.tables_dir) / table_filename(m.model, m.batch_size, a.against)
        if not ref.is_file():
            p.error(f"{f}: no shipped table {ref.name} in {a.tables_dir} to compare with "
                    f"(model {m.model!r}, batch {m.batch_size}, device {a.against!r})")
        try:
            rows.append(compare(m, CostTable.load(ref)))
        except ValueError as e:
            p.error(f"{f}: {e}")
    md = to_markdown(rows)
    print(md, end="")
    if a.out:
        Path(a.out).write_text(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
