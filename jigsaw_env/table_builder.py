"""Build :class:`~jigsaw_env.cost_table.CostTable` objects from zoo models.

Two steps (docs/cost_tables.md has every formula):

1. :func:`measure_table` runs a :mod:`jigsaw_env.zoo` model on a local device (``cpu`` or
   ``cuda``) and measures, per layer group: parameter bytes (exact), activation bytes saved for
   backward (exact, counted with ``torch.autograd.graph.saved_tensors_hooks``), forward time, and
   backward time split into weight-gradient and input-gradient time; for the whole model the
   optimizer-step time, one whole training iteration, and the fixed per-process memory.
   The per-group times are scaled by one factor so that the table's full-backprop iteration
   time ``compute_s(0)`` equals the measured whole iteration.
2. :func:`anchor_table` turns a measured table into a K80/P100/V100 table: every time is scaled by
   one factor so that ``compute_s(0) = 1 / throughput`` from Gavel's measured throughputs
   (``gavel/simulation_throughputs.json`` in the data folder), or, for a model Gavel did not
   measure, by the geometric mean of that factor over the anchored models (an extrapolation).
"""
from __future__ import annotations

import datetime as _dt
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
import torch.nn as nn
from tqdm.auto import tqdm

from jigsaw_env.cost_table import REFERENCE_BATCH_SIZES, TABLES_DIR, CostTable, LayerGroup, table_filename
from jigsaw_env.gavel_data import GAVEL_FILE, PROJECT_ROOT, data_dir, gavel_alone_throughput, gavel_key, gavel_throughputs
from jigsaw_env.zoo import MODELS, ZooModel, build_model

GPU_TYPES = ("k80", "p100", "v100")
MEASURE_DEVICES = ("cpu", "cuda")
# Assumed (not measured here) per-process CUDA context + cuDNN/cuBLAS workspace on K80/P100/V100.
ASSUMED_CUDA_OVERHEAD_BYTES = 500 * 2**20
# Used only when the CPU overhead measurement (a subprocess) fails.
FALLBACK_CPU_OVERHEAD_BYTES = 300 * 2**20

OPTIMIZER_TEXT = {
    "sgd_momentum": "SGD with momentum 0.9 and weight decay",
    "sgd": "plain SGD (no momentum)",
    "adam": "Adam",
    "adamw": "AdamW",
}


# --------------------------------------------------------------------------------------------
# exact byte counts
# --------------------------------------------------------------------------------------------
def param_bytes_per_group(model: ZooModel) -> list[int]:
    """Bytes of trainable parameters per group (sum of numel * element_size)."""
    out = []
    for g in model.groups:
        seen: set[int] = set()
        total = 0
        for p in g.parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                total += p.numel() * p.element_size()
        out.append(int(total))
    return out


def _storage_key(t: torch.Tensor) -> tuple[Any, ...]:
    try:
        st = t.untyped_storage()
        return (t.device.type, t.device.index, st.data_ptr()), st.nbytes()
    except (RuntimeError, NotImplementedError):  # tensors without a plain storage
        return ("id", id(t)), t.numel() * t.element_size()


class _SavedTensorCounter:
    """Pack hook recording, per distinct storage, its size and the highest group that saved it."""

    def __init__(self, exclude: set) -> None:
        self.exclude = exclude
        self.group = 0
        self.storages: dict[Any, tuple[int, int]] = {}

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        key, nbytes = _storage_key(t)
        if key not in self.exclude:
            prev = self.storages.get(key)
            if prev is None:
                self.storages[key] = (int(nbytes), self.group)
            else:
                self.storages[key] = (max(prev[0], int(nbytes)), max(prev[1], self.group))
        return t

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t


def activation_bytes_per_group(model: ZooModel, inputs: torch.Tensor, targets: torch.Tensor,
                               include_loss: bool = True) -> list[int]:
    """Bytes saved for backward per group during one training forward (full backprop).

    Every tensor that autograd saves while group ``b`` runs is recorded through
    ``saved_tensors_hooks``; tensors sharing a storage are counted once, at the storage's size
    (a view keeps its whole storage alive); parameters and buffers are model state, not
    activations, and are left out. A storage saved by several groups (a group's output saved
    again as the next group's input) counts in the highest of them, so the sum over groups
    ``>= s`` is exactly what a worker starting backprop at ``s`` keeps. The loss's saved tensors
    count in the last group.
    """
    exclude = {_storage_key(t)[0] for t in list(model.parameters()) + list(model.buffers())}
    counter = _SavedTensorCounter(exclude)
    B = model.num_groups
    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack):
        x = inputs
        for i, g in enumerate(model.groups):
            counter.group = i
            x = g(x)
        if include_loss:
            counter.group = B - 1
            loss = model.loss(x, targets)
        else:
            loss = x
    out = [0] * B
    for nbytes, gi in counter.storages.values():
        out[gi] += nbytes
    del loss, x
    return out


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Exact bytes of the optimizer's state tensors (distinct storages)."""
    seen: dict[Any, int] = {}
    for state in optimizer.state.values():
        for v in state.values():
            if torch.is_tensor(v):
                key, nbytes = _storage_key(v)
                seen[key] = max(seen.get(key, 0), int(nbytes))
    return int(sum(seen.values()))


def model_state_bytes(model: nn.Module) -> tuple[int, int]:
    """(bytes of all parameters and buffers, bytes of trainable parameters = gradient bytes)."""
    weights = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
    grads = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return int(weights), int(grads)


@lru_cache(maxsize=1)
def cpu_framework_overhead_bytes() -> tuple[int, str]:
    """Peak RSS of a fresh Python process after ``import torch`` and one tiny op (measured here)."""
    # VmHWM of the child's own address space (ru_maxrss would carry the parent's peak across exec)
    code = ("import torch; torch.set_num_threads(1); (torch.ones(8) + 1).sum().item(); "
            "print([int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:')][0])")
    try:
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
        kib = int(res.stdout.strip().splitlines()[-1])
        return kib * 1024, ("measured here: peak RSS of a fresh Python process after `import torch` "
                            f"and one tiny op = {kib * 1024 / 2**20:.0f} MiB")
    except Exception as e:  # pragma: no cover - depends on the host
        return FALLBACK_CPU_OVERHEAD_BYTES, (f"assumed {FALLBACK_CPU_OVERHEAD_BYTES // 2**20} MiB "
                                             f"(the RSS measurement failed: {type(e).__name__})")


def cuda_framework_overhead_bytes(device: torch.device) -> tuple[int, str]:
    """GPU memory in use on ``device`` outside PyTorch's caching allocator (CUDA context etc.)."""
    torch.cuda.init()
    torch.empty(1, device=device)
    free, total = torch.cuda.mem_get_info(device)
    used = total - free - torch.cuda.memory_reserved(device)
    return int(max(used, 0)), ("measured here: device memory in use outside the caching allocator "
                               "(total - free - reserved) after CUDA init; includes other processes "
                               "on the same GPU, if any")


# --------------------------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------------------------
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_time(fn: Callable[[], Any], repeats: int, warmup: int, device: torch.device,
                setup: Callable[[], Any] | None = None) -> float:
    """Median wall time of ``fn()`` over ``repeats`` runs after ``warmup`` runs; ``setup()`` runs
    before each call, outside the timed region."""
    for _ in range(warmup):
        if setup:
            setup()
        fn()
    times = []
    for _ in range(repeats):
        if setup:
            setup()
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return float(statistics.median(times))


def _group_inputs(model: ZooModel, inputs: torch.Tensor) -> list[torch.Tensor]:
    """The input tensor of every group, from one no-grad forward."""
    xs = [inputs]
    with torch.no_grad():
        x = inputs
        for g in list(model.groups)[:-1]:
            x = g(x)
            xs.append(x)
    return xs


def time_groups(model: ZooModel, inputs: torch.Tensor, targets: torch.Tensor, repeats: int, warmup: int,
                device: torch.device, progress: bool = False, desc: str = "") -> dict[str, list[float]]:
    """Per-group forward, weight-gradient and input-gradient backward times (median seconds).

    forward: the group's forward with gradients enabled (last group: + loss).
    backward_weight: backward of the group when its input does not require grad (what the start
    group of an SPB worker does).
    backward_input: backward when the input requires grad, minus backward_weight, clipped at 0.
    The two backward passes run interleaved (alternating which goes first) on two retained graphs,
    and the median of the per-repeat differences is taken, so slow drifts of the host's load
    cancel out. Group 0 gets 0: its input is the data batch, which never needs a gradient
    (integer ids cannot have one).
    """
    B = model.num_groups
    xs = _group_inputs(model, inputs)
    fwd, bw_w, bw_i = [0.0] * B, [0.0] * B, [0.0] * B
    it = range(B)
    if progress:
        it = tqdm(it, desc=desc or "groups", unit="group", leave=False, file=sys.stderr)
    for i in it:
        g = model.groups[i]
        params = [p for p in g.parameters() if p.requires_grad]
        last = i == B - 1
        x0 = xs[i].detach()
        can_grad_input = i > 0 and x0.is_floating_point()

        def run(x: torch.Tensor) -> torch.Tensor:
            out = g(x)
            return model.loss(out, targets) if last else out

        def fresh_input(req: bool) -> torch.Tensor:
            return x0.detach().requires_grad_(True) if req else x0

        with torch.enable_grad():
            fwd[i] = median_time(lambda: run(fresh_input(can_grad_input)), repeats, warmup, device)

            x_w = fresh_input(False)
            out_w = run(x_w)
            if not out_w.requires_grad:  # a group without parameters fed by a no-grad input
                del out_w
                continue
            gout = None if last else torch.randn_like(out_w)
            graphs = [(x_w, out_w)]
            if can_grad_input:
                x_f = fresh_input(True)
                graphs.append((x_f, run(x_f)))

            def timed_backward(k: int) -> float:
                x, out = graphs[k]
                for p in params:
                    p.grad = None
                x.grad = None
                _sync(device)
                t0 = time.perf_counter()
                torch.autograd.backward(out, gout, retain_graph=True)
                _sync(device)
                return time.perf_counter() - t0

            for _ in range(warmup):
                for k in range(len(graphs)):
                    timed_backward(k)
            t_w, t_f = [], []
            for r in range(repeats):
                order = range(len(graphs)) if r % 2 == 0 else reversed(range(len(graphs)))
                got = {k: timed_backward(k) for k in order}
                t_w.append(got[0])
                if can_grad_input:
                    t_f.append(got[1])
            bw_w[i] = float(statistics.median(t_w))
            if can_grad_input:
                bw_i[i] = max(0.0, float(statistics.median([f - w for f, w in zip(t_f, t_w)])))
            for p in params:
                p.grad = None
            del graphs, out_w, x_w
    return {"forward_s": fwd, "backward_weight_s": bw_w, "backward_input_s": bw_i}


def time_whole_iteration(model: ZooModel, inputs: torch.Tensor, targets: torch.Tensor,
                         optimizer: torch.optim.Optimizer, repeats: int, warmup: int,
                         device: torch.device) -> float:
    """Median time of one training iteration: zero_grad, forward, loss, backward, optimizer step."""

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss = model.loss(model(inputs), targets)
        loss.backward()
        model.optimizer_step(optimizer)

    with torch.enable_grad():
        return median_time(step, repeats, warmup, device)


def time_optimizer(model: ZooModel, optimizer: torch.optim.Optimizer, repeats: int, warmup: int,
                   device: torch.device) -> float:
    """Median time of one optimizer update (gradient clipping included where the model clips).
    Needs gradients in place (call after a backward)."""
    if not any(p.grad is not None for p in model.parameters()):
        raise RuntimeError("time_optimizer: run a backward first (no gradients in place)")
    return median_time(lambda: model.optimizer_step(optimizer), repeats, warmup, device)


# --------------------------------------------------------------------------------------------
# measured table
# --------------------------------------------------------------------------------------------
def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``'s ``model name``; else :func:`platform.processor`)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _loadavg() -> float | None:
    """1-minute load average of the host (other processes perturb CPU timings), or None."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def auto_repeats(probe_s: float, budget_s: float = 8.0, lo: int = 5, hi: int = 50) -> int:
    """Repeats so that one timing phase costs about ``budget_s`` (at least ``lo``, at most ``hi``)."""
    if probe_s <= 0:
        return hi
    return int(min(hi, max(lo, round(budget_s / probe_s))))


@dataclass(frozen=True)
class _Measured:
    """What :func:`measure_table` measured, for its sources and meta: times in seconds, sizes in
    bytes."""
    model: Any              # the zoo module
    batch_size: int
    device: str
    where: str              # the processor or GPU name (and threads on a CPU)
    command: str
    repeats: int
    warmup: int
    seed: int
    whole_iteration: bool
    whole_s: float | None   # the whole training iteration, when measured
    parts_s: float          # the sum of the separately measured parts
    scale: float            # whole_s / parts_s (1 without the anchor)
    weights_b: int
    grads_b: int
    opt_b: int
    overhead_b: int
    overhead_src: str
    wall_s: float
    load_start: float | None


def _measured_sources(m: _Measured) -> dict[str, str]:
    """The cost table's ``sources``: how each number was measured."""
    model, batch_size, device, repeats, warmup = m.model, m.batch_size, m.device, m.repeats, m.warmup
    how = f"measured here ({m.where}, torch {torch.__version__}; `{m.command}`)"
    clip = f", after clip_grad_norm_({model.grad_clip})" if model.grad_clip is not None else ""
    scaled = (f", then scaled by {m.scale:.4f} (see anchor)" if m.whole_iteration else "")
    return {
        "param_bytes": "exact: sum of numel*element_size of each group's trainable parameters "
                       f"(jigsaw_env.zoo.{type(model).__name__})",
        "activation_bytes": "exact: distinct storages saved for backward (torch.autograd.graph."
                            f"saved_tensors_hooks) during one training-mode forward at batch {batch_size} on "
                            f"{device}, parameters and buffers excluded; a storage saved by several groups counts "
                            "in the highest one; the loss's saved tensors count in the last group",
        "forward_s": f"{how}: median of {repeats} runs after {warmup} warm-up of the group's forward with "
                     f"gradients enabled (last group: + loss){scaled}",
        "backward_weight_s": f"{how}: median of {repeats} backward passes of the group whose input does not "
                             f"require grad (weight gradients only){scaled}",
        "backward_input_s": f"{how}: median over {repeats} interleaved pairs of (backward with an input that "
                            f"requires grad - backward with one that does not), clipped at >= 0{scaled}; group 0 is "
                            "0 (its input is the data batch: no input gradient)",
        "optimizer_s": f"{how}: median of {repeats} `optimizer.step()` on the whole model, "
                       f"{OPTIMIZER_TEXT.get(model.optimizer_name, model.optimizer_name)}{clip}{scaled}",
        "fixed_memory_bytes": f"weights+buffers {m.weights_b} B + gradients {m.grads_b} B + optimizer state {m.opt_b} B "
                              f"(exact, from the module and the optimizer state after a step) + framework "
                              f"overhead {m.overhead_b} B ({m.overhead_src})",
        "anchor": (f"{how}: whole training iteration (zero_grad, forward, loss, backward, optimizer step), "
                   f"median of {repeats} = {m.whole_s:.6g} s; the per-group parts (sum {m.parts_s:.6g} s) are scaled by "
                   f"{m.scale:.4f} so that compute_s(0) equals it") if m.whole_iteration else
                  "none: the sum of the separately measured per-group parts (no whole-iteration anchor)",
    }


def _measured_meta(m: _Measured) -> dict[str, Any]:
    """The cost table's ``meta``: where, when and how it was measured, and the byte counts."""
    model = m.model
    return {
        "kind": "measured",
        "measured_on": m.device,
        "torch_version": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": cpu_name() if m.device == "cpu" else m.where,
        "threads": torch.get_num_threads(),
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "repeats": m.repeats,
        "warmup": m.warmup,
        "seed": m.seed,
        "zoo_class": type(model).__name__,
        "group_names": list(model.group_names),
        "optimizer": model.optimizer_name,
        "grad_clip": model.grad_clip,
        "input_is_index": model.input_is_index,
        "gavel_job": model.gavel_job,
        "sum_of_parts_s": m.parts_s,
        "whole_iteration_s": m.whole_s,
        "parts_scale": m.scale,
        "weights_bytes": m.weights_b,
        "gradient_bytes": m.grads_b,
        "optimizer_state_bytes": m.opt_b,
        "framework_overhead_bytes": m.overhead_b,
        "calibration_wall_s": round(m.wall_s, 2),
        "loadavg_1min_start_end": [m.load_start, _loadavg()],
        "command": m.command,
    }


def measure_table(model_name: str, batch_size: int, device: str = "cpu", repeats: int | None = None,
                  warmup: int = 1, seed: int = 0, progress: bool = False, whole_iteration: bool = True,
                  command: str | None = None) -> CostTable:
    """Measure a cost table of ``model_name`` at ``batch_size`` on the local ``device``.

    ``device`` is ``"cpu"`` or ``"cuda"``. ``repeats=None`` picks the number of timed runs from a
    one-iteration probe (5 for models that take seconds per iteration, up to 50 for tiny ones).
    With ``whole_iteration`` (default) the per-group times are scaled by one factor so that
    ``compute_s(0)`` equals a measured whole training iteration (both numbers go in ``meta``).
    """
    if device not in MEASURE_DEVICES:
        raise ValueError(f"unknown measuring device {device!r}; allowed: {list(MEASURE_DEVICES)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but torch sees no CUDA device here")
    if batch_size <= 0:
        raise ValueError(f"batch size must be > 0, got {batch_size}")
    dev = torch.device(device)
    torch.manual_seed(seed)
    model = build_model(model_name).to(dev)
    model.train()
    gen = torch.Generator().manual_seed(seed)
    inputs, targets = model.make_batch(batch_size, generator=gen)
    inputs, targets = inputs.to(dev), targets.to(dev)

    load_start = _loadavg()
    t_start = time.perf_counter()
    # probe: one full iteration (also warms the allocator and kernels up)
    opt = model.make_optimizer()
    probe = time_whole_iteration(model, inputs, targets, opt, repeats=1, warmup=0, device=dev)
    if repeats is None:
        repeats = auto_repeats(probe)
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")

    pbytes = param_bytes_per_group(model)
    opt.zero_grad(set_to_none=True)
    abytes = activation_bytes_per_group(model, inputs, targets)
    times = time_groups(model, inputs, targets, repeats, warmup, dev, progress=progress,
                        desc=f"{model_name} bs{batch_size} {device}")
    whole = None
    if whole_iteration:
        whole = time_whole_iteration(model, inputs, targets, opt, repeats, warmup, dev)
    else:  # still need gradients in place for the optimizer timing
        with torch.enable_grad():
            model.loss(model(inputs), targets).backward()
    opt_s = time_optimizer(model, opt, repeats, warmup, dev)
    weights_b, grads_b = model_state_bytes(model)
    opt_b = optimizer_state_bytes(opt)
    if device == "cpu":
        overhead_b, overhead_src = cpu_framework_overhead_bytes()
    else:
        overhead_b, overhead_src = cuda_framework_overhead_bytes(dev)
    wall = time.perf_counter() - t_start

    parts = sum(times["forward_s"]) + sum(times["backward_weight_s"]) + sum(times["backward_input_s"][1:]) + opt_s
    scale = (whole / parts) if (whole and parts > 0) else 1.0
    groups = tuple(
        LayerGroup(name=model.group_names[i], param_bytes=pbytes[i], activation_bytes=abytes[i],
                   forward_s=times["forward_s"][i] * scale,
                   backward_weight_s=times["backward_weight_s"][i] * scale,
                   backward_input_s=times["backward_input_s"][i] * scale)
        for i in range(model.num_groups))

    if device == "cpu":
        where = f"{cpu_name()}, {torch.get_num_threads()} thread(s)"
    else:
        where = torch.cuda.get_device_name(dev)
    cmd = command or f"jigsaw calibrate --model {model_name} --batch-size {batch_size} --device {device} --repeats {repeats}"
    m = _Measured(model=model, batch_size=batch_size, device=device, where=where, command=cmd, repeats=repeats,
                  warmup=warmup, seed=seed, whole_iteration=whole_iteration, whole_s=whole, parts_s=parts, scale=scale,
                  weights_b=weights_b, grads_b=grads_b, opt_b=opt_b, overhead_b=overhead_b, overhead_src=overhead_src,
                  wall_s=wall, load_start=load_start)
    sources, meta = _measured_sources(m), _measured_meta(m)
    return CostTable(model=model_name, batch_size=batch_size, device=device, groups=groups,
                     optimizer_s=opt_s * scale,
                     fixed_memory_bytes=int(weights_b + grads_b + opt_b + overhead_b),
                     sources=sources, meta=meta)


# --------------------------------------------------------------------------------------------
# anchoring to GPU types
# --------------------------------------------------------------------------------------------
def scale_table(table: CostTable, factor: float, *, device: str, fixed_memory_bytes: int,
                sources: dict[str, str], meta: dict[str, Any]) -> CostTable:
    """Copy of ``table`` with every time multiplied by ``factor`` (bytes unchanged)."""
    if not (factor > 0 and math.isfinite(factor)):
        raise ValueError(f"scale factor must be a finite number > 0, got {factor!r}")
    groups = tuple(replace(g, forward_s=g.forward_s * factor, backward_weight_s=g.backward_weight_s * factor,
                           backward_input_s=g.backward_input_s * factor) for g in table.groups)
    return CostTable(model=table.model, batch_size=table.batch_size, device=device, groups=groups,
                     optimizer_s=table.optimizer_s * factor, fixed_memory_bytes=int(fixed_memory_bytes),
                     sources=sources, meta=meta)


def _gpu_fixed_memory(table: CostTable) -> tuple[int, str]:
    m = table.meta
    state = int(m.get("weights_bytes", 0)) + int(m.get("gradient_bytes", 0)) + int(m.get("optimizer_state_bytes", 0))
    if not state:  # a table without the breakdown: strip its own overhead
        state = table.fixed_memory_bytes - int(m.get("framework_overhead_bytes", 0))
    text = (f"weights+buffers {m.get('weights_bytes')} B + gradients {m.get('gradient_bytes')} B + optimizer state "
            f"{m.get('optimizer_state_bytes')} B (exact, counted on the module and optimizer) + CUDA context and "
            f"library workspace {ASSUMED_CUDA_OVERHEAD_BYTES // 2**20} MiB (assumed, not measured here)")
    return state + ASSUMED_CUDA_OVERHEAD_BYTES, text


def _derived_sources(base: CostTable, gpu: str, factor: float, fixed_text: str, anchor_text: str) -> dict[str, str]:
    src = base.sources
    times = (f"{base.device} table's per-group values (" + "{}" + f") x anchor scale {factor:.6g}; see anchor")
    return {
        "param_bytes": src.get("param_bytes", "exact count on the module"),
        "activation_bytes": (f"{src.get('activation_bytes', 'exact count')} (counted on {base.device}; GPU kernels "
                             f"such as cuDNN may save different workspaces on {gpu})"),
        "forward_s": times.format("forward_s: " + src.get("forward_s", "measured")),
        "backward_weight_s": times.format("backward_weight_s: " + src.get("backward_weight_s", "measured")),
        "backward_input_s": times.format("backward_input_s: " + src.get("backward_input_s", "measured")),
        "optimizer_s": times.format("optimizer_s: " + src.get("optimizer_s", "measured")),
        "fixed_memory_bytes": fixed_text,
        "anchor": anchor_text,
    } | ({"batch_scaling": src["batch_scaling"]} if "batch_scaling" in src else {})


def _split_origin(base: CostTable) -> str:
    """Where ``base``'s per-group split comes from, for an anchored table's sources."""
    split = base.meta.get("split_from")
    if not split:
        return f"the {base.device}-measured one"
    return (f"the one measured on {split['measured_on']} ({split['file']}; docs/cost_tables.md section 3a), the "
            f"optimizer step taking {split['optimizer_share']:.4g} of the iteration")


def anchor_table(base: CostTable, gpu: str, gavel_path: str | Path | None = None,
                 reference_tables: Iterable[CostTable] | None = None) -> CostTable:
    """Derive the ``gpu`` (k80/p100/v100) table of ``base`` (a measured table).

    If Gavel measured the model's job type at this batch size: scale every time by
    ``k = (1 / throughput) / base.compute_s(0)``, so the result's ``compute_s(0)`` is exactly
    ``1 / throughput``. Otherwise (extrapolation): ``k`` = geometric mean of that factor over the
    anchored ``reference_tables`` (measured tables of models Gavel has; by default the shipped
    CPU tables of resnet18, resnet50, transformer_small, lstm_lm and recommendation).
    """
    if gpu not in GPU_TYPES:
        raise ValueError(f"unknown GPU type {gpu!r}; allowed: {list(GPU_TYPES)}")
    path = Path(gavel_path) if gavel_path else data_dir() / GAVEL_FILE
    job = base.meta.get("gavel_job")
    if job is None:
        try:
            job = build_model(base.model).gavel_job
        except ValueError:
            job = None
    base_t = base.plain_compute_s(0)  # a GPU table has no live-executor overhead (it stays 0)
    fixed_b, fixed_text = _gpu_fixed_memory(base)
    meta = {k: v for k, v in base.meta.items()
            if k not in ("kind", "command", "calibration_wall_s", "loadavg_1min_start_end")}
    meta.update({"derived_from": f"{base.model}-bs{base.batch_size}-{base.device}", "base_digest": base.digest(),
                 "base_compute_s0": base_t, "gavel_file": str(GAVEL_FILE),
                 "framework_overhead_bytes": ASSUMED_CUDA_OVERHEAD_BYTES})
    hit = gavel_alone_throughput(job, base.batch_size, gpu, path)
    if hit is not None:
        key, thr = hit
        factor = (1.0 / thr) / base_t
        meta.update({"kind": "anchored", "gavel_key": key, "gavel_gpu": gpu, "gavel_throughput_it_s": thr,
                     "anchor_scale": factor})
        anchor_text = (f"Gavel measured throughput: {GAVEL_FILE} [{gpu!r}][{key!r}]['null'] = {thr:.6g} "
                       f"iterations/s alone (scale factor 1); every time of the {base.device} table is scaled by "
                       f"k = (1/{thr:.6g}) / {base_t:.6g} s = {factor:.6g}, so compute_s(0) = 1/throughput = "
                       f"{1.0 / thr:.6g} s; the per-group split is " + _split_origin(base))
    else:
        refs = list(reference_tables) if reference_tables is not None else default_reference_tables(base.device)
        ratios = {}
        for ref in refs:
            rjob = ref.meta.get("gavel_job")
            rh = gavel_alone_throughput(rjob, ref.batch_size, gpu, path)
            if rh is None or ref.model == base.model and ref.batch_size == base.batch_size:
                continue
            ratios[f"{ref.model}-bs{ref.batch_size}"] = (1.0 / rh[1]) / ref.plain_compute_s(0)
        if not ratios:
            raise ValueError(f"cannot extrapolate {base.model} to {gpu}: no Gavel-anchored reference tables "
                             f"measured on {base.device} (ship the CPU tables of the Gavel models first)")
        factor = math.exp(sum(math.log(r) for r in ratios.values()) / len(ratios))
        why = (f"Gavel has no '{job} (batch size {base.batch_size})' entry" if job else
               f"Gavel has no job type for {base.model}")
        meta.update({"kind": "extrapolated", "gavel_key": None, "gavel_gpu": gpu, "gavel_throughput_it_s": None,
                     "anchor_scale": factor, "extrapolation_ratios": ratios})
        anchor_text = (f"EXTRAPOLATION ({why}): every time of the {base.device} table is scaled by the geometric mean "
                       f"{factor:.6g} of the {base.device}->{gpu} ratios (1/Gavel throughput) / {base.device} "
                       f"compute_s(0) of the Gavel-anchored models "
                       + ", ".join(f"{k}: {v:.4g}" for k, v in sorted(ratios.items()))
                       + f" ({GAVEL_FILE}, scale factor 1, 'null' = alone)")
    sources = _derived_sources(base, gpu, factor, fixed_text, anchor_text)
    return scale_table(base, factor, device=gpu, fixed_memory_bytes=fixed_b, sources=sources, meta=meta)


def default_reference_tables(device: str = "cpu", tables_dir: Path | None = None) -> list[CostTable]:
    """Measured tables (shipped, on ``device``) of the zoo models that have a Gavel job type."""
    d = Path(tables_dir) if tables_dir else TABLES_DIR
    out = []
    for name, ctor in sorted(MODELS.items()):
        if getattr(ctor, "gavel_job", None) is None or name not in REFERENCE_BATCH_SIZES:
            continue
        p = d / table_filename(name, REFERENCE_BATCH_SIZES[name], device)
        if p.exists():
            out.append(CostTable.load(p))
    return out


def gavel_batch_sizes(job: str, gpus: Iterable[str] = GPU_TYPES, path: str | Path | None = None) -> list[int]:
    """The batch sizes at which Gavel measured job type ``job`` alone (scale factor 1) on every GPU
    type of ``gpus``; ``[]`` when it has none."""
    table = gavel_throughputs(path)
    pat = re.compile(r"\('" + re.escape(job) + r" \(batch size (\d+)\)', 1\)")
    per_gpu = []
    for g in gpus:
        sizes = set()
        for key, entry in table.get(g, {}).items():
            m = pat.fullmatch(key)
            if m and entry.get("null"):
                sizes.add(int(m.group(1)))
        per_gpu.append(sizes)
    return sorted(set.intersection(*per_gpu)) if per_gpu else []


#: models Gavel did not measure whose K80/P100/V100 tables come from a GPU measurement of their
#: own, scaled by the ratio (1 / Gavel throughput) / GPU-measured time of the anchored models of
#: the same family (docs/cost_tables.md section 4)
GPU_RATIO_FAMILY: dict[str, tuple[str, ...]] = {
    "vgg16": ("resnet18", "resnet50"),           # convolutional image classifiers
    "bert_base": ("transformer_small",),         # Transformer encoders
}
#: the repository's GPU measurements (``bench/cuda_check.sh``: ``jigsaw calibrate --device cuda``)
GPU_MEASURED_DIR = PROJECT_ROOT / "bench" / "results" / "cuda_check"


def anchor_through_gpu(measured: CostTable, gpu: str, references: Iterable[CostTable],
                       gavel_path: str | Path | None = None, where: str = "") -> CostTable:
    """The ``gpu`` (k80/p100/v100) table of a model Gavel did not measure, from ``measured`` (its
    table measured on a local GPU, ``device = "cuda"``): every time of it times

        k = exp(mean over references m of ln((1 / theta(m, gpu)) / T(m)))

    where ``references`` are GPU-measured tables (same GPU as ``measured``) of Gavel-anchored
    models, ``T(m)`` their ``compute_s(0)`` and ``theta(m, gpu)`` Gavel's alone throughput at their
    batch size. The per-group split and the activation bytes are the GPU-measured ones; the fixed
    memory is exact state + the assumed CUDA overhead (as :func:`anchor_table`)."""
    if gpu not in GPU_TYPES:
        raise ValueError(f"unknown GPU type {gpu!r}; allowed: {list(GPU_TYPES)}")
    if measured.device != "cuda":
        raise ValueError(f"{measured.model}: anchor_through_gpu needs a table measured on a GPU (device 'cuda'), "
                         f"got {measured.device!r}")
    path = Path(gavel_path) if gavel_path else data_dir() / GAVEL_FILE
    ratios = {}
    for ref in references:
        if ref.device != "cuda":
            raise ValueError(f"{ref.model}: reference tables must be measured on a GPU (device 'cuda'), got "
                             f"{ref.device!r}")
        hit = gavel_alone_throughput(ref.meta.get("gavel_job"), ref.batch_size, gpu, path)
        if hit is None:
            raise ValueError(f"{ref.model} bs {ref.batch_size}: no Gavel throughput on {gpu} to take a ratio from")
        ratios[f"{ref.model}-bs{ref.batch_size}"] = (1.0 / hit[1]) / ref.plain_compute_s(0)
    if not ratios:
        raise ValueError(f"cannot anchor {measured.model} to {gpu}: no GPU-measured reference tables")
    factor = math.exp(sum(math.log(r) for r in ratios.values()) / len(ratios))
    on = measured.meta.get("processor", "a GPU")
    base_t = measured.plain_compute_s(0)
    fixed_b, fixed_text = _gpu_fixed_memory(measured)
    meta = {k: v for k, v in measured.meta.items()
            if k not in ("kind", "calibration_wall_s", "loadavg_1min_start_end")}
    meta.update({"kind": "gpu-ratio", "derived_from": f"{where}{measured.model}-bs{measured.batch_size}-cuda.json",
                 "base_digest": measured.digest(), "base_compute_s0": base_t, "gavel_file": str(GAVEL_FILE),
                 "gavel_key": None, "gavel_gpu": gpu, "gavel_throughput_it_s": None, "anchor_scale": factor,
                 "gpu_ratios": ratios, "framework_overhead_bytes": ASSUMED_CUDA_OVERHEAD_BYTES})
    anchor_text = (f"GPU measurement x ratio (Gavel has no job type for {measured.model}): the table measured on {on} "
                   f"({where}{measured.model}-bs{measured.batch_size}-cuda.json, `{measured.meta.get('command')}`, "
                   f"full iteration {base_t:.6g} s) with every time scaled by k = {factor:.6g}, the geometric mean over "
                   f"the Gavel-anchored models of the same family of (1 / Gavel throughput on {gpu}) / their time measured "
                   f"on the same GPU: " + ", ".join(f"{k}: {v:.4g}" for k, v in sorted(ratios.items()))
                   + f" ({GAVEL_FILE}, scale factor 1, 'null' = alone); so compute_s(0) = {base_t * factor:.6g} s; the "
                   f"per-group split and activation bytes are the ones measured on {on}")
    sources = _derived_sources(measured, gpu, factor, fixed_text, anchor_text)
    sources["activation_bytes"] = (f"{measured.sources.get('activation_bytes', 'exact count')} (counted on {on}'s "
                                   f"kernels)")
    return scale_table(measured, factor, device=gpu, fixed_memory_bytes=fixed_b, sources=sources, meta=meta)
