"""``jigsaw colocation``: the co-location model from the command line.

* ``predict``: the rates of pairs of 1-GPU jobs sharing one GPU, from the simulator itself (two
  jobs placed on GPU 0 of a one-GPU cluster, stepped through one hyper-period of their SPB cycles).
* ``check``: the validation table of the fit (docs/colocation.md) and a plot of predicted against
  measured combined throughput.
* ``fit``: refit on the data folder's Gavel file and write ``jigsaw_env/colocation_fit.json``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .cluster import ClusterSpec
from .colocation_fit import load_pairs, predict_pair, validate, write_fit
from .cost_table import check_table_exists
from .engine import Component, Member
from .free_running import FreeRunner, free_running
from .interference import FIT_FILE, GPU_PEAK_TFLOPS, SHARING_MODES, SharingModel, fitted_model
from .placement import GpuLedger
from .spb import Pattern, SPBConfig
from .state import ClusterState, CostModel, Decision, JobDecision, JobState, JobStatus


def _parse_levels(text: str) -> tuple[int, int]:
    try:
        parts = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--levels must be two SPB levels LEVEL_A,LEVEL_B (e.g. 0,3), got {text!r}") from None
    if len(parts) != 2 or min(parts) < 0:
        raise argparse.ArgumentTypeError(f"--levels must be two SPB levels >= 0 as LEVEL_A,LEVEL_B (e.g. 0,3), got {text!r}")
    return parts[0], parts[1]


def parse_pair(text: str) -> tuple[tuple[str, int], tuple[str, int]]:
    """``MODEL:BATCH,MODEL:BATCH`` -> ((model, batch), (model, batch)); ValueError naming the
    malformed part and the expected form."""
    jobs = text.split(",")
    if len(jobs) != 2:
        raise ValueError(f"--pair {text!r}: expected two jobs MODEL:BATCH,MODEL:BATCH (e.g. resnet18:64,lstm_lm:20)")
    out = []
    for j in jobs:
        model, sep, batch = j.partition(":")
        if not sep or not model or not batch.isdigit() or int(batch) < 1:
            raise ValueError(f"--pair {text!r}: job {j!r} is not MODEL:BATCH with a batch size >= 1 (e.g. resnet18:64)")
        out.append((model.strip(), int(batch)))
    return out[0], out[1]


def _check_pair_fits(cluster: ClusterSpec, costs: CostModel, jobs: list[JobState], decisions: list[JobDecision],
                     pair, gpu_type: str) -> None:
    """ValueError (one line) unless both workers fit on the GPU, by the simulator's ledger."""
    state = ClusterState(cluster=cluster, costs=costs, time_s=0.0, round=0, jobs={j.job_id: j for j in jobs},
                         active_ids=[j.job_id for j in jobs], max_workers_per_gpu=len(jobs))
    ledger = GpuLedger(state, Decision())
    for j, jd in zip(jobs, decisions):
        if not ledger.fits(j.job_id, jd):
            gib, peaks = 2.0 ** 30, [ledger.peak_list(j, jd)[0] for j, jd in zip(jobs, decisions)]
            raise ValueError(f"--pair {pair[0][0]}:{pair[0][1]},{pair[1][0]}:{pair[1][1]}: the two workers do not fit "
                             f"on one {gpu_type} ({peaks[0] / gib:.2f} + {peaks[1] / gib:.2f} GiB > "
                             f"{ledger.capacity_per_gpu[0] / gib:.2f} GiB at their peaks); the simulator refuses this "
                             f"placement")
        ledger.add(j.job_id, jd, checked=True)


def predict(pair: tuple[tuple[str, int], tuple[str, int]], gpu_type: str, levels: tuple[int, int] = (0, 0),
            sharing: str = "fitted") -> dict:
    """Rates of two 1-GPU jobs sharing one GPU of ``gpu_type``, from the simulator's cost profiles,
    sharing model and engine: ``jobs`` run free, each at its own pace (the simulator's default
    pace, eqs. F1-F4, and how Gavel measured pairs); ``lockstep`` is the simulator's lockstep
    component of the two (one iteration each per step, eq. K2: ``--pace lockstep``)."""
    if gpu_type not in GPU_PEAK_TFLOPS:
        raise ValueError(f"unknown GPU type {gpu_type!r}; allowed: {', '.join(sorted(GPU_PEAK_TFLOPS))}")
    for model, batch in pair:
        check_table_exists(model, batch, gpu_type)
    cluster = ClusterSpec.from_gpus(1, gpus_per_node=1, gpu_type=gpu_type)
    costs = CostModel(cluster, SPBConfig())
    sharing_model = SharingModel(sharing, (gpu_type,))
    jobs = [JobState(job_id=i, arrival_s=0.0, num_gpus=1, model=model, batch_size=batch, iterations=1.0,
                     status=JobStatus.QUEUED) for i, (model, batch) in enumerate(pair)]
    decisions = [JobDecision((0,), level, Pattern.ROTATING) for level in levels]
    _check_pair_fits(cluster, costs, jobs, decisions, pair, gpu_type)
    members = [Member(j.job_id, costs.profile(j, jd.level, jd.pattern, jd.gpus), jd.gpus, 0)
               for j, jd in zip(jobs, decisions)]
    free = free_running([FreeRunner(m.profile, m.gpus) for m in members], sharing_model)
    pair_comp = Component(members, 0.0, sharing=None if sharing == "timeslice" else sharing_model)
    step_s = pair_comp.cycle / pair_comp.H  # mean seconds per lockstep step (one iteration of each job)
    jobs, lockstep = [], []
    for (model, batch), level, m, prof in zip(pair, levels, members, free.profiles):
        alone = Component([m], 0.0)
        together = Component([Member(m.job_id, prof, m.gpus, 0)], 0.0)
        alone_s, together_s = alone.cycle / alone.H, together.cycle / together.H  # mean seconds per iteration
        jobs.append({"model": model, "batch_size": batch, "level": level, "rate_it_s": 1.0 / together_s,
                     "alone_it_s": 1.0 / alone_s, "normalized_rate": alone_s / together_s})
        lockstep.append({"model": model, "rate_it_s": 1.0 / step_s, "normalized_rate": alone_s / step_s})
    return {"gpu_type": gpu_type, "sharing": sharing, "jobs": jobs, "combined": sum(j["normalized_rate"] for j in jobs),
            "lockstep": {"jobs": lockstep, "combined": sum(j["normalized_rate"] for j in lockstep)}}


def _run_predict(args) -> int:
    pairs = [parse_pair(p) for p in args.pair]
    levels = args.levels or (0, 0)
    out = [predict(p, args.gpu_type, levels, args.sharing) for p in pairs]
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for r in out:
            a, b = r["jobs"]
            print(f"{a['model']}:{a['batch_size']} (level {a['level']}) x {b['model']}:{b['batch_size']} "
                  f"(level {b['level']}) on {r['gpu_type']}: rates {a['normalized_rate']:.3f} + "
                  f"{b['normalized_rate']:.3f} = {r['combined']:.3f}")
    return 0


def _plot(rows_by_split: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(rows_by_split), figsize=(4.2 * len(rows_by_split), 4.0), squeeze=False)
    for ax, (title, pts) in zip(axes[0], rows_by_split.items()):
        meas = [m for m, _ in pts]
        pred = [p for _, p in pts]
        ax.scatter(meas, pred, s=8, alpha=0.6)
        ax.plot([0.3, 2.05], [0.3, 2.05], color="grey", lw=1)
        ax.axhline(1.0, color="red", lw=0.8, ls="--", label="time-slicing")
        ax.set_xlabel("measured combined throughput")
        ax.set_ylabel("predicted")
        ax.set_title(title)
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _run_check(args) -> int:
    table = validate(args.data)
    rows = [s.as_dict() for s in table]
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "colocation_check.json").write_text(json.dumps(rows, indent=2) + "\n")
        model = fitted_model()
        pairs = load_pairs(args.data)
        by = {g: [(p.combined, sum(predict_pair(model, p))) for p in pairs if p.gpu_type == g] for g in ("k80", "p100", "v100")}
        _plot({"K80 (fitted on)": by["k80"], "P100 (held out)": by["p100"], "V100 (fitted on)": by["v100"]},
              out / "colocation_check.png")
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'split':<28}{'gpu':<6}{'pairs':>6}{'median err':>11}{'p90 err':>9}{'rate err':>9}{'constant':>9}"
          f"{'timeslice':>10}  target")
    for s in table:
        print(f"{s.split:<28}{s.gpu_type:<6}{s.pairs:>6}{s.combined_median_err:>11.3f}{s.combined_p90_err:>9.3f}"
              f"{s.rate_median_err:>9.3f}{s.constant_median_err:>9.3f}{s.timeslice_median_err:>10.3f}  "
              f"{'met' if s.meets_target else 'not met'} (<= {s.target:.3f})")
    if args.out:
        print(f"wrote {Path(args.out) / 'colocation_check.json'} and colocation_check.png")
    return 0


def _run_fit(args) -> int:
    rec = write_fit(args.data)
    fitted_model.cache_clear()
    print(json.dumps(rec, indent=2) if args.json else f"wrote {FIT_FILE} ({rec['data']['pairs']} pairs, "
          f"data {rec['data']['sha256_16']})")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("colocation", help="the co-location model: predict pairs, check the fit, refit",
                              description="Rates of jobs sharing one GPU (docs/colocation.md).")
    sub = p.add_subparsers(dest="colocation_command", metavar="{predict,check,fit}")
    sub.required = True
    pr = sub.add_parser("predict", help="rates of pairs of 1-GPU jobs on one GPU, from the simulator")
    pr.add_argument("--gpu-type", required=True, help=f"one of {', '.join(sorted(GPU_PEAK_TFLOPS))}")
    pr.add_argument("--pair", action="append", required=True, metavar="MODEL:BATCH,MODEL:BATCH",
                    help="two jobs, e.g. resnet18:64,lstm_lm:20 (repeatable)")
    pr.add_argument("--levels", type=_parse_levels, default=None, metavar="LEVEL_A,LEVEL_B",
                    help="SPB levels of the two jobs (default 0,0: full backprop)")
    pr.add_argument("--sharing", choices=SHARING_MODES, default="fitted")
    pr.add_argument("--json", action="store_true", help="print a JSON list, one object per pair")
    pr.set_defaults(func=_run_predict)
    ch = sub.add_parser("check", help="validation table of the fit (and a plot with --out)")
    ch.add_argument("--data", default=None, help="data folder (default: the data folder, JIGSAW_DATA)")
    ch.add_argument("--json", action="store_true")
    ch.add_argument("--out", default=None, help="folder for colocation_check.json and colocation_check.png")
    ch.set_defaults(func=_run_check)
    fi = sub.add_parser("fit", help="refit on Gavel's pairs and write jigsaw_env/colocation_fit.json")
    fi.add_argument("--data", default=None, help="data folder (default: the data folder, JIGSAW_DATA)")
    fi.add_argument("--json", action="store_true")
    fi.set_defaults(func=_run_fit)


if __name__ == "__main__":  # pragma: no cover
    from .cli import main
    sys.exit(main(["colocation", *sys.argv[1:]]))
