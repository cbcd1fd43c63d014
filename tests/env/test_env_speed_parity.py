"""The env's per-step fast paths change no result.

Whole episodes of a random masked policy are replayed while, at every step, the env's masks,
observation, placements, decision and reward are checked against from-scratch recomputations
that share none of the fast paths' caches or shortcuts:

* masks: every action tried on a copy of the ledger (every fifth step), the plain vectorised algorithm (a RoundBuilder.masks without
  the fast paths, kept here verbatim, with no cache), and a RoundBuilder made fresh each round with its own empty
  caches, fed the same actions (its masks also recomputed with emptied caches);
* the observation: the plain encoder (no per-round or per-step cache), then np.clip, bit for bit;
* placements: plain numpy implementations of consolidated / spread / packed, for every
  option and level of the action about to be applied;
* rewards and episode metrics: a second Simulator fed the fresh builder's decisions.

Nothing is read from a stored file, so regenerating one cannot hide a change.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from jigsaw_env.actions import RoundBuilder
from jigsaw_env.pairing import search_pairing
from jigsaw_env.encoder import CLUSTER_FEATURES, JOB_FEATURES, ObservationEncoder
from jigsaw_env.env import OBS_HIGH, OBS_LOW, JigsawClusterEnv
from jigsaw_env.placement import PLACEMENT_OPTIONS
from jigsaw_env.sim_validation import validate_diff
from jigsaw_env.simulator import Simulator
from jigsaw_env.spb import Pattern
from jigsaw_env.state import JobDecision, JobStatus


# ---------------------------------------------------------------- reference implementations
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


def ref_host_columns(b, rows: np.ndarray, slots, rank: dict[int, int]) -> None:
    """The ``host:r`` columns, plainly: the search's best order at the host's configuration and
    the guest's combo, checked on a copy of the ledger with the guest taken out."""
    c, st = b.codec, b.state
    hosts = ref_hosts(b.ledger, rank, c.host_slots)
    for slot, jid in slots:
        job = st.jobs[jid]
        led = b.ledger.copy()
        if jid in led.decision:
            led.remove(jid)
        for r, hid in enumerate(hosts):
            hjd = b.ledger.decision[hid]
            if hid == jid or len(hjd.gpus) < job.num_gpus:
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


# ---------------------------------------------------------------- the replay
def _ledger_key(led):
    # the worker-count histogram the ledger keeps equals counting the list
    counts = [led._wl.count(w) for w in range(len(led._wc))]
    assert led._wc == counts and sum(counts) == len(led._wl), (led._wc, counts)
    return list(led.decision.items()), led._ml, led._wl, led.mem.tolist(), led.workers.tolist(), led._wc


def replay(env: JigsawClusterEnv, seed: int, policy_seed: int, max_steps: int | None = None) -> int:
    rng = np.random.default_rng(policy_seed)
    obs, _ = env.reset(seed=seed)
    ref_sim = Simulator(env.cluster, env.sim._initial_jobs, env.sim_config)
    ref_enc = ObservationEncoder(env.encoder.window_k, env.encoder.observe_remaining)
    ref_las = RefLAS()
    ref_las.observe(ref_sim.state)
    ref_b = RoundBuilder(ref_sim.state, env.codec, ref_sim.in_force_ledger(), priority=ref_las.rank(ref_sim.state))
    steps = 0
    while True:
        b = env.builder
        # the observation the env returned (for the state before this step)
        ref_las.observe(env.sim.state)
        want = ref_encode(ref_enc, env.sim.state, b.window, b.ledger, b.acted, env._steps_in_round, ref_las)
        assert obs.dtype == np.float32 and obs.tobytes() == want.tobytes(), f"observation differs at step {steps}"
        # masks: the env's, the plain algorithm's, and a fresh builder's with emptied caches
        mask = env.action_masks()
        assert mask.dtype == bool and mask.shape == (env.codec.n,)
        np.testing.assert_array_equal(mask, ref_masks(b, ref_las.rank(env.sim.state)),
                                      err_msg=f"masks differ at step {steps}")
        assert ref_b.window == b.window and ref_b.acted == b.acted
        assert _ledger_key(ref_b.ledger) == _ledger_key(b.ledger)
        ref_b._need_cache = {}
        np.testing.assert_array_equal(mask, ref_b.masks(), err_msg=f"fresh builder masks differ at step {steps}")
        if steps % 5 == 0:  # and by trying every action (candidate() on a copy of the ledger)
            base = np.zeros(env.codec.n, dtype=bool)
            base[env.codec.advance] = True
            np.testing.assert_array_equal(mask, b._masks_exhaustive(base), err_msg=f"exhaustive masks differ at step {steps}")
        a = int(rng.choice(np.flatnonzero(mask)))
        kind, slot, option, level, pattern = env.codec.decode(a)
        # the GPUs each option picks, as the ledger places a job with it taken out: for the job
        # about to act at its level, and every fifth step for every window job at every level
        todo = [(slot, [(level, pattern)])] if kind == "run" else []
        if steps % 5 == 0:
            todo = [(s_, env.codec.combos) for s_, jid in enumerate(b.window) if jid not in b.acted]
        for s_, combos in todo:
            led = b.ledger.copy()
            job = env.sim.state.jobs[b.window[s_]]
            if job.job_id in led.decision:
                led.remove(job.job_id)
            for lv, pt in combos:
                for opt in PLACEMENT_OPTIONS[1:]:
                    if opt in ("packed", "paired"):
                        got = getattr(led, f"_{opt}")(job, lv, pt)
                    else:
                        got = getattr(led, f"_{opt}")(job.num_gpus)
                    assert got == ref_place(led, job, opt, lv, pt), (steps, opt)
        obs, reward, term, trunc, info = env.step(a)
        steps += 1
        # the same action on the fresh builder; the reference simulator advances with its decision
        if kind != "advance":
            ref_b.apply(a)
        if "round" in info:
            r = ref_sim.step(ref_b.ledger.decision)
            assert reward == -r.job_seconds / env.reward_scale, f"reward differs at step {steps}"
            assert info["finished"] == r.finished
            if not ref_sim.done:
                ref_las.observe(ref_sim.state)
                ref_b = RoundBuilder(ref_sim.state, env.codec, ref_sim.in_force_ledger(),
                                     priority=ref_las.rank(ref_sim.state))
        else:
            assert reward == 0.0
        if term or trunc:
            got = dict(info["episode_metrics"])
            want_m = ref_sim.metrics()
            for m in (got, want_m):
                m.pop("wall_s", None)
            assert got.keys() == want_m.keys()
            for key in got:
                assert got[key] == want_m[key] or (got[key] != got[key] and want_m[key] != want_m[key]), key
            return steps
        if max_steps is not None and steps >= max_steps:
            return steps


@pytest.mark.parametrize("gpus,window_k,max_jobs,load,extra,seed", [
    (64, 16, 30, 1.0, {}, 0),
    (64, 16, 30, 1.5, {}, 1),
    (512, 16, 30, 1.0, {}, 2),
    (16, 8, 40, 2.0, {}, 3),                               # a crowded cluster: jobs wait for GPUs
    (16, 8, 40, 1.5, {"max_workers_per_gpu": 3}, 4),       # three workers per GPU
    (32, 4, 40, 1.5, {"gpus_per_node": 4, "observe_remaining": False}, 5),
])
def test_fast_paths_equal_from_scratch_recomputation(gpus, window_k, max_jobs, load, extra, seed):
    env = JigsawClusterEnv(gpus=gpus, window_k=window_k, max_jobs=max_jobs, load=load, **extra)
    steps = replay(env, seed=seed, policy_seed=100 + seed)
    assert steps > 100
    # a second episode on the same env (caches are per episode; job ids repeat)
    replay(env, seed=seed + 10, policy_seed=200 + seed, max_steps=300)


def test_an_infeasible_apply_leaves_the_ledger_exactly_as_it_was():
    # apply() takes a running job out of the ledger itself to place it; when the placement is
    # infeasible it must put back the exact bytes, worker counts and decision order
    from jigsaw_env.actions import InvalidAction

    env = JigsawClusterEnv(gpus=16, window_k=8, max_jobs=40, load=2.0)
    env.reset(seed=3)
    rng = np.random.default_rng(0)
    tried = 0
    for _ in range(3000):
        b = env.builder
        mask = env.action_masks()
        for slot, jid in enumerate(b.window):
            if jid in b.acted or jid not in b.ledger.decision:
                continue
            off = slot * env.codec.per_job
            for a in range(off, off + env.codec.n_opt * env.codec.n_lp):
                if mask[a]:
                    continue
                before = _ledger_key(b.ledger)
                with pytest.raises(InvalidAction):
                    b.apply(a)
                assert _ledger_key(b.ledger) == before
                assert jid not in b.acted
                tried += 1
        _, _, term, trunc, _ = env.step(int(rng.choice(np.flatnonzero(env.action_masks()))))
        if term or trunc or tried > 200:
            break
    assert tried > 20


def test_the_builders_ledger_is_taken_over_only_when_validation_would_build_the_same():
    """Simulator.step(decision, ledger=builder.ledger): at every round of random play the ledger
    taken over equals, byte for byte and in job order, the one validation builds; a job re-added
    with an unchanged JobDecision (validation keeps its place) and a ledger of an earlier round
    are validated instead."""
    from jigsaw_env.state import JobDecision

    env = JigsawClusterEnv(gpus=32, window_k=8, max_jobs=40, load=1.5)
    env.reset(seed=7)
    rng = np.random.default_rng(7)
    adopted = fallback = 0
    calls = []
    orig = env.sim._adopt
    env.sim._adopt = lambda led: (calls.append(1), orig(led))[1]
    for _ in range(4000):
        b = env.builder
        mask = env.action_masks()
        a = int(rng.choice(np.flatnonzero(mask)))
        if a == env.codec.advance:
            sim = env.sim
            got = sim._adopt(b.ledger)
            led, removed, added = validate_diff(sim._in_force, b.ledger.decision)
            if got is None:
                fallback += 1
                # the order differs: some job came back with the JobDecision in force
                cd = sim._in_force.decision
                assert any(b.ledger.decision.get(j) == jd for j, jd in cd.items())
            else:
                adopted += 1
                assert got[0] is b.ledger and (got[1], got[2]) == (removed, added)
                assert _ledger_key(got[0]) == _ledger_key(led)
        n_calls = len(calls)
        _, _, term, trunc, info = env.step(a)
        if a == env.codec.advance:
            assert len(calls) == n_calls + 1  # the env hands its builder's ledger over every round
        if term or trunc:
            break
    assert adopted > 50 and fallback > 0, (adopted, fallback)
    # a ledger handed out before the last step is of an earlier round: validated, not taken over
    env.reset(seed=9)
    sim = env.sim
    sim._adopt = lambda led: (calls.append(1), Simulator._adopt(sim, led))[1]
    stale = sim.in_force_ledger()
    sim.step(None)
    if not sim.done:
        n_calls = len(calls)
        sim.step(stale.decision, ledger=stale)
        assert len(calls) == n_calls
    # and a ledger from elsewhere never bypasses validation: an infeasible decision is refused
    from jigsaw_env.placement import GpuLedger, InfeasibleDecision
    env.reset(seed=8)
    sim = env.sim
    while not sim.state.active_ids:
        sim.step(None)
    jid = sim.state.active_ids[0]
    foreign = GpuLedger(sim.state)
    foreign.decision[jid] = JobDecision(tuple(range(sim.state.jobs[jid].num_gpus + 1)), 0)  # one GPU too many
    with pytest.raises(InfeasibleDecision):
        sim.step(foreign.decision, ledger=foreign)


def test_the_env_keeps_its_cost_model_across_episodes():
    from jigsaw_env.simulator import SimConfig

    env = JigsawClusterEnv(gpus=16, window_k=4, max_jobs=10)
    env.reset(seed=1)
    costs = env.sim.costs
    assert env.sim._tables is costs.step_tables
    env.reset(seed=2)
    assert env.sim.costs is costs and env.sim._tables is costs.step_tables
    env.sim_config = SimConfig(round_s=env.sim_config.round_s, eta_scale=0.8)  # other settings: a new one
    env.reset(seed=3)
    assert env.sim.costs is not costs and env.sim.costs.eta_scale == 0.8
    with pytest.raises(ValueError, match=r"costs: a CostModel made for another eta_scale \(0.8, expected 1.0\)"):
        Simulator(env.cluster, env.sim._initial_jobs, SimConfig(), costs=env.sim.costs)
