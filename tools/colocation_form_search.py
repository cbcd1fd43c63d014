"""Choose the co-location model's form by cross-validation on K80 and V100 pairs only.

Usage (from the repository root; JIGSAW_DATA names the data folder)::

    python tools/colocation_form_search.py            # CV table of every candidate form (never reads P100)
    python tools/colocation_form_search.py --json OUT # the same table as JSON
    python tools/colocation_form_search.py --evaluate-p100 FORM   # the one held-out evaluation
    python tools/colocation_form_search.py --type-medians   # K80's and V100's pairs by job type

Protocol (docs/colocation.md, "Choosing the form"):

* The search drops every P100 pair as soon as the data is loaded; only ``--evaluate-p100`` reads
  them, for one form named on the command line, after the choice.
* Candidates are fitted exactly as the shipped model is (least squares on each job's normalized
  rate, soft-L1 loss scale 0.1, ridge 0.01 on all but the intercept, from zeros).
* Folds: leave-one-GPU-type-out (fit K80, test V100; fit V100, test K80) and leave-one-model-out
  on K80 and V100 together (fit without the model's pairs, test on its K80 pairs and its V100
  pairs: 10 test sets).
* A fold's score is the median absolute error of the combined normalized throughput divided by
  the constant predictor's on that test set (its own median combined throughput). The criterion
  is the mean of (mean LOTO score, mean LOMO score); lower is better. It was fixed before any
  candidate was evaluated.

Job features (per Gavel job type and batch size, from the zoo model that stands for it and its
cost table):

* ``t``: alone iteration time (1 / Gavel's alone throughput, what the cost tables are anchored to);
* ``B``: batch size;
* ``F``: FLOPs of one training iteration (forward + backward), counted by
  ``torch.utils.flop_counter.FlopCounterMode`` on the zoo model (LSTM cells added by hand:
  8 (d_in + h) h FLOPs per token forward, x3 with backward);
* ``M``: bytes touched per iteration, an estimate: 2 x the activations saved for backward (written
  in forward, read in backward) + 2 x (weights + gradients + optimizer state) (read and written);
* ``mem``: the process's peak memory (the cost table's full-depth peak);
* ``k``: kernels launched per training iteration, counted as the non-view ATen operators of one
  iteration (forward, backward, SGD step with momentum without ``foreach``) of the zoo model on
  the CPU (:func:`kernels_per_iteration`; the LSTM's fused cell counts as the CPU runs it). A job
  whose host-side launches take a large share of its time leaves its GPU idle between kernels:
  ``h = k * 10 us / t`` is that share (the 10 us per launch only shifts ``log h`` by a constant,
  which the fit's intercept absorbs);
* ``e`` and ``rho``: how the alone time grows with the batch size on the same GPU
  (:func:`batch_scaling`);
* ``is:<job type>``: 1 for a worker of that Gavel job type, else 0. Forms with these terms give
  each job type its own fitted sensitivity (as the slowed worker) or pressure (as the co-runner)
  on top of the features, the same on every GPU type. A job type left out of the fit (the LOMO
  folds, or a zoo model Gavel did not measure) gets 0, so it is predicted from its features.

GPU features (datasheets): peak FP32 TFLOP/s (K80 4.37 per GK210 GPU, P100 PCIe 9.3, V100 SXM2
15.7), memory bandwidth (K80 240 GB/s per GK210 GPU = 480 per board / 2, P100 PCIe 732, V100 SXM2
900), memory (K80 12 GiB per GPU, P100 16, V100 16). Derived: compute utilization
``u = F / (t * peak)``, bandwidth utilization ``v = M / (t * bandwidth)``, memory share
``m = mem / capacity``.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from jigsaw_env.colocation_fit import LOSS_SCALE, RIDGE, ZOO_GAVEL_JOBS, load_pairs  # noqa: E402

ZOO_OF = {"ResNet-18": "resnet18", "ResNet-50": "resnet50", "Transformer": "transformer_small",
          "LM": "lstm_lm", "Recommendation": "recommendation"}
PEAK_TFLOPS = {"k80": 4.37, "p100": 9.3, "v100": 15.7}
BANDWIDTH_GBS = {"k80": 240.0, "p100": 732.0, "v100": 900.0}
MEMORY_GIB = {"k80": 12.0, "p100": 16.0, "v100": 16.0}


def kernels_per_iteration(model_name: str) -> int:
    """Non-view ATen operators (kernels, on a GPU) of one training iteration of a zoo model: its
    forward, backward and an SGD step with momentum (``foreach=False``: one update per tensor),
    at batch size 4 on the CPU (the count does not depend on the batch size)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from jigsaw_env.zoo import build_model

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not (func.is_view or func.overloadpacket is torch.ops.aten.detach):
                self.n += 1
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    m = build_model(model_name)
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9, foreach=False)
    x, y = m.make_batch(4, torch.Generator().manual_seed(0))
    m.loss(m(x), y).backward()  # the first step makes the momentum buffers
    opt.step()
    opt.zero_grad(set_to_none=False)
    with Count() as c:
        m.loss(m(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
    return c.n


def flops_per_sample(model_name: str) -> float:
    """FLOPs of one training iteration per sample (forward + backward) of a zoo model."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from jigsaw_env.zoo import build_model
    torch.manual_seed(0)
    m = build_model(model_name)
    x, y = m.make_batch(2, torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as fc:
        m.loss(m(x), y).backward()
    total = fc.get_total_flops() / 2
    lstm = [mod for mod in m.modules() if isinstance(mod, torch.nn.LSTM)]
    for mod in lstm:  # aten's fused LSTM is not counted: 4 gates x (d_in + h) x h MACs per token
        total += 3 * 8 * (mod.input_size + mod.hidden_size) * mod.hidden_size * m.bptt
    return float(total)


@dataclass(frozen=True)
class JobFeatures:
    t: float
    batch: int
    flops: float
    bytes_touched: float
    mem_bytes: float
    elasticity: float = 1.0  # d log t / d log B between this batch size and the next (batch_scaling)
    busy_fit: float = 1.0    # (t - c) / t, c the intercept of t = c + w B over the job's batch sizes
    job: str = ""            # the Gavel job type
    kernels: int = 1         # kernels launched per iteration (kernels_per_iteration)


def job_features(pairs) -> dict:
    """(gpu, job, batch) -> JobFeatures for every job in ``pairs``."""
    from jigsaw_env.cost_table import get_table
    per_sample = {job: flops_per_sample(z) for job, z in ZOO_OF.items()}
    kernels = {job: kernels_per_iteration(z) for job, z in ZOO_OF.items()}
    out = {}
    for p in pairs:
        for job, bs, alone in ((p.job_a, p.batch_a, p.alone_a), (p.job_b, p.batch_b, p.alone_b)):
            key = (p.gpu_type, job, bs)
            if key in out:
                continue
            tab = get_table(ZOO_OF[job], bs, p.gpu_type)
            state = tab.meta["weights_bytes"] + tab.meta["gradient_bytes"] + tab.meta["optimizer_state_bytes"]
            act = tab.activation_peak_bytes(0)
            out[key] = JobFeatures(1.0 / alone, bs, per_sample[job] * bs, 2.0 * act + 2.0 * state,
                                   float(tab.process_peak_bytes(0)), job=job, kernels=kernels[job])
    return batch_scaling(out)


def batch_scaling(feats: dict) -> dict:
    """``feats`` with each job's batch-scaling features, from the alone times of its job type at
    the batch sizes measured on the same GPU (Gavel's alone throughputs, no pairs):

    * ``elasticity``: ``log(t(B') / t(B)) / log(B' / B)`` with ``B'`` the next larger measured
      batch size (the next smaller for the largest), clipped to [0.05, 1.5]: near 0 when a larger
      batch costs no more time (the GPU idles behind fixed per-iteration work), 1 when time grows
      with the batch;
    * ``busy_fit``: ``(t - c) / t`` with ``c >= 0`` the intercept of the least-squares line
      ``t = c + w B`` over the type's batch sizes, clipped to [0.05, 1]: the share of the time
      that grows with the batch.
    """
    import dataclasses

    by_type: dict = {}
    for (gpu, job, bs), f in feats.items():
        by_type.setdefault((gpu, job), {})[bs] = f.t
    out = {}
    for (gpu, job, bs), f in feats.items():
        times = by_type[(gpu, job)]
        sizes = sorted(times)
        if len(sizes) == 1:
            e, busy = 1.0, 1.0
        else:
            i = sizes.index(bs)
            b1, b2 = (sizes[i], sizes[i + 1]) if i + 1 < len(sizes) else (sizes[i - 1], sizes[i])
            e = math.log(times[b2] / times[b1]) / math.log(b2 / b1)
            w, c = np.polyfit(np.array(sizes, float), np.array([times[b] for b in sizes]), 1)
            busy = (f.t - max(c, 0.0)) / f.t
        out[(gpu, job, bs)] = dataclasses.replace(f, elasticity=min(max(e, 0.05), 1.5),
                                                  busy_fit=min(max(busy, 0.05), 1.0))
    return out


def feature_columns(gpu: str, f: JobFeatures) -> dict:
    """Log features of one job on ``gpu``."""
    peak, bw, cap = PEAK_TFLOPS[gpu] * 1e12, BANDWIDTH_GBS[gpu] * 1e9, MEMORY_GIB[gpu] * 2**30
    u = f.flops / (f.t * peak)
    v = f.bytes_touched / (f.t * bw)
    return {"lt": math.log(f.t), "lb": math.log(f.batch), "lp": math.log(PEAK_TFLOPS[gpu]),
            "lbw": math.log(BANDWIDTH_GBS[gpu]), "lu": math.log(u), "lv": math.log(v),
            "lm": math.log(f.mem_bytes / cap), "lroof": math.log(max(u, v)), "lsum": math.log(u + v),
            "u": u, "v": v, "ltp": math.log(f.t * PEAK_TFLOPS[gpu]), "ltbw": math.log(f.t * BANDWIDTH_GBS[gpu]),
            "lbusy": math.log(f.flops / peak + f.bytes_touched / bw) - math.log(f.t),
            "e": f.elasticity, "le": math.log(f.elasticity), "rho": f.busy_fit, "lrho": math.log(f.busy_fit),
            "lk": math.log(f.kernels), "lh": math.log(f.kernels * 10e-6 / f.t),
            **{f"is:{job}": float(f.job == job) for job in ZOO_GAVEL_JOBS}}


# ----- candidate forms: each maps (features of a, features of b) to the terms multiplying coefficients
def _terms(names_self, names_other=(), gaps=(), typ=()):
    def f(a, b):
        return ([1.0] + [a[n] for n in names_self] + [b[n] for n in names_other]
                + [abs(a[n] - b[n]) for n in gaps] + [a[n] for n in typ])
    return f


JOB_TYPE = tuple(f"is:{job}" for job in ZOO_GAVEL_JOBS)

FORMS = {
    "t, B + gaps + peak": _terms(("lt", "lb"), ("lt", "lb"), ("lt", "lb"), ("lp",)),
    "util u": _terms(("lu",), ("lu",)),
    "util u + t": _terms(("lu", "lt"), ("lu", "lt")),
    "util u, bandwidth v": _terms(("lu", "lv"), ("lu", "lv")),
    "util u, bandwidth v, memory m": _terms(("lu", "lv", "lm"), ("lu", "lv", "lm")),
    "u, v + t": _terms(("lu", "lv", "lt"), ("lu", "lv", "lt")),
    "u, v + gaps": _terms(("lu", "lv"), ("lu", "lv"), ("lu", "lv")),
    "u, v + peak": _terms(("lu", "lv"), ("lu", "lv"), (), ("lp",)),
    "u, v + bandwidth": _terms(("lu", "lv"), ("lu", "lv"), (), ("lbw",)),
    "roofline max(u, v)": _terms(("lroof",), ("lroof",)),
    "roofline max(u, v) + t": _terms(("lroof", "lt"), ("lroof", "lt")),
    "u + v summed": _terms(("lsum",), ("lsum",)),
    "u, v, m, t, B": _terms(("lu", "lv", "lm", "lt", "lb"), ("lu", "lv", "lm", "lt", "lb")),
    "u, v, m, t, B + peak": _terms(("lu", "lv", "lm", "lt", "lb"), ("lu", "lv", "lm", "lt", "lb"), (), ("lp",)),
    "t, B": _terms(("lt", "lb"), ("lt", "lb")),
    "t, B + peak": _terms(("lt", "lb"), ("lt", "lb"), (), ("lp",)),
    "t x peak, B (type-normalized time)": _terms(("ltp", "lb"), ("ltp", "lb")),
    "t x peak, B + gaps": _terms(("ltp", "lb"), ("ltp", "lb"), ("ltp", "lb")),
    "t x bandwidth, B": _terms(("ltbw", "lb"), ("ltbw", "lb")),
    "busy (F/peak + M/bw) / t": _terms(("lbusy",), ("lbusy",)),
    "busy + t": _terms(("lbusy", "lt"), ("lbusy", "lt")),
    "busy + t + peak": _terms(("lbusy", "lt"), ("lbusy", "lt"), (), ("lp",)),
    "t, B, u, v + gaps + peak": _terms(("lt", "lb", "lu", "lv"), ("lt", "lb", "lu", "lv"), ("lt", "lb"), ("lp",)),
    "t, B, m + gaps + peak": _terms(("lt", "lb", "lm"), ("lt", "lb", "lm"), ("lt", "lb"), ("lp",)),
    "busy + t, B + peak": _terms(("lbusy", "lt", "lb"), ("lbusy", "lt", "lb"), (), ("lp",)),
    "t + peak (no batch)": _terms(("lt",), ("lt",), (), ("lp",)),
    "t, B + peak, other's t only": _terms(("lt", "lb"), ("lt",), (), ("lp",)),
    "t, B, m + peak": _terms(("lt", "lb", "lm"), ("lt", "lb", "lm"), (), ("lp",)),
    "batch elasticity e + t + peak": _terms(("e", "lt"), ("e", "lt"), (), ("lp",)),
    "log elasticity + t, B + peak": _terms(("le", "lt", "lb"), ("le", "lt", "lb"), (), ("lp",)),
    "busy share (batch fit) + t, B + peak": _terms(("lrho", "lt", "lb"), ("lrho", "lt", "lb"), (), ("lp",)),
    "busy share (batch fit), linear + peak": _terms(("rho",), ("rho",), (), ("lp",)),
    "t, B + peak + job type's sensitivity": _terms(("lt", "lb") + JOB_TYPE, ("lt", "lb"), (), ("lp",)),
    "t, B + peak + job type's pressure": _terms(("lt", "lb"), ("lt", "lb") + JOB_TYPE, (), ("lp",)),
    "t, B + peak + job type's sensitivity and pressure": _terms(("lt", "lb") + JOB_TYPE, ("lt", "lb") + JOB_TYPE, (),
                                                                 ("lp",)),
    "t + peak + job type's pressure": _terms(("lt",), ("lt",) + JOB_TYPE, (), ("lp",)),
    "t, B, kernels k + peak": _terms(("lt", "lb", "lk"), ("lt", "lb", "lk"), (), ("lp",)),
    "launch share h + peak": _terms(("lh",), ("lh",), (), ("lp",)),
    "launch share h + t + peak": _terms(("lh", "lt"), ("lh", "lt"), (), ("lp",)),
    "launch share h, B + peak": _terms(("lh", "lb"), ("lh", "lb"), (), ("lp",)),
}


def design(form, pairs, feats):
    da, db = [], []
    for p in pairs:
        fa = feature_columns(p.gpu_type, feats[(p.gpu_type, p.job_a, p.batch_a)])
        fb = feature_columns(p.gpu_type, feats[(p.gpu_type, p.job_b, p.batch_b)])
        da.append(form(fa, fb))
        db.append(form(fb, fa))
    return np.array(da), np.array(db)


def fit(form, pairs, feats, loss="soft_l1"):
    from scipy.optimize import least_squares
    da, db = design(form, pairs, feats)
    xa = np.array([p.rate_a for p in pairs])
    xb = np.array([p.rate_b for p in pairs])

    def residuals(c):
        return np.concatenate([1 / (1 + np.exp(da @ c)) - xa, 1 / (1 + np.exp(db @ c)) - xb, RIDGE * c[1:]])

    return least_squares(residuals, np.zeros(da.shape[1]), loss=loss, f_scale=LOSS_SCALE).x


def errors(form, coef, pairs, feats) -> dict:
    da, db = design(form, pairs, feats)
    pa, pb = 1 / (1 + np.exp(da @ coef)), 1 / (1 + np.exp(db @ coef))
    ma = np.array([p.rate_a for p in pairs])
    mb = np.array([p.rate_b for p in pairs])
    comb = ma + mb
    ce = np.abs(pa + pb - comb)
    re_ = np.abs(np.concatenate([pa - ma, pb - mb]))
    const = float(np.median(np.abs(comb - np.median(comb))))
    return {"pairs": len(pairs), "median_combined": float(np.median(comb)), "median_err": float(np.median(ce)),
            "p90_err": float(np.percentile(ce, 90)), "rate_median_err": float(np.median(re_)),
            "rate_p90_err": float(np.percentile(re_, 90)), "constant_err": const,
            "ratio": float(np.median(ce)) / const}


def cross_validate(form, train, feats) -> dict:
    """LOTO and LOMO folds on K80 + V100 pairs (``train``)."""
    loto = {}
    for fit_gpu, test_gpu in (("k80", "v100"), ("v100", "k80")):
        c = fit(form, [p for p in train if p.gpu_type == fit_gpu], feats)
        loto[f"fit {fit_gpu} test {test_gpu}"] = errors(form, c, [p for p in train if p.gpu_type == test_gpu], feats)
    lomo = {}
    for job in ZOO_GAVEL_JOBS:
        c = fit(form, [p for p in train if job not in (p.job_a, p.job_b)], feats)
        for gpu in ("k80", "v100"):
            held = [p for p in train if p.gpu_type == gpu and job in (p.job_a, p.job_b)]
            lomo[f"leave out {job} ({gpu})"] = errors(form, c, held, feats)
    s_loto = float(np.mean([e["ratio"] for e in loto.values()]))
    s_lomo = float(np.mean([e["ratio"] for e in lomo.values()]))
    c_all = fit(form, train, feats)
    in_sample = {g: errors(form, c_all, [p for p in train if p.gpu_type == g], feats) for g in ("k80", "v100")}
    return {"loto": loto, "lomo": lomo, "score_loto": s_loto, "score_lomo": s_lomo,
            "criterion": (s_loto + s_lomo) / 2, "in_sample": in_sample, "coef": c_all.tolist()}


def type_medians(train) -> str:
    """Markdown: each GPU type's median combined throughput per pair of job types (pairs counted),
    from the fitting GPU types' pairs only."""
    lines = []
    for gpu in ("k80", "v100"):
        cells: dict = {}
        for p in train:
            if p.gpu_type == gpu:
                cells.setdefault(tuple(sorted((p.job_a, p.job_b))), []).append(p.combined)
        jobs = sorted({j for pair in cells for j in pair})
        lines += [f"{gpu.upper()}: median combined throughput (pairs)", "",
                  "| | " + " | ".join(jobs) + " |", "|---" * (len(jobs) + 1) + "|"]
        for a in jobs:
            row = [f"{np.median(cells[key]):.2f} ({len(cells[key])})" if (key := tuple(sorted((a, b)))) in cells
                   else "" for b in jobs]
            lines.append(f"| {a} | " + " | ".join(row) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=None, help="data folder (default JIGSAW_DATA)")
    ap.add_argument("--json", default=None, help="write the CV table here")
    ap.add_argument("--evaluate-p100", default=None, metavar="FORM", help="evaluate one chosen form on P100")
    ap.add_argument("--type-medians", action="store_true",
                    help="print K80's and V100's median combined throughput per pair of job types, and exit")
    args = ap.parse_args(argv)
    path = None if args.data is None else Path(args.data) / "gavel/simulation_throughputs.json"
    pairs = load_pairs(path)
    if args.evaluate_p100 is None:
        pairs = [p for p in pairs if p.gpu_type in ("k80", "v100")]  # P100 never enters the search
    feats = job_features(pairs)
    train = [p for p in pairs if p.gpu_type in ("k80", "v100")]
    if args.type_medians:
        print(type_medians(train))
        return 0
    if args.evaluate_p100 is not None:
        form = FORMS[args.evaluate_p100]
        c = fit(form, train, feats)
        res = errors(form, c, [p for p in pairs if p.gpu_type == "p100"], feats)
        print(json.dumps({"form": args.evaluate_p100, "coef": c.tolist(), "p100": res}, indent=2))
        return 0
    table = {}
    print(f"{'form':<36}{'LOTO':>7}{'LOMO':>7}{'crit':>7}  k80->v100  v100->k80  (median err / constant)")
    for name, form in FORMS.items():
        r = table[name] = cross_validate(form, train, feats)
        lt = list(r["loto"].values())
        print(f"{name:<36}{r['score_loto']:>7.3f}{r['score_lomo']:>7.3f}{r['criterion']:>7.3f}  "
              f"{lt[0]['median_err']:.3f}/{lt[0]['constant_err']:.3f}  {lt[1]['median_err']:.3f}/{lt[1]['constant_err']:.3f}",
              flush=True)
    best = min(table, key=lambda n: table[n]["criterion"])
    print(f"chosen (lowest criterion): {best}")
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
