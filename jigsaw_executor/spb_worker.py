"""Real Structured Partial Backpropagation (SPB) for one data-parallel worker (docs/design.md section 2).

:class:`SPBTrainer` wraps a model whose ``groups`` (an ``nn.ModuleList``, input first) are its SPB
layer groups, and an optimizer. One :meth:`SPBTrainer.step` is one SPB iteration of this worker:

1. **Start groups.** Every worker's start ``s_w`` comes from ``jigsaw_env.spb.worker_starts`` (the
   simulator's own function) for the iteration's level and pattern, or from explicit ``starts``.
   All ranks compute the same vector from the shared decision; no communication is needed.
2. **Forward.** Groups ``0..s-1`` run under ``torch.no_grad()`` (no graph, no saved activations);
   the input of group ``s`` is detached, so group ``s`` computes weight gradients but no input
   gradient; groups ``s..B-1`` and the loss run with autograd. Backward from the loss. Groups below
   ``s`` keep ``.grad = None``.
3. **Gradient sync, per layer group ``b``,** over the contributors ``C_b = {w : s_w <= b}`` only.
   The group's gradients are flattened into one buffer (one collective per group and dtype):

   * ring: all-reduce (SUM) over the whole job, the ``W - |C_b|`` non-contributors sending a
     buffer of ``-0.0`` (the exact additive identity of IEEE floats: ``x + (-0.0) = x`` for every
     ``x``, ``+0.0`` and ``-0.0`` included), then divide by the divisor on every rank;
   * reduce+broadcast: reduce (SUM) to the lowest contributing rank over a cached process subgroup
     of ``C_b``, divide there, then broadcast from that rank to the whole job;
   * ``|C_b| = 0``: no communication and no update: every rank sets the group's ``.grad`` to
     ``None``, so SGD / Adam skip those parameters (no momentum, no weight decay, no step count).

   Which of the two runs is ``jigsaw_env.network.group_sync``'s choice (eq. N4 of
   docs/spb_model.md: the faster by the alpha-beta model, the simulator's own function), so the
   executor and the simulator use the same algorithm per group; ``sync_method`` forces one. Both
   add the same contributions, so they give the same sum; bit for bit whenever the sum does not
   depend on the order of the additions (always with at most two contributors, since float
   addition is commutative; with three or more, gloo's ring and its reduce add in different orders
   and may differ in the last bit: ``tests/executor/test_executor_spb.py::test_sync_methods_bit_identical``).
   The divisor is ``|C_b|`` (``average_over="contributors"``, default) or ``W`` (``"all"``). The
   division happens on one rank (reduce root) or identically on all ranks (ring), so every rank
   steps the optimizer on bit-identical gradients and replicas stay bit-identical.
4. **Optimizer step** (``model.optimizer_step``: the zoo model's clipping, then ``step``).
5. **BatchNorm buffers.** Running statistics are updated in the forward on every rank from
   different data (also in the no-grad part). After the step the floating-point buffers of every
   normalisation module with running statistics are all-reduced and averaged (``buffer_sync=
   "average"``, default) or broadcast from job rank 0 (``"broadcast"``), so replicas stay
   identical. ``num_batches_tracked`` is the same on every rank and is not sent. These bytes are
   counted apart (``buffer_bytes_*``), not in the SPB gradient bytes.

**Bytes convention** (the simulator's, ``jigsaw_env.network``): bytes on the wire summed over the
ranks. At every collective call this rank adds what *it* puts on the wire to ``bytes_sent``, and
the call's total over all ranks to ``bytes_on_wire_total`` (same on every rank):

* ring all-reduce of ``M`` bytes over ``W`` ranks: total ``2 (W-1) M``; rank ``r`` sends the
  ``2 (W-1)`` chunks of a nominal ring (reduce-scatter then all-gather over ``W`` chunks of
  ``numel // W`` or ``numel // W + 1`` elements): ``2 M - chunk[(r+1) % W] - chunk[(r+2) % W]`` bytes,
  so the per-rank integers sum exactly to the total;
* reduce over ``C`` ranks: each non-root contributor sends ``M``; total ``(C-1) M``;
* broadcast over ``W`` ranks: the root sends ``M`` to each other rank; total ``(W-1) M``.

This is a nominal count of the algorithm we ask for, not a trace of what gloo or NCCL do inside
(gloo may pick a different all-reduce schedule with the same totals up to chunking).

**Peak activation memory** is counted exactly with ``torch.autograd.graph.saved_tensors_hooks``
(distinct storages saved for backward, parameters and buffers excluded), as
``jigsaw_env.table_builder.activation_bytes_per_group`` counts a cost table's activation bytes, so
it compares with ``CostTable.activation_peak_bytes(s)``. On CUDA the allocator's peak during the
iteration (``torch.cuda.max_memory_allocated`` minus the allocation at its start) is reported too.

**Failures and timeouts.** Every collective runs on a process group created with a timeout
(``init_process_group(timeout=...)``, ``new_group(timeout=...)``); a peer that dies or stalls
makes the collective raise instead of hanging. :mod:`jigsaw_executor.launcher` turns a worker's
exception into a job failure naming the rank.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.modules.batchnorm import _NormBase

from jigsaw_env.network import INTRA_NODE, NONE, REDUCE_BROADCAST, RING, SYNC_METHODS, Link, group_sync
from jigsaw_env.spb import Pattern, SPBConfig, cycle_length, worker_starts

# the checkpoint files (spb_checkpoint.py); read_checkpoint_meta, select_checkpoint and
# CheckpointUnreadable are part of this module's interface too
from .spb_checkpoint import (CheckpointUnreadable, load_trainer_checkpoint, read_checkpoint_meta,
                             save_trainer_checkpoint, select_checkpoint)
from .transport import LoopbackWindow

BUFFER_SYNC_MODES = ("average", "broadcast")
AVERAGE_OVER = ("contributors", "all")

__all__ = [
    "GroupSync", "IterationReport", "SPBTrainer", "plan_sync", "ring_bytes_sent", "state_hash",
    "read_checkpoint_meta", "select_checkpoint", "CheckpointUnreadable", "BUFFER_SYNC_MODES",
]


# --------------------------------------------------------------------------------------------
# the sync plan: a pure function of the shared decision
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GroupSync:
    """How layer group ``group`` is synced at one iteration (the same on every rank).

    contributors: job ranks that computed the group's gradient, ``C_b``, ascending.
    algorithm: ``"ring"``, ``"reduce_broadcast"`` or ``"none"`` (the simulator's names; ``"none"``
        when there is no contributor, no parameter, or a single worker).
    root: job rank that reduces and broadcasts (lowest contributor) for ``reduce_broadcast``.
    divisor: what the summed gradient is divided by (0: no contributor, no update).
    nbytes: the group's gradient bytes ``M``.
    """

    group: int
    contributors: tuple[int, ...]
    algorithm: str
    root: int | None
    divisor: int
    nbytes: int

    @property
    def updated(self) -> bool:
        return len(self.contributors) > 0


def plan_sync(starts: Sequence[int], param_bytes: Sequence[int], link: Link = INTRA_NODE,
              average_over: str = "contributors", method: str = "fastest") -> tuple[GroupSync, ...]:
    """The per-group sync plan for worker start groups ``starts`` (one per job rank). ``method``:
    ``"fastest"`` (the simulator's choice per group, ``group_sync``), or ``"ring"`` /
    ``"reduce_broadcast"`` for every group that syncs."""
    if average_over not in AVERAGE_OVER:
        raise ValueError(f"average_over must be one of {list(AVERAGE_OVER)}, got {average_over!r}")
    if method not in SYNC_METHODS:
        raise ValueError(f"sync method must be one of {list(SYNC_METHODS)}, got {method!r}")
    starts = [int(s) for s in starts]
    world, B = len(starts), len(param_bytes)
    if world < 1:
        raise ValueError("a job needs at least one worker")
    if min(starts) < 0 or max(starts) >= B:
        raise ValueError(f"start groups must be in 0..{B - 1}, got {starts}")
    plan = []
    for b in range(B):
        contrib = tuple(w for w in range(world) if starts[w] <= b)
        m = int(param_bytes[b])
        if not contrib:
            plan.append(GroupSync(b, contrib, NONE, None, 0, m))
            continue
        _, _, algo = group_sync(len(contrib), world, float(m), link, method)
        divisor = len(contrib) if average_over == "contributors" else world
        root = contrib[0] if algo == REDUCE_BROADCAST else None
        plan.append(GroupSync(b, contrib, algo, root, divisor, m))
    return tuple(plan)


def _chunks(numel: int, world: int) -> list[int]:
    q, r = divmod(numel, world)
    return [q + (1 if i < r else 0) for i in range(world)]


def ring_bytes_sent(numel: int, element_size: int, world: int, rank: int) -> int:
    """Bytes rank ``rank`` sends in a nominal ring all-reduce of ``numel`` elements (see module doc)."""
    if world <= 1:
        return 0
    c = _chunks(numel, world)
    return (2 * numel - c[(rank + 1) % world] - c[(rank + 2) % world]) * element_size


# --------------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------------
@dataclass
class IterationReport:
    """What one worker measured in one SPB iteration.

    Times in seconds (``compute_s`` = forward + backward + optimizer step), bytes in bytes.
    ``bytes_sent``: SPB gradient bytes this rank put on the wire; ``bytes_on_wire_total``: the
    job's total by the simulator's convention (same on every rank; equals
    ``jigsaw_env.spb.iteration_cost(table, starts, link).bytes``). ``bytes_by_collective``: this
    rank's bytes per collective kind and process (sub)group, e.g. ``"reduce@0,2"``,
    ``"broadcast@all"``, ``"allreduce@all"``. ``peak_activation_bytes``: bytes saved for backward
    (exact count); ``device_peak_bytes``: CUDA allocator peak during the iteration above its start
    (``None`` on CPU). ``loopback_bytes``: bytes the loopback interface carried while this rank
    synced its gradients, counted by the kernel (``jigsaw_executor.transport``: every process of
    the machine, TCP/IP headers included), with ``SPBTrainer(count_loopback=True)``; else None.
    """

    iteration: int
    rank: int
    world_size: int
    level: int
    pattern: str
    start_group: int
    starts: tuple[int, ...]
    loss: float
    forward_s: float
    backward_s: float
    sync_s: float
    optimizer_s: float
    buffer_sync_s: float
    compute_s: float
    step_s: float
    bytes_sent: int
    bytes_on_wire_total: int
    buffer_bytes_sent: int
    buffer_bytes_on_wire_total: int
    bytes_by_collective: dict[str, int]
    contributors: tuple[int, ...]
    algorithms: tuple[str, ...]
    peak_activation_bytes: int
    device_peak_bytes: int | None = None
    loopback_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["starts"] = list(self.starts)
        d["contributors"] = list(self.contributors)
        d["algorithms"] = list(self.algorithms)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "IterationReport":
        d = dict(d)
        for k in ("starts", "contributors", "algorithms"):
            d[k] = tuple(d[k])
        return cls(**d)


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------
def _storage_key(t: torch.Tensor) -> tuple[Any, int]:
    try:
        st = t.untyped_storage()
        return (t.device.type, t.device.index, st.data_ptr()), int(st.nbytes())
    except (RuntimeError, NotImplementedError):
        return ("id", id(t)), int(t.numel() * t.element_size())


class _SavedBytes:
    """saved_tensors_hooks pack hook counting distinct saved storages (params/buffers excluded)."""

    def __init__(self, exclude: set) -> None:
        self.exclude = exclude
        self.sizes: dict[Any, int] = {}

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        key, nbytes = _storage_key(t)
        if key not in self.exclude:
            self.sizes[key] = max(self.sizes.get(key, 0), nbytes)
        return t

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    @property
    def total(self) -> int:
        return int(sum(self.sizes.values()))


def _tensor_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().to("cpu").contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def state_hash(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> str:
    """sha256 of every parameter and buffer (state_dict order by name), and of the optimizer state."""
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        if torch.is_tensor(v):
            h.update(str(v.dtype).encode())
            h.update(str(tuple(v.shape)).encode())
            h.update(_tensor_bytes(v))
        else:
            h.update(repr(v).encode())
    if optimizer is not None:
        sd = optimizer.state_dict()
        for pid in sorted(sd["state"]):
            for k, v in sorted(sd["state"][pid].items()):
                h.update(f"{pid}/{k}".encode())
                h.update(_tensor_bytes(v) if torch.is_tensor(v) else repr(v).encode())
    return h.hexdigest()


def _is_running_stats_norm(m: nn.Module) -> bool:
    return isinstance(m, _NormBase) and bool(getattr(m, "track_running_stats", False))


def _now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


# --------------------------------------------------------------------------------------------
# the trainer
# --------------------------------------------------------------------------------------------
class SPBTrainer:
    """One data-parallel SPB worker. See the module docstring for the algorithm.

    Args:
        model: module with ``groups`` (``nn.ModuleList``, input first); every trainable parameter
            must belong to exactly one group. A :class:`jigsaw_env.zoo.ZooModel` gives ``loss`` and
            ``optimizer_step`` too.
        optimizer: optimizer over the model's parameters (identically built on every rank).
        rank, world: this worker's rank in the job and the job's size; default: from
            ``process_group`` (or 0 and 1 without torch.distributed).
        spb_config: levels and slots (``SPBConfig``); its ``average_over`` is the default divisor.
        pattern, level: defaults for :meth:`step`.
        average_over: ``"contributors"`` or ``"all"``; None takes ``spb_config.average_over``.
        process_group: the job's process group (None: the default world group). If it is not the
            whole world, the reduce over the contributors runs point to point on it (send/recv to
            the root) instead of over a cached subgroup.
        link: the link the simulator assumes, used only to choose ring vs reduce+broadcast exactly
            as ``jigsaw_env.network.group_sync`` does.
        sync_method: ``"fastest"`` (that choice, the default), ``"ring"`` or ``"reduce_broadcast"``
            (one method for every group, e.g. to compare the two).
        buffer_sync: ``"average"`` or ``"broadcast"`` for BatchNorm running statistics.
        measure_activations: count saved-for-backward bytes with saved_tensors_hooks.
        loss_fn: ``(output, targets) -> loss``; default ``model.loss`` or cross entropy.
        timeout_s: timeout of the process subgroups this trainer creates (None: the default group's).
        sync_initial_state: broadcast job rank 0's parameters and buffers at construction.
        precreate_subgroups: create, at construction, the contributor subgroups that every level and
            pattern of ``spb_config`` can need (otherwise they are created lazily, in the same order
            on every rank, the first time a plan needs them).
        transactional: make a step that fails before its optimizer update leave no trace: the
            model's buffers (BatchNorm running statistics, which the forward updates) are copied
            before the forward and put back if the step raises before the update, so the replica
            is exactly at the start of the failed iteration (partial recovery needs it;
            ``completed_iteration`` says whether the update of an iteration happened).
        count_loopback: read the loopback interface's byte counter around every gradient sync
            (``IterationReport.loopback_bytes``; two reads of ``/proc/net/dev`` per iteration, inside
            ``sync_s``).
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, rank: int | None = None,
                 world: int | None = None, spb_config: SPBConfig = SPBConfig(),
                 pattern: Pattern | str = Pattern.ROTATING, level: int = 0, average_over: str | None = None,
                 process_group: Any = None, link: Link = INTRA_NODE, buffer_sync: str = "average",
                 measure_activations: bool = True, loss_fn: Callable | None = None,
                 timeout_s: float | None = None, sync_initial_state: bool = True,
                 precreate_subgroups: bool = True, transactional: bool = False,
                 sync_method: str = "fastest", count_loopback: bool = False) -> None:
        groups = getattr(model, "groups", None)
        if not isinstance(groups, nn.ModuleList) or len(groups) == 0:
            raise ValueError("SPBTrainer needs a model with a non-empty `groups` nn.ModuleList (its layer groups)")
        if buffer_sync not in BUFFER_SYNC_MODES:
            raise ValueError(f"buffer_sync must be one of {list(BUFFER_SYNC_MODES)}, got {buffer_sync!r}")
        if sync_method not in SYNC_METHODS:
            raise ValueError(f"sync_method must be one of {list(SYNC_METHODS)}, got {sync_method!r}")
        self.sync_method = sync_method
        self.count_loopback = bool(count_loopback)
        self.model = model
        self.optimizer = optimizer
        self.spb = spb_config
        self.pattern = Pattern.parse(pattern)
        self.spb.check_level(level)
        self.level = int(level)
        self.average_over = average_over or spb_config.average_over
        if self.average_over not in AVERAGE_OVER:
            raise ValueError(f"average_over must be one of {list(AVERAGE_OVER)}, got {self.average_over!r}")
        self.link = link
        self.buffer_sync = buffer_sync
        self.measure_activations = measure_activations
        self.timeout = timedelta(seconds=timeout_s) if timeout_s else None
        self.loss_fn = loss_fn or getattr(model, "loss", None) or nn.functional.cross_entropy

        # ----- job and process groups -----
        self.distributed = dist.is_available() and dist.is_initialized()
        if self.distributed:
            self.pg = process_group or dist.group.WORLD
            self.global_ranks = list(dist.get_process_group_ranks(self.pg))
            self.rank = dist.get_rank(self.pg) if rank is None else int(rank)
            self.world = len(self.global_ranks) if world is None else int(world)
            if self.world != len(self.global_ranks) or self.rank != dist.get_rank(self.pg):
                raise ValueError(f"rank/world ({self.rank}/{self.world}) disagree with the process group "
                                 f"({dist.get_rank(self.pg)}/{len(self.global_ranks)})")
            self.pg_is_world = len(self.global_ranks) == dist.get_world_size()
        else:
            self.pg, self.global_ranks, self.pg_is_world = None, [0], True
            self.rank, self.world = (0 if rank is None else int(rank)), (1 if world is None else int(world))
            if self.world != 1:
                raise ValueError(f"world={self.world} needs torch.distributed to be initialised")
        self._subgroups: dict[tuple[int, ...], Any] = {}  # contributor set -> process group (world jobs)

        # ----- parameters per group -----
        seen: dict[int, int] = {}
        self.group_params: list[list[nn.Parameter]] = []
        for b, g in enumerate(groups):
            ps = []
            for p in g.parameters():
                if not p.requires_grad:
                    continue
                if id(p) in seen and seen[id(p)] != b:
                    raise ValueError(f"parameter shared by layer groups {seen[id(p)]} and {b}: SPB needs every "
                                     "trainable parameter in exactly one group")
                if id(p) not in seen:
                    seen[id(p)] = b
                    ps.append(p)
            self.group_params.append(ps)
        outside = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in seen]
        if outside:
            raise ValueError(f"trainable parameters outside every layer group would never be synced: {outside[:5]}")
        self.param_bytes = [sum(p.numel() * p.element_size() for p in ps) for ps in self.group_params]
        self.param_names = {id(p): n for n, p in model.named_parameters()}
        self.norm_buffers = [buf for m in model.modules() if _is_running_stats_norm(m)
                             for name, buf in m.named_buffers(recurse=False)
                             if buf is not None and buf.is_floating_point()]
        try:
            self.device = next(model.parameters()).device
        except StopIteration:
            self.device = torch.device("cpu")
        self.setup_bytes_sent = 0
        self.transactional = bool(transactional)
        self.completed_iteration: int | None = None  # the last iteration whose optimizer step ran here
        self.last_local_grads: dict[str, torch.Tensor | None] | None = None
        self.last_synced_grads: dict[str, torch.Tensor | None] | None = None

        if self.world > 1:
            if sync_initial_state:
                self._broadcast_state()
            if precreate_subgroups:
                self._precreate_subgroups()

    # ----- decisions -----
    @property
    def num_groups(self) -> int:
        return len(self.group_params)

    def starts_for(self, iteration: int, level: int | None = None, pattern: Pattern | str | None = None) -> tuple[int, ...]:
        """Every worker's start group at ``iteration`` (``jigsaw_env.spb.worker_starts``)."""
        level = self.level if level is None else int(level)
        pattern = self.pattern if pattern is None else Pattern.parse(pattern)
        slots = self.spb.start_slots(level, self.num_groups)
        return tuple(int(s) for s in worker_starts(slots, pattern, self.world, int(iteration)))

    def plan(self, starts: Sequence[int]) -> tuple[GroupSync, ...]:
        return plan_sync(starts, self.param_bytes, self.link, self.average_over, self.sync_method)

    # ----- process subgroups -----
    def _global(self, job_rank: int) -> int:
        return self.global_ranks[job_rank]

    def _needs_subgroup(self, gs: GroupSync) -> bool:
        return gs.algorithm == REDUCE_BROADCAST and 1 < len(gs.contributors) < self.world and gs.nbytes > 0

    def _subgroup(self, contributors: tuple[int, ...]) -> Any:
        """The cached process group of ``contributors`` (job ranks); created on first use.

        Every rank of the world calls ``new_group`` for every set, in the same order on every rank
        (the plan is the same everywhere), as ``new_group`` requires.
        """
        if contributors not in self._subgroups:
            ranks = [self._global(r) for r in contributors]
            self._subgroups[contributors] = dist.new_group(ranks=ranks, timeout=self.timeout)
        return self._subgroups[contributors]

    def _ensure_subgroups(self, plan: Sequence[GroupSync]) -> None:
        if not self.pg_is_world:
            return
        for gs in plan:
            if self._needs_subgroup(gs):
                self._subgroup(gs.contributors)

    def _precreate_subgroups(self) -> None:
        if not self.pg_is_world:
            return
        sets: set[tuple[int, ...]] = set()
        for level in self.spb.levels:
            slots = self.spb.start_slots(level, self.num_groups)
            for pattern in Pattern:
                for t in range(cycle_length(slots, pattern)):
                    starts = worker_starts(slots, pattern, self.world, t)
                    sets.update(gs.contributors for gs in self.plan(starts) if self._needs_subgroup(gs))
        for c in sorted(sets, key=lambda c: (len(c), c)):
            self._subgroup(c)

    # ----- collectives with byte accounting -----
    def _count(self, acc: dict[str, Any], label: str, mine: int, total: int) -> None:
        acc["sent"] += int(mine)
        acc["total"] += int(total)
        if mine:
            acc["by"][label] = acc["by"].get(label, 0) + int(mine)

    def _allreduce(self, flat: torch.Tensor, acc: dict[str, Any]) -> None:
        m = flat.numel() * flat.element_size()
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.pg)
        self._count(acc, "allreduce@all", ring_bytes_sent(flat.numel(), flat.element_size(), self.world, self.rank),
                    2 * (self.world - 1) * m)

    def _reduce(self, flat: torch.Tensor, contributors: tuple[int, ...], acc: dict[str, Any]) -> None:
        root = contributors[0]
        m = flat.numel() * flat.element_size()
        if self.pg_is_world:
            dist.reduce(flat, dst=self._global(root), op=dist.ReduceOp.SUM, group=self._subgroup(contributors))
        elif self.rank == root:
            # the job is part of a larger world: torch's member-only new_group
            # (use_local_synchronization) names a group by the ranks *and* by how many groups the
            # caller already has, which differs between members here; so reduce point to point on
            # the job's group instead: the root adds the others' buffers in rank order
            buf = torch.empty_like(flat)
            for r in contributors[1:]:
                dist.recv(buf, src=self._global(r), group=self.pg)
                flat.add_(buf)
        else:
            dist.send(flat, dst=self._global(root), group=self.pg)
        self._count(acc, "reduce@" + ",".join(map(str, contributors)), 0 if self.rank == root else m,
                    (len(contributors) - 1) * m)

    def _broadcast(self, flat: torch.Tensor, root: int, acc: dict[str, Any]) -> None:
        m = flat.numel() * flat.element_size()
        dist.broadcast(flat, src=self._global(root), group=self.pg)
        self._count(acc, "broadcast@all", (self.world - 1) * m if self.rank == root else 0, (self.world - 1) * m)

    @staticmethod
    def _new_acc() -> dict[str, Any]:
        return {"sent": 0, "total": 0, "by": {}}

    # ----- the iteration -----
    def step(self, batch: tuple[torch.Tensor, torch.Tensor], iteration: int, level: int | None = None,
             pattern: Pattern | str | None = None, starts: Sequence[int] | None = None,
             record_grads: bool = False) -> IterationReport:
        """One SPB iteration on this worker's ``batch``; collective: every rank of the job calls it
        with the same ``iteration``, ``level``, ``pattern`` and ``starts``."""
        level = self.level if level is None else int(level)
        self.spb.check_level(level)
        pattern = self.pattern if pattern is None else Pattern.parse(pattern)
        if starts is None:
            starts = self.starts_for(iteration, level, pattern)
        else:
            starts = tuple(int(s) for s in starts)
            if len(starts) != self.world:
                raise ValueError(f"starts needs one start group per worker ({self.world}), got {list(starts)}")
        plan = self.plan(starts)
        self._ensure_subgroups(plan)
        s = starts[self.rank]
        dev = self.device
        inputs, targets = batch
        inputs, targets = inputs.to(dev, non_blocking=True), targets.to(dev, non_blocking=True)

        self.optimizer.zero_grad(set_to_none=True)
        saved = [b.detach().clone() for b in self.model.buffers()] if self.transactional else None
        try:
            return self._step(inputs, targets, iteration, level, pattern, starts, plan, s, record_grads)
        except BaseException:
            if saved is not None and self.completed_iteration != int(iteration):
                with torch.no_grad():  # the failed iteration's forward must leave no trace
                    for b, v in zip(self.model.buffers(), saved):
                        b.copy_(v)
            raise

    def _step(self, inputs, targets, iteration, level, pattern, starts, plan, s, record_grads) -> IterationReport:
        dev = self.device
        cuda = dev.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(dev)
            mem0 = torch.cuda.memory_allocated(dev)
        t0 = _now(dev)
        x = inputs
        with torch.no_grad():
            for g in self.model.groups[:s]:
                x = g(x)
        x = x.detach()  # group s: weight gradients only, no input gradient
        counter = None
        with torch.enable_grad():
            if self.measure_activations:
                exclude = {_storage_key(t)[0] for t in list(self.model.parameters()) + list(self.model.buffers())}
                counter = _SavedBytes(exclude)
                with torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack):
                    for g in self.model.groups[s:]:
                        x = g(x)
                    loss = self.loss_fn(x, targets)
            else:
                for g in self.model.groups[s:]:
                    x = g(x)
                loss = self.loss_fn(x, targets)
        t1 = _now(dev)
        if loss.requires_grad:
            loss.backward()
        del x
        t2 = _now(dev)
        if record_grads:
            self.last_local_grads = self._grads_snapshot()

        acc = self._new_acc()
        with LoopbackWindow(required=False) if self.count_loopback else contextlib.nullcontext() as lo:
            self._sync_grads(plan, acc)
        t3 = _now(dev)
        if record_grads:
            self.last_synced_grads = self._grads_snapshot()
        step_fn = getattr(self.model, "optimizer_step", None)
        if callable(step_fn):
            step_fn(self.optimizer)
        else:
            self.optimizer.step()
        self.completed_iteration = int(iteration)
        t4 = _now(dev)
        buf_acc = self._new_acc()
        self._sync_buffers(buf_acc)
        t5 = _now(dev)
        dev_peak = int(torch.cuda.max_memory_allocated(dev) - mem0) if cuda else None

        return IterationReport(
            iteration=int(iteration), rank=self.rank, world_size=self.world, level=level, pattern=pattern.value,
            start_group=int(s), starts=tuple(starts), loss=float(loss.detach().item()),
            forward_s=t1 - t0, backward_s=t2 - t1, sync_s=t3 - t2, optimizer_s=t4 - t3, buffer_sync_s=t5 - t4,
            compute_s=(t2 - t0) + (t4 - t3), step_s=t5 - t0,
            bytes_sent=acc["sent"], bytes_on_wire_total=acc["total"],
            buffer_bytes_sent=buf_acc["sent"], buffer_bytes_on_wire_total=buf_acc["total"],
            bytes_by_collective=dict(acc["by"]),
            contributors=tuple(len(gs.contributors) for gs in plan),
            algorithms=tuple(gs.algorithm for gs in plan),
            peak_activation_bytes=counter.total if counter is not None else 0,
            device_peak_bytes=dev_peak, loopback_bytes=lo.bytes if lo is not None else None)

    def _grads_snapshot(self) -> dict[str, torch.Tensor | None]:
        return {self.param_names[id(p)]: (None if p.grad is None else p.grad.detach().to("cpu").clone())
                for ps in self.group_params for p in ps}

    def _sync_grads(self, plan: Sequence[GroupSync], acc: dict[str, Any]) -> None:
        for gs in reversed(plan):  # output side first, as a backward would produce them
            params = self.group_params[gs.group]
            if not params:
                continue
            if not gs.updated:
                for p in params:  # nobody computed it: no update at all this iteration
                    p.grad = None
                continue
            if self.world == 1:
                if gs.divisor != 1:
                    for p in params:
                        if p.grad is not None:
                            p.grad.div_(gs.divisor)
                continue
            contributing = self.rank in gs.contributors
            by_dtype: dict[torch.dtype, list[nn.Parameter]] = {}
            for p in params:
                by_dtype.setdefault(p.dtype, []).append(p)
            for dtype, ps in by_dtype.items():
                if contributing:
                    # a parameter that got no gradient on a contributor counts as zero
                    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                                      for p in ps])
                elif gs.algorithm == RING:  # -0.0: the exact additive identity (module doc, step 3)
                    flat = torch.full((sum(p.numel() for p in ps),), -0.0, dtype=dtype, device=self.device)
                else:  # filled by the broadcast
                    flat = torch.empty(sum(p.numel() for p in ps), dtype=dtype, device=self.device)
                if gs.algorithm == RING:
                    self._allreduce(flat, acc)
                    flat.div_(gs.divisor)
                elif gs.algorithm == REDUCE_BROADCAST:
                    if len(gs.contributors) > 1:
                        if contributing:
                            self._reduce(flat, gs.contributors, acc)
                        else:  # a call among the contributors: its bytes still count in the job total
                            self._count(acc, "", 0, (len(gs.contributors) - 1) * flat.numel() * flat.element_size())
                    if self.rank == gs.root:
                        flat.div_(gs.divisor)
                    self._broadcast(flat, gs.root, acc)
                else:  # pragma: no cover - plan_sync never gives "none" here (W > 1, M > 0, C > 0)
                    raise RuntimeError(f"unexpected sync algorithm {gs.algorithm!r} for group {gs.group}")
                offset = 0
                for p in ps:
                    n = p.numel()
                    p.grad = flat[offset:offset + n].view_as(p)
                    offset += n

    def _sync_buffers(self, acc: dict[str, Any]) -> None:
        if self.world == 1 or not self.norm_buffers:
            return
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for b in self.norm_buffers:
            by_dtype.setdefault(b.dtype, []).append(b)
        with torch.no_grad():
            for bufs in by_dtype.values():
                flat = torch.cat([b.reshape(-1) for b in bufs])
                if self.buffer_sync == "average":
                    self._allreduce(flat, acc)
                    flat.div_(self.world)
                else:
                    self._broadcast(flat, 0, acc)
                offset = 0
                for b in bufs:
                    n = b.numel()
                    b.copy_(flat[offset:offset + n].view_as(b))
                    offset += n

    def _broadcast_state(self) -> None:
        """Make every replica start from job rank 0's parameters and buffers (setup, not counted per
        iteration: ``setup_bytes_sent``)."""
        tensors = [t for t in list(self.model.parameters()) + list(self.model.buffers())]
        acc = self._new_acc()
        with torch.no_grad():
            by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
            for t in tensors:
                by_dtype.setdefault(t.dtype, []).append(t)
            for ts in by_dtype.values():
                flat = torch.cat([t.detach().reshape(-1) for t in ts])
                self._broadcast(flat, 0, acc)
                offset = 0
                for t in ts:
                    n = t.numel()
                    t.copy_(flat[offset:offset + n].view_as(t))
                    offset += n
        self.setup_bytes_sent += acc["sent"]

    def barrier(self) -> None:
        """A barrier over the job (an all-reduce of one element, so it honours the group's timeout
        with gloo and NCCL alike)."""
        if self.world > 1:
            dist.all_reduce(torch.zeros(1, device=self.device), group=self.pg)

    # ----- state and checkpoints -----
    def state_hash(self, include_optimizer: bool = False) -> str:
        return state_hash(self.model, self.optimizer if include_optimizer else None)

    def save_checkpoint(self, path: str | Path, iteration: int, extra: dict[str, Any] | None = None) -> None:
        """Collective. Job rank 0 writes the model, optimizer and ``iteration`` (the next iteration
        to run) to ``path/state-<iteration>.pt``; every rank writes its RNG state to
        ``path/rng-rank{r}-<iteration>.pt``; then rank 0 replaces ``meta.json`` (iteration, world
        size, state hash, the file names; the checkpoint before it under ``"previous"``), and only
        then deletes the files of older checkpoints: the last two complete checkpoints are kept.

        Durability: every file is written to a temporary name and renamed, and ``meta.json`` names
        the files of complete checkpoints at every moment, so a process killed at any point of a
        save (or of a failed collective inside it) leaves the previous checkpoint loadable, and a
        newest checkpoint damaged later (a truncated file) leaves the one before it
        (:func:`select_checkpoint`); a folder without ``meta.json`` is not a checkpoint."""
        save_trainer_checkpoint(self, path, iteration, extra)

    def load_checkpoint(self, path: str | Path) -> int:
        """Collective. Restore model, optimizer and (same world size) this rank's RNG state from the
        newest checkpoint ``meta.json`` names; returns the iteration to continue from. Raises if it
        is incomplete or corrupt (:func:`select_checkpoint`, called before the workers start,
        drops a damaged newest one). Files load with ``weights_only=True``: tensors and plain
        data, no code."""
        return load_trainer_checkpoint(self, path)

    # ----- partial recovery: copy a peer's state -----
    def broadcast_state(self, src: int, extra: dict[str, Any] | None = None) -> tuple[dict[str, Any], int]:
        """Collective. Job rank ``src`` sends its model state, optimizer state and ``extra`` (any
        picklable dict) to every other rank of the job, which load them; afterwards every replica
        is bit-identical to ``src`` (checked: each rank compares its state hash, optimizer
        included, with the source's). Returns ``(src's extra, bytes sent by src to each rank)``.

        This is how a replacement worker joins a running job in partial recovery (CPR-style): it
        copies the current weights and optimizer state from a surviving peer instead of everyone
        rolling back to the last checkpoint."""
        if self.world == 1:
            return dict(extra or {}), 0
        n = torch.zeros(1, dtype=torch.int64)
        if self.rank == src:
            buf = io.BytesIO()
            torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                        "hash": self.state_hash(include_optimizer=True), "extra": dict(extra or {})}, buf)
            data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
            n[0] = data.numel()
        dist.broadcast(n, src=self._global(src), group=self.pg)
        if self.rank != src:
            data = torch.empty(int(n[0]), dtype=torch.uint8)
        dist.broadcast(data, src=self._global(src), group=self.pg)
        obj = torch.load(io.BytesIO(data.numpy().tobytes()), map_location=self.device, weights_only=True)
        if self.rank != src:
            self.model.load_state_dict(obj["model"])
            self.optimizer.load_state_dict(obj["optimizer"])
            got = self.state_hash(include_optimizer=True)
            if got != obj["hash"]:
                raise RuntimeError(f"state copied from rank {src} hashes to {got[:12]}, not {obj['hash'][:12]}")
        return obj["extra"], int(n[0])
