"""Statistical efficiency of SPB, measured: iterations to a held-out accuracy with and without SPB.

    nice -n 10 python -m bench.eta --write-tables             # the shipped measurement (13 min, 2 cores)
    python -m bench.eta --quick --out /tmp/eta                # smoke run: 2 workers, 1 seed, < 30 s
    python -m bench.eta --from-json bench/results/eta/eta.json --write-tables   # re-apply, no training
    nice -n 10 python -m bench.eta --world 2 --seeds 0,1,2,3,4 --out bench/results/eta/w2   # W = 2 (91 s)
    nice -n 10 python -m bench.eta --world 1 --seeds 0,1,2,3,4 --out bench/results/eta/w1   # W = 1 (49 s)
    python -m bench.eta --from-json bench/results/eta/w2/eta.json --write-tables --by-workers  # the /w2 keys

eta(model, level, pattern) is the progress of one SPB iteration relative to one full-backprop
iteration (docs/design.md section 2, docs/spb_model.md eq. E1). Measured here as

    eta = iterations_full / iterations_spb

where ``iterations_x`` is the number of training iterations until the held-out accuracy first
reaches ``--target`` (evaluated every ``--eval-every`` iterations), for full backprop (level 0) and
for the SPB configuration, with the *same* seed (same initial weights, same data order, same
train/held-out split), the same learning rate and optimizer, and the same number of workers. One
eta per seed pair; the report gives the mean over seeds with a 95% t-interval (and a bootstrap
percentile interval).

How it trains: real SPB (``jigsaw_executor.spb_worker.SPBTrainer``, the executor's own trainer:
no-grad forward below each worker's start group, per-group reduce/broadcast over the contributors)
on ``--world`` gloo processes, one thread each, started once for the whole measurement
(``torch.multiprocessing``); every run builds a fresh model and trainer. The data are
scikit-learn's bundled digits through ``jigsaw_executor.data.DigitsData(seed)``: a seeded 80/20
train/held-out split, seeded epochs, rank ``r`` taking its slice of each global batch. Rank 0
evaluates the held-out accuracy every ``--eval-every`` iterations and broadcasts it, so every rank
stops at the same iteration. (``jigsaw_executor.launcher.run_job_local`` evaluates only at the
end of a job, hence this driver.)

Censoring: a run that does not reach the target within ``--max-iterations`` is recorded as
censored: an SPB run gives an upper bound ``eta < iterations_full / max_iterations``; a censored
full-backprop run gives no value for that seed (a lower bound if the SPB run reached the target).
Bounds are kept in the per-seed list and flagged, never dropped; a mean that includes an upper
bound is itself an upper bound (flagged ``mean_is_upper_bound``).

Outputs (``--out``, default ``bench/results/eta``): ``eta.json`` (every run: iterations, the
accuracy curve at the evaluation points, rank 0's training loss, wall time; per configuration: the
per-seed etas, mean, intervals, and the eq. E1 prior for comparison) and ``eta.md`` (a table).
``--write-tables`` sets, in every cost table of ``--tables-dir`` (default the shipped
``jigsaw_env/tables``) whose ``model`` is a measured model, ``meta["eta"]["<level>/<pattern>"]``
(the key ``jigsaw_env.spb.eta_for`` reads) to the mean, capped at 1 (eta <= 1 by definition; the
raw mean is kept in ``meta["eta_source"]``), and ``meta["eta_source"]`` to a description of the
measurement, whose ``workers`` is the worker count the values were measured at (the simulator
applies these default values at every W). Nothing else in those files changes, and tables of
other models are not touched. ``--write-tables --by-workers`` instead adds
``meta["eta"]["<level>/<pattern>/w<W>"]`` (``W`` = ``--world`` of the measurement) and
``meta["eta_source"]["w<W>"]``, keeping every other key: a table can then hold measurements at
several worker counts, and ``jigsaw_env.spb.eta_for`` uses the one at the job's own W before the
default (docs/spb_model.md section 7).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import queue as _queue
import re
import signal
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "bench" / "results" / "eta"
DEFAULT_TABLES = ROOT / "jigsaw_env" / "tables"
DEFAULT_MODELS = ("tiny_cnn", "tiny_mlp")
DEFAULT_CONFIGS = ("1/rotating", "1/static", "2/rotating", "2/static", "3/rotating", "3/static")
# one learning rate per model, the same for full backprop and every SPB configuration
# (the zoo defaults; bench/results/eta/eta.md says why 0.05 for tiny_mlp)
DEFAULT_LR = {"tiny_cnn": 0.05, "tiny_mlp": 0.05, "tiny_transformer": 3e-3}
QUICK = {"world": 2, "seeds": "0", "models": "tiny_cnn", "configs": "2/rotating", "max_iterations": 24,
         "eval_every": 2, "target": 0.2, "batch_size": 16}  # a smoke test of the machinery, not a measurement


@dataclass(frozen=True)
class Run:
    """One training run to the target."""

    model: str
    level: int
    pattern: str
    seed: int
    lr: float

    @property
    def config(self) -> str:
        return f"{self.level}/{self.pattern}"


@dataclass(frozen=True)
class Options:
    world: int
    batch_size: int
    target: float
    eval_every: int
    max_iterations: int
    timeout_s: float


def parse_config(text: str) -> tuple[int, str]:
    """``"2/rotating"`` -> ``(2, "rotating")``; the key format of ``meta["eta"]``."""
    from jigsaw_env.spb import Pattern, SPBConfig

    try:
        lvl, pat = text.strip().split("/")
        level = int(lvl)
    except ValueError:
        raise ValueError(f"SPB configuration {text!r} must look like '<level>/<pattern>', e.g. '2/rotating'") from None
    SPBConfig().check_level(level)
    if level == 0:
        raise ValueError("level 0 is the full-backprop baseline, always measured; list SPB levels only")
    return level, Pattern.parse(pat).value


# --------------------------------------------------------------------------------------------
# worker side
# --------------------------------------------------------------------------------------------
def _train_to_target(run: Run, opts: Options, rank: int, subgroups: dict) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from jigsaw_env.spb import SPBConfig
    from jigsaw_executor.data import DigitsData
    from jigsaw_executor.models import build_executor_model
    from jigsaw_executor.spb_worker import SPBTrainer

    t0 = time.perf_counter()
    W = opts.world
    torch.manual_seed(run.seed)  # same initial weights for every configuration of this seed
    model = build_executor_model(run.model)
    model.lr = float(run.lr)
    model.train()
    optimizer = model.make_optimizer()
    trainer = SPBTrainer(model, optimizer, spb_config=SPBConfig(), level=run.level, pattern=run.pattern,
                         measure_activations=False, timeout_s=opts.timeout_s, precreate_subgroups=False)
    # contributor subgroups are created lazily in plan order (the same on every rank); share them
    # across runs so the measurement does not create new gloo groups for every run
    if isinstance(getattr(trainer, "_subgroups", None), dict):
        trainer._subgroups = subgroups
    data = DigitsData(seed=run.seed)
    hx, hy = data.holdout()
    flag = torch.zeros(2)
    curve: list[list[float]] = []
    reached = None
    for t in range(opts.max_iterations):
        rep = trainer.step(data.batch(t, rank, W, opts.batch_size), t, run.level, run.pattern)
        n = t + 1
        if n % opts.eval_every == 0 or n == opts.max_iterations:
            if rank == 0:
                model.eval()
                with torch.no_grad():
                    flag[0] = (model(hx).argmax(dim=-1) == hy).float().mean()
                model.train()
                flag[1] = rep.loss
            if W > 1:
                dist.broadcast(flag, src=0)
            acc = float(flag[0])
            curve.append([n, round(acc, 6), round(float(flag[1]), 6)])
            if acc >= opts.target:
                reached = n
                break
    return {"model": run.model, "level": run.level, "pattern": run.pattern, "config": run.config,
            "seed": run.seed, "lr": run.lr, "reached": reached is not None,
            "iterations": reached if reached is not None else opts.max_iterations,
            "final_accuracy": curve[-1][1] if curve else None, "curve": curve,
            "num_groups": trainer.num_groups, "wall_s": round(time.perf_counter() - t0, 3)}


def _worker(rank: int, runs: list[Run], opts: Options, port: int, q) -> None:
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:
            pass
        timeout = timedelta(seconds=opts.timeout_s)
        if opts.world > 1:
            store = dist.TCPStore("127.0.0.1", port, None, False, timeout=timeout)
            dist.init_process_group("gloo", store=store, rank=rank, world_size=opts.world, timeout=timeout)
        subgroups: dict = {}
        for i, run in enumerate(runs):
            res = _train_to_target(run, opts, rank, subgroups)
            if rank == 0:
                q.put(("run", i, res))
        if opts.world > 1:
            dist.barrier()
            dist.destroy_process_group()
        q.put(("done", rank, None))
    except BaseException as e:  # noqa: BLE001 - every failure must reach the parent
        q.put(("error", rank, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        sys.stderr.flush()
        os._exit(1)


def measure(runs: list[Run], opts: Options, progress: bool = True) -> list[dict[str, Any]]:
    """Train every run on ``opts.world`` gloo processes started once; results in ``runs`` order."""
    import multiprocessing as mp

    import torch.distributed as dist
    from tqdm import tqdm

    ctx = mp.get_context("spawn")
    store = None
    port = 0
    if opts.world > 1:  # the parent hosts the rendezvous on an OS-chosen port (no free-port race)
        store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=opts.timeout_s),
                              wait_for_workers=False)
        port = int(store.port)
    q = ctx.Queue()
    env_before = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    for k in env_before:
        os.environ[k] = "1"
    try:
        # daemonic: they die with this process; SIGTERM here runs the cleanup below (see main)
        procs = [ctx.Process(target=_worker, args=(r, runs, opts, port, q), name=f"bench-eta-rank{r}", daemon=True)
                 for r in range(opts.world)]
        for p in procs:
            p.start()
    finally:
        for k, v in env_before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    results: list[dict[str, Any] | None] = [None] * len(runs)
    done: set[int] = set()
    bar = tqdm(total=len(runs), desc="eta runs", unit="run", disable=not progress, file=sys.stderr)
    try:
        while len(done) < opts.world:
            try:
                kind, idx, payload = q.get(timeout=1.0)
            except _queue.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"bench.eta: worker rank(s) {dead} died without reporting an error")
                continue
            if kind == "run":
                results[idx] = payload
                bar.update(1)
                bar.set_postfix_str(f"{payload['model']} {payload['config']} seed {payload['seed']}: "
                                    f"{payload['iterations']}{'' if payload['reached'] else '+'} it")
            elif kind == "done":
                done.add(idx)
            else:
                raise RuntimeError(f"bench.eta: worker rank {idx} failed: {payload}")
    finally:
        bar.close()
        for p in procs:
            p.join(timeout=5.0 if len(done) == opts.world else 0.5)
        for p in procs:  # only ours: stop what is still running after a failure
            if p.exitcode is None:
                p.terminate()
                p.join(2.0)
            if p.exitcode is None:
                p.kill()
        del store
    missing = [i for i, r in enumerate(results) if r is None]
    if missing:
        raise RuntimeError(f"bench.eta: no result for runs {missing}")
    return results  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------
# statistics
# --------------------------------------------------------------------------------------------
def t_interval(values: list[float], level: float = 0.95) -> list[float] | None:
    """Two-sided t-interval of the mean; None with fewer than 2 values."""
    if len(values) < 2:
        return None
    from scipy import stats

    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    h = float(stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    return [mean - h, mean + h]


def bootstrap_interval(values: list[float], level: float = 0.95, resamples: int = 10_000,
                       seed: int = 0) -> list[float] | None:
    """Percentile bootstrap interval of the mean over seeds; None with fewer than 2 values."""
    if len(values) < 2:
        return None
    import numpy as np

    v = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, len(v), size=(resamples, len(v)))].mean(axis=1)
    lo, hi = np.quantile(means, [0.5 - level / 2, 0.5 + level / 2])
    return [float(lo), float(hi)]


def prior_eta(model: str, level: int, pattern: str, world: int) -> tuple[float, list[int]]:
    """The eq. E1 prior ``1 - c * mean skipped fraction`` at ``world`` workers, and the slots, from
    the model's layer-group count (what the simulator uses where a table has no measured eta)."""
    import numpy as np

    from jigsaw_env.spb import Pattern, SPBConfig, cycle_length, worker_starts
    from jigsaw_executor.models import build_executor_model

    import torch

    with torch.device("meta"):
        B = build_executor_model(model).num_groups
    spb = SPBConfig()
    pat = Pattern.parse(pattern)
    slots = spb.start_slots(level, B)
    starts = np.stack([worker_starts(slots, pat, world, t) for t in range(cycle_length(slots, pat))])
    return 1.0 - spb.eta_prior_slope * float(starts.mean()) / B, list(slots)


def summarize(results: list[dict[str, Any]], opts: Options, lrs: dict[str, float]) -> dict[str, Any]:
    """Per model and SPB configuration: per-seed eta (with censoring), mean and intervals."""
    by: dict[tuple[str, str, int], dict[str, Any]] = {(r["model"], r["config"], r["seed"]): r for r in results}
    models = list(dict.fromkeys(r["model"] for r in results))
    out: dict[str, Any] = {}
    for m in models:
        seeds = sorted({r["seed"] for r in results if r["model"] == m})
        configs = [c for c in dict.fromkeys(r["config"] for r in results if r["model"] == m) if c != "0/rotating"]
        full = {s: by[(m, "0/rotating", s)] for s in seeds}
        mo: dict[str, Any] = {
            "lr": lrs[m], "num_groups": next(r["num_groups"] for r in results if r["model"] == m),
            "full_backprop": {"iterations": [full[s]["iterations"] for s in seeds],
                              "reached": [full[s]["reached"] for s in seeds],
                              "mean_iterations": _mean([full[s]["iterations"] for s in seeds])},
            "configs": {}}
        for c in configs:
            level, pattern = parse_config(c)
            per_seed = []
            for s in seeds:
                f, p = full[s], by[(m, c, s)]
                if f["reached"] and p["reached"]:
                    kind, value = "exact", f["iterations"] / p["iterations"]
                elif f["reached"]:  # SPB censored: eta < full / cap
                    kind, value = "upper_bound", f["iterations"] / opts.max_iterations
                elif p["reached"]:  # full censored: eta > cap / spb
                    kind, value = "lower_bound", opts.max_iterations / p["iterations"]
                else:
                    kind, value = "undefined", None
                per_seed.append({"seed": s, "iterations_full": f["iterations"], "iterations_spb": p["iterations"],
                                 "full_reached": f["reached"], "spb_reached": p["reached"], "eta": value, "kind": kind})
            usable = [e["eta"] for e in per_seed if e["kind"] in ("exact", "upper_bound")]
            mean = _mean(usable)
            prior, slots = prior_eta(m, level, pattern, opts.world)
            spb_its = [e["iterations_spb"] for e in per_seed]
            mo["configs"][c] = {
                "level": level, "pattern": pattern, "slots": slots, "per_seed": per_seed,
                "n": len(usable), "mean": mean, "sd": _sd(usable),
                "ci95_t": t_interval(usable), "ci95_bootstrap": bootstrap_interval(usable),
                "censored_seeds": [e["seed"] for e in per_seed if e["kind"] != "exact"],
                "mean_is_upper_bound": any(e["kind"] == "upper_bound" for e in per_seed),
                "ratio_of_mean_iterations": (_mean([e["iterations_full"] for e in per_seed]) / _mean(spb_its)
                                             if all(e["full_reached"] and e["spb_reached"] for e in per_seed) else None),
                "mean_iterations_spb": _mean(spb_its), "prior_eta": prior}
        out[m] = mo
    return out


def _mean(v: list[float]) -> float | None:
    return float(sum(v) / len(v)) if v else None


def _sd(v: list[float]) -> float | None:
    if len(v) < 2:
        return None
    m = sum(v) / len(v)
    return float(math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1)))


# --------------------------------------------------------------------------------------------
# report and tables
# --------------------------------------------------------------------------------------------
def _fmt(x: float | None, nd: int = 3) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def markdown(doc: dict[str, Any]) -> str:
    s = doc["setup"]
    lines = [
        "# Measured statistical efficiency (eta) of SPB",
        "",
        f"Command: `{doc['command']}` ({doc['date_utc']}, wall {doc['wall_s']:.0f} s, {doc['cpus']} CPUs).",
        f"{s['world']} gloo workers (one thread each), batch {s['batch_size']} per worker, sklearn digits "
        f"(seeded 80/20 split), target: held-out accuracy >= {s['target']} evaluated every {s['eval_every']} "
        f"iterations, cap {s['max_iterations']} iterations, seeds {s['seeds']}. "
        "eta = iterations(full backprop) / iterations(SPB), per seed (same seed = same initial weights, "
        "data order and split); mean over seeds with a 95% t-interval. Prior = eq. E1, "
        f"1 - 0.5 x mean skipped fraction at {s['world']} workers.",
        "",
        "| model | lr | config | slots | eta mean | 95% CI (t) | 95% CI (bootstrap) | per seed | iterations full / SPB (mean) | censored | prior |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m, mo in doc["summary"].items():
        for c, r in mo["configs"].items():
            ci = r["ci95_t"]
            bci = r["ci95_bootstrap"]
            per = ", ".join(("-" if e["eta"] is None else f"{e['eta']:.2f}") + ("" if e["kind"] == "exact" else
                            {"upper_bound": "<", "lower_bound": ">", "undefined": "?"}[e["kind"]])
                            for e in r["per_seed"])
            lines.append(
                f"| {m} | {mo['lr']:g} | {c} | {tuple(r['slots'])} | {_fmt(r['mean'])}"
                f"{' (upper bound)' if r['mean_is_upper_bound'] else ''} | "
                f"{'-' if ci is None else f'[{ci[0]:.3f}, {ci[1]:.3f}]'} | "
                f"{'-' if bci is None else f'[{bci[0]:.3f}, {bci[1]:.3f}]'} | {per} | "
                f"{_fmt(mo['full_backprop']['mean_iterations'], 1)} / {_fmt(r['mean_iterations_spb'], 1)} | "
                f"{len(r['censored_seeds'])} | {r['prior_eta']:.3f} |")
    runs = doc.get("runs", [])
    cens = [r for r in runs if not r["reached"]]
    lines += ["", "Per-seed values marked `<` are upper bounds (the SPB run hit the cap), `>` lower bounds "
              "(the full-backprop run hit the cap). The same lr is used for full backprop and SPB "
              f"({', '.join(f'{m} {v:g}' for m, v in s['lr'].items())}). Runs that hit the cap: {len(cens)} of "
              f"{len(runs)}" + (": " + ", ".join(f"{r['model']} {r['config']} seed {r['seed']} (final held-out "
                                                f"accuracy {r['final_accuracy']:.3f})" for r in cens) if cens else "")
              + "."]
    return "\n".join(lines) + "\n"


def dump_json(doc: dict[str, Any]) -> str:
    """``json.dumps(indent=1)`` with every innermost list of scalars on one line (the accuracy curves)."""
    text = json.dumps(doc, indent=1)
    return re.sub(r"\[\s+([^\[\]{}]*?)\s+\]", lambda m: "[" + re.sub(r"\s*\n\s*", " ", m.group(1)) + "]", text) + "\n"


def table_eta_values(doc: dict[str, Any], model: str) -> dict[str, float]:
    """``meta["eta"]`` for ``model``: the mean per configuration, capped at 1."""
    return {c: round(min(1.0, r["mean"]), 4) for c, r in doc["summary"][model]["configs"].items()
            if r["mean"] is not None}


def eta_source(doc: dict[str, Any], model: str, results: str = "bench/results/eta/eta.json") -> dict[str, Any]:
    s = doc["setup"]
    mo = doc["summary"][model]
    return {
        "what": ("eta = iterations to the target with full backprop / with SPB, same seed, same lr; "
                 "meta['eta'] holds the mean over seeds, capped at 1"),
        "command": doc["command"], "results": results, "date_utc": doc["date_utc"],
        "target": f"held-out accuracy >= {s['target']} on sklearn digits (DigitsData(seed), 20% held out), "
                  f"evaluated every {s['eval_every']} iterations",
        "workers": s["world"], "batch_size_per_worker": s["batch_size"], "seeds": s["seeds"],
        "max_iterations": s["max_iterations"], "lr": mo["lr"],
        "optimizer": f"{_optimizer_name(model)} (the zoo model's make_optimizer, same for full backprop and SPB)",
        "gradient_averaging": s.get("average_over", "contributors"),
        "per_config": {c: {"mean": r["mean"], "ci95_t": r["ci95_t"], "n": r["n"],
                           "censored_seeds": r["censored_seeds"], "mean_is_upper_bound": r["mean_is_upper_bound"],
                           "prior_eta": r["prior_eta"]}
                       for c, r in mo["configs"].items()},
        "scope": (f"measured on {model} at {s['world']} workers only ('workers'). The simulator applies the "
                  "default '<level>/<pattern>' values at every W unless the table also has a value measured at "
                  "the job's W ('<level>/<pattern>/w<W>', `--write-tables --by-workers`): with fewer workers than "
                  "slots the default is off (W = 1 static is full backprop, eta 1; at W = 2 rotating SPB measured "
                  "far lower for tiny_mlp, bench/results/eta/w2). Tables of other models keep the eq. E1 prior; "
                  "using these values for them would be extrapolation (docs/spb_model.md, section 7)"),
    }


def _optimizer_name(model: str) -> str:
    from jigsaw_executor.models import EXECUTOR_MODELS
    from jigsaw_env.zoo import MODELS

    ctor = MODELS.get(model) or EXECUTOR_MODELS.get(model)
    return str(getattr(ctor, "optimizer_name", "unknown"))


def write_tables(doc: dict[str, Any], tables_dir: Path, models: list[str] | None = None,
                 by_workers: bool = False, results: str = "bench/results/eta/eta.json") -> list[Path]:
    """Set meta['eta'] and meta['eta_source'] in every table of ``tables_dir`` whose model was measured
    (only those two keys change). ``by_workers``: add the values under W-qualified keys
    ``"<level>/<pattern>/w<W>"`` (and the source under ``meta["eta_source"]["w<W>"]``), keeping
    every existing key. ``results``: the eta.json the values come from, as the source names it.
    Returns the files written."""
    from jigsaw_env.cost_table import table_files

    models = list(doc["summary"]) if models is None else models
    world = int(doc["setup"]["world"])
    written = []
    for path in table_files(tables_dir):
        d = json.loads(path.read_text())
        m = d.get("model")
        if m not in models or m not in doc["summary"]:
            continue
        meta = d.setdefault("meta", {})
        if by_workers:
            eta = dict(meta.get("eta") or {})
            eta.update({f"{k}/w{world}": v for k, v in table_eta_values(doc, m).items()})
            meta["eta"] = eta
            src = dict(meta.get("eta_source") or {})
            src[f"w{world}"] = eta_source(doc, m, results)
            meta["eta_source"] = src
        else:
            meta["eta"] = table_eta_values(doc, m)
            meta["eta_source"] = eta_source(doc, m, results)
        path.write_text(json.dumps(d, indent=1, sort_keys=False) + "\n")  # as CostTable.save writes
        written.append(path)
    return written


# --------------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------------
def _parse_lrs(text: str | None, models: list[str]) -> dict[str, float]:
    lrs = {m: DEFAULT_LR.get(m) for m in models}
    if text:
        for part in text.split(","):
            if "=" in part:
                k, v = part.split("=", 1)
                lrs[k.strip()] = float(v)
            else:
                lrs = {m: float(part) for m in models}
    missing = [m for m in models if lrs.get(m) is None]
    if missing:
        raise ValueError(f"no learning rate for {missing}; pass --lr MODEL=LR")
    return {m: float(lrs[m]) for m in models}


def _sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    if threading.current_thread() is not threading.main_thread():
        return _main(argv)
    previous = signal.signal(signal.SIGTERM, _sigterm)  # a killed measurement stops its workers too
    try:
        return _main(argv)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _main(argv: list[str] | None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.eta", description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated digit models")
    p.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                   help="SPB configurations '<level>/<pattern>' (level 0 is always run as the baseline)")
    p.add_argument("--seeds", default="0,1,2,3,4,5,6,7,8,9", help="comma-separated seeds (>= 3 for an interval worth having)")
    p.add_argument("--world", type=int, default=4, help="gloo worker processes")
    p.add_argument("--batch-size", type=int, default=32, help="per worker")
    p.add_argument("--lr", default=None, help="one lr for all models, or MODEL=LR,...; default "
                   + ", ".join(f"{k}={v:g}" for k, v in DEFAULT_LR.items()))
    p.add_argument("--target", type=float, default=0.9, help="held-out accuracy to reach")
    p.add_argument("--eval-every", type=int, default=2, help="iterations between held-out evaluations")
    p.add_argument("--max-iterations", type=int, default=600, help="cap; runs that do not reach the target are censored")
    p.add_argument("--timeout-s", type=float, default=120.0, help="collective timeout")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="folder for eta.json and eta.md")
    p.add_argument("--quick", action="store_true", help="smoke mode: " + ", ".join(f"{k}={v}" for k, v in QUICK.items()))
    p.add_argument("--write-tables", action="store_true", help="write meta['eta'] into the measured models' tables")
    p.add_argument("--tables-dir", default=str(DEFAULT_TABLES), help="cost-table folder for --write-tables")
    p.add_argument("--by-workers", action="store_true",
                   help="with --write-tables: write W-qualified keys '<level>/<pattern>/w<W>', keeping the others")
    p.add_argument("--from-json", default=None, help="skip training: read an eta.json (e.g. to --write-tables)")
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    if a.quick:
        defaults = {act.dest: act.default for act in p._actions}
        for k, v in QUICK.items():
            if getattr(a, k) == defaults[k]:
                setattr(a, k, v)
    cmd = "python -m bench.eta " + " ".join(argv if argv is not None else sys.argv[1:])

    if a.from_json:
        doc = json.loads(Path(a.from_json).read_text())
    else:
        os.environ["OMP_NUM_THREADS"] = "1"
        import torch

        torch.set_num_threads(1)
        models = [m.strip() for m in a.models.split(",") if m.strip()]
        from jigsaw_executor.data import DIGITS_MODELS

        bad = [m for m in models if m not in DIGITS_MODELS]
        if bad:
            raise SystemExit(f"bench.eta: models {bad} do not train on digits; allowed: {list(DIGITS_MODELS)}")
        configs = [parse_config(c) for c in a.configs.split(",") if c.strip()]
        seeds = [int(s) for s in a.seeds.split(",") if s.strip()]
        lrs = _parse_lrs(a.lr, models)
        if a.world < 1 or a.batch_size < 1 or a.eval_every < 1 or a.max_iterations < 1 or not 0 < a.target <= 1:
            raise SystemExit("bench.eta: need world, batch size, eval-every, max-iterations >= 1 and 0 < target <= 1")
        opts = Options(world=a.world, batch_size=a.batch_size, target=a.target, eval_every=a.eval_every,
                       max_iterations=a.max_iterations, timeout_s=a.timeout_s)
        # seeds outermost, so a partial look at the progress bar covers every configuration
        runs = [Run(m, lvl, pat, s, lrs[m]) for s in seeds for m in models
                for lvl, pat in [(0, "rotating")] + configs]
        t0 = time.perf_counter()
        load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        print(f"[bench.eta] {len(runs)} runs: models {models}, configs 0/rotating + "
              f"{[f'{l}/{q}' for l, q in configs]}, seeds {seeds}, {a.world} workers, lr {lrs}",
              file=sys.stderr, flush=True)
        results = measure(runs, opts, progress=not a.no_progress)
        wall = time.perf_counter() - t0
        doc = {"command": cmd, "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
               "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
               "torch": torch.__version__, "python": platform.python_version(),
               "loadavg_1min_start_end": [load0, os.getloadavg()[0] if hasattr(os, "getloadavg") else None],
               "wall_s": wall,
               "setup": asdict(opts) | {"seeds": seeds, "models": models, "lr": lrs,
                                        "configs": [f"{l}/{q}" for l, q in configs],
                                        "data": "sklearn load_digits via jigsaw_executor.data.DigitsData(seed)",
                                        "trainer": "jigsaw_executor.spb_worker.SPBTrainer, gloo, 1 thread/worker",
                                        "average_over": "contributors"},
               "summary": summarize(results, opts, lrs), "runs": results}
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "eta.json").write_text(dump_json(doc))
        (out / "eta.md").write_text(markdown(doc))
        print(markdown(doc))
        print(f"wrote {out / 'eta.json'} and {out / 'eta.md'} ({wall:.0f} s)")
    if a.write_tables:
        src = Path(a.from_json) if a.from_json else Path(a.out) / "eta.json"
        try:
            src = src.resolve().relative_to(ROOT)
        except ValueError:
            pass
        written = write_tables(doc, Path(a.tables_dir), by_workers=a.by_workers, results=str(src))
        print(f"wrote meta['eta'] into {len(written)} table(s): {', '.join(p.name for p in written)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
