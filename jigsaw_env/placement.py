"""GPU bookkeeping under a decision, feasibility checks, and the placement-option menu.

``GpuLedger`` tracks, for a decision being built, each GPU's memory in use (at each process's
peak), its workers, and the jobs on it. Heuristics, the environment's action masks and the
simulator's validation all check feasibility through it, so they agree by construction.

Placement options (the environment's finite menu; heuristics may also build placements by hand):
    keep          the job's current GPUs (running jobs only): change level/pattern without a restart
    consolidated  exclusive GPUs on the fewest nodes (best fit: fullest nodes that still fit first)
    spread        exclusive GPUs, one per node round-robin over the nodes with the most free GPUs
    packed        GPUs shared with other jobs' workers where memory and the per-GPU worker cap allow,
                  least-loaded occupied GPUs first, then free ones
    paired        the GPUs of one host: a job in the decision alone on its GPUs (each holds only its
                  worker) with at least as many GPUs. The guest's worker i goes on the host's GPU
                  of worker W-1-i (W the host's width): its full-depth worker beside the host's
                  lightest under static patterns (Jigsaw's "backward window", agents.common.
                  guest_orders). Of the hosts where the guest's largest worker fits each of those
                  GPUs: the narrowest first (the smallest lockstep group), then the one whose
                  isolated iteration time is closest to the guest's (in log ratio: the pair's
                  lockstep step wastes least), then the most attained GPU-seconds (Tiresias's
                  lowest priority, the hosts Jigsaw's fitting tries first), then the lowest id.
                  This is the pairing Jigsaw builds (docs/schedulers.md, jigsaw, rule 3: fitting); ``packed`` cannot
                  express it, since it spreads a guest over the least-loaded GPUs of several jobs.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from .declared import seal_declared_classes
from .spb import Pattern
from .state import ClusterState, Decision, JobDecision, JobState, trusted_decision

PLACEMENT_OPTIONS = ("keep", "consolidated", "spread", "packed", "paired")


def consolidated_from_counts(counts: list[int], free_on, n: int) -> list[int] | None:
    """``n`` GPUs on the fewest nodes -- the ledger's "consolidated" option, and the choice
    ``agents.common.consolidated_gpus`` makes on a mask -- from per-node counts of free GPUs
    (``counts``, a list, node order) and ``free_on(node)``, that node's free GPUs in ascending
    order: the fullest node that still fits ``n`` (the first on ties), else nodes by most free GPUs
    first (the lower node on ties); None when fewer than ``n`` are free. A caller that keeps the
    counts as its ledger changes (Jigsaw's exclusive pass) scans the nodes instead of reducing a
    mask of every GPU."""
    if sum(counts) < n:
        return None
    # the best fit is the first node holding the smallest count >= n: try n, n + 1, ... up to
    # the largest count, each a scan in C (a node holds at most its GPUs: a few values to try)
    for c in range(n, max(counts, default=-1) + 1):
        if c in counts:
            return free_on(counts.index(c))[:n]
    out: list[int] = []
    for k in sorted(range(len(counts)), key=counts.__getitem__, reverse=True):
        out.extend(free_on(k)[:n - len(out)])
        if len(out) == n:
            return out
    return None


class InfeasibleDecision(ValueError):
    """A decision that breaks a hard constraint (memory, worker cap, GPU count, unknown job)."""


class PeakEntry:
    """:meth:`GpuLedger.peak_list`'s memo entry: a job's worker peaks (bytes, Python floats) for
    the very decision and job objects they were computed for (attributes declared in
    placement.pxd)."""

    def __init__(self, decision: JobDecision, job: JobState, peaks: list[float]):
        self.decision, self.job, self.peaks = decision, job, peaks


class GpuLedger:
    """Per-GPU memory (bytes), worker count and owners under a (partial) decision.

    The per-GPU state lives in Python lists (``_ml``: bytes in use, ``_wl``: workers, ``_cl``:
    capacity), which every update writes and every scalar check reads. :attr:`mem` and
    :attr:`workers` are numpy arrays of the same values, made when first read and from then on
    written by every update as well: a ledger nobody reads as arrays (a heuristic's decision,
    the simulator's validation: hundreds of adds and checks a round) writes no numpy scalar,
    and one that is read (the environment's placement menu at many nodes) is not rebuilt.
    """

    # the simulator round whose in_force_ledger() handed this ledger out (Simulator.step may take
    # such a ledger back); None for every other ledger, copies included
    origin: object = None

    def __init__(self, state: ClusterState, decision: Decision | None = None, checked: bool = False,
                 peak_memo: dict | None = None):
        """``decision``: start from it; ``checked=True`` trusts it (e.g. the allocation in force,
        which the simulator validated when it was applied) and skips the feasibility checks.
        ``peak_memo``: a dict kept by the caller across ledgers for :meth:`peak_list`'s memo
        (its entries answer only for the job and decision objects they were made for)."""
        self.state = state
        cl = state.cluster
        self.capacity = cl.memory_array()
        G = self.capacity.shape[0]
        # per GPU: bytes in use, workers, capacity (Python lists: numpy scalar indexing is slow)
        self._ml = [0.0] * G
        self._wl = [0] * G
        self._cl = self.capacity.tolist()
        # peak_list's memo (job id -> PeakEntry), shared with copies
        self._pk: dict = {} if peak_memo is None else peak_memo
        # GPUs by worker count: _wc[w] = _wl.count(w), kept by every update (O(1) counts)
        self._wc = [G, 0, 0]
        # mem and workers as numpy arrays once read (None before), and their read-only views
        self._mem = self._workers = self._views_ro = None
        self.decision = Decision()
        if decision:
            for jid, jd in decision.items():
                self.add(jid, jd, checked=checked)

    def copy(self, decision: Decision | None = None) -> "GpuLedger":
        """An independent copy; ``decision``: the same jobs in another order (default: a copy of
        this ledger's decision, in its order). A subclass's ledger copies to its class."""
        cls = self.__class__
        new = cls.__new__(cls)
        new.state = self.state
        new.capacity = self.capacity
        new._views_ro = None
        if self._mem is None:
            new._mem = new._workers = None
        else:
            new._mem, new._workers = self._mem.copy(), self._workers.copy()
        new._ml = self._ml.copy()
        new._wl = self._wl.copy()
        new._cl = self._cl
        new._pk = self._pk
        new._wc = self._wc.copy()
        new.decision = Decision(self.decision) if decision is None else decision
        return new

    #: what a copy or a pickle keeps (every attribute but the views; tests/sim/test_accel.py checks
    #: that a ledger has no other): listed, since the compiled build keeps them out of __dict__
    _STATE = ("state", "capacity", "decision", "_ml", "_wl", "_cl", "_wc", "_pk", "_mem", "_workers", "origin")

    def __getstate__(self) -> dict:
        # a deep copy or a pickle copies the views apart from the arrays they view: drop them,
        # and the copy makes its own from its own arrays on its first read
        d = {name: getattr(self, name) for name in self._STATE}
        d["_views_ro"] = None
        return d

    def __setstate__(self, d: dict) -> None:
        for name, value in d.items():
            setattr(self, name, value)

    # ----- queries -----
    def _views(self) -> tuple[np.ndarray, np.ndarray]:
        """Read-only views of ``_mem`` and ``_workers``, the arrays every update writes once
        they exist (made here on the first read)."""
        if self._views_ro is None:
            if self._mem is None:
                self._mem, self._workers = np.array(self._ml, dtype=np.float64), np.array(self._wl, dtype=np.int64)
            mv, wv = self._mem.view(), self._workers.view()
            mv.flags.writeable = wv.flags.writeable = False
            self._views_ro = (mv, wv)
        return self._views_ro

    @property
    def mem(self) -> np.ndarray:
        """Memory in use on each GPU (bytes, float64; each worker at its process's peak); a
        read-only view that follows the ledger's updates."""
        return self._views()[0]

    @property
    def workers(self) -> np.ndarray:
        """Workers on each GPU (int64); a read-only view that follows the ledger's updates."""
        return self._views()[1]

    @property
    def num_gpus(self) -> int:
        """GPUs of the cluster (the length of every per-GPU list and array)."""
        return len(self._wl)

    def worker_counts(self) -> list[int]:
        """Workers on each GPU as the ledger's own Python list, which its adds and removes keep
        current (for a caller that reads it many times while it places jobs; never write to it)."""
        return self._wl

    @property
    def owners(self) -> list[list[int]]:
        """Job ids on each GPU, in the order they were added (derived from the decision)."""
        out: list[list[int]] = [[] for _ in range(len(self._wl))]
        for jid, jd in self.decision.items():
            for g in jd.gpus:
                out[g].append(jid)
        return out

    def peaks(self, job: JobState, jd: JobDecision) -> np.ndarray:
        return self.state.costs.profile(job, jd.level, jd.pattern, jd.gpus).peak_bytes

    def peak_list(self, job: JobState, jd: JobDecision) -> list[float]:
        """The worker peaks as Python floats (the scalar fast path below; same values). Kept per
        job for the JobDecision object last asked about (a check, then its add, then its remove
        ask about the same one), in a memo the ledger's copies share: an entry holds the job and
        decision objects it was computed for and is used only for those very objects."""
        e = self._pk.get(job.job_id)
        if e is not None and e.decision is jd and e.job is job:
            return e.peaks
        v = self.state.costs.peak_list(job, jd.level, jd.pattern, jd.gpus)
        self._pk[job.job_id] = PeakEntry(jd, job, v)
        return v

    def check(self, job_id: int, jd: JobDecision, _chosen: bool = False) -> str | None:
        """Why ``jd`` cannot be added (a sentence), or None when it can.

        Scalar loops over the job's few workers: the same comparisons as the vector form
        (``workers[g] + 1 > cap``, ``mem[g] + peak[w] > capacity[g]``), element by element.
        ``_chosen``: the GPUs are :meth:`place`'s choice, distinct GPUs of this cluster by
        construction, so those two tests are skipped.
        """
        st = self.state
        job = st.jobs.get(job_id)
        if job is None or not job.active:
            return f"job {job_id} is not an arrived, unfinished job"
        if job_id in self.decision:
            return f"job {job_id} is already placed in this decision"
        gpus = jd.gpus
        n = len(gpus)
        if n != job.num_gpus:
            return f"job {job_id} needs {job.num_gpus} GPUs, decision gives {n}"
        if not _chosen:
            G = self.capacity.shape[0]
            if len(set(gpus)) != n:
                return f"job {job_id}: workers of one job must be on distinct GPUs, got {list(gpus)}"
            if min(gpus) < 0 or max(gpus) >= G:
                return f"job {job_id}: GPU index out of range 0..{G - 1}: {list(gpus)}"
        if not 0 <= jd.level <= st.spb.max_level:
            return f"job {job_id}: SPB level must be in 0..{st.spb.max_level}, got {jd.level}"
        cap_w = st.max_workers_per_gpu
        workers, mem, capacity = self._wl, self._ml, self._cl
        for g in gpus:
            if workers[g] + 1 > cap_w:
                return f"job {job_id}: a GPU would hold more than {cap_w} workers"
        for g, p in zip(gpus, self.peak_list(job, jd)):
            need = mem[g] + p
            if need > capacity[g]:
                return (f"job {job_id}: GPU {g} memory exceeded "
                        f"({need / 2**30:.2f} GiB > {capacity[g] / 2**30:.2f} GiB)")
        return None

    def fits(self, job_id: int, jd: JobDecision) -> bool:
        return self.check(job_id, jd) is None

    # ----- updates -----
    def add(self, job_id: int, jd: JobDecision, checked: bool = False) -> None:
        """Add ``jd``; ``checked=True`` skips the feasibility check (the caller just did it)."""
        why = None if checked else self.check(job_id, jd)
        if why:
            raise InfeasibleDecision(why)
        job = self.state.jobs[job_id]
        wl, ml, wc = self._wl, self._ml, self._wc
        mem, workers = self._mem, self._workers
        for g, p in zip(jd.gpus, self.peak_list(job, jd)):
            m = ml[g] + p
            ml[g] = m
            w = wl[g] + 1
            wl[g] = w
            if mem is not None:
                mem[g] = m
                workers[g] = w
            wc[w - 1] -= 1
            if w < len(wc):
                wc[w] += 1
            else:
                wc.append(1)
        self.decision[job_id] = jd

    def add_alone(self, job_id: int, jd: JobDecision) -> None:
        """Add ``jd``, unchecked, on GPUs that hold no worker: the state :meth:`add` with
        ``checked=True`` gives (each GPU's bytes are the worker's peak: ``0.0 + peak``), in fewer
        steps. For callers that place jobs exclusively and have checked the rest (Jigsaw's
        exclusive pass); a GPU already holding a worker raises ValueError, the ledger unchanged."""
        gpus = jd.gpus
        wl, ml = self._wl, self._ml
        if any(map(wl.__getitem__, gpus)):
            raise ValueError(f"job {job_id}: add_alone needs GPUs without workers, "
                             f"{[g for g in gpus if wl[g]]} hold some")
        mem, workers = self._mem, self._workers
        for g, p in zip(gpus, self.peak_list(self.state.jobs[job_id], jd)):
            ml[g] = p
            wl[g] = 1
            if mem is not None:
                mem[g] = p
                workers[g] = 1
        n = len(gpus)
        wc = self._wc
        wc[0] -= n
        wc[1] += n
        self.decision[job_id] = jd

    def remove(self, job_id: int) -> None:
        jd = self.decision.pop(job_id)
        job = self.state.jobs[job_id]
        wl, ml, wc = self._wl, self._ml, self._wc
        mem, workers = self._mem, self._workers
        for g, p in zip(jd.gpus, self.peak_list(job, jd)):
            w = wl[g] - 1
            wl[g] = w
            wc[w + 1] -= 1
            wc[w] += 1
            m = 0.0 if w == 0 else max(ml[g] - p, 0.0)
            ml[g] = m
            if mem is not None:
                mem[g] = m
                workers[g] = w

    @property
    def workers_per_gpu(self) -> list[int]:
        """Workers on each GPU, by GPU id (the ledger's own list: read, do not change it)."""
        return self._wl

    @property
    def bytes_per_gpu(self) -> list[float]:
        """Bytes each GPU holds at its processes' peaks, by GPU id (the ledger's own list)."""
        return self._ml

    @property
    def capacity_per_gpu(self) -> list[float]:
        """Each GPU's memory in bytes, by GPU id (the ledger's own list)."""
        return self._cl

    @property
    def gpus_by_worker_count(self) -> list[int]:
        """How many GPUs hold 0, 1, 2, ... workers (the ledger's own histogram)."""
        return self._wc

    def num_with_workers(self, w: int) -> int:
        """How many GPUs hold exactly ``w`` workers (``_wl.count(w)``, kept as the ledger changes)."""
        return self._wc[w] if 0 <= w < len(self._wc) else self._wl.count(w)

    def snapshot(self, job_id: int) -> tuple:
        """What :meth:`restore` needs to undo a remove of ``job_id`` exactly: its decision, its
        position in the decision's order, and its GPUs' memory and worker counts."""
        jd = self.decision[job_id]
        return jd, list(self.decision), [(g, self._ml[g], self._wl[g]) for g in jd.gpus]

    def restore(self, job_id: int, snap: tuple) -> None:
        """Undo a remove of ``job_id`` (and nothing else since): the same bytes (not the
        arithmetic of an add, which may round differently), counts and decision order."""
        jd, order, gpus = snap
        dec = self.decision
        dec[job_id] = jd
        for x in order[order.index(job_id) + 1:]:  # back to its position in the dict
            dec[x] = dec.pop(x)
        wl, ml, wc = self._wl, self._ml, self._wc
        mem, workers = self._mem, self._workers
        for g, m, w in gpus:
            wc[wl[g]] -= 1
            wc[w] += 1
            ml[g] = m
            wl[g] = w
            if mem is not None:
                mem[g] = m
                workers[g] = w

    # ----- placement menu -----
    def free_gpus(self) -> np.ndarray:
        return np.flatnonzero(self.workers == 0)

    def place(self, job: JobState, option: str, level: int = 0, pattern: Pattern = Pattern.ROTATING) -> JobDecision | None:
        """The JobDecision for ``option`` at this level/pattern, or None when infeasible."""
        if option == "keep":
            if job.status.value != "running" or not job.placement:
                return None
            gpus = job.placement
            if job.job_id in self.decision:
                return None
        elif option == "consolidated":
            gpus = self._consolidated(job.num_gpus)
        elif option == "spread":
            gpus = self._spread(job.num_gpus)
        elif option == "packed":
            gpus = self._packed(job, level, pattern)
        elif option == "paired":
            gpus = self._paired(job, level, pattern)
        else:
            raise ValueError(f"unknown placement option {option!r}; allowed: {list(PLACEMENT_OPTIONS)}")
        if gpus is None:
            return None
        if option == "keep":  # the job's own placement, as whoever built the job gave it
            jd = JobDecision(tuple(gpus), level, pattern)
            return jd if self.fits(job.job_id, jd) else None
        # GPUs this ledger chose: num_gpus distinct Python ints of this cluster
        jd = trusted_decision(tuple(gpus), level, pattern)
        return jd if self.check(job.job_id, jd, _chosen=True) is None else None

    def place_and_add(self, job: JobState, option: str, level: int = 0,
                      pattern: Pattern = Pattern.ROTATING) -> JobDecision | None:
        """:meth:`place`, then add the result (if any) to the ledger."""
        jd = self.place(job, option, level, pattern)
        if jd is not None:
            self.add(job.job_id, jd, checked=True)
        return jd

    def _free_per_node(self) -> list[int]:
        """Free GPUs (no worker) on each node."""
        cl = self.state.cluster
        gpn = cl.gpus_per_node
        if cl.num_nodes <= 16:  # a count in C per node beats numpy's three calls up to about 20 nodes
            wl = self._wl
            return [wl[s:s + gpn].count(0) for s in range(0, len(wl), gpn)]
        return np.add.reduce((self.workers == 0).reshape(cl.num_nodes, gpn), axis=1).tolist()

    def _free_on(self, node: int) -> list[int]:
        """The free GPUs of ``node`` (global indices, ascending)."""
        gpn = self.state.cluster.gpus_per_node
        wl = self._wl
        start = node * gpn
        return [g for g in range(start, start + gpn) if wl[g] == 0]

    def consolidated_gpus(self, n: int, also_free: Sequence[int] = ()) -> list[int] | None:
        """The ``n`` GPUs the ``consolidated`` option picks (free GPUs on the fewest nodes, best
        fit), before its memory check, with the GPUs ``also_free`` (distinct GPUs that hold
        workers now) counted free as well; None when fewer than ``n`` are free."""
        if not also_free:
            return self._consolidated(n)
        gpn = self.state.cluster.gpus_per_node
        counts = self._free_per_node()
        extra: dict[int, list[int]] = {}
        for g in also_free:
            counts[g // gpn] += 1
            extra.setdefault(g // gpn, []).append(g)

        def free_on(node: int) -> list[int]:
            more = extra.get(node)
            return sorted(self._free_on(node) + more) if more else self._free_on(node)

        return consolidated_from_counts(counts, free_on, n)

    def _consolidated(self, n: int) -> list[int] | None:
        # one node if possible: the fullest node (fewest free) that still fits n (best fit; the
        # first such node on ties); else nodes by most free GPUs first (lower node on ties)
        return consolidated_from_counts(self._free_per_node(), self._free_on, n)

    def _spread(self, n: int) -> list[int] | None:
        counts = self._free_per_node()
        if sum(counts) < n:
            return None
        # one GPU per node round-robin over the nodes by most free GPUs first (stable): in round r
        # the nodes with more than r free GPUs, a prefix of that order, each give their r-th
        order = sorted(range(len(counts)), key=counts.__getitem__, reverse=True)  # stable: ties keep node order
        lists: dict[int, list[int]] = {}
        out: list[int] = []
        r = 0
        while True:
            for k in order:
                if counts[k] <= r:
                    break
                lst = lists.get(k)
                if lst is None:
                    lst = lists[k] = self._free_on(k)
                out.append(lst[r])
                if len(out) == n:
                    return out
            r += 1

    def hosts(self) -> list[tuple[int, tuple[int, ...]]]:
        """``(job id, GPUs)`` of every job in the decision alone on its GPUs (each holds only its
        worker), in decision order; none when the worker cap is 1 (no GPU can take a guest)."""
        return [(jid, jd.gpus) for jid, jd in self.host_decisions()]

    def host_decisions(self) -> list[tuple[int, JobDecision]]:
        """:meth:`hosts` with each host's JobDecision instead of its GPUs."""
        if self.state.max_workers_per_gpu < 2:
            return []
        wl = self._wl
        out = []
        for item in self.decision.items():
            for g in item[1].gpus:
                if wl[g] != 1:
                    break
            else:
                out.append(item)
        return out

    def _paired(self, job: JobState, level: int, pattern: Pattern) -> list[int] | None:
        """The GPUs the ``paired`` option gives the job (module docstring: the chosen host's last
        ``n`` GPUs, last first), or None when no host takes it."""
        n = job.num_gpus
        need = self.state.costs.largest_peak(job, level, pattern)
        ml, cl = self._ml, self._cl
        st = self.state
        jobs = st.jobs
        iso = st.costs.isolated_iteration_s
        t_guest = iso(job)
        best = None
        for hid, jd in self.host_decisions():
            gpus = jd.gpus
            if len(gpus) < n or hid == job.job_id:
                continue
            g = gpus[::-1][:n]
            if all(ml[x] + need <= cl[x] for x in g):
                host = jobs[hid]
                key = (len(gpus), abs(math.log(iso(host) / t_guest)), -host.attained_gpu_s, hid)
                if best is None or key < best[0]:
                    best = (key, g)
        return list(best[1]) if best is not None else None

    def _packed(self, job: JobState, level: int, pattern: Pattern) -> list[int] | None:
        st = self.state
        n = job.num_gpus
        need = st.costs.largest_peak(job, level, pattern)
        workers = self.workers
        ok = workers < st.max_workers_per_gpu
        ok &= self.mem + need <= self.capacity
        cand = ok.nonzero()[0]
        if cand.size < n:
            return None
        # occupied GPUs first (packing), then by fewest workers, then by node to stay consolidated
        # (cand ascends, so GPU index order is node order): occupied by (workers, index), then free
        wc = workers[cand]
        occ = cand[wc > 0]
        if occ.size >= n and st.max_workers_per_gpu == 2:
            return occ[:n].tolist()  # all hold one worker: index order
        if st.max_workers_per_gpu > 2:
            occ = occ[np.argsort(workers[occ], kind="stable")]
        if occ.size >= n:
            return occ[:n].tolist()
        return occ.tolist() + cand[wc == 0][:n - occ.size].tolist()


def validate_decision(state: ClusterState, decision: Decision) -> GpuLedger:
    """Check a whole decision; raise InfeasibleDecision naming the first problem. Returns the ledger."""
    if not isinstance(decision, dict):
        raise InfeasibleDecision(f"a decision must be a dict job_id -> JobDecision, got {type(decision).__name__}")
    ledger = GpuLedger(state)
    for jid, jd in decision.items():
        if not isinstance(jd, JobDecision):
            raise InfeasibleDecision(f"decision for job {jid} must be a JobDecision, got {type(jd).__name__}")
        ledger.add(int(jid), jd)
    return ledger


def connected_groups(gpus_of: Mapping[int, Sequence[int]]) -> list[list[int]]:
    """Jobs connected through shared GPUs (union-find over ``{job_id: gpus}``): each group
    sorted, groups ordered by their smallest job id. The simulator's co-location components and
    the live executor's lockstep groups."""
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    owner: dict[int, int] = {}
    for jid, gpus in gpus_of.items():
        find(jid)
        for g in gpus:
            if g in owner:
                a, b = find(owner[g]), find(jid)
                if a != b:
                    parent[a] = b
            else:
                owner[g] = jid
    groups: dict[int, list[int]] = {}
    for jid in gpus_of:
        groups.setdefault(find(jid), []).append(jid)
    return sorted((sorted(g) for g in groups.values()), key=lambda g: g[0])


def gpus_on_nodes(state: ClusterState, gpus: Sequence[int]) -> int:
    return len({g // state.cluster.gpus_per_node for g in gpus})


seal_declared_classes(globals())  # the classes placement.pxd declares behave as compiled (jigsaw_env/declared.py)
