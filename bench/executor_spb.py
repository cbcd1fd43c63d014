"""Live SPB executor on this CPU: bytes, backward time and activation memory, SPB vs full backprop.

    python -m bench.executor_spb                       # resnet18 bs 8 + tiny_transformer bs 32, 4 workers
    python -m bench.executor_spb --models tiny_cnn --world 4 --iterations 12 --out /tmp/spb.json

For every model: full backprop (level 0) and the half level (level 2) with the rotating and the
static pattern, each a real ``jigsaw_executor.launcher.run_job_local`` job of ``--world`` gloo processes
(one thread each; on a 2-core machine 4 processes share 2 cores, so their times are noisy) on the
same data. Reported per configuration:

* bytes/iter: gradient bytes on the wire per iteration, measured (sum over ranks of the bytes each
  counted at its collective calls) and predicted (``jigsaw_env.spb.iteration_cost(table, starts,
  INTRA_NODE).bytes`` on an exact-bytes cost table of the same model), mean over iterations;
* lo/iter: bytes counted at the transport, by the kernel: the loopback interface's transmit
  counter (``/proc/net/dev``) read by rank 0 just before and after its gradient sync, mean over
  iterations. It holds every process's loopback traffic in that window (the other ranks' too,
  which is the point: the job's whole exchange), TCP/IP headers, and whatever else the machine
  sends over loopback meanwhile (``jigsaw_executor.transport``); ``job lo/f``: the loopback count
  over the whole job (start to exit of the workers) over the formula's bytes of the job (every
  iteration's plus the initial state broadcast);
* bwd ms (job): mean per-worker backward time in the job, over ranks and iterations after warm-up;
* bwd ms (alone): the same mean built from backward times measured one process at a time (a
  single process, no other worker running, median of ``--repeats`` per start group), i.e. without
  the CPU contention of the 4-process job;
* table: what the simulator's cost table predicts for the same change, the mean per-worker backward
  over the same starts relative to full backprop (eq. C1 without forward and optimizer; the CPU
  table at this batch size, else the model's shipped one);
* peak act: per rank, the largest saved-for-backward bytes over the iterations (exact count),
  against ``CostTable.activation_peak_bytes(min start of that rank over the cycle)`` (eq. M1).

Prints a table and writes everything as JSON (``--out``).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

CONFIGS = (("full", 0, "rotating"), ("L2 rotating", 2, "rotating"), ("L2 static", 2, "static"))
DEFAULT_BATCH = {"resnet18": 8, "tiny_transformer": 32, "tiny_cnn": 32, "tiny_mlp": 32, "tiny_bn_cnn": 32}


def _single_process_times(model_name: str, batch_size: int, starts: set[int], repeats: int, seed: int) -> dict:
    """Median forward / backward seconds per start group, one process, one thread."""
    import torch

    from jigsaw_executor.data import default_source, make_batch_fn
    from jigsaw_executor.models import build_executor_model
    from jigsaw_executor.spb_worker import SPBTrainer

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    model = build_executor_model(model_name).train()
    trainer = SPBTrainer(model, model.make_optimizer(), measure_activations=False)
    batch = make_batch_fn(default_source(model_name), model, seed, 1, batch_size)
    fw: dict[int, list[float]] = {s: [] for s in starts}
    bw: dict[int, list[float]] = {s: [] for s in starts}
    for i in range(repeats + 1):  # round-robin over the starts, so load drift hits them alike
        for s in sorted(starts):
            rep = trainer.step(batch(i, 0), i, starts=(s,))
            if i:  # first round is warm-up
                fw[s].append(rep.forward_s)
                bw[s].append(rep.backward_s)
    return {s: {"forward_s": statistics.median(fw[s]), "backward_s": statistics.median(bw[s]),
                "backward_s_all": bw[s]} for s in sorted(starts)}


def run_model(model_name: str, world: int, iterations: int, warmup: int, batch_size: int, repeats: int,
              seed: int, timeout_s: float) -> dict:
    import numpy as np

    from jigsaw_env.network import INTRA_NODE
    from jigsaw_env.spb import SPBConfig, iteration_cost
    from jigsaw_executor.launcher import Decision, run_job_local
    from jigsaw_executor.models import build_executor_model, exact_bytes_table

    import torch

    torch.manual_seed(seed)
    table = exact_bytes_table(build_executor_model(model_name), batch_size)
    spb = SPBConfig()
    rows = []
    jobs = {}
    for label, level, pattern in CONFIGS:
        t0 = time.perf_counter()
        res = run_job_local(model_name, world, iterations, Decision(level, pattern), batch_size=batch_size,
                            seed=seed, timeout_s=timeout_s, job_timeout_s=max(600.0, 20 * timeout_s),
                            count_loopback=True)
        wall = time.perf_counter() - t0
        assert res.identical_replicas, f"{model_name} {label}: replicas differ"
        its = range(iterations)
        starts = [res.reports[0][i].starts for i in its]
        measured = res.bytes_per_iteration()
        predicted = [iteration_cost(table, s, INTRA_NODE).bytes for s in starts]
        loopback = [res.reports[0][i].loopback_bytes for i in its]  # None off Linux
        formula_job = sum(measured) + sum(res.setup_bytes_sent)
        timed = range(warmup, iterations)
        bwd_job = float(np.mean([res.reports[r][i].backward_s for r in range(world) for i in timed]))
        fwd_job = float(np.mean([res.reports[r][i].forward_s for r in range(world) for i in timed]))
        sync_job = float(np.mean([res.reports[r][i].sync_s for r in range(world) for i in timed]))
        step_job = float(np.mean([max(res.reports[r][i].step_s for r in range(world)) for i in timed]))
        peak = [max(res.reports[r][i].peak_activation_bytes for i in its) for r in range(world)]
        min_start = [min(s[r] for s in starts) for r in range(world)]
        peak_pred = [table.activation_peak_bytes(m) for m in min_start]
        jobs[label] = {"level": level, "pattern": pattern, "slots": list(spb.start_slots(level, table.num_groups)),
                       "starts": [list(s) for s in starts], "bytes_measured": measured, "bytes_predicted": predicted,
                       "bytes_loopback_rank0_sync": loopback, "bytes_loopback_job": res.loopback_bytes,
                       "bytes_formula_job": formula_job,
                       "backward_s_job_mean": bwd_job, "forward_s_job_mean": fwd_job, "sync_s_job_mean": sync_job,
                       "iteration_s_job_mean": step_job, "peak_activation_bytes": peak,
                       "peak_activation_predicted": peak_pred, "job_wall_s": wall,
                       "losses_rank0": [res.reports[0][i].loss for i in its]}
    all_starts = {s for j in jobs.values() for st in j["starts"] for s in st}
    alone = _single_process_times(model_name, batch_size, all_starts, repeats, seed)
    pred_table = _prediction_table(model_name, batch_size)
    bwd_pred = backward_by_start(pred_table) if pred_table is not None else None
    for label, j in jobs.items():
        timed_starts = [s for st in j["starts"][warmup:] for s in st]
        j["backward_s_alone_mean"] = float(np.mean([alone[s]["backward_s"] for s in timed_starts]))
        if bwd_pred is not None:
            # the cost table's mean per-worker backward over the same starts (eq. C1 without the
            # forward and the optimizer): seconds at the table's batch size, and relative to full
            j["backward_s_pred_mean"] = float(np.mean([bwd_pred[s] for s in timed_starts]))
            j["backward_pred_table"] = f"{pred_table.model}-bs{pred_table.batch_size}-{pred_table.device}"
        rows.append(j | {"label": label})
    return {"model": model_name, "batch_size": batch_size, "world": world, "iterations": iterations,
            "warmup": warmup, "num_groups": table.num_groups, "param_bytes": [g.param_bytes for g in table.groups],
            "activation_bytes": [g.activation_bytes for g in table.groups],
            "single_process_by_start": {str(k): v for k, v in alone.items()}, "configs": jobs}


def _prediction_table(model_name: str, batch_size: int):
    """The CPU cost table the simulator would use for this model: the one at this batch size, or
    else the shipped one (another batch size: only its relative backward times are compared)."""
    from jigsaw_env.calibrate import SHIPPED
    from jigsaw_env.cost_table import get_table

    for bs in (batch_size, SHIPPED.get(model_name)):
        if bs is None:
            continue
        try:
            return get_table(model_name, bs, "cpu")
        except (KeyError, ValueError, FileNotFoundError):
            continue
    return None


def backward_by_start(table) -> list[float]:
    """Per start group s, a worker's backward seconds in the table: the weight gradients of groups
    s.. plus the input gradients of groups s+1.. (eq. C1 without forward, optimizer and overhead)."""
    import numpy as np

    a = table.arrays()
    w = np.cumsum(a["backward_weight_s"][::-1])[::-1]
    i = np.concatenate([np.cumsum(a["backward_input_s"][::-1])[::-1][1:], [0.0]])
    return (w + i).tolist()


def _fmt_bytes(b: float) -> str:
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(b) >= div:
            return f"{b / div:.2f} {unit}"
    return f"{b:.0f} B"


def print_table(results: list[dict]) -> None:
    head = (f"{'model':<22}{'config':<13}{'bytes/iter meas':>16}{'pred':>11}{'lo/iter':>11}{'job lo/f':>9}{'vs full':>9}"
            f"{'bwd ms job':>12}{'bwd ms alone':>13}{'vs full':>9}{'table':>8}  {'peak act per rank (meas = pred?)'}")
    print(head)
    print("-" * len(head))
    for res in results:
        full = res["configs"]["full"]
        fb = sum(full["bytes_measured"]) / len(full["bytes_measured"])
        for label, j in res["configs"].items():
            mb = sum(j["bytes_measured"]) / len(j["bytes_measured"])
            pb = sum(j["bytes_predicted"]) / len(j["bytes_predicted"])
            same = all(a == b for a, b in zip(j["peak_activation_bytes"], j["peak_activation_predicted"]))
            peaks = ", ".join(_fmt_bytes(p) for p in j["peak_activation_bytes"])
            lo = j.get("bytes_loopback_rank0_sync") or []
            lo_s = _fmt_bytes(sum(lo) / len(lo)) if lo and None not in lo else "-"
            ratio = (f"{j['bytes_loopback_job'] / j['bytes_formula_job']:.3f}"
                     if j.get("bytes_loopback_job") is not None and j.get("bytes_formula_job") else "-")
            print(f"{res['model'] + ' bs' + str(res['batch_size']):<22}{label:<13}{_fmt_bytes(mb):>16}"
                  f"{_fmt_bytes(pb):>11}{lo_s:>11}{ratio:>9}{(mb / fb - 1) * 100:>8.1f}%"
                  f"{j['backward_s_job_mean'] * 1e3:>12.2f}{j['backward_s_alone_mean'] * 1e3:>13.2f}"
                  f"{(j['backward_s_alone_mean'] / full['backward_s_alone_mean'] - 1) * 100:>8.1f}%"
                  + (f"{(j['backward_s_pred_mean'] / full['backward_s_pred_mean'] - 1) * 100:>7.1f}%"
                     if "backward_s_pred_mean" in j else f"{'-':>8}")
                  + f"  [{peaks}] {'=' if same else '!='} pred")
        if "backward_pred_table" in full:
            print(f"{'':<22}(table column: the cost table {full['backward_pred_table']}'s backward over the same "
                  f"starts, relative to full backprop; {full['backward_s_pred_mean'] * 1e3:.2f} ms at full)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="resnet18,tiny_transformer", help="comma-separated executor models")
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--iterations", type=int, default=14)
    p.add_argument("--warmup", type=int, default=2, help="iterations left out of the job timings")
    p.add_argument("--batch-size", type=int, default=None, help="per worker (default: per model)")
    p.add_argument("--repeats", type=int, default=9, help="single-process timing repeats per start group")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout-s", type=float, default=120.0)
    p.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "jigsaw-bench" / "executor_spb.json"))
    a = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    t0 = time.perf_counter()
    load_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    results = []
    for m in [x.strip() for x in a.models.split(",") if x.strip()]:
        bs = a.batch_size or DEFAULT_BATCH.get(m, 16)
        print(f"[bench.executor_spb] {m} bs{bs}, {a.world} workers, {a.iterations} iterations per config ...",
              file=sys.stderr, flush=True)
        results.append(run_model(m, a.world, a.iterations, a.warmup, bs, a.repeats, a.seed, a.timeout_s))
    print_table(results)
    load_end = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    print(f"host load average (1 min) at start / end: {load_start} / {load_end} on {os.cpu_count()} CPUs "
          "(other processes perturb the times; bytes and activation bytes are exact)")
    doc = {"command": "python -m bench.executor_spb " + " ".join(argv if argv is not None else sys.argv[1:]),
           "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
           "torch": torch.__version__, "python": platform.python_version(),
           "loadavg_1min_start_end": [load_start, load_end],
           "wall_s": time.perf_counter() - t0, "link_for_algorithm_choice": "jigsaw_env.network.INTRA_NODE",
           "results": results}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
