"""Does a cost table's per-group split depend on the batch size? And how good is eq. B1?

Two checks behind docs/cost_tables.md section 9:

1. ``split``: cpu tables of one model measured at several batch sizes (``jigsaw calibrate --device
   cpu``, here with the zoo's torch modules); for each, the share of a full iteration's compute a
   worker saves when it starts backprop at group ``s``, ``1 - compute_s(s) / compute_s(0)`` (eq.
   C1: the only thing SPB's speed-up takes from a table), compared with the model's reference batch
   size (the largest difference over every start, and at level 3's deepest start), and the
   activation bytes per sample over the reference's. A table measured twice at the same batch size
   gives the noise of the comparison.
2. ``rule``: eq. B1 (the nearest batch size's table, scaled with the exponent of the bracketing
   pair) against Gavel's own measurements, leaving each Gavel batch size out in turn.

Usage::

    python -m bench.batch_split split TABLE.json ... [--against DIR] [--out FILE.md]
    python -m bench.batch_split rule [--out FILE.md]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from bench.table_split import saved_share
from jigsaw_env.cost_table import (REFERENCE_BATCH_SIZES, TABLES_DIR, CostTable, get_table, scale_to_batch,
                                   table_filename)
from jigsaw_env.spb import SPBConfig


def split_rows(tables: list[CostTable], against: Path = TABLES_DIR, spb: SPBConfig = SPBConfig()) -> list[dict]:
    """One row per table: its saved shares against the model's reference-batch cpu table in
    ``against`` (fractions), activation bytes per sample over the reference's."""
    rows = []
    for t in sorted(tables, key=lambda t: (t.model, t.batch_size)):
        ref = CostTable.load(Path(against) / table_filename(t.model, REFERENCE_BATCH_SIZES[t.model], t.device))
        a, b = saved_share(t), saved_share(ref)
        slots = list(spb.start_slots(spb.max_level, t.num_groups))
        act = t.arrays()["activation_bytes"].sum() / t.batch_size
        act_ref = ref.arrays()["activation_bytes"].sum() / ref.batch_size
        rows.append({"model": t.model, "batch_size": t.batch_size, "reference_batch_size": ref.batch_size,
                     "iteration_s": t.plain_compute_s(0), "optimizer_share": t.optimizer_s / t.plain_compute_s(0),
                     "optimizer_share_reference": ref.optimizer_s / ref.plain_compute_s(0),
                     "deepest_start": slots[-1], "saved_deepest": float(a[slots[-1]]),
                     "saved_deepest_reference": float(b[slots[-1]]),
                     "saved_mean_l3": float(a[slots].mean()), "saved_mean_l3_reference": float(b[slots].mean()),
                     "max_abs_diff": float(np.abs(a - b).max()),
                     "activation_per_sample_ratio": float(act / act_ref),
                     "loadavg": t.meta.get("loadavg_1min_start_end")})
    return rows


def rule_rows(gpus: tuple[str, ...] = ("k80", "p100", "v100")) -> list[dict]:
    """Eq. B1 against Gavel, leaving one batch size out: for every Gavel model, GPU type and batch
    size ``b`` Gavel measured, the shipped tables of the model's other Gavel batch sizes give
    ``b``'s table by eq. B1 (nearest of them, exponent from the pair bracketing ``b``), compared
    with Gavel's ``1 / throughput`` at ``b``. ``linear`` is the same with exponent 1."""
    from jigsaw_env import table_builder as tb
    from jigsaw_env.cost_table import batch_exponent, nearest_batch_size
    from jigsaw_env.zoo import MODELS

    rows = []
    for m in sorted(REFERENCE_BATCH_SIZES):
        job = MODELS[m].gavel_job
        if job is None:
            continue
        sizes = tb.gavel_batch_sizes(job, gpus)
        for g in gpus:
            times = {b: get_table(m, b, g).compute_s(0) for b in sizes}
            for b in sizes:
                rest = {x: t for x, t in times.items() if x != b}
                near = nearest_batch_size(b, list(rest))
                alpha, pair = batch_exponent(b, rest)
                pred = scale_to_batch(get_table(m, near, g), b, alpha).compute_s(0)
                lin = scale_to_batch(get_table(m, near, g), b, 1.0).compute_s(0)
                rows.append({"model": m, "gpu": g, "from": near, "to": b, "alpha": alpha, "pair": pair,
                             "predicted_s": pred, "linear_s": lin, "gavel_s": times[b],
                             "error": pred / times[b] - 1.0, "linear_error": lin / times[b] - 1.0})
    return rows


def render_split(rows: list[dict]) -> str:
    out = ["| model | batch (ref) | iteration s (cpu) | optimizer share (ref) | saved at L3's deepest start (ref) "
           "| mean over L3 slots (ref) | max abs diff over starts | activation bytes per sample / ref | load avg |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['model']} | {r['batch_size']} ({r['reference_batch_size']}) | {r['iteration_s']:.4g} | "
                   f"{100 * r['optimizer_share']:.1f} % ({100 * r['optimizer_share_reference']:.1f} %) | "
                   f"{100 * r['saved_deepest']:.1f} % ({100 * r['saved_deepest_reference']:.1f} %, s={r['deepest_start']}) | "
                   f"{100 * r['saved_mean_l3']:.1f} % ({100 * r['saved_mean_l3_reference']:.1f} %) | "
                   f"{100 * r['max_abs_diff']:.1f} pts | {r['activation_per_sample_ratio']:.3f} | {r['loadavg']} |")
    return "\n".join(out)


def render_rule(rows: list[dict]) -> str:
    out = ["| model | GPU | batch b (left out) | from | alpha (pair) | eq. B1 s | Gavel 1/throughput s | error | "
           "exponent 1: error |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['model']} | {r['gpu']} | {r['to']} | {r['from']} | {r['alpha']:.3f} {r['pair']} | "
                   f"{r['predicted_s']:.4g} | {r['gavel_s']:.4g} | {100 * r['error']:+.1f} % | "
                   f"{100 * r['linear_error']:+.1f} % |")
    out.append("")
    for key, what in (("error", "eq. B1"), ("linear_error", "exponent 1 (time proportional to the batch)")):
        errs = np.abs([r[key] for r in rows])
        inner = np.abs([r[key] for r in rows if r["pair"][0] < r["to"] < r["pair"][1]])
        out.append(f"{what}: {len(rows)} predictions, median |error| {100 * np.median(errs):.1f} %, 90th percentile "
                   f"{100 * np.percentile(errs, 90):.1f} %, max {100 * errs.max():.1f} %; the {len(inner)} inside the "
                   f"pair's range: median {100 * np.median(inner):.1f} %, max {100 * inner.max():.1f} %")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.batch_split", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("split", help="per-group split of cpu tables at several batch sizes")
    s.add_argument("tables", nargs="+", type=Path)
    s.add_argument("--against", type=Path, default=TABLES_DIR, help="folder of the reference-batch cpu tables")
    s.add_argument("--out", type=Path, default=None)
    r = sub.add_parser("rule", help="eq. B1 against Gavel's throughputs, each batch size left out in turn")
    r.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    if a.what == "split":
        text = render_split(split_rows([CostTable.load(p) for p in a.tables], a.against))
    else:
        text = render_rule(rule_rows())
    print(text)
    if a.out:
        a.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
