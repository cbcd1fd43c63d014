"""``jigsaw tables``: the cost tables the simulator uses.

* ``list``: every (model, batch size, device) with a table (shipped, or registered with
  ``--tables``), with its full-backprop iteration time alone and where the time comes from.
* ``show MODEL --batch-size B --gpu-type T``: one table's numbers as the simulator reads them:
  ``iteration_s`` (full backprop alone, one GPU), the mean iteration time and process peak per SPB
  level and pattern, bytes per sync, each layer group, and the source of every number.
"""
from __future__ import annotations

import json
from dataclasses import asdict

from .cost_table import (CostTable, DEVICE_TYPES, available_tables, check_table_exists, get_table,
                         register_tables_dir)
from .spb import Pattern, SPBConfig, job_profile
from .network import CROSS_NODE, INTRA_NODE


def spb_rows(table: CostTable, workers: int, spb: SPBConfig = SPBConfig()) -> list[dict]:
    """Per SPB level and pattern, a job of ``workers`` workers on one node (intra-node link):
    mean iteration time over the cycle (s: slowest worker + sync, eq. T1), its ratio to full
    backprop, mean bytes on the wire per iteration, the largest process peak (bytes) and eta."""
    link = INTRA_NODE if workers <= 8 else CROSS_NODE
    full = job_profile(table, 0, Pattern.ROTATING, workers, link, spb)
    full_s = float(full.dedicated_iteration_s().mean())
    rows = []
    for level in range(spb.max_level + 1):
        for pattern in ((Pattern.ROTATING,) if level == 0 else (Pattern.ROTATING, Pattern.STATIC)):
            p = job_profile(table, level, pattern, workers, link, spb)
            it = float(p.dedicated_iteration_s().mean())
            rows.append({"level": level, "pattern": pattern.value, "workers": workers, "period": p.period,
                         "iteration_s": it, "relative_to_full": it / full_s,
                         "compute_s_mean": float(p.compute_s.mean()), "sync_s_mean": float(p.comm_s.mean()),
                         "bytes_per_iteration": float(p.bytes.mean()), "peak_bytes_max": float(p.peak_bytes.max()),
                         "peak_bytes_min": float(p.peak_bytes.min()), "eta": float(p.eta)})
    return rows


def show(model: str, batch_size: int, device: str, workers: tuple[int, ...] = (1, 4)) -> dict:
    """The record ``jigsaw tables show`` prints (see the module docstring)."""
    check_table_exists(model, batch_size, device)
    t = get_table(model, batch_size, device)
    return {"model": t.model, "batch_size": t.batch_size, "gpu_type": t.device, "digest": t.digest(),
            "iteration_s": t.iteration_time_s(), "compute_s_full": t.compute_s(0),
            "optimizer_s": t.optimizer_s, "fixed_memory_bytes": t.fixed_memory_bytes,
            "process_peak_bytes_full": t.process_peak_bytes(0), "param_bytes": t.param_bytes_total,
            "groups": [asdict(g) for g in t.groups],
            "spb": {str(w): spb_rows(t, w) for w in workers},
            "sources": dict(t.sources), "eta": dict(t.meta.get("eta") or {}),
            "eta_source": t.meta.get("eta_source")}


def list_tables() -> list[dict]:
    out = []
    for model, batch, device in available_tables():
        t = get_table(model, batch, device)
        out.append({"model": model, "batch_size": batch, "gpu_type": device, "iteration_s": t.iteration_time_s(),
                    "groups": t.num_groups, "kind": t.meta.get("kind", "measured" if device == "cpu" else ""),
                    "anchor": t.sources.get("anchor", "")})
    return out


def _run_list(args) -> int:
    if args.tables:
        register_tables_dir(args.tables)
    rows = list_tables()
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'model':<18}{'batch':>6}  {'type':<5}{'iteration (ms)':>15}{'groups':>7}  anchor")
    for r in rows:
        anchor = r["anchor"].split(";")[0][:70]
        print(f"{r['model']:<18}{r['batch_size']:>6}  {r['gpu_type']:<5}{1e3 * r['iteration_s']:>15.3f}"
              f"{r['groups']:>7}  {anchor}")
    return 0


def _run_show(args) -> int:
    if args.tables:
        register_tables_dir(args.tables)
    rec = show(args.model, args.batch_size, args.gpu_type)
    if args.json:
        print(json.dumps(rec, indent=1, default=str))
        return 0
    print(f"{rec['model']} at batch {rec['batch_size']} on {rec['gpu_type']} (table {rec['digest']})")
    print(f"  iteration alone, full backprop, 1 GPU: {1e3 * rec['iteration_s']:.3f} ms; process peak "
          f"{rec['process_peak_bytes_full'] / 2**30:.2f} GiB; parameters {rec['param_bytes'] / 2**20:.1f} MiB")
    for w, rows in rec["spb"].items():
        print(f"  {w} worker(s), one node: level/pattern  iteration (ms)  vs full  MB on the wire  peak GiB (max/min)  eta")
        for r in rows:
            print(f"    {r['level']}/{r['pattern']:<9} {1e3 * r['iteration_s']:>14.3f} {r['relative_to_full']:>8.3f}"
                  f" {r['bytes_per_iteration'] / 1e6:>12.2f} {r['peak_bytes_max'] / 2**30:>9.2f}/"
                  f"{r['peak_bytes_min'] / 2**30:.2f} {r['eta']:>6.3f}")
    print("  sources:")
    for k, v in rec["sources"].items():
        print(f"    {k}: {v}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("tables", help="the cost tables: list them, show one",
                              description="The cost tables the simulator uses (docs/cost_tables.md).")
    sub = p.add_subparsers(dest="tables_command", metavar="{list,show}")
    sub.required = True
    ls = sub.add_parser("list", help="every (model, batch size, device) with a table")
    ls.add_argument("--tables", default=None, help="folder of extra cost tables (*.json) to include")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=_run_list)
    sh = sub.add_parser("show", help="one table as the simulator reads it, per SPB level and pattern")
    sh.add_argument("model")
    sh.add_argument("--batch-size", type=int, required=True)
    sh.add_argument("--gpu-type", required=True, help=f"one of {', '.join(DEVICE_TYPES)}")
    sh.add_argument("--tables", default=None, help="folder of extra cost tables (*.json) to include")
    sh.add_argument("--json", action="store_true")
    sh.set_defaults(func=_run_show)
