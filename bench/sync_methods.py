"""The two SPB sync methods measured on this machine: ring over all workers vs reduce+broadcast.

    nice -n 10 python -m bench.sync_methods --out bench/results/sync_methods    # about a minute, 2 cores
    python -m bench.sync_methods --worlds 2 --sizes-kb 4 --repeats 3 --out /tmp/sm   # smoke run

For every world size ``W`` of ``--worlds`` (gloo processes on this machine, one thread each), every
contributor count ``C = 1..W`` and every group size ``M`` of ``--sizes-kb`` (float32), one layer
group is synced by the executor's own code (``SPBTrainer._sync_grads`` on a plan of
``plan_sync(..., method=...)``) with each method:

* ``ring``: all-reduce over all ``W`` ranks, the ``W - C`` non-contributors sending ``-0.0``;
* ``reduce_broadcast``: reduce over the ``C`` contributors to the lowest one, then broadcast to all.

Timing: every rank waits at a barrier, syncs, and the slowest rank's seconds (an all-reduce MAX of
the per-rank times, outside the timed part) is one sample; ``--warmup`` samples are dropped and the
median of ``--repeats`` is reported. The methods and sizes are interleaved, so load drift hits them
alike. On 2 cores with ``W > 2`` the processes share cores, so these are loopback-and-scheduler
times, not a network's.

The alpha-beta model (docs/spb_model.md eqs. N1, N2, N4) is then fitted to all the medians of this
run, alpha and 1/beta by non-negative least squares on relative errors, and the report says, per
cell, which method was measured faster, which one N4 picks with the fitted link, and by how much
the measured times differ. Writes ``sync_methods.json`` (every sample) and ``sync_methods.md``.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("ring", "reduce_broadcast")


def _worker(rank: int, world: int, port: int, sizes: list[int], repeats: int, warmup: int, q) -> None:
    import torch
    import torch.distributed as dist

    from jigsaw_executor.spb_worker import SPBTrainer, plan_sync

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    try:
        out = {}
        for numel in sizes:
            model = torch.nn.Module()
            model.groups = torch.nn.ModuleList([torch.nn.Linear(numel, 1, bias=False)])
            trainer = SPBTrainer(model, torch.optim.SGD(model.parameters(), lr=0.1), timeout_s=120,
                                 sync_initial_state=False, precreate_subgroups=False)
            p = trainer.group_params[0][0]
            g = torch.Generator().manual_seed(rank)
            grad = torch.randn(p.shape, generator=g)
            for c in range(1, world + 1):
                # contributors: the lowest c ranks (start group 0), the others skip the group (start 1)
                starts = [0 if r < c else 1 for r in range(world)]
                plans = {m: plan_sync(starts, trainer.param_bytes + [4], method=m)[:1] for m in METHODS}
                for m in METHODS:
                    trainer._ensure_subgroups(plans[m])
                samples = {m: [] for m in METHODS}
                for i in range(warmup + repeats):
                    for m in (METHODS if i % 2 == 0 else METHODS[::-1]):
                        p.grad = grad.clone() if rank < c else None
                        dist.barrier()
                        t0 = time.perf_counter()
                        trainer._sync_grads(plans[m], trainer._new_acc())
                        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
                        if i >= warmup:
                            samples[m].append(float(dt[0]))
                out[(numel * 4, c)] = samples
        if rank == 0:
            q.put(out)
    finally:
        dist.destroy_process_group()


def measure(world: int, sizes_bytes: list[int], repeats: int, warmup: int) -> dict:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, world, port, [b // 4 for b in sizes_bytes], repeats, warmup, q))
             for r in range(world)]
    for p in procs:
        p.start()
    try:
        res = q.get(timeout=900)
    finally:
        for p in procs:
            p.join(timeout=60)
    return res


def fit_link(cells: list[dict]) -> tuple[float, float]:
    """alpha (s) and beta (B/s) of eqs. N1/N2 fitted to the measured medians, NNLS on relative error."""
    import numpy as np
    from scipy.optimize import nnls

    rows, y = [], []
    for c in cells:
        W, C, M = c["world"], c["contributors"], c["bytes"]
        for m in METHODS:
            k = (2 * (W - 1), 2 * (W - 1) * M / W) if m == "ring" else ((C + W - 2), (C + W - 2) * M)
            t = c[m]["median_s"]
            rows.append([k[0] / t, k[1] / t])
            y.append(1.0)
    x, _ = nnls(np.array(rows), np.array(y))
    return float(x[0]), float(1.0 / x[1]) if x[1] > 0 else float("inf")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sync_methods", description=__doc__.splitlines()[0])
    p.add_argument("--worlds", default="2,3,4", help="comma-separated world sizes (gloo processes)")
    p.add_argument("--sizes-kb", default="1,16,256,2048", help="comma-separated group sizes in KiB (float32)")
    p.add_argument("--repeats", type=int, default=15, help="timed samples per cell and method (median reported)")
    p.add_argument("--warmup", type=int, default=3, help="samples dropped first")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "sync_methods"), help="output folder")
    a = p.parse_args(argv)
    try:
        worlds = [int(w) for w in a.worlds.split(",") if w.strip()]
        sizes = [int(float(k) * 1024) // 4 * 4 for k in a.sizes_kb.split(",") if k.strip()]
    except ValueError:
        raise SystemExit("bench.sync_methods: --worlds and --sizes-kb take comma-separated numbers") from None
    if not worlds or min(worlds) < 2 or not sizes or min(sizes) < 4 or a.repeats < 1 or a.warmup < 0:
        raise SystemExit("bench.sync_methods: need --worlds >= 2, --sizes-kb >= 0.004, --repeats >= 1, --warmup >= 0")
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    from jigsaw_env.network import Link, group_sync

    torch.set_num_threads(1)
    cmd = "python -m bench.sync_methods " + " ".join(argv if argv is not None else sys.argv[1:])
    t0 = time.perf_counter()
    load0 = os.getloadavg()[0]
    cells = []
    for w in worlds:
        res = measure(w, sizes, a.repeats, a.warmup)
        for (nbytes, c), samples in sorted(res.items()):
            cell = {"world": w, "contributors": c, "bytes": nbytes}
            for m in METHODS:
                cell[m] = {"median_s": statistics.median(samples[m]), "samples_s": samples[m]}
            cells.append(cell)
    wall = time.perf_counter() - t0
    alpha, beta = fit_link(cells)
    link = Link(alpha, beta)
    agree = 0
    for c in cells:
        W, C, M = c["world"], c["contributors"], c["bytes"]
        rt, rbt = c["ring"]["median_s"], c["reduce_broadcast"]["median_s"]
        c["measured_faster"] = "ring" if rt < rbt else "reduce_broadcast"
        c["n4_choice"] = group_sync(C, W, float(M), link)[2]
        c["predicted_s"] = {m: group_sync(C, W, float(M), link, method=m)[0] for m in METHODS}
        c["slower_by"] = max(rt, rbt) / min(rt, rbt) - 1.0
        agree += c["measured_faster"] == c["n4_choice"]
    doc = {"command": cmd, "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
           "torch": torch.__version__, "python": platform.python_version(),
           "loadavg_1min_start_end": [load0, os.getloadavg()[0]], "wall_s": wall,
           "setup": {"worlds": worlds, "sizes_bytes": sizes, "repeats": a.repeats, "warmup": a.warmup,
                     "backend": "gloo", "threads_per_process": 1, "dtype": "float32",
                     "code": "jigsaw_executor.spb_worker.SPBTrainer._sync_grads on plan_sync(..., method=m)"},
           "fitted_link": {"alpha_s": alpha, "bandwidth_Bps": beta,
                           "fit": "NNLS of eqs. N1/N2 on relative error over every cell's two medians"},
           "n4_agrees_with_measured": [agree, len(cells)], "cells": cells}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sync_methods.json").write_text(json.dumps(doc, indent=1) + "\n")
    md = markdown(doc)
    (out / "sync_methods.md").write_text(md)
    print(md)
    print(f"wrote {out / 'sync_methods.json'} and {out / 'sync_methods.md'} ({wall:.0f} s)")
    return 0


def markdown(doc: dict) -> str:
    fl = doc["fitted_link"]
    agree, n = doc["n4_agrees_with_measured"]
    lines = [
        "# SPB sync methods measured: ring over all workers vs reduce+broadcast over the contributors", "",
        f"Command: `{doc['command']}` ({doc['date_utc']}, wall {doc['wall_s']:.0f} s, {doc['cpus']} CPUs, "
        f"load average {doc['loadavg_1min_start_end'][0]:.2f} -> {doc['loadavg_1min_start_end'][1]:.2f}).",
        f"gloo, one thread per process, float32, the executor's own sync code; median of "
        f"{doc['setup']['repeats']} samples (slowest rank, after {doc['setup']['warmup']} warm-up samples). "
        "`ring`: all-reduce over all W ranks, non-contributors sending -0.0; `r+b`: reduce to the lowest "
        "contributor, then broadcast to all W.", "",
        f"Link fitted to these medians (eqs. N1/N2, NNLS on relative error): alpha = {fl['alpha_s'] * 1e6:.1f} us, "
        f"beta = {fl['bandwidth_Bps'] / 1e9:.3f} GB/s. N4 with this link picks the measured faster method in "
        f"{agree} of {n} cells.", "",
        "| W | C | group bytes | ring ms | r+b ms | faster (measured) | slower by | N4 pick | N4 ring / r+b ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in doc["cells"]:
        short = {"ring": "ring", "reduce_broadcast": "r+b"}
        pr = c["predicted_s"]
        lines.append(f"| {c['world']} | {c['contributors']} | {c['bytes']:,} | {c['ring']['median_s'] * 1e3:.3f} | "
                     f"{c['reduce_broadcast']['median_s'] * 1e3:.3f} | {short[c['measured_faster']]} | "
                     f"{c['slower_by'] * 100:.0f} % | {short[c['n4_choice']]} | "
                     f"{pr['ring'] * 1e3:.3f} / {pr['reduce_broadcast'] * 1e3:.3f} |")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
