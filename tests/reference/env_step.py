"""Plain from-scratch versions of the env's per-step fast paths, which tests/env/test_env_speed_parity.py
holds them to: the masks (every action's feasibility without caches), the host slots and their mask
columns, the observation (no per-round or per-step cache), 2D-LAS, and the placements
(consolidated, spread, packed, paired). References: slow, written for clarity, never used by the
package.
"""
from __future__ import annotations

import math

import numpy as np

from jigsaw_env.actions import RoundBuilder
from jigsaw_env.encoder import CLUSTER_FEATURES, JOB_FEATURES, ObservationEncoder
from jigsaw_env.env import OBS_HIGH, OBS_LOW
from jigsaw_env.pairing import search_pairing
from jigsaw_env.spb import Pattern
from jigsaw_env.state import JobDecision, JobStatus


def ref_masks(b: RoundBuilder, rank: dict[int, int]) -> np.ndarray:
    """RoundBuilder.masks without the fast paths (vectorised, no caches); ``rank``: the jobs'
    2D-LAS ranks (the host slots' order)."""
    c = b.codec
    mask = np.zeros(c.n, dtype=bool)
    mask[c.advance] = True
    st = b.state
    slots = [(slot, jid) for slot, jid in enumerate(b.window) if jid not in b.acted]
    if not slots:
        return mask
    cap_w = st.max_workers_per_gpu
    n_lp = c.n_lp
    base = b.ledger
    cap0 = float(base.capacity[0])
    base_free = base._wl.count(0)
    jobs = [st.jobs[jid] for _, jid in slots]
    need = np.stack([st.costs.need_vector(j, c.combos) for j in jobs])
    n = np.array([job.num_gpus for job in jobs])
    open_mem = np.sort(base.mem[base.workers < cap_w])
    nth = np.full(len(slots), np.inf)
    ok_n = n <= open_mem.size
    nth[ok_n] = open_mem[n[ok_n] - 1]
    packed_ok = nth[:, None] + need <= cap0
    free_excl = np.full(len(slots), base_free)
    keep_rows = []
    wl, ml, cl = base._wl, base._ml, base._cl
    for i, job in enumerate(jobs):
        jd = base.decision.get(job.job_id)
        if jd is None:
            continue
        m_new, w_new = [], []
        for g, p in zip(jd.gpus, st.costs.peak_list(job, jd.level, jd.pattern, jd.gpus)):
            w = wl[g] - 1
            w_new.append(w)
            m_new.append(0.0 if w == 0 else max(ml[g] - p, 0.0))
        free_excl[i] += w_new.count(0)
        nj = job.num_gpus
        pref = open_mem[: nj + len(m_new)].tolist()
        for g in jd.gpus:
            if wl[g] < cap_w:
                try:
                    pref.remove(ml[g])
                except ValueError:
                    pass
        pref.extend(m for m, w in zip(m_new, w_new) if w < cap_w)
        pref.sort()
        packed_ok[i] = (pref[nj - 1] + need[i] <= cap0) if nj <= len(pref) else False
        if job.status is JobStatus.RUNNING:
            caps = [cl[g] for g in jd.gpus]
            keep_rows.append((i, [all(m + p <= cc for m, p, cc in zip(m_new, r, caps))
                                  for r in st.costs.peak_rows(job, c.combos)]))
    excl_ok = (free_excl[:, None] >= n[:, None]) & (need <= cap0)
    rows = mask[: c.advance].reshape(c.window_k, c.per_job)
    idx = np.array([slot for slot, _ in slots])
    rows[idx, n_lp: 2 * n_lp] = excl_ok
    rows[idx, 2 * n_lp: 3 * n_lp] = excl_ok
    rows[idx, 3 * n_lp: 4 * n_lp] = packed_ok
    for slot, jid in slots:
        if jid in base.decision:
            rows[slot, c.n_opt * n_lp] = True
    for i, keep in keep_rows:
        rows[slots[i][0], :n_lp] = keep
    for i, (slot, jid) in enumerate(slots):  # paired (added after the speed work): plainly, per combo
        led = base.copy()
        if jid in led.decision:
            led.remove(jid)
        for lp, (lv, pt) in enumerate(c.combos):
            rows[slot, 4 * n_lp + lp] = ref_paired(led, jobs[i], lv, pt) is not None
    ref_host_columns(b, rows, slots, rank)
    return mask


def ref_paired(led, job, level: int, pattern) -> list[int] | None:
    """The paired option's GPUs, plainly: every job alone on its GPUs (numpy worker counts) and
    at least as wide is a host; the guest's largest worker must fit each of its last n GPUs,
    which it takes last first; hosts sorted by width, closeness of isolated iteration time (log
    ratio), most attained service, job id."""
    st = led.state
    if st.max_workers_per_gpu < 2:
        return None
    n = job.num_gpus
    need = float(st.costs.worker_peaks(job, level, pattern).max())
    hosts = []
    for hid, jd in led.decision.items():
        g = list(jd.gpus)
        tail = g[::-1][:n]
        if hid != job.job_id and len(g) >= n and (led.workers[g] == 1).all() \
                and (led.mem[tail] + need <= led.capacity[tail]).all():
            iso = st.costs.isolated_iteration_s
            close = abs(math.log(iso(st.jobs[hid]) / iso(job)))
            hosts.append((len(g), close, -st.jobs[hid].attained_gpu_s, hid, tail))
    return min(hosts)[4] if hosts else None


class RefLAS:
    """Tiresias's 2D-LAS queue with its starvation guard, plainly (thresholds 3600 GPU-s, factor
    10, the encoder's): per job, when its current run began, its last run's length, when its
    current wait began, and its attained service at its last promotion."""

    TH, SF = 3600.0, 10.0

    def __init__(self):
        self.run_since, self.last_run, self.wait_since, self.base = {}, {}, {}, {}
        self.t = None

    def observe(self, state) -> None:
        if state.time_s == self.t:
            return
        now = self.t = state.time_s
        for jid in state.active_ids:
            j = state.jobs[jid]
            if j.status is JobStatus.RUNNING:
                self.run_since.setdefault(jid, now)
                self.wait_since.pop(jid, None)
                continue
            if jid in self.run_since:
                self.last_run[jid] = max(now - self.run_since.pop(jid), 1e-9)
                self.wait_since[jid] = now
            if jid in self.wait_since and now - self.wait_since[jid] >= self.SF * self.last_run[jid]:
                self.base[jid] = j.attained_gpu_s
                self.wait_since[jid] = now

    def features(self, j, now) -> tuple[float, float, float]:
        service = j.attained_gpu_s - self.base.get(j.job_id, 0.0)
        starve = 0.0
        if j.status is not JobStatus.RUNNING and j.job_id in self.wait_since:
            starve = min(1.0, (now - self.wait_since[j.job_id]) / (self.SF * self.last_run[j.job_id]))
        return float(service >= self.TH), math.log1p(max(0.0, service)) / 20, starve

    def order(self, state) -> list:
        """The active jobs in 2D-LAS order: (queue, arrival, id)."""
        jobs = [state.jobs[x] for x in state.active_ids]
        return sorted(jobs, key=lambda j: (j.attained_gpu_s - self.base.get(j.job_id, 0.0) >= self.TH, j.arrival_s,
                                           j.job_id))

    def rank(self, state) -> dict[int, int]:
        return {j.job_id: i for i, j in enumerate(self.order(state))}

    def fill(self, state) -> dict[int, tuple[float, float, float, float]]:
        """Features 22-25 of every active job: the jobs sorted by (queue, arrival, id), each taken
        while its GPUs fit in the GPUs left."""
        G = state.cluster.num_gpus
        order = self.order(state)
        out = {}
        for i, j in enumerate(order):
            before = order[:i]
            left = G
            skipped = 0
            for b in before:
                if b.num_gpus <= left:
                    left -= b.num_gpus
                else:
                    skipped += 1
            ahead = sum(b.num_gpus for b in before)
            out[j.job_id] = (min(2.0, ahead / G) / 2, left / G, float(j.num_gpus <= left), min(1.0, math.log1p(skipped) / 4))
        return out


def ref_hosts(ledger, rank: dict[int, int], h: int) -> list[int]:
    """The host slots, plainly: the jobs of the decision whose GPUs each hold one worker (numpy
    worker counts; none under a worker cap of 1), lowest priority (largest rank) first, the first ``h``."""
    if ledger.state.max_workers_per_gpu < 2:
        return []
    alone = [jid for jid, jd in ledger.decision.items() if (ledger.workers[list(jd.gpus)] == 1).all()]
    return sorted(alone, key=lambda x: (-rank[x], x))[:h]


def ref_around(led, job, hid: int) -> tuple[int, ...] | None:
    """The GPUs of ``job`` placed around host ``hid``, plainly: with the host's GPUs counted free
    (numpy worker counts), the free GPUs of the fullest node that holds ``n`` of them (the first
    on ties), else of the nodes with the most free GPUs first (the lower on ties), lowest GPUs
    first; None unless they hold every GPU of the host."""
    gpn = led.state.cluster.gpus_per_node
    free = led.workers == 0
    host = list(led.decision[hid].gpus)
    free[host] = True
    n = job.num_gpus
    if free.sum() < n:
        return None
    per_node = free.reshape(-1, gpn)
    counts = per_node.sum(axis=1)
    fits = [k for k in range(len(counts)) if counts[k] >= n]
    if fits:
        k = min(fits, key=lambda k: (counts[k], k))
        gpus = [k * gpn + i for i in np.flatnonzero(per_node[k])[:n]]
    else:
        gpus = []
        for k in sorted(range(len(counts)), key=lambda k: (-counts[k], k)):
            gpus += [k * gpn + int(i) for i in np.flatnonzero(per_node[k])][: n - len(gpus)]
    gpus = tuple(int(g) for g in gpus)
    return gpus if set(host) <= set(gpus) else None


def ref_host_columns(b, rows: np.ndarray, slots, rank: dict[int, int]) -> None:
    """The ``host:r`` columns, plainly: for a host at least as wide, the search's best order at the
    host's configuration and the guest's combo, checked on a copy of the ledger with the guest
    taken out; for a narrower one, the placement around it (:func:`ref_around`), checked likewise."""
    c, st = b.codec, b.state
    hosts = ref_hosts(b.ledger, rank, c.host_slots)
    for slot, jid in slots:
        job = st.jobs[jid]
        led = b.ledger.copy()
        if jid in led.decision:
            led.remove(jid)
        for r, hid in enumerate(hosts):
            hjd = b.ledger.decision[hid]
            if hid == jid:
                continue
            if len(hjd.gpus) < job.num_gpus:  # placed around the host
                gpus = ref_around(led, job, hid)
                for lp, (lv, pt) in enumerate(c.combos):
                    ok = gpus is not None and led.fits(jid, JobDecision(gpus, lv, pt))
                    rows[slot, (c.n_menu + r) * c.n_lp + lp] = ok
                continue
            for lp, (lv, pt) in enumerate(c.combos):
                plan = search_pairing(st, st.jobs[hid], hjd.gpus, job, [(hjd.level, hjd.pattern)], [(lv, pt)])
                ok = plan is not None and led.fits(jid, JobDecision(plan.guest_gpus, lv, pt))
                rows[slot, (c.n_menu + r) * c.n_lp + lp] = ok


def ref_encode(enc: ObservationEncoder, state, window, ledger, acted, steps_in_round, las: RefLAS) -> np.ndarray:
    """ObservationEncoder.encode without the fast paths, with no cache (the per-model
    constants come from a fresh encoder's ``_job_static``); ``las``: the LAS queue, observed at
    this state."""
    k = enc.window_k
    hosts = ref_hosts(ledger, las.rank(state), enc.host_slots)
    block = np.zeros((k + enc.host_slots) * JOB_FEATURES, dtype=np.float32)
    G = state.cluster.num_gpus
    now = state.time_s
    L = max(1, state.spb.max_level)
    by_arrival = sorted(state.active_ids, key=lambda x: (state.jobs[x].arrival_s, x))
    n_act = len(by_arrival)
    fill = las.fill(state)
    for slot, jid in [*enumerate(window[:k]), *((k + r, hid) for r, hid in enumerate(hosts))]:
        j = state.jobs[jid]
        rank = by_arrival.index(jid) / (n_act - 1) if n_act > 1 else 0.0
        since = j.status_since_s
        if math.isnan(since):
            since = j.first_start_s if j.status is JobStatus.RUNNING and not math.isnan(j.first_start_s) else j.arrival_s
        if enc.observe_remaining:
            rem = math.log1p(j.remaining * state.costs.isolated_iteration_s(j)) / 16
            frac = j.progress / j.iterations if j.iterations > 0 else 0.0
        else:
            rem = frac = 0.0
        o = slot * JOB_FEATURES
        block[o:o + JOB_FEATURES] = (
            1.0, j.status is JobStatus.RUNNING, 0.0, 0.0, math.log2(1 + j.num_gpus) / 8, min(1.0, j.num_gpus / G),
            math.log1p(max(0.0, now - j.arrival_s)) / 16, math.log1p(j.attained_gpu_s) / 20, rem, frac,
            j.level / L, j.pattern is Pattern.STATIC, *enc._job_static(state, j),
            rank, math.log1p(max(0.0, now - since)) / 16, math.log1p(j.last_run_s) / 16, *las.features(j, now),
            *fill.get(jid, (0.0, 0.0, 0.0, 0.0)), 0.0)
    n_wait = sum(1 for x in state.active_ids if state.jobs[x].status is not JobStatus.RUNNING)
    gpus_wait = sum(state.jobs[x].num_gpus for x in state.active_ids if state.jobs[x].status is not JobStatus.RUNNING)
    stats = (math.log1p(n_wait) / 8, math.log1p(len(state.active_ids) - n_wait) / 8, min(4.0, gpus_wait / G) / 4)
    obs = np.empty(enc.size, dtype=np.float32)
    obs[:(k + enc.host_slots) * JOB_FEATURES] = block
    for slot, jid in enumerate(window[:k]):
        obs[slot * JOB_FEATURES + 2] = jid in ledger.decision
        obs[slot * JOB_FEATURES + 3] = jid in acted
        others = [x for x in ledger.decision if x != jid and jid in ledger.decision
                  and set(ledger.decision[x].gpus) & set(ledger.decision[jid].gpus)]
        obs[slot * JOB_FEATURES + 26] = bool(others)
    for r, hid in enumerate(hosts):  # a host: in the decision, alone on its GPUs
        obs[(k + r) * JOB_FEATURES + 2] = 1.0
        obs[(k + r) * JOB_FEATURES + 3] = hid in acted
    k += enc.host_slots  # the cluster features follow the host slots (round progress is per window slot)
    wl = ledger._wl
    n_free = wl.count(0)
    cap_w = state.max_workers_per_gpu
    n_open = G if cap_w > max(wl) else sum(1 for w in wl if w < cap_w)
    n_shared = G - n_free - wl.count(1)
    if n_free < G:
        occ = ledger.workers > 0
        cap = ledger.capacity
        if (cap == cap[0]).all():  # one capacity: the bytes (whole, so summed exactly) over capacity x GPUs
            mem_use = float(ledger.mem[occ].sum()) / (float(cap[0]) * int(occ.sum()))
        else:
            mem_use = float((ledger.mem[occ] / cap[occ]).mean())
    else:
        mem_use = 0.0
    kw = enc.window_k
    obs[k * JOB_FEATURES:] = (n_free / G, n_open / G, n_shared / G, mem_use, *stats, len(acted) / kw,
                              min(1.0, steps_in_round / (2 * kw + 2)), min(len(window), kw) / kw)
    assert obs.size == k * JOB_FEATURES + CLUSTER_FEATURES
    return np.clip(obs, OBS_LOW, OBS_HIGH)


def ref_place(led, job, option: str, level: int, pattern) -> list[int] | None:
    """GpuLedger's consolidated / spread / packed GPU choices as they were (numpy), and paired."""
    st = led.state
    cl = st.cluster
    n = job.num_gpus
    if option == "paired":
        return ref_paired(led, job, level, pattern)
    if option in ("consolidated", "spread"):
        per_node = (led.workers == 0).reshape(cl.num_nodes, cl.gpus_per_node)
        counts = per_node.sum(axis=1)
        if counts.sum() < n:
            return None
        if option == "consolidated":
            fits = np.flatnonzero(counts >= n)
            if len(fits):
                node = int(fits[np.argmin(counts[fits])])
                return [node * cl.gpus_per_node + int(i) for i in np.flatnonzero(per_node[node])[:n]]
            out: list[int] = []
            for node in np.argsort(-counts, kind="stable"):
                for i in np.flatnonzero(per_node[node]):
                    out.append(int(node) * cl.gpus_per_node + int(i))
                    if len(out) == n:
                        return out
            return None
        lists = [list(np.flatnonzero(per_node[k])) for k in range(cl.num_nodes)]
        order = sorted(range(cl.num_nodes), key=lambda k: -len(lists[k]))
        out = []
        while len(out) < n:
            for k in order:
                if lists[k]:
                    out.append(k * cl.gpus_per_node + int(lists[k].pop(0)))
                    if len(out) == n:
                        break
        return out
    need = float(st.costs.worker_peaks(job, level, pattern).max())
    ok = (led.workers < st.max_workers_per_gpu) & (led.mem + need <= led.capacity)
    cand = np.flatnonzero(ok)
    if len(cand) < n:
        return None
    occupied = led.workers[cand] > 0
    order = np.lexsort((cand, cand // cl.gpus_per_node, led.workers[cand], ~occupied))
    return [int(g) for g in cand[order][:n]]
