"""``jigsaw calibrate --device cpu --executor``: the live executor's own cost, measured.

A CPU cost table measures a plain training loop. The live executor's iteration costs more: the SPB
trainer's bookkeeping (timers, saved-tensor hooks, per-group sync), the control read and, for a
multi-rank job, the per-iteration command broadcast; and its ranks talk over loopback gloo, not
over the simulator's intra-node link. This module measures both, so that the simulator (and
``jigsaw deploy --tables``) can use them (docs/deploy.md section 5, docs/spb_model.md eq. C1):

1. **Base tables**: each model's plain-loop CPU table, measured now (``jigsaw calibrate --device
   cpu``, the same measurement as the shipped CPU tables) unless ``base_tables`` gives them.
2. **Executor runs**: ``repeats`` separate live runs (one Ray session, ``fifo``, one round per job,
   no SPB: level 0). In each, every model trains ``iterations`` iterations alone on one slot (two
   one-slot jobs run at the same time, one per slot, as in a busy live cluster) and, for the link,
   on 2 slots. A job's iteration time in one run is its mean stepping time per iteration (what the
   replay compares: ``stepping_s / iterations``); the calibrated value is the **median over the
   repeats** (one run on a shared machine is noisy).
3. **Overhead (eq. X1)**: ``executor_overhead_s = max(0, T1 - plain compute_s(0))``, ``T1`` the
   median one-slot level-0 iteration. Written into the base table (every other number unchanged).
4. **Link (eq. X2)**: ``comm_m = T2_m - T1_m`` per model (``T2``: 2 slots); with the bandwidth held
   at the simulator's intra-node value (the tiny models' gradients, 72-153 kB, cannot resolve it:
   at 7.67 GB/s they take 10-20 us against ~1 ms of latency per message), the per-message latency
   is the least-squares ``alpha`` of ``comm_m = 2 n_m alpha + P_m / beta`` (``n_m`` groups with
   parameters, ``P_m`` gradient bytes): :func:`jigsaw_env.network.fit_executor_alpha`. Written to
   ``OUT/link.json``, which ``jigsaw deploy --tables OUT`` uses.

Units: seconds (tables, ``link.json`` ``alpha_s``), bytes per second (``bandwidth_Bps``).
"""
from __future__ import annotations

import datetime as _dt
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

from jigsaw_env.cost_table import CostTable, table_filename
from jigsaw_env.network import INTRA_NODE, LINK_FILE, Link, fit_executor_alpha, save_link

DEFAULT_MODELS = ("tiny_cnn", "tiny_mlp", "tiny_transformer")


def _run(jobs, out: Path, slots: int, pool, hub) -> dict:
    from jigsaw_env.spb import SPBConfig

    from .live import LiveConfig, LiveExecutor
    from .policies import build_scheduler, scheduler_spec

    spec = scheduler_spec("fifo")
    sched, rec = build_scheduler(spec, SPBConfig())
    # one round per job (a round ends when its jobs are done), no checkpoint inside the run
    cfg = LiveConfig(slots=slots, round_s=1e6, max_workers_per_gpu=1, timeout_s=60, checkpoint_every=0,
                     evaluate=False)
    ex = LiveExecutor(jobs, sched, cfg, out, scheduler_spec=spec, pool=pool, hub=hub, recorder=rec)
    try:
        return ex.run()
    finally:
        ex.close()


def calibrate_executor(models: list[str], batch_sizes: dict[str, int], out: str | Path, *, repeats: int = 3,
                       iterations: int = 300, link: bool = True,
                       base_tables: dict[str, CostTable] | None = None, pool=None, hub=None,
                       slots: int | None = None, plain_repeats: int | None = None,
                       log: Callable[[str], None] = print,
                       command: str | None = None) -> dict:
    """Measure the executor overhead of ``models`` (and the link, with ``link``) and write the
    tables and ``link.json`` into the folder ``out`` (module docstring). ``pool``/``hub``: an
    existing slot pool and control hub (tests); otherwise a local Ray session is started and
    stopped. Returns a summary dict (per model T1, T2, overhead; the link)."""
    from jigsaw_env.calibrate import calibrate

    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"executor repeats must be an integer >= 1, got {repeats!r}")
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"executor iterations must be an integer >= 1, got {iterations!r}")
    out = Path(out)
    out.mkdir(exist_ok=True)
    cmd = command or "jigsaw calibrate --device cpu --executor"
    load0 = os.getloadavg()[0]
    t_start = time.time()
    base: dict[str, CostTable] = {}
    for m in models:
        if base_tables and m in base_tables:
            base[m] = base_tables[m]
        else:
            log(f"{m}: measuring the plain-loop table (jigsaw calibrate --device cpu)")
            base[m] = calibrate(m, batch_sizes[m], "cpu", repeats=plain_repeats, command=f"{cmd} (plain-loop part)")
        if base[m].executor_overhead_s:
            raise ValueError(f"base table of {m} already has executor_overhead_s = {base[m].executor_overhead_s}; "
                             "give a plain-loop table")
    from .live import LiveJob

    one = [LiveJob(100 + i, m, 1, iterations, seed=i, batch_size=batch_sizes[m]) for i, m in enumerate(models)]
    two = [LiveJob(200 + i, m, 2, iterations, seed=i, batch_size=batch_sizes[m]) for i, m in enumerate(models)] \
        if link else []
    need = 2 if link else 1
    session = None
    own_pool = pool is None
    if own_pool:
        from .cluster_ray import RaySession, SlotPool, check_slots, get_or_create_hub

        from .cluster_ray import physical_cores

        if link and physical_cores() < 2:
            raise ValueError(f"fitting the link needs 2 slots but this machine has {physical_cores()} physical core: "
                             "use --no-link")
        slots = slots or need
        check_slots(slots)
        session = RaySession(slots).start()
        tag = f"jigsaw-cal-{os.getpid()}"
        pool = SlotPool(slots, 1, prefix=tag)
        hub = get_or_create_hub(f"{tag}-hub")
    slots = slots or need
    runs: list[dict] = []
    scratch = Path(tempfile.mkdtemp(prefix="jigsaw-cal-"))
    try:
        for r in range(repeats):
            log(f"executor run {r + 1}/{repeats}: {len(one)} one-slot and {len(two)} two-slot level-0 jobs, "
                f"{iterations} iterations each")
            s = _run(one + two, scratch / f"run{r}", slots, pool, hub)
            runs.append({str(j["job_id"]): j["mean_iter_s"] for j in s["jobs"].values()})
    finally:
        if own_pool:
            from .cluster_ray import kill_actor

            pool.close()
            kill_actor(hub)
            session.stop()
    load1 = os.getloadavg()[0]
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    def med(jid: int) -> tuple[float, list[float]]:
        xs = [r[str(jid)] for r in runs if r.get(str(jid)) is not None]
        if not xs:
            raise RuntimeError(f"calibration job {jid} ran no iteration")
        return float(statistics.median(xs)), xs

    summary: dict = {"command": cmd, "date_utc": date, "repeats": repeats, "iterations": iterations,
                     "loadavg_1min_start_end": [load0, load1], "wall_s": round(time.time() - t_start, 1),
                     "models": {}}
    points = []
    written = []
    for i, m in enumerate(models):
        t1, xs1 = med(100 + i)
        plain = base[m].plain_compute_s(0)
        x = max(0.0, t1 - plain)
        rec = {"batch_size": batch_sizes[m], "one_slot_iter_s": t1, "one_slot_iter_s_runs": xs1,
               "plain_compute_s0": plain, "raw_overhead_s": t1 - plain, "executor_overhead_s": x}
        if link:
            t2, xs2 = med(200 + i)
            g = [grp.param_bytes for grp in base[m].groups if grp.param_bytes > 0]
            rec.update(two_slot_iter_s=t2, two_slot_iter_s_runs=xs2, comm_s=t2 - t1, messages=2 * len(g),
                       gradient_bytes=sum(g))
            points.append((2 * len(g), sum(g), t2 - t1))
        summary["models"][m] = rec
        t = base[m]
        src = dict(t.sources)
        src["executor_overhead_s"] = (
            f"measured here (`{cmd}`, {date}, load average {load0:.1f} -> {load1:.1f}): the live executor's median "
            f"over {repeats} runs of the mean level-0 iteration of {m} alone on one slot ({iterations} iterations "
            f"per run: {', '.join(f'{v * 1e3:.3f}' for v in xs1)} ms; median {t1 * 1e3:.3f} ms) minus this "
            f"table's plain-loop compute_s(0) = {plain * 1e3:.3f} ms"
            + ("" if t1 >= plain else " (negative: clipped at 0)")
            + "; paid by every iteration whatever its start group (docs/spb_model.md eq. C1, docs/deploy.md eq. X1)")
        meta = dict(t.meta, executor_calibration=rec | {"command": cmd, "date_utc": date, "repeats": repeats,
                                                         "loadavg_1min_start_end": [load0, load1]})
        new = CostTable(t.model, t.batch_size, t.device, t.groups, t.optimizer_s, t.fixed_memory_bytes, src, meta,
                        executor_overhead_s=x)
        path = out / table_filename(m, t.batch_size, "cpu")
        new.save(path)
        written.append(path)
        log(f"{m}: executor level-0 iteration {t1 * 1e3:.3f} ms (runs {', '.join(f'{v * 1e3:.3f}' for v in xs1)}), "
            f"plain loop {plain * 1e3:.3f} ms -> executor_overhead_s = {x * 1e3:.3f} ms -> {path}")
    if link:
        bw = INTRA_NODE.bandwidth_Bps
        alpha = fit_executor_alpha(points, bw)
        lk = Link(alpha, bw)
        src = (f"measured here (`{cmd}`, {date}, load average {load0:.1f} -> {load1:.1f}): alpha = least squares of "
               f"comm = 2 n alpha + P / beta over the 2-slot level-0 jobs of {', '.join(models)} (comm = median 2-slot "
               f"minus median 1-slot iteration over {repeats} runs; docs/deploy.md eq. X2); bandwidth not fitted: the "
               f"simulator's intra-node {bw / 1e9:.2f} GB/s (jigsaw_env.network.INTRA_NODE)")
        save_link(out / LINK_FILE, lk, src, {"points": [{"model": m, "messages": n, "gradient_bytes": p, "comm_s": c}
                                                        for m, (n, p, c) in zip(models, points)]})
        summary["link"] = {"alpha_s": alpha, "bandwidth_Bps": bw, "file": str(out / LINK_FILE)}
        written.append(out / LINK_FILE)
        log(f"link: alpha {alpha * 1e6:.1f} us per message, {bw / 1e9:.2f} GB/s (not fitted) -> {out / LINK_FILE} "
            f"(jigsaw deploy --tables {out} uses it; or --link-alpha-us {alpha * 1e6:.1f} --link-gbps {bw / 1e9:.2f})")
    summary["written"] = [str(p) for p in written]
    return summary
