"""The simulator's live co-location components: forming and dissolving them as jobs start, stop,
move and finish, and the running jobs' counters kept beside them.

A component is a set of running jobs connected by shared GPUs (:class:`jigsaw_env.engine.Component`;
under the free pace a group of co-located jobs is a component per job, formed together).
:class:`LiveComponents` holds a simulator's live components, the job and GPU maps onto them, the
groups of jobs that share GPUs, the components' step state as arrays (:class:`ComponentSet`) and
their jobs' counters as arrays (:class:`RunningJobs`). :mod:`jigsaw_env.sim_advance` advances
them. Formulas: docs/simulator.md, docs/colocation.md.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .declared import seal_declared_classes
from .engine import Component, ComponentSet, Member
from .free_running import FreeRunner, free_running
from .interference import SharingModel
from .placement import connected_groups
from .state import ClusterState, CostModel, JobState, JobStatus


class RunningJobs:
    """The running jobs' progress counters in arrays, one row per job in a live component, so a
    round credits every job at once (the per-job formulas of :func:`jigsaw_env.sim_advance.advance_components`,
    element by element). While a job has a row, the row is the truth once the simulator has made
    the arrays current; :meth:`write_back` copies it to the :class:`JobState` (the simulator does
    it at the end of every round and when the job's component dissolves). Units: iterations,
    seconds, GPU-seconds.

    Rows are filled lazily: :meth:`add` only reserves the row, and the row's values are copied
    from the job (and its member) by :meth:`materialize`, which every method reading the arrays
    calls first (the simulator calls it before a vectorised advance). Until then the job object
    is the truth, so a row that comes and goes while the simulator advances the objects (few
    components: the scalar path) costs no array writes."""

    _FIELDS = ("progress", "iterations", "eta", "iso", "ngpus", "run_s", "attained", "comp")

    def __init__(self, capacity: int = 64):
        self._cap = 0
        self._free: list[int] = []
        self.jobs: dict[int, JobState] = {}  # row -> job
        self._pending: dict[int, tuple] = {}  # row -> (job, member, component slot), not filled yet
        self._grow(capacity)

    def _grow(self, cap: int) -> None:
        old = self._cap
        for name in self._FIELDS + ("iteration",):
            new = np.zeros(cap, dtype=np.int64 if name in ("iteration", "comp") else np.float64)
            if old:
                new[:old] = getattr(self, name)
            setattr(self, name, new)
        self._free.extend(range(cap - 1, old - 1, -1))
        self._cap = cap

    def add(self, job: JobState, m: Member, comp_slot: int) -> int:
        """A row for ``job`` (member ``m`` of the component in ``comp_slot``), filled from the job
        when the arrays are next read (:meth:`materialize`)."""
        if not self._free:
            self._grow(2 * self._cap)
        row = self._free.pop()
        self.jobs[row] = job
        self._pending[row] = (job, m, comp_slot)
        m.slot = row
        return row

    def materialize(self) -> None:
        """Fill the rows added since the last call from their jobs (the jobs are their truth)."""
        if not self._pending:
            return
        rows = np.array(list(self._pending), dtype=np.intp)  # (converted once for the nine writes)
        vals = list(self._pending.values())
        self.progress[rows] = [j.progress for j, _, _ in vals]
        self.iterations[rows] = [j.iterations for j, _, _ in vals]
        self.eta[rows] = [m.profile.eta for _, m, _ in vals]
        self.iso[rows] = [m.iso_s for _, m, _ in vals]
        self.ngpus[rows] = [j.num_gpus for j, _, _ in vals]
        self.run_s[rows] = [j.run_s for j, _, _ in vals]
        self.attained[rows] = [j.attained_gpu_s for j, _, _ in vals]
        self.iteration[rows] = [j.iteration for j, _, _ in vals]
        self.comp[rows] = [c for _, _, c in vals]
        self._pending.clear()

    def write_back(self, rows=None) -> None:
        """Copy rows (default: all) to their jobs' progress, iteration, run_s, attained_gpu_s
        (rows not filled yet are skipped: their jobs are current)."""
        if rows is None:
            rows = list(self.jobs)
        pend = self._pending
        if pend:
            rows = [r for r in rows if r not in pend]
        elif not isinstance(rows, list):
            rows = list(rows)
        if not rows:
            return
        idx = np.array(rows, dtype=np.intp)  # (converted once for the four gathers)
        for j, p, it, r, a in zip(map(self.jobs.__getitem__, rows), self.progress[idx].tolist(),
                                  self.iteration[idx].tolist(), self.run_s[idx].tolist(), self.attained[idx].tolist()):
            j.progress, j.iteration, j.run_s, j.attained_gpu_s = p, it, r, a

    def load(self, rows=None) -> None:
        """Refresh rows (default: all) from their jobs (after the scalar path credited them)."""
        self.materialize()
        rows = list(self.jobs) if rows is None else list(rows)
        for row in rows:
            j = self.jobs[row]
            self.progress[row], self.iteration[row] = j.progress, j.iteration
            self.run_s[row], self.attained[row] = j.run_s, j.attained_gpu_s

    def remove(self, row: int, write_back: bool = True) -> None:
        """Free a row, first writing it back to its job (unless the job is the more recent, or
        the row was never filled)."""
        if self._pending.pop(row, None) is None and write_back:
            j = self.jobs[row]
            j.progress, j.iteration = float(self.progress[row]), int(self.iteration[row])
            j.run_s, j.attained_gpu_s = float(self.run_s[row]), float(self.attained[row])
        del self.jobs[row]
        self._free.append(row)



class LiveComponents:
    """A simulator's live co-location components and what is kept beside them (times in seconds,
    busy time in GPU-seconds).

    ``components``: key -> live component, in the order they formed (the components' order);
    ``of_job`` and ``of_gpu``: job id and GPU -> the live component it is in or that uses it;
    ``shared``: key -> job ids of the live components of two or more jobs, grouped as the sharing
    connects them (:attr:`ClusterState.shared_ref`); ``num_gpus_held``: GPUs the live components
    hold; ``cset`` and ``rjobs``: their step state and their jobs' counters as arrays;
    ``current``: which copy of those counters is current (:mod:`jigsaw_env.sim_advance`);
    ``need_finish``: components whose next completion is not computed yet; ``formed``:
    components formed so far (each one's ``seq``); ``busy_flushed``: busy seconds per GPU of the
    components already dissolved (Python floats). ``vector_min_components`` and
    ``vector_min_finish``: from this many live components on, a round advances them, and looks
    for the next completion, in one vectorised pass on the arrays (fewer go one by one: numpy's
    per-call overhead dominates)."""

    VECTOR_MIN_COMPONENTS = 12
    VECTOR_MIN_FINISH = 48

    def __init__(self, state: ClusterState, costs: CostModel, sharing: SharingModel, *, free_pace: bool,
                 lockstep_s: float, log_rounds: bool):
        self.state = state
        self.costs = costs
        self.sharing = sharing
        self.free_pace = free_pace
        self.lockstep_s = lockstep_s
        self.log_rounds = log_rounds
        # shared step tables of components (engine.Component), kept by the cost model whose
        # profiles they are computed from: they stay valid for as long as it lives (None: none shared)
        self.tables: dict | None = costs.step_tables
        self.components: dict[tuple, Component] = {}
        self.of_job: dict[int, Component] = {}
        self.of_gpu: dict[int, Component] = {}
        self.shared: dict[tuple, tuple[int, ...]] = {}
        self.num_gpus_held = 0
        self.cset = ComponentSet()
        self.rjobs = RunningJobs()
        self.current = "both"
        self.need_finish: list[Component] = []
        self.formed = 0
        self.busy_flushed = [0.0] * state.cluster.num_gpus
        self.vector_min_components = self.VECTOR_MIN_COMPONENTS
        self.vector_min_finish = self.VECTOR_MIN_FINISH
        self._order = None       # order_arrays(), until a component forms or dissolves
        self._comps_list = None  # in_order(), likewise
        self._gathered = None    # gathered(), likewise

    # ----- the live components in their order
    def in_order(self) -> list:
        """The live components in their order (cached until one forms or dissolves)."""
        if self._comps_list is None:
            self._comps_list = list(self.components.values())
        return self._comps_list

    def order_arrays(self) -> tuple:
        """Index arrays over the live components in their order (cached until one forms or
        dissolves): component slots, the components, job rows, each row's position among the
        components, the GPUs each component is charged for (``Component.alloc_gpus``) and its
        formation time (s)."""
        if self._order is None:
            comps = self.in_order()
            slots = np.array([c.slot for c in comps], dtype=np.int64)
            rows: list[int] = []
            ext = rows.extend
            for c in comps:
                ext(c.rows)
            pos = np.repeat(np.arange(len(comps)), [len(c.rows) for c in comps])
            self._order = (slots, comps, np.array(rows, dtype=np.int64), pos,
                           np.array([c.alloc_gpus for c in comps], dtype=np.float64),
                           np.array([c.formed_s for c in comps], dtype=np.float64))
        return self._order

    def gathered(self) -> tuple:
        """The component set's constants in the components' order (``ComponentSet.gather``;
        cached until a component forms or dissolves)."""
        if self._gathered is None:
            self._gathered = self.cset.gather(self.order_arrays()[0])
        return self._gathered

    def _changed(self) -> None:
        self._order = self._comps_list = self._gathered = None

    def busy_per_gpu(self) -> np.ndarray:
        """(G,) compute seconds per GPU so far: the dissolved components' and the live ones'."""
        out = np.array(self.busy_flushed, dtype=np.float64)
        for comp in self.components.values():
            out[comp.gpu_list] += comp.busy_vector()
        return out

    def member_row(self, jid: int) -> int:
        """The running-job row of job ``jid`` (a member of a live component)."""
        for m in self.of_job[jid].members:
            if m.job_id == jid:
                return m.slot
        raise KeyError(jid)

    def components_of(self, job_ids: list[int]) -> list:
        """The live components of ``job_ids``, with the free pace's siblings (formed together)."""
        of_job = self.of_job
        some = []
        for jid in job_ids:
            comp = of_job[jid]
            for c in ((comp,) if comp.group is None else comp.group):
                if c not in some:
                    some.append(c)
        return some

    # ----- forming and dissolving
    def dissolve(self, comp: Component) -> Component:
        """Take a live component out: its step state and its jobs' counters go back to the
        objects, and its per-GPU busy seconds are added to the dissolved total (Python floats:
        the same additions as ``flushed[comp.gpus] += comp.busy_vector()``)."""
        del self.components[comp.key]
        if len(comp.members) > 1:
            del self.shared[comp.key]
        elif comp.group is not None:
            self.shared.pop(comp.group_key, None)
        from_arrays = self.current != "objects"
        self.cset.remove(comp, write_back=from_arrays)
        bf = self.busy_flushed
        for g, v in zip(comp.gpu_list, comp.busy_list()):
            bf[g] += v
        rj = self.rjobs
        for m in comp.members:
            rj.remove(m.slot, write_back=from_arrays)
            m.slot = -1
        gc = self.of_gpu
        for g in comp.gpu_list:
            if gc.get(g) is comp:
                del gc[g]
                self.num_gpus_held -= 1
        self._changed()
        return comp

    def dissolve_group(self, comp: Component) -> tuple:
        """Dissolve ``comp`` and, under the free pace, the components of the jobs it shares GPUs
        with (formed together: their times depend on each other); returns them."""
        group = (comp,) if comp.group is None else comp.group
        for c in group:
            if c.slot >= 0:
                self.dissolve(c)
        return group

    def form(self, key: tuple, comp: Component) -> None:
        """Put a new component in: a slot in the component set, a row per job, its GPUs."""
        comp.key = key
        comp.seq = self.formed  # (a dict appends: increasing seq is the components' order)
        self.formed += 1
        self.components[key] = comp
        if len(comp.members) > 1:
            self.shared[key] = tuple([m.job_id for m in comp.members])
        slot = self.cset.add(comp)
        jobs = self.state.jobs
        rj = self.rjobs
        of_job = self.of_job
        for m in comp.members:
            rj.add(jobs[m.job_id], m, slot)
            of_job[m.job_id] = comp
        comp.rows = [m.slot for m in comp.members]
        gc = self.of_gpu
        for g in comp.gpu_list:
            if g not in gc:
                self.num_gpus_held += 1
            gc[g] = comp
        self.need_finish.append(comp)
        self._changed()

    def rebuild(self, changed: set[int], at_s: float | None = None) -> None:
        """Recompute the co-location components touched by ``changed`` jobs, formed at ``at_s``
        (s; default the state's time, the round's start). (A live component holds a slot in the
        component set: ``comp.slot >= 0``.)"""
        if not changed:
            return
        jobs = self.state.jobs
        running = [j for j in self._dissolve_touched(changed) if jobs[j].status is JobStatus.RUNNING]
        if not running:
            return
        groups = [running] if len(running) == 1 else connected_groups({jid: jobs[jid].placement for jid in running})
        formed_s = self.state.time_s if at_s is None else at_s
        for jids in groups:
            self._form_group(jids, formed_s)

    def _dissolve_touched(self, changed: set[int]) -> set[int]:
        """Dissolve the components that lose or gain members, and those that share GPUs with
        their running jobs, transitively; returns the jobs to regroup (out of ``of_job``)."""
        jobs = self.state.jobs
        of_job = self.of_job
        RUNNING = JobStatus.RUNNING
        dirty = set(changed)
        for jid in changed:
            comp = of_job.get(jid)
            if comp is not None and comp.slot >= 0:
                for c in self.dissolve_group(comp):
                    dirty.update(m.job_id for m in c.members)
        # GPUs of dirty running jobs may touch clean components: dissolve those too
        gpu_owner = self.of_gpu
        frontier = [j for j in dirty if jobs[j].status is RUNNING]
        while frontier:
            jid = frontier.pop()
            for g in jobs[jid].placement:
                comp = gpu_owner.get(g)
                if comp is not None and comp.slot >= 0:
                    for c in self.dissolve_group(comp):
                        for m in c.members:
                            if m.job_id not in dirty:
                                dirty.add(m.job_id)
                                frontier.append(m.job_id)
        for jid in dirty:
            of_job.pop(jid, None)
        return dirty

    def _form_group(self, jids: list[int], formed_s: float) -> None:
        """Form the component(s) of running jobs ``jids`` that share GPUs (one connected group)."""
        st = self.state
        jobs = st.jobs
        costs = self.costs
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
        if self.free_pace and len(members) > 1:
            self.form_free_group(tuple(key), members, formed_s)
        else:
            self.form(tuple(key), Component(members, ready, self.tables, self.lockstep_s, formed_s, self.sharing))

    def form_free_group(self, key: tuple, members: list[Member], formed_s: float) -> None:
        """Under the free pace, a component per job of a group that shares GPUs, each stepping
        with the times it takes beside the others (eqs. F1-F4, :mod:`jigsaw_env.free_running`)."""
        fr = self.free_running_of(members)
        per_gpu: dict[int, int] = {}
        for m in members:
            for g in set(m.gpus):
                per_gpu[g] = per_gpu.get(g, 0) + 1
        jobs = self.state.jobs
        now = self.state.time_s
        comps = []
        for m, prof, rate, entry in zip(members, fr.profiles, fr.busy_rate, key):
            ready = max(now, jobs[m.job_id].restart_until_s)
            comp = Component([Member(m.job_id, prof, m.gpus, m.iteration0, m.iso_s)], ready, self.tables, 0.0,
                             formed_s, None)
            comp.alloc_gpus = sum(1.0 / per_gpu[g] for g in comp.gpu_list)
            comp.set_busy_rate(rate)
            comps.append((entry, comp))
        group = tuple(c for _, c in comps)
        for entry, comp in comps:
            comp.group, comp.group_key = group, key
            self.form((entry,), comp)
        self.shared[key] = tuple([m.job_id for m in members])

    def free_running_of(self, members: list[Member]):
        """:func:`free_running` of ``members``, kept by the cost model: the result depends on the
        members' profiles and on which of the group's GPUs (their types and nodes) each uses,
        not on where the group sits or on the jobs' phases."""
        sharing = self.sharing
        gpus = sorted({g for m in members for g in m.gpus})
        col = {g: i for i, g in enumerate(gpus)}
        key = (sharing.mode, tuple((id(m.profile), tuple(col[g] for g in m.gpus)) for m in members),
               tuple(sharing.gpu_type_of(g) for g in gpus), sharing.node_signature(gpus))
        cache = self.costs.free_running
        hit = cache.get(key)
        if hit is not None and all(p is m.profile for p, m in zip(hit.profiles, members)):
            return hit.result
        fr = free_running([FreeRunner(m.profile, m.gpus) for m in members], sharing)
        if len(cache) > 50_000:
            cache.clear()
        cache[key] = _FreeRunningEntry(tuple(m.profile for m in members), fr)
        return fr


class _FreeRunningEntry(NamedTuple):
    """A cached :func:`free_running` result and the profiles it was computed for (kept so that
    the profile ids in its key stay theirs)."""

    profiles: tuple
    result: object


seal_declared_classes(globals())  # the classes sim_components.pxd declares behave as compiled (jigsaw_env/declared.py)
