"""The simulator's clock inside a round: when the next job finishes, and advancing the live
components to a time while crediting their jobs.

Two copies of the step counters and job counters exist: the objects (components and JobStates)
and the arrays (the component set ``live.cset`` and the running jobs ``live.rjobs`` of a
:class:`~jigsaw_env.sim_components.LiveComponents`). ``live.current`` says which is current: ``"both"`` (at a round's end), ``"arrays"`` (after a
vectorised advance) or ``"objects"`` (after a scalar one). A round with few live components
advances them one by one on the objects; one with many (``live.vector_min_components``) in
one vectorised pass on the arrays. Both give the same numbers (tests/sim/test_perf.py). Formulas:
docs/simulator.md.
"""
from __future__ import annotations

import math
import operator

import numpy as np

from .engine import Component
from .sim_components import LiveComponents

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


def finish_time(live: LiveComponents, comp: Component, now: float) -> tuple[float, list[int]]:
    """Earliest absolute time a member finishes, and who finishes then. Cached on the
    component: advancing it does not move that time, and any change rebuilds the component."""
    if comp.finish is not None:
        return comp.finish
    st = live.state
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


def next_completion(live: LiveComponents, now: float, t_end: float) -> tuple[float, list[int]]:
    """The next completion before ``t_end`` (or ``t_end``) and the jobs finishing then: the
    earliest cached finish time across components, ties within 1e-9 s. Only components whose
    finish is near or before ``t_end`` can matter; they are scanned in the components' order,
    exactly as a scan over all of them would go."""
    cset = live.cset
    for comp in live.need_finish:
        if comp.slot >= 0:
            cset.fin[comp.slot] = finish_time(live, comp, now)[0]
    live.need_finish.clear()
    t_next, who_all = t_end, []
    comps = live.in_order()
    if not comps:
        return t_next, who_all
    if len(comps) < live.vector_min_finish:
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


def use_arrays(live: LiveComponents) -> None:
    """Make the arrays current (load what the scalar path advanced since)."""
    cset, rj = live.cset, live.rjobs
    cset.materialize()
    rj.materialize()
    if live.current == "objects":
        for comp in live.components.values():
            cset.load(comp)
        rj.load()
    live.current = "arrays"


def use_objects(live: LiveComponents) -> None:
    """Make the objects current (write back what the vectorised path advanced since)."""
    if live.current == "arrays":
        live.rjobs.write_back()
        live.cset.sync()
    live.current = "objects"


def end_round(live: LiveComponents) -> None:
    """At the round's end the objects are current, for whoever reads the state next."""
    if live.current == "arrays":
        live.rjobs.write_back()
        live.cset.sync()
        live.current = "both"


def advance_components(live: LiveComponents, t: float, base_s: float, acc: dict, some: list | None = None) -> None:
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
    comps = live.in_order()
    if not comps:
        return
    if len(comps) < live.vector_min_components:
        use_objects(live)
        advance_scalar(live, comps if some is None else some, t, base_s, acc)
        return
    use_arrays(live)
    if some is not None:
        advance_from_arrays(live, some, t, base_s, acc)
        return
    _, comps, rows, pos, ngpu, formed = live.order_arrays()
    now = np.maximum(formed, base_s)
    dt = t - now
    steps, run, busy = live.cset.advance(live.gathered(), now, dt)
    rj = live.rjobs
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
    if live.log_rounds:
        log_jobs(live, acc["jobs"], comps, steps, mrun, msteps, gain)
    acc["busy"] += sum(busy.tolist())
    acc["useful"] += useful_sum
    acc["alloc"] += sum((dt * ngpu).tolist())


def advance_from_arrays(live: LiveComponents, comps: list, t: float, base_s: float, acc: dict) -> None:
    """:func:`advance_scalar` for a few components while the arrays are current (a
    completion's components): their slots and job rows are copied to the objects, advanced
    there, and copied back; a few scalar reads and writes instead of the vectorised path's
    per-call cost, with the same arithmetic (tests/sim/test_perf.py holds the two paths equal)."""
    cset, rj = live.cset, live.rjobs
    rows = [r for c in comps for r in c.rows]
    rj.write_back(rows)
    for c in comps:
        c.k, c.partial = int(cset.k[c.slot]), float(cset.partial[c.slot])
    advance_scalar(live, comps, t, base_s, acc)
    for c in comps:
        cset.load(c)
    rj.load(rows)


def advance_scalar(live: LiveComponents, comps: list, t: float, base_s: float, acc: dict) -> None:
    """:func:`advance_components` one component and one job at a time, on the objects (the
    same formulas and summation order; faster for a few components)."""
    jobs = live.state.jobs
    log = live.log_rounds
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


def log_jobs(live: LiveComponents, per_job: dict, comps: list, steps: np.ndarray, mrun: np.ndarray, msteps: np.ndarray,
              gain: np.ndarray) -> None:
    """Add this advance to the round log's per-job sums: run seconds, steps, progress gained,
    bytes on the wire (the component's per-member cumulative bytes over the steps taken)."""
    i = 0
    ks = live.cset.k
    for comp, dk in zip(comps, steps.tolist()):
        k1 = int(ks[comp.slot])
        for m, by in zip(comp.members, comp.bytes_between(k1 - dk, k1)):
            add_to_round_log(per_job, m.job_id, float(mrun[i]), int(msteps[i]), float(gain[i]), by)
            i += 1
