"""Run one SPB data-parallel job as local worker processes (:func:`run_job_local`).

The parent process hosts the rendezvous (a ``torch.distributed.TCPStore`` on 127.0.0.1, port
chosen by the OS: no free-port race), starts ``W`` worker processes (``forkserver`` on Linux,
``spawn`` elsewhere; torch is preloaded once in the fork server), and watches them:

* every worker sets one intra-op thread (``threads``), joins the job's process group with
  ``timeout_s`` (gloo on CPU; on CUDA: NCCL when each rank has its own GPU, gloo over CUDA tensors
  when ranks share GPUs), builds the model from the same seed, and runs an :class:`SPBTrainer`
  through the iterations' decisions;
* a worker that raises writes its error (rank, type, message, traceback, time) to the job's
  scratch folder and exits non-zero. As soon as any worker exits non-zero, the parent stops the
  others and raises :class:`JobFailed` naming the rank and the error that happened first (the
  others' errors, typically "connection closed" or a collective timeout, are listed as
  consequences). A worker that stalls without dying makes its peers' next collective time out
  after ``timeout_s``; ``job_timeout_s`` bounds the whole job as a last resort. No path hangs.

Results come back through files: per rank, the :class:`IterationReport` list, the final state
hash (parameters and buffers, optionally optimizer state), recorded gradients, held-out accuracy.
"""
from __future__ import annotations

import json
import logging
import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from jigsaw_env.network import INTRA_NODE, SYNC_METHODS, Link
from jigsaw_env.spb import Pattern, SPBConfig

from .data import DATA_SOURCES, DigitsData, default_source, make_batch_fn, mix_seed
from .models import build_executor_model, executor_model_names
from .peer_failure import is_peer_failure
from .spb_worker import IterationReport, SPBTrainer, read_checkpoint_meta, select_checkpoint, state_hash
from .transport import LoopbackWindow

#: where a checkpoint fallback is logged (one line: which checkpoint was unreadable, which loads)
CHECKPOINT_LOG = logging.getLogger("jigsaw_executor.checkpoint")

__all__ = ["Decision", "JobFailed", "JobResult", "run_job_local", "FAIL_MODES"]

FAIL_MODES = ("raise", "hang", "exit", "kill")


@dataclass(frozen=True)
class Decision:
    """The SPB decision of one iteration: level, pattern, and optionally explicit start groups
    (one per worker; overrides level/pattern's ``worker_starts``)."""

    level: int = 0
    pattern: str = "rotating"
    starts: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "pattern", Pattern.parse(self.pattern).value)
        if self.starts is not None:
            object.__setattr__(self, "starts", tuple(int(s) for s in self.starts))

    @classmethod
    def coerce(cls, d: Any) -> "Decision":
        if isinstance(d, Decision):
            return d
        if isinstance(d, dict):
            return cls(**d)
        if isinstance(d, (tuple, list)):
            return cls(*d)
        if isinstance(d, int):
            return cls(level=d)
        raise TypeError(f"cannot read an SPB decision from {d!r}")


class JobFailed(RuntimeError):
    """A worker of the job failed (or the job timed out). ``rank``: the rank whose error came first
    (None for a job timeout); ``errors``: every rank's error record."""

    def __init__(self, message: str, rank: int | None, errors: dict[int, dict[str, Any]]) -> None:
        super().__init__(message)
        self.rank = rank
        self.errors = errors


@dataclass
class JobResult:
    """What :func:`run_job_local` returns. ``reports[r]``: rank ``r``'s iteration reports."""

    reports: list[list[IterationReport]]
    state_hashes: list[str]
    start_iteration: int
    end_iteration: int
    wall_s: float
    accuracy: float | None = None
    state_dict: dict[str, Any] | None = None          # rank 0's model state (return_state=True)
    optimizer_state: dict[str, Any] | None = None     # rank 0's optimizer state (return_state=True)
    grads: list[dict[int, dict[str, Any]]] = field(default_factory=list)  # [rank][iteration] -> local/synced
    setup_bytes_sent: list[int] = field(default_factory=list)
    #: bytes the loopback interface carried from the workers' start to their exit, counted by the
    #: kernel (every process of the machine; ``jigsaw_executor.transport``); None off Linux
    loopback_bytes: int | None = None

    @property
    def identical_replicas(self) -> bool:
        return len(set(self.state_hashes)) == 1

    def bytes_per_iteration(self) -> list[int]:
        """Gradient bytes on the wire per iteration, summed over the ranks' ``bytes_sent``."""
        n = len(self.reports[0])
        return [sum(self.reports[r][i].bytes_sent for r in range(len(self.reports))) for i in range(n)]


@dataclass(frozen=True)
class _JobSpec:
    model_name: str
    world_size: int
    start_iteration: int
    decisions: tuple[Decision, ...]
    batch_size: int
    data: str
    seed: int
    spb: SPBConfig
    average_over: str
    link: Link
    device: str
    backend: str
    timeout_s: float
    store_port: int
    out_dir: str
    checkpoint_dir: str | None
    resume: bool
    checkpoint_every: int
    save_at_end: bool
    fail_at: tuple[int, int] | None
    fail_mode: str
    record_grads_at: tuple[int, ...]
    measure_activations: bool
    buffer_sync: str
    model_kwargs: tuple[tuple[str, Any], ...]
    lr: float | None
    threads: int
    return_state: bool
    evaluate: bool
    hash_optimizer: bool
    sync_method: str = "fastest"
    count_loopback: bool = False


# --------------------------------------------------------------------------------------------
# worker side
# --------------------------------------------------------------------------------------------
def _pick_backend(device: str, backend: str, world: int) -> tuple[str, str]:
    """(backend, device string for this rank's tensors); rank-independent part."""
    if device == "cpu":
        if backend not in ("auto", "gloo"):
            raise ValueError(f"backend {backend!r} cannot run on CPU tensors; use 'gloo'")
        return "gloo", "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("device 'cuda' requested but torch sees no CUDA device")
        n = torch.cuda.device_count()
        if backend == "auto":
            backend = "nccl" if world <= n and torch.distributed.is_nccl_available() else "gloo"
        if backend == "nccl" and world > n:
            raise ValueError(f"NCCL needs one GPU per rank: {world} ranks, {n} GPU(s); use backend 'gloo'")
        if backend not in ("nccl", "gloo"):
            raise ValueError(f"unknown backend {backend!r}; allowed: auto, gloo, nccl")
        return backend, "cuda"
    raise ValueError(f"unknown device {device!r}; allowed: cpu, cuda")


def _run_worker(rank: int, spec: _JobSpec) -> dict[str, Any]:
    torch.set_num_threads(spec.threads)
    try:
        torch.set_num_interop_threads(spec.threads)
    except RuntimeError:
        pass
    W = spec.world_size
    backend, devtype = _pick_backend(spec.device, spec.backend, W)
    if devtype == "cuda":
        dev = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    timeout = timedelta(seconds=spec.timeout_s)
    store = dist.TCPStore("127.0.0.1", spec.store_port, None, False, timeout=timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=W, timeout=timeout,
                            **({"device_id": dev} if backend == "nccl" else {}))
    # no try/finally around the work: after a failure the process exits at once (_worker_entry);
    # tearing down a broken process group could block
    torch.manual_seed(spec.seed)  # the same initial weights on every rank (rank 0's are broadcast too)
    model = build_executor_model(spec.model_name, **dict(spec.model_kwargs))
    if spec.lr is not None:
        model.lr = spec.lr
    model = model.to(dev).train()
    optimizer = model.make_optimizer()
    trainer = SPBTrainer(model, optimizer, spb_config=spec.spb, average_over=spec.average_over,
                         link=spec.link, buffer_sync=spec.buffer_sync,
                         measure_activations=spec.measure_activations, timeout_s=spec.timeout_s,
                         sync_method=spec.sync_method, count_loopback=spec.count_loopback)
    torch.manual_seed(mix_seed(spec.seed, 0xD40, rank))  # per-rank stream (dropout), in the checkpoint
    start = spec.start_iteration
    if spec.resume and spec.checkpoint_dir and read_checkpoint_meta(spec.checkpoint_dir) is not None:
        start = trainer.load_checkpoint(spec.checkpoint_dir)
        if start != spec.start_iteration:
            raise RuntimeError(f"checkpoint iteration {start} differs from the planned start "
                               f"{spec.start_iteration} (checkpoint changed during launch?)")
    batch_fn = make_batch_fn(spec.data, model, spec.seed, W, spec.batch_size)
    reports, grads = [], {}
    for i, dec in enumerate(spec.decisions):
        t = start + i
        if spec.fail_at is not None and spec.fail_at == (rank, t):
            if spec.fail_mode == "raise":
                raise RuntimeError(f"injected failure on rank {rank} at iteration {t}")
            if spec.fail_mode == "hang":
                time.sleep(10 ** 6)
            if spec.fail_mode == "exit":
                os._exit(3)
            if spec.fail_mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
        rec = t in spec.record_grads_at
        rep = trainer.step(batch_fn(t, rank), t, dec.level, dec.pattern, dec.starts, record_grads=rec)
        reports.append(rep.to_dict())
        if rec:
            grads[t] = {"local": trainer.last_local_grads, "synced": trainer.last_synced_grads}
        if spec.checkpoint_dir and spec.checkpoint_every and (t + 1) % spec.checkpoint_every == 0:
            trainer.save_checkpoint(spec.checkpoint_dir, t + 1)
    end = start + len(spec.decisions)
    if spec.checkpoint_dir and spec.save_at_end and not (spec.checkpoint_every and end % spec.checkpoint_every == 0
                                                         and spec.decisions):
        trainer.save_checkpoint(spec.checkpoint_dir, end)
    acc = None
    if spec.evaluate and spec.data == "digits" and rank == 0:
        acc = DigitsData(seed=spec.seed).accuracy(model, dev)
    trainer.barrier()
    out = {"rank": rank, "reports": reports, "grads": grads, "accuracy": acc, "start": start, "end": end,
           "hash": state_hash(model, optimizer if spec.hash_optimizer else None),
           "setup_bytes_sent": trainer.setup_bytes_sent}
    if spec.return_state and rank == 0:
        out["state_dict"] = {k: v.detach().to("cpu").clone() for k, v in model.state_dict().items()}
        out["optimizer_state"] = _to_cpu(optimizer.state_dict())
    dist.destroy_process_group()
    return out


def _to_cpu(obj: Any) -> Any:
    if torch.is_tensor(obj):
        return obj.detach().to("cpu").clone()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


def _worker_entry(rank: int, spec: _JobSpec) -> None:
    out = Path(spec.out_dir)
    try:
        result = _run_worker(rank, spec)

        tmp = out / f"result-rank{rank}.pt.tmp"
        torch.save(result, tmp)
        os.replace(tmp, out / f"result-rank{rank}.pt")
    except BaseException as e:  # noqa: BLE001 - every failure must reach the parent
        rec = {"rank": rank, "type": type(e).__name__, "message": str(e), "time": time.time(),
               "traceback": traceback.format_exc()}
        tmp = out / f"error-rank{rank}.json.tmp"
        tmp.write_text(json.dumps(rec))
        os.replace(tmp, out / f"error-rank{rank}.json")
        sys.stderr.write(f"[jigsaw spb worker rank {rank}] {type(e).__name__}: {e}\n")
        sys.stderr.flush()
        os._exit(1)  # skip interpreter teardown: a broken process group must not hang the exit


# --------------------------------------------------------------------------------------------
# parent side
# --------------------------------------------------------------------------------------------
# imported once in the fork server, so each worker starts in a fraction of a second: torch._dynamo
# is imported lazily by the first optimizer (seconds), sklearn.datasets by the digits loader.
_PRELOAD = ("torch", "torch.distributed", "torch._dynamo", "torch.optim", "sklearn.datasets",
            "jigsaw_executor.spb_worker", "jigsaw_executor.data", "jigsaw_executor.models")


def _mp_context() -> mp.context.BaseContext:
    if sys.platform.startswith("linux"):
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(list(_PRELOAD))
        return ctx
    return mp.get_context("spawn")


def _normalise_decisions(decisions: Any, start: int, iterations: int) -> tuple[Decision, ...]:
    if callable(decisions) and not isinstance(decisions, Decision):
        return tuple(Decision.coerce(decisions(t)) for t in range(start, start + iterations))
    if isinstance(decisions, (Decision, dict, int)) or (isinstance(decisions, tuple) and decisions
                                                       and not isinstance(decisions[0], (Decision, dict, tuple, list))):
        d = Decision.coerce(decisions)
        return (d,) * iterations
    seq = list(decisions)
    if len(seq) < start + iterations:
        raise ValueError(f"decisions are indexed by the global iteration: need {start + iterations} "
                         f"(iterations {start}..{start + iterations - 1}), got {len(seq)}")
    return tuple(Decision.coerce(d) for d in seq[start:start + iterations])


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except (ValueError, TypeError):
        return str(-code)


def _stop(procs: Sequence[mp.process.BaseProcess], grace_s: float = 5.0) -> set[int]:
    """Terminate (then kill) the workers still running; returns the ranks stopped here."""
    stopped = {r for r, p in enumerate(procs) if p.exitcode is None}
    for r in stopped:
        procs[r].terminate()
    deadline = time.monotonic() + grace_s
    for r in stopped:
        procs[r].join(max(0.0, deadline - time.monotonic()))
    for r in stopped:
        if procs[r].exitcode is None:
            procs[r].kill()
            procs[r].join(2.0)
    return stopped


def _failure(procs, out: Path, model_name: str, timed_out: float | None, exit_seen: dict[int, float],
             stopped: set[int]) -> JobFailed:
    """The job's failure: the root-cause rank is the earliest *primary* event (a Python error that
    is not a peer-failure symptom, or a death without a Python error), else the earliest event."""
    errors: dict[int, dict[str, Any]] = {}
    for r in range(len(procs)):
        f = out / f"error-rank{r}.json"
        if f.exists():
            errors[r] = json.loads(f.read_text())
    if timed_out is not None and not errors:
        return JobFailed(f"SPB job {model_name}: timed out after {timed_out:.0f} s (job_timeout_s); "
                         f"ranks still running: {sorted(stopped)}", None, errors)
    silent = {r: p.exitcode for r, p in enumerate(procs)
              if r not in errors and r not in stopped and p.exitcode not in (None, 0)}
    events = [(rec["time"], not is_peer_failure(rec), r) for r, rec in errors.items()]
    events += [(exit_seen.get(r, time.time()), True, r) for r in silent]
    primary = [e for e in events if e[1]]
    _, _, r = min(primary or events)
    stalled = sorted(stopped - set(errors))
    tail = (f"\n(ranks {stalled} were still running when the job failed: a stalled worker makes its peers' "
            f"collectives time out)" if stalled else "")
    others = "; ".join(f"rank {o}: {e['type']}: {e['message'].splitlines()[0] if e['message'] else ''}"
                       for o, e in sorted(errors.items()) if o != r)
    others = f"\n(then: {others})" if others else ""
    if r in errors:
        rec = errors[r]
        msg = (f"SPB job {model_name}: worker rank {r} failed: {rec['type']}: {rec['message']}{others}{tail}"
               f"\n--- rank {r} traceback ---\n{rec['traceback']}")
        return JobFailed(msg, r, errors)
    code = silent[r]
    why = f"killed by signal {_signal_name(code)}" if code < 0 else f"exit code {code}"
    return JobFailed(f"SPB job {model_name}: worker rank {r} died ({why}) without a Python error{others}{tail}",
                     r, errors)


def _check_job_args(model_name: str, world_size: int, iterations: int, *, sync_method: str, fail_mode: str,
                    data: str | None, device: str, backend: str) -> str:
    """ValueError naming the argument for a job ``run_job_local`` cannot run; the data source."""
    if model_name not in executor_model_names():
        raise ValueError(f"unknown model {model_name!r}; allowed: {executor_model_names()}")
    if world_size < 1 or iterations < 0:
        raise ValueError(f"need world_size >= 1 and iterations >= 0, got {world_size}, {iterations}")
    if sync_method not in SYNC_METHODS:
        raise ValueError(f"sync_method must be one of {list(SYNC_METHODS)}, got {sync_method!r}")
    if fail_mode not in FAIL_MODES:
        raise ValueError(f"fail_mode must be one of {list(FAIL_MODES)}, got {fail_mode!r}")
    data = data or default_source(model_name)
    if data not in DATA_SOURCES:
        raise ValueError(f"unknown data source {data!r}; allowed: {list(DATA_SOURCES)}")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"unknown device {device!r}; allowed: cpu, cuda")
    if device == "cpu":
        _pick_backend(device, backend, world_size)
    return data


def _start_workers(spec: "_JobSpec", world_size: int, threads: int) -> list:
    """Start one process per rank (``threads`` BLAS/OpenMP threads each, through the environment
    they inherit; the parent's environment is left as it was)."""
    ctx = _mp_context()
    env_before = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    for k in env_before:  # inherited by the workers (and a fork server started now)
        os.environ.setdefault(k, str(threads))
    procs = [ctx.Process(target=_worker_entry, args=(r, spec), name=f"jigsaw-spb-rank{r}") for r in range(world_size)]
    try:
        for p in procs:
            p.start()
    finally:
        for k, v in env_before.items():
            if v is None:
                os.environ.pop(k, None)
    return procs


def _watch_workers(procs: list, job_timeout_s: float | None) -> tuple[bool | None, float | None, dict[int, float], set[int]]:
    """Wait until every worker exited, one failed (its peers get a second to fail on their own) or
    ``job_timeout_s`` passed; then stop those still running. Returns (a worker failed, the timeout
    that expired or None, when the parent saw each rank exit (wall time), the ranks stopped)."""
    deadline = None if job_timeout_s is None else time.monotonic() + float(job_timeout_s)
    failed = timed_out = None
    exit_seen: dict[int, float] = {}  # wall time at which the parent saw each worker exit

    def note_exits() -> None:
        for r, p in enumerate(procs):
            if r not in exit_seen and p.exitcode is not None:
                exit_seen[r] = time.time()

    stopped: set[int] = set()
    try:
        while True:
            note_exits()
            if any(p.exitcode not in (None, 0) for p in procs):
                failed = True
                # give peers a moment to fail on their own and write their errors
                end = time.monotonic() + 1.0
                while time.monotonic() < end and any(p.exitcode is None for p in procs):
                    multiprocessing.connection.wait([p.sentinel for p in procs if p.exitcode is None], 0.1)
                    note_exits()
                break
            alive = [p for p in procs if p.exitcode is None]
            if not alive:
                break
            wait = 0.5
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = float(job_timeout_s)
                    break
                wait = min(wait, left)
            multiprocessing.connection.wait([p.sentinel for p in alive], wait)
    finally:
        stopped = _stop(procs)
    return failed, timed_out, exit_seen, stopped


def _read_results(out: Path, world_size: int, model_name: str) -> list[dict]:
    """Every rank's result file (tensors and plain data); JobFailed for a rank that left none."""
    results = []
    for r in range(world_size):
        f = out / f"result-rank{r}.pt"
        if not f.exists():
            raise JobFailed(f"SPB job {model_name}: worker rank {r} exited without a result", r, {})
        results.append(torch.load(f, weights_only=True))
    return results


def run_job_local(model_name: str, world_size: int, iterations: int,
                  decisions: Decision | Sequence[Any] | Callable[[int], Any] = Decision(), *,
                  batch_size: int = 16, data: str | None = None, seed: int = 0,
                  spb_config: SPBConfig = SPBConfig(), average_over: str | None = None,
                  link: Link = INTRA_NODE, device: str = "cpu", backend: str = "auto",
                  timeout_s: float = 60.0, job_timeout_s: float | None = None,
                  checkpoint_dir: str | os.PathLike | None = None, resume: bool = False,
                  checkpoint_every: int = 0, save_checkpoint: bool = True,
                  fail_at: tuple[int, int] | None = None, fail_mode: str = "raise",
                  record_grads_at: Sequence[int] = (), measure_activations: bool = True,
                  buffer_sync: str = "average", model_kwargs: dict[str, Any] | None = None,
                  lr: float | None = None, threads: int = 1, return_state: bool = False,
                  evaluate: bool = False, hash_optimizer: bool = True, sync_method: str = "fastest",
                  count_loopback: bool = False) -> JobResult:
    """Train ``model_name`` with real SPB on ``world_size`` local processes.

    decisions: one :class:`Decision` (or ``(level, pattern[, starts])``) for every iteration, a
        sequence indexed by the *global* iteration, or a function ``t -> decision``.
    data: ``"digits"`` or ``"synthetic"`` (default: digits for the tiny digit models).
    timeout_s: timeout of every collective (process-group timeout) and of the rendezvous.
    job_timeout_s: wall-clock bound of the whole job (None: none beyond the collective timeouts).
    checkpoint_dir / resume: with ``resume`` and a complete checkpoint there, continue from its
        iteration; at the end (``save_checkpoint``) and every ``checkpoint_every`` iterations, save.
    fail_at / fail_mode: fault injection for tests: rank ``fail_at[0]`` at iteration ``fail_at[1]``
        raises (``"raise"``), stalls (``"hang"``) or exits without a Python error (``"exit"``).
    record_grads_at: iterations whose local (before sync) and synced gradients are returned.
    count_loopback: every rank counts the loopback interface's bytes around its gradient syncs
        (``IterationReport.loopback_bytes``). ``JobResult.loopback_bytes`` (the whole job's window)
        is counted either way.
    sync_method: ``"fastest"`` (the simulator's choice per group, eq. N4), ``"ring"`` or
        ``"reduce_broadcast"`` (``SPBTrainer``).
    Returns a :class:`JobResult`; raises :class:`JobFailed` when a worker fails.
    """
    data = _check_job_args(model_name, world_size, iterations, sync_method=sync_method, fail_mode=fail_mode,
                           data=data, device=device, backend=backend)
    start = 0
    if resume:
        if checkpoint_dir is None:
            raise ValueError("resume=True needs a checkpoint_dir")
        # the newest checkpoint that loads (a truncated newest one: the one before it, one line logged)
        start = select_checkpoint(checkpoint_dir, log=CHECKPOINT_LOG.warning)
    decs = _normalise_decisions(decisions, start, iterations)
    for d in decs:
        spb_config.check_level(d.level)
        if d.starts is not None and len(d.starts) != world_size:
            raise ValueError(f"decision starts {d.starts} need one start group per worker ({world_size})")

    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=timeout_s),
                          wait_for_workers=False)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="jigsaw-spb-") as tmp:
        out = Path(tmp)
        spec = _JobSpec(
            model_name=model_name, world_size=world_size, start_iteration=start, decisions=decs,
            batch_size=batch_size, data=data, seed=seed, spb=spb_config,
            average_over=average_over or spb_config.average_over, link=link, device=device, backend=backend,
            timeout_s=float(timeout_s), store_port=int(store.port), out_dir=str(out),
            checkpoint_dir=str(checkpoint_dir) if checkpoint_dir is not None else None, resume=resume,
            checkpoint_every=int(checkpoint_every), save_at_end=save_checkpoint, fail_at=tuple(fail_at) if fail_at else None,
            fail_mode=fail_mode, record_grads_at=tuple(int(t) for t in record_grads_at),
            measure_activations=measure_activations, buffer_sync=buffer_sync,
            model_kwargs=tuple(sorted((model_kwargs or {}).items())), lr=lr, threads=threads,
            return_state=return_state, evaluate=evaluate, hash_optimizer=hash_optimizer, sync_method=sync_method,
            count_loopback=bool(count_loopback))
        with LoopbackWindow(required=False) as lo:  # the kernel's count, from the start to the exits
            procs = _start_workers(spec, world_size, threads)
            failed, timed_out, exit_seen, stopped = _watch_workers(procs, job_timeout_s)
        if failed or timed_out is not None:
            raise _failure(procs, out, model_name, timed_out, exit_seen, stopped)
        results = _read_results(out, world_size, model_name)
    wall = time.perf_counter() - t0
    del store
    return JobResult(
        reports=[[IterationReport.from_dict(d) for d in res["reports"]] for res in results],
        state_hashes=[res["hash"] for res in results], start_iteration=results[0]["start"],
        end_iteration=results[0]["end"], wall_s=wall, accuracy=results[0]["accuracy"],
        state_dict=results[0].get("state_dict"), optimizer_state=results[0].get("optimizer_state"), grads=[res["grads"] for res in results],
        setup_bytes_sent=[res["setup_bytes_sent"] for res in results], loopback_bytes=lo.bytes)
