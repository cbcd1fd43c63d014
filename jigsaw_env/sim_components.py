"""The simulator's co-location components: forming and dissolving them as jobs start, stop, move
and finish.

A component is a set of running jobs connected by shared GPUs (:class:`jigsaw_env.engine.Component`;
under the free pace a group of co-located jobs is a component per job, formed together). These
functions keep a :class:`~jigsaw_env.simulator.Simulator`'s live components (``sim._components``),
the job and GPU maps onto them (``sim._comp_of``, ``sim._gpu_comp``), the groups of jobs that share
GPUs (``sim._shared``), their slots in the component set (``sim._cset``) and their jobs' rows among
the running jobs (``sim._rjobs``). Formulas: docs/simulator.md, docs/colocation.md.
"""
from __future__ import annotations

from typing import NamedTuple

from .engine import Component, Member
from .free_running import FreeRunner, free_running
from .placement import connected_groups
from .state import JobStatus


def flush_busy(sim, comp: Component) -> None:
    """Add a dissolving component's per-GPU busy seconds to the dissolved total (Python
    floats: the same additions as ``flushed[comp.gpus] += comp.busy_vector()``)."""
    bf = sim._busy_flushed
    for g, v in zip(comp.gpu_list, comp.busy_list()):
        bf[g] += v


def dissolve(sim, comp: Component) -> Component:
    """Take a live component out: its step state and its jobs' counters go back to the
    objects, and its per-GPU busy seconds are added to the dissolved total."""
    del sim._components[comp.key]
    if len(comp.members) > 1:
        del sim._shared[comp.key]
    elif comp.group is not None:
        sim._shared.pop(comp.group_key, None)
    from_arrays = sim._current != "objects"
    sim._cset.remove(comp, write_back=from_arrays)
    gpus = comp.gpu_list
    flush_busy(sim, comp)
    rj = sim._rjobs
    for m in comp.members:
        rj.remove(m.slot, write_back=from_arrays)
        m.slot = -1
    gc = sim._gpu_comp
    for g in gpus:
        if gc.get(g) is comp:
            del gc[g]
            sim._n_live_gpus -= 1
    sim._order = sim._gathered = sim._comps_list = None
    return comp


def dissolve_group(sim, comp: Component) -> tuple:
    """Dissolve ``comp`` and, under the free pace, the components of the jobs it shares GPUs
    with (formed together: their times depend on each other); returns them."""
    group = (comp,) if comp.group is None else comp.group
    for c in group:
        if c.slot >= 0:
            dissolve(sim, c)
    return group


def form(sim, key: tuple, comp: Component) -> None:
    """Put a new component in: a slot in the component set, a row per job, its GPUs."""
    comp.key = key
    comp.seq = sim._formed  # (a dict appends: increasing seq is the components' order)
    sim._formed += 1
    sim._components[key] = comp
    if len(comp.members) > 1:
        sim._shared[key] = tuple([m.job_id for m in comp.members])
    slot = sim._cset.add(comp)
    jobs = sim.state.jobs
    rj = sim._rjobs
    comp_of = sim._comp_of
    for m in comp.members:
        rj.add(jobs[m.job_id], m, slot)
        comp_of[m.job_id] = comp
    comp.rows = [m.slot for m in comp.members]
    gc = sim._gpu_comp
    for g in comp.gpu_list:
        if g not in gc:
            sim._n_live_gpus += 1
        gc[g] = comp
    sim._need_finish.append(comp)
    sim._order = sim._gathered = sim._comps_list = None


def rebuild(sim, changed: set[int], at_s: float | None = None) -> None:
    """Recompute the co-location components touched by ``changed`` jobs, formed at ``at_s``
    (s; default the state's time, the round's start). (A live component holds a slot in the
    component set: ``comp.slot >= 0``.)"""
    if not changed:
        return
    st = sim.state
    jobs = st.jobs
    comp_of = sim._comp_of
    RUNNING = JobStatus.RUNNING
    # components that lose or gain members are dissolved; their surviving jobs are regrouped
    dirty = set(changed)
    for jid in changed:
        comp = comp_of.get(jid)
        if comp is not None and comp.slot >= 0:
            for c in dissolve_group(sim, comp):
                dirty.update(m.job_id for m in c.members)
    # GPUs of dirty running jobs may touch clean components: dissolve those too
    gpu_owner = sim._gpu_comp
    frontier = [j for j in dirty if jobs[j].status is RUNNING]
    while frontier:
        jid = frontier.pop()
        for g in jobs[jid].placement:
            comp = gpu_owner.get(g)
            if comp is not None and comp.slot >= 0:
                for c in dissolve_group(sim, comp):
                    for m in c.members:
                        if m.job_id not in dirty:
                            dirty.add(m.job_id)
                            frontier.append(m.job_id)
    for jid in dirty:
        comp_of.pop(jid, None)
    running = [j for j in dirty if jobs[j].status is RUNNING]
    if not running:
        return
    groups = [running] if len(running) == 1 else connected_groups({jid: jobs[jid].placement for jid in running})
    costs = sim.costs
    formed_s = st.time_s if at_s is None else at_s
    free = sim.config.pace == "free"
    for jids in groups:
        members = []
        key = []
        ready = st.time_s
        for jid in jids:
            j = jobs[jid]
            pl = j.placement
            members.append(Member(jid, costs.profile(j, j.level, j.pattern, pl), pl, j.iteration,
                                  costs.isolated_iteration_s(j)))
            key.append((jid, pl, j.level, j.pattern.value))
            if j.restart_until_s > ready:
                ready = j.restart_until_s
        if free and len(members) > 1:
            form_free_group(sim, tuple(key), members, formed_s)
        else:
            form(sim, tuple(key), Component(members, ready, sim._tables,
                                             sim.config.lockstep_s, formed_s, sim._sharing))


def form_free_group(sim, key: tuple, members: list[Member], formed_s: float) -> None:
    """Under the free pace, a component per job of a group that shares GPUs, each stepping
    with the times it takes beside the others (eqs. F1-F4, :mod:`jigsaw_env.free_running`)."""
    fr = free_running_of(sim, members)
    per_gpu: dict[int, int] = {}
    for m in members:
        for g in set(m.gpus):
            per_gpu[g] = per_gpu.get(g, 0) + 1
    jobs = sim.state.jobs
    cache = sim._tables
    comps = []
    for m, prof, rate, entry in zip(members, fr.profiles, fr.busy_rate, key):
        ready = max(sim.state.time_s, jobs[m.job_id].restart_until_s)
        comp = Component([Member(m.job_id, prof, m.gpus, m.iteration0, m.iso_s)], ready, cache, 0.0, formed_s, None)
        comp.alloc_gpus = sum(1.0 / per_gpu[g] for g in comp.gpu_list)
        comp.set_busy_rate(rate)
        comps.append((entry, comp))
    group = tuple(c for _, c in comps)
    for entry, comp in comps:
        comp.group, comp.group_key = group, key
        form(sim, (entry,), comp)
    sim._shared[key] = tuple([m.job_id for m in members])


class _FreeRunningEntry(NamedTuple):
    """A cached :func:`free_running` result and the profiles it was computed for (kept so that
    the profile ids in its key stay theirs)."""

    profiles: tuple
    result: object


def free_running_of(sim, members: list[Member]):
    """:func:`free_running` of ``members``, kept with the step tables: the result depends on
    the members' profiles and on which of the group's GPUs (their types and nodes) each uses,
    not on where the group sits or on the jobs' phases."""
    sharing = sim._sharing
    gpus = sorted({g for m in members for g in m.gpus})
    col = {g: i for i, g in enumerate(gpus)}
    key = (sharing.mode, tuple((id(m.profile), tuple(col[g] for g in m.gpus)) for m in members),
           tuple(sharing.gpu_type_of(g) for g in gpus), sharing.node_signature(gpus))
    cache = sim.costs.free_running
    hit = cache.get(key)
    if hit is not None and all(p is m.profile for p, m in zip(hit.profiles, members)):
        return hit.result
    fr = free_running([FreeRunner(m.profile, m.gpus) for m in members], sharing)
    if len(cache) > 50_000:
        cache.clear()
    cache[key] = _FreeRunningEntry(tuple(m.profile for m in members), fr)
    return fr


def member_row(sim, jid: int) -> int:
    """The running-job row of job ``jid`` (a member of a live component)."""
    for m in sim._comp_of[jid].members:
        if m.job_id == jid:
            return m.slot
    raise KeyError(jid)


def components_of(sim, job_ids: list[int]) -> list:
    """The live components of ``job_ids``, with the free pace's siblings (formed together)."""
    comp_of = sim._comp_of
    some = []
    for jid in job_ids:
        comp = comp_of[jid]
        for c in ((comp,) if comp.group is None else comp.group):
            if c not in some:
                some.append(c)
    return some
