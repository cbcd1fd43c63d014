"""``jigsaw calibrate --device cpu --executor``: the live executor's own cost, measured.

A CPU cost table measures a plain training loop. The live executor's iteration costs more: the SPB
trainer's bookkeeping (timers, saved-tensor hooks, per-group sync), the control read and, for a
multi-rank job, the per-iteration command broadcast; and its ranks talk over loopback gloo, not
over the simulator's intra-node link. This module measures both, so that the simulator (and
``jigsaw deploy --tables``) can use them (docs/deploy.md section 5, docs/spb_model.md eq. C1):

1. **Base tables**: each model's plain-loop CPU table, measured now (``jigsaw calibrate --device
   cpu``, the same measurement as the shipped CPU tables, with 10 warm-up and 200 timed runs)
   unless ``base_tables`` gives them.
2. **Executor runs**: ``repeats`` separate live runs (one Ray session, one round per job, no SPB:
   level 0). In each, every model trains ``iterations`` iterations alone on one slot and, for the
   link, on 2 slots. With 2 slots each model runs once on each slot, side by side with another
   model on the other slot (slot 0 takes the models in order, slot 1 the same sequence shifted by
   one: a busy live cluster, and the slots of a shared machine are not alike, while the
   simulator's are). A job's iteration time in one run is its mean stepping time per iteration
   (what the replay compares: ``stepping_s / iterations``); the calibrated value is the **median
   over the repeats and slots** (one run on a shared machine is noisy).
3. **Overhead (eq. X1)**: ``executor_overhead_s = max(0, T1 - plain compute_s(0))``, ``T1`` the
   median one-slot level-0 iteration. Written into the base table (every other number unchanged),
   except when the plain loop measured slower than ``T1`` (a disturbed measurement: the executor
   does its work and more): then every time of the table is scaled by ``T1 / plain`` and the
   overhead is 0, so that the table's level-0 iteration is ``T1`` either way.
4. **Link (eq. X2)**: ``comm_m = T2_m - T1_m`` per model (``T2``: 2 slots); with the bandwidth held
   at the simulator's intra-node value (the tiny models' gradients, 72-153 kB, cannot resolve it:
   at 7.67 GB/s they take 10-20 us against ~1 ms of latency per message), the per-message latency
   is the least-squares ``alpha`` of ``comm_m = 2 n_m alpha + P_m / beta`` (``n_m`` groups with
   parameters, ``P_m`` gradient bytes): :func:`jigsaw_env.network.fit_executor_alpha`. Written to
   ``OUT/link.json``, which ``jigsaw deploy --tables OUT`` uses.
5. **Lockstep barrier (eq. X3)**: co-located pairs of the models (every pair; a model with itself
   when there is one), both jobs at level 0 on one slot in lockstep, ``repeats`` times; the
   barrier is the mean over pairs of the median pair step minus the two models' ``T1``
   (:mod:`jigsaw_executor.lockstep`). Written to ``OUT/lockstep.json``, which the decision-log
   replay gives the simulator (``SimConfig.lockstep_s``, eq. K3).

Units: seconds (tables, ``link.json`` ``alpha_s``), bytes per second (``bandwidth_Bps``).
"""
from __future__ import annotations

import datetime as _dt
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from agents.base import Scheduler
from jigsaw_env.calibrate import calibrate
from jigsaw_env.cost_table import CostTable, table_filename
from jigsaw_env.network import INTRA_NODE, LINK_FILE, Link, fit_executor_alpha, save_link
from jigsaw_env.spb import SPBConfig
from jigsaw_env.state import Decision, JobDecision

from .cluster_ray import RaySession, SlotPool, check_slots, get_or_create_hub, kill_actor, physical_cores
from .live import LiveConfig, LiveExecutor, LiveJob
from .lockstep import LOCKSTEP_FILE, fit_lockstep, save_lockstep
from .policies import build_scheduler, scheduler_spec

DEFAULT_MODELS = ("tiny_cnn", "tiny_mlp", "tiny_transformer")
PLAIN_REPEATS = 200  # timed runs of the plain-loop table measured here (unless --repeats)
PLAIN_WARMUP = 10    # warm-up runs before them


class PinnedGroups(Scheduler):
    """A scheduler for calibration runs: groups of jobs, each group on the GPUs given for it at
    level 0, in list order; a group starts once no earlier group still holds any of its GPUs
    (so the jobs of a group share its GPUs, in lockstep when there are several)."""

    name = "calibration-pinned"

    def __init__(self, groups: list[tuple[tuple[int, ...], tuple[int, ...]]]):
        self.groups = [(tuple(j), tuple(g)) for j, g in groups]

    def schedule(self, state):
        dec, used = Decision(), set()
        for jids, gpus in self.groups:
            live = [j for j in jids if j in state.jobs and state.jobs[j].active]
            if not live or used & set(gpus):
                used.update(gpus if live else ())
                continue
            for j in live:
                dec[j] = JobDecision(gpus, 0)
            used.update(gpus)
        return dec


def _layout(n_models: int, link: bool) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The :class:`PinnedGroups` of a level-0 run: with ``link``, slot 0 runs the models in order
    and slot 1 the same sequence shifted by one, side by side (each model once on each slot, the
    other slot busy, as in a live cluster: the simulator's slots are alike, so a model's one-slot
    time is the median over both), then each two-slot job; without, the models one by one on slot 0."""
    if not link:
        return [((ONE_SLOT_ID + i,), (0,)) for i in range(n_models)]
    groups = []
    for i in range(n_models):
        groups.append(((ONE_SLOT_ID + i,), (0,)))
        groups.append(((ONE_SLOT_ID + SLOT_STRIDE + (i + 1) % n_models,), (1,)))
    return groups + [((TWO_SLOT_ID + i,), (0, 1)) for i in range(n_models)]


def _run(jobs, out: Path, slots: int, pool, hub, groups=None, max_workers_per_gpu: int = 2) -> dict:
    if groups is None:
        spec = scheduler_spec("fifo")
        sched, rec = build_scheduler(spec, SPBConfig())
    else:
        sched, rec = PinnedGroups(groups), None
        spec = {"kind": "custom", "name": PinnedGroups.name, "groups": [[list(j), list(g)] for j, g in groups]}
    # one round per job (a round ends when its jobs are done), no checkpoint inside the run; the
    # pairs step in lockstep, whose barrier they measure (eq. X3)
    cfg = LiveConfig(slots=slots, round_s=1e6, max_workers_per_gpu=max_workers_per_gpu, timeout_s=60,
                     checkpoint_every=0, evaluate=False, pace="lockstep")
    ex = LiveExecutor(jobs, sched, cfg, out, scheduler_spec=spec, pool=pool, hub=hub, recorder=rec)
    try:
        return ex.run()
    finally:
        ex.close()


@dataclass(frozen=True)
class _Provenance:
    """How and when a calibration ran (written into every file's sources)."""

    cmd: str
    date: str
    load0: float
    load1: float
    repeats: int
    iterations: int

    @property
    def here(self) -> str:
        return f"measured here (`{self.cmd}`, {self.date}, load average {self.load0:.1f} -> {self.load1:.1f})"


def _check_calibration_args(repeats, iterations, lockstep: bool, pool) -> None:
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"executor repeats must be an integer >= 1, got {repeats!r}")
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"executor iterations must be an integer >= 1, got {iterations!r}")
    if lockstep and pool is not None and getattr(pool, "cap", 2) < 2:  # before any measurement
        raise ValueError(f"the lockstep pairs need 2 workers per slot but the given slot pool holds {pool.cap}; "
                         "give a pool with 2 hosts per slot or lockstep=False")


def _plain_tables(models: list[str], batch_sizes: dict[str, int], base_tables: dict[str, CostTable] | None,
                  plain_repeats: int | None, cmd: str, log: Callable[[str], None]) -> dict[str, CostTable]:
    """The plain-loop table of every model: given in ``base_tables`` or measured here."""
    base: dict[str, CostTable] = {}
    for m in models:
        if base_tables and m in base_tables:
            base[m] = base_tables[m]
        else:
            log(f"{m}: measuring the plain-loop table (jigsaw calibrate --device cpu)")
            # more warm-up and timed runs than a one-off table: the tiny models' iterations take
            # 0.5-5 ms, and 50 runs after 1 warm-up varied by up to 2x between calibrations here
            # (the first model measured in a process paid torch's warm-up); 10 + 200 did not
            base[m] = calibrate(m, batch_sizes[m], "cpu", repeats=plain_repeats or PLAIN_REPEATS, warmup=PLAIN_WARMUP,
                                command=f"{cmd} (plain-loop part)")
        if base[m].executor_overhead_s:
            raise ValueError(f"base table of {m} already has executor_overhead_s = {base[m].executor_overhead_s}; "
                             "give a plain-loop table")
    return base


#: job ids of the calibration runs: model i alone on slot s is ONE_SLOT_ID + i + SLOT_STRIDE x s,
#: on both slots TWO_SLOT_ID + i; the co-located pairs are 300 + 2k and 301 + 2k
ONE_SLOT_ID, SLOT_STRIDE, TWO_SLOT_ID = 100, 50, 200


def one_slot_ids(i: int, slots: int) -> list[int]:
    """The job ids of model ``i``'s one-slot runs, one per slot."""
    return [ONE_SLOT_ID + i + SLOT_STRIDE * s for s in range(slots)]


def _calibration_jobs(models: list[str], batch_sizes: dict[str, int], iterations: int, link: bool, lockstep: bool):
    """(one-slot jobs: each model once per slot with ``link``, else once; two-slot jobs; co-located
    pairs), ids as :data:`ONE_SLOT_ID` says."""
    slots = 2 if link else 1
    one = [LiveJob(jid, m, 1, iterations, seed=i, batch_size=batch_sizes[m])
           for i, m in enumerate(models) for jid in one_slot_ids(i, slots)]
    two = [LiveJob(TWO_SLOT_ID + i, m, 2, iterations, seed=i, batch_size=batch_sizes[m])
           for i, m in enumerate(models)] if link else []
    pairs = _pairs(models) if lockstep else []
    duo = [(LiveJob(300 + 2 * k, a, 1, iterations, seed=k, batch_size=batch_sizes[a]),
            LiveJob(301 + 2 * k, b, 1, iterations, seed=k + 50, batch_size=batch_sizes[b])) for k, (a, b) in enumerate(pairs)]
    return one, two, duo


def _measure(one, two, duo, *, repeats: int, iterations: int, link: bool, slots: int | None, pool, hub,
             log: Callable[[str], None]) -> list[dict]:
    """Run the jobs ``repeats`` times (in a Ray session and slot pool of its own unless ``pool`` is
    given); per run, job id -> its mean iteration time."""
    need = 2 if link else 1
    session = None
    own_pool = pool is None
    if own_pool:
        if link and physical_cores() < 2:
            raise ValueError(f"fitting the link needs 2 slots but this machine has {physical_cores()} physical core: "
                             "use --no-link")
        slots = slots or need
        check_slots(slots)
        session = RaySession(slots).start()
        tag = f"jigsaw-cal-{os.getpid()}"
        pool = SlotPool(slots, 2 if duo else 1, prefix=tag)
        hub = get_or_create_hub(f"{tag}-hub")
    slots = slots or need
    runs: list[dict] = []
    scratch = Path(tempfile.mkdtemp(prefix="jigsaw-cal-"))
    try:
        for r in range(repeats):
            log(f"executor run {r + 1}/{repeats}: {len(one)} one-slot (each model on each slot) and {len(two)} "
                f"two-slot level-0 jobs, {iterations} iterations each")
            s = _run(one + two, scratch / f"run{r}", slots, pool, hub, _layout(len(one) // (2 if link else 1), link),
                     max_workers_per_gpu=1)
            runs.append({str(j["job_id"]): j["mean_iter_s"] for j in s["jobs"].values()})
            if duo:
                log(f"executor run {r + 1}/{repeats}: {len(duo)} co-located level-0 pairs in lockstep, "
                    f"{iterations} iterations each")
                groups = [((x.job_id, y.job_id), (k % slots,)) for k, (x, y) in enumerate(duo)]
                s = _run([j for xy in duo for j in xy], scratch / f"pairs{r}", slots, pool, hub, groups,
                         max_workers_per_gpu=2)
                runs[-1].update({str(j["job_id"]): j["mean_iter_s"] for j in s["jobs"].values()})
    finally:
        if own_pool:
            pool.close()
            kill_actor(hub)
            session.stop()
    return runs


def _median(runs: list[dict], *jids: int) -> tuple[float, list[float]]:
    """The median over the runs (and the given jobs: a model's runs on each slot) of the mean
    iteration time, and the values (run by run, the jobs in the given order)."""
    xs = [r[str(j)] for r in runs for j in jids if r.get(str(j)) is not None]
    if not xs:
        raise RuntimeError(f"calibration job {jids[0]} ran no iteration")
    return float(statistics.median(xs)), xs


def _overhead_table(m: str, i: int, base: CostTable, batch_size: int, runs: list[dict], link: bool, out: Path,
                    pv: _Provenance, log: Callable[[str], None]) -> tuple[dict, tuple | None, Path]:
    """Model ``m``'s table with its executor overhead (eq. X1), written to ``out``: (its record in
    the summary, its link point (messages, bytes, comm_s) or None, the file)."""
    t1, xs1 = _median(runs, *one_slot_ids(i, 2 if link else 1))
    plain = base.plain_compute_s(0)
    x = max(0.0, t1 - plain)
    rec = {"batch_size": batch_size, "one_slot_iter_s": t1, "one_slot_iter_s_runs": xs1,
           "plain_compute_s0": plain, "raw_overhead_s": t1 - plain, "executor_overhead_s": x}
    point = None
    if link:
        t2, xs2 = _median(runs, TWO_SLOT_ID + i)
        g = [grp.param_bytes for grp in base.groups if grp.param_bytes > 0]
        rec.update(two_slot_iter_s=t2, two_slot_iter_s_runs=xs2, comm_s=t2 - t1, messages=2 * len(g),
                   gradient_bytes=sum(g))
        point = (2 * len(g), sum(g), t2 - t1)
    t = base
    src = dict(t.sources)
    # the executor does the plain loop's work and more, so a plain loop measured slower than T1
    # was disturbed (up to 2x here on 2 shared cores): its per-group times are scaled down to T1,
    # keeping their shape across groups (what the SPB levels read), and the overhead is 0
    scale = t1 / plain if t1 < plain else 1.0
    rec["plain_scale"] = scale
    if scale != 1.0:
        from jigsaw_env.table_builder import scale_table

        src["plain_scale"] = (f"the plain loop ({plain * 1e3:.3f} ms) measured slower than the live executor's "
                              f"level-0 iteration ({t1 * 1e3:.3f} ms): every time scaled by {scale:.4f} so that "
                              f"compute_s(0) equals it (docs/deploy.md eq. X1)")
        t = scale_table(t, scale, device=t.device, fixed_memory_bytes=t.fixed_memory_bytes, sources=src, meta=t.meta)
    src["executor_overhead_s"] = (
        f"{pv.here}: the live executor's median "
        f"over {pv.repeats} runs of the mean level-0 iteration of {m} alone on one slot ({pv.iterations} iterations "
        f"per run: {', '.join(f'{v * 1e3:.3f}' for v in xs1)} ms; median {t1 * 1e3:.3f} ms) minus this "
        f"table's plain-loop compute_s(0) = {plain * 1e3:.3f} ms"
        + ("" if t1 >= plain else " (negative: 0, and the table scaled to the executor's iteration)")
        + "; paid by every iteration whatever its start group (docs/spb_model.md eq. C1, docs/deploy.md eq. X1)")
    meta = dict(t.meta, executor_calibration=rec | {"command": pv.cmd, "date_utc": pv.date, "repeats": pv.repeats,
                                                     "loadavg_1min_start_end": [pv.load0, pv.load1]})
    new = CostTable(t.model, t.batch_size, t.device, t.groups, t.optimizer_s, t.fixed_memory_bytes, src, meta,
                    executor_overhead_s=x)
    path = out / table_filename(m, t.batch_size, "cpu")
    new.save(path)
    log(f"{m}: executor level-0 iteration {t1 * 1e3:.3f} ms (runs{' x slots' if link else ''} "
        f"{', '.join(f'{v * 1e3:.3f}' for v in xs1)}), "
        f"plain loop {plain * 1e3:.3f} ms -> executor_overhead_s = {x * 1e3:.3f} ms"
        + (f", table scaled by {scale:.3f}" if scale != 1.0 else "") + f" -> {path}")
    return rec, point, path


def _write_link(models: list[str], points: list[tuple], out: Path, pv: _Provenance,
                log: Callable[[str], None]) -> dict:
    """Fit the link's alpha (eq. X2) and write ``link.json``; its summary."""
    bw = INTRA_NODE.bandwidth_Bps
    alpha = fit_executor_alpha(points, bw)
    lk = Link(alpha, bw)
    src = (f"{pv.here}: alpha = least squares of "
           f"comm = 2 n alpha + P / beta over the 2-slot level-0 jobs of {', '.join(models)} (comm = median 2-slot "
           f"minus median 1-slot iteration over {pv.repeats} runs; docs/deploy.md eq. X2); bandwidth not fitted: the "
           f"simulator's intra-node {bw / 1e9:.2f} GB/s (jigsaw_env.network.INTRA_NODE)")
    save_link(out / LINK_FILE, lk, src, {"points": [{"model": m, "messages": n, "gradient_bytes": p, "comm_s": c}
                                                    for m, (n, p, c) in zip(models, points)]})
    log(f"link: alpha {alpha * 1e6:.1f} us per message, {bw / 1e9:.2f} GB/s (not fitted) -> {out / LINK_FILE} "
        f"(jigsaw deploy --tables {out} uses it; or --link-alpha-us {alpha * 1e6:.1f} --link-gbps {bw / 1e9:.2f})")
    return {"alpha_s": alpha, "bandwidth_Bps": bw, "file": str(out / LINK_FILE)}


def _write_lockstep(duo, alone_s: dict[str, float], runs: list[dict], out: Path, pv: _Provenance,
                    log: Callable[[str], None]) -> dict:
    """Fit the lockstep barrier (eq. X3) from the co-located pairs and write ``lockstep.json``; its
    summary. ``alone_s``: each model's median level-0 iteration alone on one slot."""
    lpts = []
    for x, y in duo:
        # both jobs of a pair step together: the pair's step is the mean of their two means
        ta, xa = _median(runs, x.job_id)
        tb, xb = _median(runs, y.job_id)
        tp = (ta + tb) / 2
        lpts.append({"models": [x.model, y.model], "pair_step_s": tp, "pair_step_s_runs": [(u + v) / 2 for u, v in zip(xa, xb)],
                     "alone_iter_s": [alone_s[x.model], alone_s[y.model]],
                     "barrier_s": tp - alone_s[x.model] - alone_s[y.model]})
    b = fit_lockstep([(q["pair_step_s"], *q["alone_iter_s"]) for q in lpts])
    src = (f"{pv.here}: the mean over "
           f"{len(lpts)} co-located level-0 pairs of the median pair step (both jobs on one slot in lockstep, "
           f"{pv.repeats} runs of {pv.iterations} steps) minus the two models' median level-0 iterations alone "
           f"(docs/deploy.md eq. X3), clipped at 0")
    save_lockstep(out / LOCKSTEP_FILE, b, src, {"points": lpts})
    log(f"lockstep barrier: {b * 1e3:.3f} ms per co-located step (pairs: "
        + ", ".join(f"{'+'.join(q['models'])} {q['barrier_s'] * 1e3:+.3f}" for q in lpts) + f" ms) -> {out / LOCKSTEP_FILE}")
    return {"lockstep_s": b, "points": lpts, "file": str(out / LOCKSTEP_FILE)}


def calibrate_executor(models: list[str], batch_sizes: dict[str, int], out: str | Path, *, repeats: int = 3,
                       iterations: int = 1000, link: bool = True, lockstep: bool = True,
                       base_tables: dict[str, CostTable] | None = None, pool=None, hub=None,
                       slots: int | None = None, plain_repeats: int | None = None,
                       log: Callable[[str], None] = print,
                       command: str | None = None) -> dict:
    """Measure the executor overhead of ``models`` (and the link, with ``link``; the lockstep
    barrier, with ``lockstep``) and write the tables, ``link.json`` and ``lockstep.json`` into the
    folder ``out`` (module docstring). ``pool``/``hub``: an
    existing slot pool and control hub (tests); otherwise a local Ray session is started and
    stopped. Returns a summary dict (per model T1, T2, overhead; the link)."""
    _check_calibration_args(repeats, iterations, lockstep, pool)
    out = Path(out)
    out.mkdir(exist_ok=True)
    cmd = command or "jigsaw calibrate --device cpu --executor"
    load0 = os.getloadavg()[0]
    t_start = time.time()
    base = _plain_tables(models, batch_sizes, base_tables, plain_repeats, cmd, log)
    one, two, duo = _calibration_jobs(models, batch_sizes, iterations, link, lockstep)
    runs = _measure(one, two, duo, repeats=repeats, iterations=iterations, link=link, slots=slots, pool=pool, hub=hub,
                    log=log)
    load1 = os.getloadavg()[0]
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    pv = _Provenance(cmd, date, load0, load1, repeats, iterations)
    summary: dict = {"command": cmd, "date_utc": date, "repeats": repeats, "iterations": iterations,
                     "loadavg_1min_start_end": [load0, load1], "wall_s": round(time.time() - t_start, 1),
                     "models": {}}
    points = []
    written = []
    for i, m in enumerate(models):
        rec, point, path = _overhead_table(m, i, base[m], batch_sizes[m], runs, link, out, pv, log)
        summary["models"][m] = rec
        if point is not None:
            points.append(point)
        written.append(path)
    if link:
        summary["link"] = _write_link(models, points, out, pv, log)
        written.append(out / LINK_FILE)
    if duo:
        alone_s = {m: summary["models"][m]["one_slot_iter_s"] for m in models}
        summary["lockstep"] = _write_lockstep(duo, alone_s, runs, out, pv, log)
        written.append(out / LOCKSTEP_FILE)
    summary["written"] = [str(p) for p in written]
    return summary


def _pairs(models: list[str]) -> list[tuple[str, str]]:
    """The co-located pairs of the lockstep calibration: every unordered pair of ``models``, or a
    model with itself when there is only one."""
    if len(models) == 1:
        return [(models[0], models[0])]
    return [(a, b) for i, a in enumerate(models) for b in models[i + 1:]]
