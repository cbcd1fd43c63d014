"""The simulator's clock inside a round: when the next job finishes, and advancing the live
components to a time while crediting their jobs.

Two copies of the step counters and job counters exist: the objects (components and JobStates)
and the arrays (the component set ``sim._cset`` and the running jobs ``sim._rjobs``).
``sim._current`` says which is current: ``"both"`` (at a round's end), ``"arrays"`` (after a
vectorised advance) or ``"objects"`` (after a scalar one). A round with few live components
advances them one by one on the objects; one with many (``Simulator.VECTOR_MIN_COMPONENTS``) in
one vectorised pass on the arrays. Both give the same numbers (tests/sim/test_perf.py). Formulas:
docs/simulator.md.
"""
from __future__ import annotations

import math
import operator

import numpy as np

from .engine import Component

_BY_SEQ = operator.attrgetter("seq")


def add_to_round_log(per_job: dict, job_id: int, run_s: float, steps: int, gain: float, nbytes: float) -> None:
    """Add one advance to a job's round-log sums [run seconds, steps, progress gained, bytes]."""
    r = per_job.get(job_id)
    if r is None:
        per_job[job_id] = [run_s, steps, gain, nbytes]
    else:
        r[0] += run_s
        r[1] += steps
        r[2] += gain
        r[3] += nbytes


def finish_time(sim, comp: Component, now: float) -> tuple[float, list[int]]:
    """Earliest absolute time a member finishes, and who finishes then. Cached on the
    component: advancing it does not move that time, and any change rebuilds the component."""
    if comp.finish is not None:
        return comp.finish
    st = sim.state
    best, who = float("inf"), []
    for i, m in enumerate(comp.members):
        j = st.jobs[m.job_id]
        # steps already taken in this component have been credited to j.progress
        steps = math.ceil(j.remaining / m.profile.eta - 1e-9)  # as int(np.ceil(...))
        # steps == 0: an earlier advance already completed the last step (Component.steps_within
        # counts a step that ends within its relative tolerance after the round end): finish now
        t = now + comp.time_to_steps(steps, now) if steps > 0 else now
        if t < best - 1e-9:
            best, who = t, [m.job_id]
        elif abs(t - best) <= 1e-9:
            who.append(m.job_id)
    comp.finish = (best, who)
    return best, who


def next_completion(sim, now: float, t_end: float) -> tuple[float, list[int]]:
    """The next completion before ``t_end`` (or ``t_end``) and the jobs finishing then: the
    earliest cached finish time across components, ties within 1e-9 s. Only components whose
    finish is near or before ``t_end`` can matter; they are scanned in the components' order,
    exactly as a scan over all of them would go."""
    cset = sim._cset
    for comp in sim._need_finish:
        if comp.slot >= 0:
            cset.fin[comp.slot] = finish_time(sim, comp, now)[0]
    sim._need_finish.clear()
    t_next, who_all = t_end, []
    comps = live_comps(sim)
    if not comps:
        return t_next, who_all
    if len(comps) < sim.VECTOR_MIN_FINISH:
        lim = t_end + 2e-9
        for comp in comps:  # the same scan one by one (fewer numpy calls)
            t_fin, who = comp.finish
            if t_fin <= lim:
                if t_fin < t_next - 1e-9:
                    t_next, who_all = t_fin, list(who)
                elif abs(t_fin - t_next) <= 1e-9:
                    who_all.extend(who)
        return t_next, who_all
    # every slot's cached finish (a free slot's is +inf): the few components near or before
    # t_end, put back in the components' order
    near = np.flatnonzero(cset.fin <= t_end + 2e-9).tolist()
    near = list(map(cset.comps.__getitem__, near))
    if len(near) > 1:
        near.sort(key=_BY_SEQ)
    for comp in near:
        t_fin, who = comp.finish
        if t_fin < t_next - 1e-9:
            t_next, who_all = t_fin, list(who)
        elif abs(t_fin - t_next) <= 1e-9:
            who_all.extend(who)
    return t_next, who_all


def live_order(sim) -> tuple:
    """Index arrays over the live components in their dict order (cached until one forms or
    dissolves): component slots, the components, job rows, each row's position among the
    components, the GPUs each component is charged for (``Component.alloc_gpus``) and its
    formation time (s)."""
    if sim._order is None:
        comps = live_comps(sim)
        slots = np.array([c.slot for c in comps], dtype=np.int64)
        rows: list[int] = []
        ext = rows.extend
        for c in comps:
            ext(c.rows)
        pos = np.repeat(np.arange(len(comps)), [len(c.rows) for c in comps])
        sim._order = (slots, comps, np.array(rows, dtype=np.int64), pos,
                       np.array([c.alloc_gpus for c in comps], dtype=np.float64),
                       np.array([c.formed_s for c in comps], dtype=np.float64))
    return sim._order


def live_comps(sim) -> list:
    """The live components in their dict order (cached until one forms or dissolves)."""
    if sim._comps_list is None:
        sim._comps_list = list(sim._components.values())
    return sim._comps_list


def use_arrays(sim) -> None:
    """Make the arrays current (load what the scalar path advanced since)."""
    cset, rj = sim._cset, sim._rjobs
    cset.materialize()
    rj.materialize()
    if sim._current == "objects":
        for comp in sim._components.values():
            cset.load(comp)
        rj.load()
    sim._current = "arrays"


def use_objects(sim) -> None:
    """Make the objects current (write back what the vectorised path advanced since)."""
    if sim._current == "arrays":
        sim._rjobs.write_back()
        sim._cset.sync()
    sim._current = "objects"


def end_round(sim) -> None:
    """At the round's end the objects are current, for whoever reads the state next."""
    if sim._current == "arrays":
        sim._rjobs.write_back()
        sim._cset.sync()
        sim._current = "both"


def advance_components(sim, t: float, base_s: float, acc: dict, some: list | None = None) -> None:
    """Advance live components to time ``t`` (s) and credit their jobs: every live one, or
    only those of ``some``. Each component is advanced from its own clock: its formation
    time, or ``base_s`` (when every live component was last advanced together: the round's
    start, or the end of the measured window) if that is later. Components are independent
    between a round's decisions (a completion changes only its own component, rebuilt then),
    so the round advances only the finishing ones at a completion and all of them at its end.

    Each job gains ``steps x eta`` full-backprop-equivalent iterations capped at what it still
    needs, ``steps`` raw iterations, the component's run seconds, and ``dt x GPUs``
    GPU-seconds held. Sums go into ``acc`` (busy, useful and allocated GPU-seconds) in the
    components' order, one by one, as a scalar loop would add them."""
    comps = live_comps(sim)
    if not comps:
        return
    if len(comps) < sim.VECTOR_MIN_COMPONENTS:
        use_objects(sim)
        advance_scalar(sim, comps if some is None else some, t, base_s, acc)
        return
    use_arrays(sim)
    if some is not None:
        advance_from_arrays(sim, some, t, base_s, acc)
        return
    slots, comps, rows, pos, ngpu, formed = live_order(sim)
    if sim._gathered is None:
        sim._gathered = sim._cset.gather(slots)
    now = np.maximum(formed, base_s)
    dt = t - now
    steps, run, busy = sim._cset.advance(sim._gathered, now, dt)
    rj = sim._rjobs
    msteps = steps[pos]
    gain = msteps * rj.eta[rows]
    progress = rj.progress[rows]
    rem = rj.iterations[rows] - progress
    gain = np.where(gain > rem, np.where(rem > 0.0, rem, 0.0), gain)
    rj.progress[rows] = progress + gain
    rj.iteration[rows] += msteps
    mrun = run[pos]
    rj.run_s[rows] += mrun
    ng = rj.ngpus[rows]
    rj.attained[rows] += dt[pos] * ng
    useful_sum = sum((gain * rj.iso[rows] * ng).tolist())
    if sim.config.log_rounds:
        log_jobs(sim, acc["jobs"], comps, steps, mrun, msteps, gain)
    acc["busy"] += sum(busy.tolist())
    acc["useful"] += useful_sum
    acc["alloc"] += sum((dt * ngpu).tolist())


def advance_from_arrays(sim, comps: list, t: float, base_s: float, acc: dict) -> None:
    """:func:`advance_scalar` for a few components while the arrays are current (a
    completion's components): their slots and job rows are copied to the objects, advanced
    there, and copied back; a few scalar reads and writes instead of the vectorised path's
    per-call cost, with the same arithmetic (tests/sim/test_perf.py holds the two paths equal)."""
    cset, rj = sim._cset, sim._rjobs
    rows = [r for c in comps for r in c.rows]
    rj.write_back(rows)
    for c in comps:
        c.k, c.partial = int(cset.k[c.slot]), float(cset.partial[c.slot])
    advance_scalar(sim, comps, t, base_s, acc)
    for c in comps:
        cset.load(c)
    rj.load(rows)


def advance_scalar(sim, comps: list, t: float, base_s: float, acc: dict) -> None:
    """:func:`advance_components` one component and one job at a time, on the objects (the
    same formulas and summation order; faster for a few components)."""
    jobs = sim.state.jobs
    log = sim.config.log_rounds
    per_job = acc["jobs"]
    busy_sum = useful_sum = alloc_sum = 0.0
    for comp in comps:
        now = comp.formed_s if comp.formed_s > base_s else base_s
        dt = t - now
        steps, run_s, busy, bytes_ = comp.advance_totals(now, dt)
        busy_sum += busy
        alloc_sum += dt * comp.alloc_gpus
        for m, by in zip(comp.members, bytes_):
            j = jobs[m.job_id]
            rem = j.iterations - j.progress
            gain = steps * m.profile.eta
            if gain > rem:
                gain = rem if rem > 0.0 else 0.0
            j.progress += gain
            j.iteration += steps
            j.run_s += run_s
            j.attained_gpu_s += dt * j.num_gpus
            useful_sum += gain * m.iso_s * j.num_gpus
            if log:
                add_to_round_log(per_job, m.job_id, run_s, steps, gain, by)
    acc["busy"] += busy_sum
    acc["useful"] += useful_sum
    acc["alloc"] += alloc_sum


def log_jobs(sim, per_job: dict, comps: list, steps: np.ndarray, mrun: np.ndarray, msteps: np.ndarray,
              gain: np.ndarray) -> None:
    """Add this advance to the round log's per-job sums: run seconds, steps, progress gained,
    bytes on the wire (the component's per-member cumulative bytes over the steps taken)."""
    i = 0
    ks = sim._cset.k
    for comp, dk in zip(comps, steps.tolist()):
        k1 = int(ks[comp.slot])
        k0 = k1 - dk
        H = comp.H
        q0, r0 = divmod(k0, H)
        q1, r1 = divmod(k1, H)
        for m, cb in zip(comp.members, comp._cum_bytes_l):
            by = (q1 - q0) * cb[-1] + cb[r1] - cb[r0]
            add_to_round_log(per_job, m.job_id, float(mrun[i]), int(msteps[i]), float(gain[i]), by)
            i += 1
