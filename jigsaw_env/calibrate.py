"""``jigsaw calibrate``: measure a zoo model's cost table, and (re)build the shipped tables.

Examples::

    jigsaw calibrate --model tiny_mlp --batch-size 16 --device cpu --out tiny.json
    jigsaw calibrate --model resnet18 --batch-size 64 --device v100 --out r18-v100.json
    python -m jigsaw_env.calibrate --ship                 # rebuild every shipped table
    python -m jigsaw_env.calibrate --ship --derive-only   # re-derive GPU tables from shipped CPU ones
    jigsaw calibrate --device cpu --executor --out cal/  # + the live executor's overhead and link

``--device cpu`` / ``cuda`` measure on the local CPU / GPU. ``--device k80|p100|v100`` measures on
the local CPU and anchors the times to Gavel's measured throughput on that GPU type (or, for a
model Gavel did not measure, extrapolates with the shipped CPU tables of the Gavel models); see
docs/cost_tables.md.

``--executor`` (with ``--device cpu``) measures, under the live executor on CPU slots (Ray), each
model's level-0 iteration ``--executor-repeats`` times (median), and writes into the folder
``--out``: each model's plain-loop table plus ``executor_overhead_s`` (the executor's own cost per
iteration), ``link.json`` (the fitted slot-to-slot latency) unless ``--no-link``, and
``lockstep.json`` (the barrier of a co-located step, from co-located pairs) unless ``--no-lockstep``.
``jigsaw deploy --tables OUT`` and the replay use them. Models: ``--model`` (one) or ``--only``
(several); default the tiny models. See ``jigsaw_executor.calibrate_executor`` and docs/deploy.md
section 5.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

from jigsaw_env import cost_table, gpu_split
from jigsaw_env.cli_args import positive_int
from jigsaw_env.cost_table import (REFERENCE_BATCH_SIZES, TABLES_DIR, CostTable, nearest_batch_size, scale_to_batch,
                                   table_filename, table_files)
from jigsaw_env.gavel_data import gavel_alone_throughput

# model -> batch size of its reference tables (a Gavel batch size where Gavel has the job type)
SHIPPED: dict[str, int] = REFERENCE_BATCH_SIZES
# model -> further batch sizes its cpu table is measured at; with SHIPPED they are the cpu tables the
# Gavel batch sizes' K80/P100/V100 tables are derived from (docs/cost_tables.md section 9)
MEASURED_BATCHES: dict[str, tuple[int, ...]] = {
    "resnet18": (16, 32),
    "resnet50": (16,),
    "transformer_small": (16, 32),
    "lstm_lm": (5, 10, 40, 80),
    "recommendation": (512, 2048, 4096, 8192),
}
GPU_TYPES = ("k80", "p100", "v100")
DEVICES = ("cpu", "cuda") + GPU_TYPES
SHIP_DEVICES = ("cpu",) + GPU_TYPES


def _allowed_models() -> list[str]:
    from jigsaw_env.zoo import model_names
    return model_names()


def _validate(model: str, batch_size: int, device: str, repeats: int | None,
              anchor_device: str | None) -> tuple[str, str | None]:
    """Check the arguments; return (measuring device, anchor GPU type or None)."""
    allowed = _allowed_models()
    if model not in allowed:
        raise ValueError(f"unknown model {model!r}; allowed: {allowed}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch size must be a positive integer, got {batch_size!r}")
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; allowed: {list(DEVICES)}")
    if repeats is not None and (isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1):
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    if anchor_device is not None and anchor_device not in GPU_TYPES:
        raise ValueError(f"unknown anchor device {anchor_device!r}; allowed: {list(GPU_TYPES)}")
    if device in GPU_TYPES:
        if anchor_device is not None and anchor_device != device:
            raise ValueError(f"--device {device} already anchors to {device}; it conflicts with anchor "
                             f"device {anchor_device!r}")
        return "cpu", device
    if device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise ValueError("device 'cuda' requested but torch sees no CUDA device here; use --device cpu")
    return device, anchor_device


def calibrate(model: str, batch_size: int, device: str = "cpu", repeats: int | None = None,
              anchor_device: str | None = None, *, warmup: int = 1, seed: int = 0, progress: bool = False,
              reference_tables: list[CostTable] | None = None, gavel_path: str | Path | None = None,
              command: str | None = None, eta_from: str | Path | None = TABLES_DIR) -> CostTable:
    """Measure the cost table of zoo ``model`` at ``batch_size``.

    ``device``: ``"cpu"`` or ``"cuda"`` (measure there) or ``"k80"``/``"p100"``/``"v100"`` (measure on
    the CPU, then anchor to that GPU type). ``anchor_device``: anchor a cpu/cuda measurement to a
    GPU type. ``repeats=None``: chosen from a one-iteration probe. ``eta_from``: a tables folder
    whose table of the same model and batch size lends its measured eta (:func:`carry_measured_eta`;
    None: none). Raises ValueError for bad input.
    """
    from jigsaw_env import table_builder as tb

    measure_on, anchor = _validate(model, batch_size, device, repeats, anchor_device)
    if anchor is not None:  # fail before a long measurement when the data folder is missing
        tb.gavel_throughputs(gavel_path)
    cmd = command or (f"jigsaw calibrate --model {model} --batch-size {batch_size} --device {device}"
                      + (f" --repeats {repeats}" if repeats else ""))
    table = tb.measure_table(model, batch_size, device=measure_on, repeats=repeats, warmup=warmup, seed=seed,
                             progress=progress, command=cmd)
    if anchor is not None:
        table = tb.anchor_table(table, anchor, gavel_path=gavel_path, reference_tables=reference_tables)
    return carry_measured_eta(table, eta_from) if eta_from is not None else table


def carry_measured_eta(table: CostTable, tables_dir: str | Path = TABLES_DIR) -> CostTable:
    """``table`` with the measured statistical efficiency (``meta["eta"]``, ``meta["eta_source"]``)
    of the table of the same model and batch size in ``tables_dir`` (the same device first, else
    any device that has it), when ``table`` has none. eta is iterations to a target metric with
    full backprop over those with SPB (``python -m bench.eta --write-tables``): a property of the
    training, not of the machine's speed, so a re-measured speed table keeps it. Without it a
    recalibrated table would fall back to the eq. E1 prior (0.81 instead of the measured 0.97 for
    tiny_cnn at level 3) and the simulator would ask SPB jobs for up to 20 % more steps than the
    live executor, which uses the shipped value. ``meta["eta_source"]["carried_from"]`` names the
    table (and its digest) the values came from. Returns ``table`` itself when there is nothing
    to carry."""
    if isinstance(table.meta, dict) and table.meta.get("eta"):
        return table
    d = Path(tables_dir)
    devices = [table.device] + [x for x in SHIP_DEVICES if x != table.device]
    for dev in devices:
        f = d / table_filename(table.model, table.batch_size, dev)
        if not f.is_file():
            continue
        src = CostTable.load(f)
        eta = src.meta.get("eta") if isinstance(src.meta, dict) else None
        if not eta:
            continue
        how = src.meta.get("eta_source")
        how = dict(how) if isinstance(how, dict) else {"what": how}
        how["carried_from"] = f"{f.name} (digest {src.digest()}): eta does not depend on the speed this table measures"
        return dataclasses.replace(table, meta=dict(table.meta, eta=dict(eta), eta_source=how))
    return table


def _summary(table: CostTable) -> str:
    mb = table.param_bytes_total / 1e6
    return (f"{table.model} bs{table.batch_size} {table.device}: {table.num_groups} groups, params {mb:.2f} MB, "
            f"full-backprop iteration {table.compute_s(0):.6g} s, fixed memory "
            f"{table.fixed_memory_bytes / 2**20:.0f} MiB, activations {table.activation_peak_bytes(0) / 2**20:.1f} MiB")


def ship(models: list[str] | None = None, repeats: int | None = None, derive_only: bool = False,
         progress: bool = True, tables_dir: Path | None = None, gavel_path: str | Path | None = None,
         log=print) -> list[Path]:
    """(Re)build the shipped tables: measure each model's CPU table once at its ``SHIPPED`` batch
    size, then derive its K80/P100/V100 tables without re-measuring (Gavel-anchored models first,
    then the extrapolated ones, which use the anchored models' CPU tables). With ``derive_only``
    the CPU tables already in ``tables_dir`` are reused."""
    from jigsaw_env import table_builder as tb
    from jigsaw_env.zoo import MODELS

    out_dir = Path(tables_dir) if tables_dir else TABLES_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    names = list(SHIPPED) if not models else list(models)
    for n in names:
        if n not in SHIPPED:
            raise ValueError(f"model {n!r} is not shipped; shipped: {list(SHIPPED)}")
    tb.gavel_throughputs(gavel_path)  # fail early without the data folder
    anchored = [n for n in SHIPPED if MODELS[n].gavel_job is not None]
    order = [n for n in names if n in anchored] + [n for n in names if n not in anchored]
    written: list[Path] = []

    cpu_tables: dict[str, CostTable] = {}
    for n in order:
        path = out_dir / table_filename(n, SHIPPED[n], "cpu")
        if derive_only:
            cpu_tables[n] = CostTable.load(path)
            continue
        t0 = time.perf_counter()
        table = calibrate(n, SHIPPED[n], "cpu", repeats=repeats, progress=progress,
                          command="python -m jigsaw_env.calibrate --ship", eta_from=out_dir)
        table.save(path)
        written.append(path)
        cpu_tables[n] = table
        log(f"{_summary(table)}  [{time.perf_counter() - t0:.0f} s] -> {path.name}")
        for b in MEASURED_BATCHES.get(n, ()):
            t0 = time.perf_counter()
            extra = calibrate(n, b, "cpu", repeats=repeats, progress=progress,
                              command="python -m jigsaw_env.calibrate --ship", eta_from=out_dir)
            p = out_dir / table_filename(n, b, "cpu")
            extra.save(p)
            written.append(p)
            log(f"{_summary(extra)}  [{time.perf_counter() - t0:.0f} s] -> {p.name}")
    # reference tables for the extrapolation: every Gavel model's CPU table (fresh or shipped)
    refs = []
    for n in anchored:
        if n in cpu_tables:
            refs.append(cpu_tables[n])
        else:
            p = out_dir / table_filename(n, SHIPPED[n], "cpu")
            if p.exists():
                refs.append(CostTable.load(p))
    # a re-measured Gavel model changes the extrapolation scale: re-derive every extrapolated model
    derive = list(order)
    if any(n in anchored for n in names):
        for n in SHIPPED:
            p = out_dir / table_filename(n, SHIPPED[n], "cpu")
            if n not in anchored and n not in derive and p.exists():
                cpu_tables[n] = CostTable.load(p)
                derive.append(n)
    splits = gpu_splits({n: cpu_tables[n] for n in derive if n in anchored}, out_dir)
    for gpu in GPU_TYPES:
        for n in derive:
            if n in tb.GPU_RATIO_FAMILY:
                continue
            base = cpu_tables[n]
            if n in splits:
                base = gpu_split.with_gpu_shares(base, splits[n], splits[n].optimizer_share)
            t = tb.anchor_table(base, gpu, gavel_path=gavel_path, reference_tables=refs)
            path = out_dir / table_filename(n, SHIPPED[n], gpu)
            t.save(path)
            written.append(path)
            log(f"{_summary(t)} [{t.meta['kind']}] -> {path.name}")
    for t in derive_gavel_batches([n for n in names if n in anchored], out_dir, gavel_path):
        path = out_dir / table_filename(t.model, t.batch_size, t.device)
        t.save(path)
        written.append(path)
        log(f"{_summary(t)} [{t.meta['kind']}] -> {path.name}")
    for t in derive_gpu_ratio([n for n in names if n in tb.GPU_RATIO_FAMILY], gavel_path=gavel_path):
        path = out_dir / table_filename(t.model, t.batch_size, t.device)
        t.save(path)
        written.append(path)
        log(f"{_summary(t)} [{t.meta['kind']}] -> {path.name}")
    for fn_name in ("_shipped_tables", "available_tables", "get_table"):  # let get_table see new files
        fn = getattr(cost_table, fn_name, None)
        if hasattr(fn, "cache_clear"):
            fn.cache_clear()
    return written


def gpu_splits(cpu_tables: dict[str, CostTable], tables_dir: Path) -> dict:
    """model -> :class:`jigsaw_env.gpu_split.GpuSplit` for the Gavel-anchored models of
    ``cpu_tables`` (their cpu tables at the reference batch size) whose GPU-measured split differs
    from the cpu one by more than the noise (docs/cost_tables.md eq. S1); the noise is taken from
    the repeated measurements and the cpu tables in ``tables_dir``."""
    if not cpu_tables:
        return {}
    noise = gpu_split.measured_noise(Path(tables_dir))
    chosen = {n: gpu_split.choose_gpu_split(t, noise) for n, t in cpu_tables.items()}
    return {n: s for n, s in chosen.items() if s is not None}


def _batch_optimizer_share(split, job: str, ref_batch: int, batch: int, gpu: str, gavel_path) -> float:
    """Eq. S2: the optimizer step's share at ``batch`` on ``gpu`` when its time is the reference
    batch's (``split.optimizer_share`` of ``1 / theta(ref)``) and the iteration is ``1 / theta(batch)``."""
    ref = gavel_alone_throughput(job, ref_batch, gpu, gavel_path)
    here = gavel_alone_throughput(job, batch, gpu, gavel_path)
    if ref is None or here is None:
        raise ValueError(f"{job}: Gavel has no alone throughput on {gpu} at batch size "
                         f"{ref_batch if ref is None else batch} to split the optimizer step by")
    share = split.optimizer_share * here[1] / ref[1]
    if share >= 1.0:
        raise ValueError(f"{job} bs {batch} on {gpu}: the reference batch's optimizer step ({split.optimizer_share:.3g} "
                         f"of 1/{ref[1]:.4g} s) does not fit in Gavel's iteration 1/{here[1]:.4g} s")
    return share


def derive_gavel_batches(models: list[str], tables_dir: Path, gavel_path: str | Path | None = None) -> list[CostTable]:
    """The K80/P100/V100 tables of every batch size Gavel measured for ``models`` (Gavel-anchored
    zoo models) other than the reference batch size, each anchored exactly to Gavel's alone
    throughput there (:func:`jigsaw_env.table_builder.anchor_table`). The times are split as the
    cpu table measured at that batch size in ``tables_dir``, or where there is none, as the
    nearest measured cpu table scaled to the batch size by eq. B1
    (:func:`jigsaw_env.cost_table.scale_to_batch`); docs/cost_tables.md section 9. A model whose
    GPU-measured split is switched to (:func:`gpu_splits`) takes it at every batch size, with the
    optimizer step's time the reference batch's (eq. S2, docs/cost_tables.md section 3a)."""
    from jigsaw_env import table_builder as tb
    from jigsaw_env.zoo import MODELS

    out = []
    for n in models:
        job = MODELS[n].gavel_job
        measured = {}
        for b in (SHIPPED[n], *MEASURED_BATCHES.get(n, ())):
            p = Path(tables_dir) / table_filename(n, b, "cpu")
            if p.exists():
                measured[b] = CostTable.load(p)
        if not measured:
            raise ValueError(f"{n}: no measured cpu table in {tables_dir} to derive its Gavel batch sizes from")
        splits = gpu_splits({n: measured[SHIPPED[n]]}, tables_dir) if SHIPPED[n] in measured else {}
        for b in tb.gavel_batch_sizes(job, GPU_TYPES, gavel_path):
            if b == SHIPPED[n]:
                continue
            base = measured.get(b) or scale_to_batch(
                measured[nearest_batch_size(b, list(measured))], b, 1.0,
                "1 (any exponent gives this table: the anchor to Gavel below rescales every time)")
            for gpu in GPU_TYPES:
                here = base
                if n in splits:
                    share = _batch_optimizer_share(splits[n], job, SHIPPED[n], b, gpu, gavel_path)
                    here = gpu_split.with_gpu_shares(base, splits[n], share)
                out.append(tb.anchor_table(here, gpu, gavel_path=gavel_path))
    return out


def derive_gpu_ratio(models: list[str], gpu_dir: Path | None = None,
                     gavel_path: str | Path | None = None) -> list[CostTable]:
    """The K80/P100/V100 tables of ``models`` (keys of
    :data:`jigsaw_env.table_builder.GPU_RATIO_FAMILY`) from their GPU-measured tables in ``gpu_dir``
    (default ``bench/results/cuda_check``), by :func:`jigsaw_env.table_builder.anchor_through_gpu`."""
    from jigsaw_env import table_builder as tb

    d = Path(gpu_dir) if gpu_dir else tb.GPU_MEASURED_DIR
    where = f"{d.relative_to(tb.PROJECT_ROOT)}/" if d.is_relative_to(tb.PROJECT_ROOT) else f"{d}/"

    def load(m: str) -> CostTable:
        p = d / table_filename(m, SHIPPED[m], "cuda")
        if not p.exists():
            raise FileNotFoundError(f"GPU-measured table not found: {p} (bench/cuda_check.sh measures it)")
        return CostTable.load(p)

    out = []
    for n in models:
        measured = load(n)
        refs = [load(r) for r in tb.GPU_RATIO_FAMILY[n]]
        for gpu in GPU_TYPES:
            out.append(tb.anchor_through_gpu(measured, gpu, refs, gavel_path=gavel_path, where=where))
    return out


# --------------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------------
def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="zoo model name (see jigsaw_env.zoo.MODELS)")
    p.add_argument("--batch-size", type=int, help="per-worker batch size (> 0)")
    p.add_argument("--device", default="cpu",
                   help="cpu | cuda (measure locally) | k80 | p100 | v100 (measure on the CPU, anchor to Gavel)")
    p.add_argument("--anchor-device", default=None, help="anchor a cpu/cuda measurement to k80 | p100 | v100")
    p.add_argument("--out", default=None, help="output JSON file (default: ./<model>-bs<N>-<device>.json)")
    p.add_argument("--repeats", type=int, default=None, help="timed runs per measurement (default: automatic)")
    p.add_argument("--warmup", type=int, default=1, help="untimed warm-up runs per measurement")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: leave as set; `jigsaw` sets OMP_NUM_THREADS=1)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--ship", action="store_true",
                   help="(re)build every shipped table in jigsaw_env/tables/ (ignores --model/--batch-size)")
    p.add_argument("--only", nargs="+", default=None, help="with --ship: only these models")
    p.add_argument("--derive-only", action="store_true",
                   help="with --ship: reuse the shipped CPU tables, only re-derive the GPU tables")
    p.add_argument("--executor", action="store_true",
                   help="also measure the live executor's per-iteration overhead (and the slot-to-slot link) on CPU "
                        "slots; --out is then a folder (docs/deploy.md section 5)")
    p.add_argument("--executor-repeats", type=positive_int("--executor-repeats"), default=3, metavar="N",
                   help="with --executor: separate live runs; the median is kept (default 3)")
    p.add_argument("--executor-iterations", type=positive_int("--executor-iterations"), default=1000, metavar="N",
                   help="with --executor: iterations per calibration job (default 1000; 300 left the medians noisy here)")
    p.add_argument("--no-link", action="store_true", help="with --executor: do not fit the link (1 slot is enough)")
    p.add_argument("--no-lockstep", action="store_true",
                   help="with --executor: do not measure the lockstep barrier of co-located pairs")
    p.add_argument("--base-tables", default=None, metavar="DIR",
                   help="with --executor: take the plain-loop tables from DIR (e.g. jigsaw_env/tables) instead of "
                        "measuring them now")


def _check_out_file(out: Path, example: str) -> None:
    if out.is_dir():
        raise ValueError(f"--out {out} is a directory; give a file name such as {out / example}")
    if not out.parent.is_dir():
        raise FileNotFoundError(f"output folder does not exist: {out.parent}")


def run(args: argparse.Namespace) -> int:
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        import torch
        torch.set_num_threads(args.threads)
    if args.warmup is not None and args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
    progress = not args.no_progress and sys.stderr.isatty()
    if getattr(args, "executor", False):
        return run_executor(args)
    if args.ship:
        ship(models=args.only, repeats=args.repeats, derive_only=args.derive_only, progress=progress)
        return 0
    if not args.model:
        raise ValueError(f"--model is required; allowed: {_allowed_models()}")
    if args.batch_size is None:
        raise ValueError("--batch-size is required (a positive integer)")
    # every argument is checked before the (possibly long) measurement starts
    _validate(args.model, args.batch_size, args.device, args.repeats, args.anchor_device)
    if args.out:
        _check_out_file(Path(args.out), table_filename(args.model, args.batch_size, args.device))
    table = calibrate(args.model, args.batch_size, args.device, repeats=args.repeats,
                      anchor_device=args.anchor_device, warmup=args.warmup, seed=args.seed, progress=progress)
    out = Path(args.out) if args.out else Path(table_filename(table.model, table.batch_size, table.device))
    table.save(out)
    print(f"{_summary(table)} -> {out}")
    return 0


def run_executor(args: argparse.Namespace) -> int:
    """``--executor``: every argument is checked before Ray or any measurement starts."""
    if args.ship:
        raise ValueError("--executor and --ship do not go together")
    if args.device != "cpu":
        raise ValueError(f"--executor measures the live executor on CPU slots: use --device cpu, got {args.device!r}")
    if args.anchor_device is not None:
        raise ValueError("--executor measures CPU tables: --anchor-device does not apply")
    if not args.out:
        raise ValueError("--executor writes a folder of tables and link.json: give --out FOLDER")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; --executor writes a folder")
    if not out.parent.is_dir():
        raise FileNotFoundError(f"output folder does not exist: {out.parent}")
    if args.model and args.only:
        raise ValueError("give --model (one model) or --only (several), not both")
    from jigsaw_executor.calibrate_executor import DEFAULT_MODELS, calibrate_executor

    models = list(args.only or ([args.model] if args.model else DEFAULT_MODELS))
    allowed = _allowed_models()
    for m in models:
        if m not in allowed:
            raise ValueError(f"unknown model {m!r}; allowed: {allowed}")
    sizes = {}
    for m in models:
        bs = args.batch_size if args.batch_size is not None else SHIPPED.get(m)
        if bs is None:
            raise ValueError(f"--batch-size is required for {m} (it has no shipped table)")
        _validate(m, bs, "cpu", args.repeats, None)
        sizes[m] = bs
    base = None
    if args.base_tables:
        d = Path(args.base_tables)
        if not d.is_dir():
            raise FileNotFoundError(f"cost-table folder not found: {d}")
        found = {}
        for f in table_files(d):
            t = CostTable.load(f)
            if t.device == "cpu" and t.model in sizes and t.batch_size == sizes[t.model]:
                found[t.model] = t
        missing = [m for m in models if m not in found]
        if missing:
            raise ValueError(f"--base-tables {d} has no cpu table for {missing[0]} at batch size {sizes[missing[0]]}")
        base = found
    cmd = "jigsaw calibrate --device cpu --executor " + " ".join(
        x for x in (f"--only {' '.join(models)}", f"--executor-repeats {args.executor_repeats}",
                    f"--executor-iterations {args.executor_iterations}", "--no-link" if args.no_link else "",
                    "--no-lockstep" if args.no_lockstep else "",
                    f"--base-tables {args.base_tables}" if args.base_tables else "") if x)
    calibrate_executor(models, sizes, out, repeats=args.executor_repeats, iterations=args.executor_iterations,
                       link=not args.no_link, lockstep=not args.no_lockstep, base_tables=base, plain_repeats=args.repeats, command=cmd)
    return 0


def register(subparsers) -> None:
    """Add the ``calibrate`` subcommand to the ``jigsaw`` command line."""
    p = subparsers.add_parser(
        "calibrate", help="measure a zoo model's cost table (or rebuild the shipped ones)",
        description=__doc__.split("\n\n")[0] + " See docs/cost_tables.md.")
    _add_arguments(p)
    p.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    """``python -m jigsaw_env.calibrate [...]``: same options as ``jigsaw calibrate``."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    parser = argparse.ArgumentParser(prog="python -m jigsaw_env.calibrate", description=__doc__.split("\n\n")[0])
    _add_arguments(parser)
    args = parser.parse_args(argv)
    if args.threads is None:
        args.threads = 1
    try:
        return run(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"calibrate: error: {str(e).strip().splitlines()[0]}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
