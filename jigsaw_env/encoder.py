"""The one observation encoder, used by the Gymnasium env and by the live executor.

The observation is a float32 vector of ``(K + H) * JOB_FEATURES + CLUSTER_FEATURES`` values,
whatever the cluster's size: per-job features for the K jobs of the round's window (zeros for
empty slots), then the same features for the H host slots (the jobs the pair-with-host placement
options name, ``jigsaw_env.actions.RoundBuilder.hosts``: jobs of the decision being built alone on
their GPUs, lowest 2D-LAS priority first; zeros for empty host slots), then cluster features that
are fractions or log-scaled counts. A policy trained on 64
simulated GPUs therefore reads a 4-slot live cluster unchanged.

Per-job features (index: meaning):
 0 slot holds a job           1 running now                 2 placed in the decision being built
 3 already decided this round 4 log2(1+GPUs)/8              5 GPUs / cluster GPUs (capped at 1)
 6 log1p(age s)/16            7 log1p(attained GPU-s)/20    8 log1p(remaining isolated s)/16 *
 9 progress fraction *        10 current level / L          11 static pattern
12 log1p(isolated iteration ms)/10                          13 SPB compute gain at the half level - 1
14 eta at the half level      15 worker peak memory / GPU memory
16 arrival rank among the active jobs / (active jobs - 1)  (0: the oldest job present)
17 log1p(s since it last started, resumed or was preempted; since arrival if never started)/16
18 log1p(s of its last continuous run that ended in a preemption)/16
19 LAS queue / number of thresholds (0: the highest-priority queue)
20 log1p(LAS service: GPU-s since its last starvation promotion)/20
21 starvation progress: s waited / (starve factor x last run), at most 1 (0 unless it waits
   after a run)
22 GPUs of the active jobs ahead of it in the 2D-LAS order / cluster GPUs, at most 2, /2
23 GPUs the 2D-LAS fill has left when it reaches the job / cluster GPUs
24 the 2D-LAS fill takes it (1) or skips it (0)
25 log1p(jobs ahead of it that the 2D-LAS fill skips)/4, at most 1
26 shares a GPU: one of its GPUs in the decision being built holds another job's worker
(* zero unless ``observe_remaining``: an oracle, as SRTF has.)

Features 16-18 are the job's history as any scheduler can see it (``JobState.status_since_s``,
``last_run_s``): Tiresias and Jigsaw serve a queue FIFO by arrival, and their starvation guard
promotes a job that has waited ``starve_factor`` times its last run, so without them those
decisions are not a function of the observation (in arrival order, ages of hundreds of hours
differ in the fifth digit of feature 6).

Features 19-21 are the job's place in Tiresias's discretized 2D-LAS queue
(:class:`~jigsaw_env.las.LASQueues`, with the thresholds and starvation factor the ``tiresias`` and
``jigsaw`` schedulers use by default), which the encoder keeps from round to round: a starvation
promotion resets the service the queue is judged by, and that reset is visible in no other
feature. On the PPO study's 12 held-out Philly windows, the only two with any promotion (windows 2
and 10: 32 and 7 under Jigsaw) were the only two where every clone of Jigsaw lost to Tiresias
(docs/environment.md). The encoder is therefore stateful: :meth:`ObservationEncoder.reset` starts
a new episode (the env and the learned scheduler call it), and the queue is updated once per
round, at the round's first encoding.

Features 22-25 place the job in that queue's order against the cluster's size. The 2D-LAS order
is (queue, arrival, id), highest priority first; the *fill* walks it taking every job whose GPUs
still fit in the cluster's GPUs left and skipping the others (``agents.common.select_by_budget``,
the run set of ``tiresias`` and the exclusive set ``jigsaw`` starts from). Whether a job is in
it depends on the GPUs of every job ahead of it, inside the window or behind it, which no
per-slot feature and no pooling over the K slots shows: on the PPO study's held-out window 2,
a third to a half of the clones' wrong actions with a 32-GPU job undecided started a job Jigsaw
left for a later round (docs/environment.md).

Feature 26, like features 2 and 3, is set at every step from the decision being built (which
starts from the allocation in force): whether the job shares a GPU with another job. Jigsaw keeps
a running pair whose sharing still pays (``keep_margin``) although its guest is outside the fill;
without this feature a running guest and a running job alone on its GPUs look the same.

Cluster features: exclusive-free GPU fraction, GPUs under the worker cap fraction, shared GPU
fraction, memory use of occupied GPUs (their bytes over their capacity, computed exactly and
rounded once; the mean of each GPU's fraction when GPU types differ in memory), log1p(waiting
jobs)/8, log1p(running jobs)/8, waiting GPU demand / cluster GPUs (capped at 4)/4, jobs decided
this round / K, round progress (steps this round / (2K+2)), fraction of the window filled.

Feature groups (``features``, the env's ``obs_features``, ``jigsaw train --obs-features``): the
per-job features fall in named groups, :data:`FEATURE_GROUPS`; an encoder made with some of
them keeps only their per-job columns, in the order above (every cluster feature stays). The
default is every group but ``proposal`` (:data:`DEFAULT_FEATURES`), the 27 x (K + H) + 10 layout
above, computed with no selection step. ``base`` (0-7, 10-15, 26) is always in; ``oracle`` (8-9),
``history`` (16-18), ``las`` (19-21) and ``fill`` (22-25) can be left out, e.g. to study a
representation without the oracle or the heuristic-derived features. docs/environment.md lists
every index.

The ``proposal`` group adds no per-job columns: it appends a block after the cluster features
that shows, per window and host slot, what a heuristic (the *proposer*) runs this round
(:mod:`jigsaw_env.proposal`: ``(K + H) x (7 + H)`` values). An encoder with it needs that
decision at each :meth:`ObservationEncoder.encode` (``proposal=``).
"""
from __future__ import annotations

import math

import numpy as np

from .las import LASQueues
from .proposal import ProposalBlock, proposal_slot_features
from .remaining import remaining_rank
from .spb import Pattern, spb_compute_bound
from .state import ClusterState, Decision, JobStatus

JOB_FEATURES = 27
CLUSTER_FEATURES = 10
#: host slots H: the running or placed jobs a pair-with-host placement option can name
#: (``jigsaw_env.actions``); the observation shows each one's job features
HOST_SLOTS = 8

#: per-job feature indices of each group (module docstring); every cluster feature is in ``base``
FEATURE_GROUPS: dict[str, tuple[int, ...]] = {
    "base": (0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12, 13, 14, 15, 26),
    "oracle": (8, 9),
    "history": (16, 17, 18),
    "las": (19, 20, 21),
    "fill": (22, 23, 24, 25),
    # no per-job columns: a block of its own after the cluster features (jigsaw_env.proposal)
    "proposal": (),
}
#: the groups that need a proposer (a heuristic asked each round) to encode
PROPOSAL_GROUP = "proposal"
#: every group but ``proposal``, in canonical order: the default observation
DEFAULT_FEATURES: tuple[str, ...] = tuple(g for g in FEATURE_GROUPS if g != PROPOSAL_GROUP)


def check_features(features, name: str = "obs_features") -> tuple[str, ...]:
    """The feature groups ``features`` names (a sequence of group names or one comma-separated
    string; None: every group) in canonical order, without repeats. ValueError (one line naming
    ``name`` and the allowed groups) for an unknown group, an empty selection or one without
    ``base``."""
    if features is None:
        return DEFAULT_FEATURES
    items = features.split(",") if isinstance(features, str) else features
    try:
        names = [str(x).strip() if isinstance(x, str) else x for x in items]
    except TypeError:
        raise ValueError(f"{name} must be a list of feature groups from {list(FEATURE_GROUPS)}, "
                         f"got {features!r}") from None
    names = [x for x in names if x != ""]
    bad = [x for x in names if not isinstance(x, str) or x not in FEATURE_GROUPS]
    if bad:
        raise ValueError(f"{name}: unknown feature group {bad[0]!r}; allowed: {list(FEATURE_GROUPS)}")
    if "base" not in names:
        raise ValueError(f"{name} must include 'base' (the job's size, state and model features and every "
                         f"cluster feature), got {names}; allowed groups: {list(FEATURE_GROUPS)}")
    return tuple(g for g in FEATURE_GROUPS if g in names)


def job_feature_indices(features=None) -> tuple[int, ...]:
    """The per-job feature indices an encoder with these groups keeps, ascending."""
    groups = check_features(features)
    return tuple(sorted(i for g in groups for i in FEATURE_GROUPS[g]))


def job_feature_count(features=None) -> int:
    return len(job_feature_indices(features))


_NOT_QUEUED = (0.0, 0.0, 0.0, 0.0)  # features 22-25 of a job no longer active (an episode's last observation)


def observation_size(window_k: int, features=None, host_slots: int = HOST_SLOTS) -> int:
    """Values in the observation: K window slots and H host slots of job features, then the
    cluster features, then the proposal block when ``features`` has that group."""
    size = (window_k + host_slots) * job_feature_count(features) + CLUSTER_FEATURES
    if PROPOSAL_GROUP in check_features(features):
        size += (window_k + host_slots) * proposal_slot_features(host_slots)
    return size


class ObservationEncoder:
    """Encodes (state, decision under construction) into the fixed-size observation; ``features``
    selects feature groups (module docstring; None: every group)."""

    def __init__(self, window_k: int = 16, observe_remaining: bool = True, features=None,
                 host_slots: int = HOST_SLOTS):
        if window_k < 1:
            raise ValueError(f"window_k must be >= 1, got {window_k}")
        if host_slots < 0:
            raise ValueError(f"host_slots must be >= 0, got {host_slots}")
        self.window_k = window_k
        self.host_slots = host_slots
        self.observe_remaining = observe_remaining
        #: the feature groups of this encoder's observation, in canonical order
        self.features = check_features(features)
        keep = job_feature_indices(self.features)
        #: the per-job features kept per slot
        self.job_features = len(keep)
        # indices of the full observation that this one keeps (None: all of them, no selection)
        self._keep = None if len(keep) == JOB_FEATURES else np.concatenate(
            [np.asarray(keep, dtype=np.intp) + s * JOB_FEATURES for s in range(window_k + host_slots)]
            + [np.arange(CLUSTER_FEATURES, dtype=np.intp) + (window_k + host_slots) * JOB_FEATURES])
        self._static_cache: dict = {}
        self._round_key: tuple | None = None
        self._round_state = None
        self._round_val = None
        self._block: np.ndarray | None = None       # the last window's job blocks (float32)
        self._block_window: list[int] | None = None  # and that window (None: rebuild)
        self._job_consts: dict[int, tuple] = {}     # per job of the state: size/model features
        self._cap_arr = None                         # the last ledger capacity array seen
        self._cap0: float | None = None              # its one value, when all GPUs have the same
        self._rank_ids: dict[int, float] | None = None  # arrival rank features of this round
        self._fill: dict[int, tuple] = {}            # features 22-25 of this round's active jobs
        self._las = LASQueues()                      # the jobs' LAS queue, kept across rounds
        self._las_t: float | None = None             # the time it was last updated (s)
        self._las_rank: dict[int, int] | None = None  # this round's 2D-LAS rank of each active job
        self._las_order: list = []                   # this round's active jobs in 2D-LAS order
        self._rows: dict[int, np.ndarray] = {}      # this round's job rows (float32), made on first use
        #: the proposal block's writer, when the encoder has that group (else None)
        self.proposal = ProposalBlock(host_slots) if PROPOSAL_GROUP in self.features else None

    def reset(self) -> None:
        """Start a new episode: forget the LAS queue's history. The per-round caches follow the
        state object (:meth:`_round_part`); forgetting it makes the next encoding a new round."""
        self._las.reset()
        self._las_t = None
        self._round_state = None

    def las_state_dict(self) -> dict:
        """The LAS queue's bookkeeping (``LASQueues.state_dict``) and when it was last updated,
        as plain data: the only memory the encoder carries between rounds (its other tables are
        caches of one round or one state object)."""
        return {"queues": self._las.state_dict(), "t": self._las_t}

    def load_las_state_dict(self, d: dict) -> None:
        """:meth:`las_state_dict`'s inverse; ValueError (one line naming the field) otherwise."""
        if not isinstance(d, dict) or not (d.get("t") is None or isinstance(d.get("t"), (int, float))):
            raise ValueError("scheduler state: field 'las': expected {\"queues\": ..., \"t\": seconds or null}")
        self._las.load_state_dict(d.get("queues"))
        self._las_t = None if d.get("t") is None else float(d["t"])
        self._round_state = None

    @property
    def size(self) -> int:
        size = (self.window_k + self.host_slots) * self.job_features + CLUSTER_FEATURES
        if self.proposal is not None:
            size += self.proposal.size(self.window_k)
        return size

    def las_rank(self, state: ClusterState) -> dict[int, int]:
        """Each active job's position in this round's 2D-LAS order (0: the highest priority), the
        order of features 19-25, with the queue updated for the round as an encoding does. The
        round builder lists the host slots by it (``RoundBuilder(priority=...)``)."""
        self._round_part(state)
        rank = self._las_rank
        if rank is None:
            rank = self._las_rank = {j.job_id: i for i, j in enumerate(self._las_order)}
        return rank

    def window_rank(self, state: ClusterState, window_order: str) -> dict[int, int]:
        """The ranks a round builder with ``window_order`` takes (``RoundBuilder(priority=...)``):
        :func:`~jigsaw_env.remaining.remaining_rank` (2D-SRTF) for ``remaining``, else
        :meth:`las_rank`, which also updates the LAS queue for the round."""
        if window_order == "remaining":
            return remaining_rank(state)
        return self.las_rank(state)

    def _job_static(self, state: ClusterState, job) -> tuple[float, float, float, float]:
        """Features that depend only on the job's model/size: iteration time, gain, eta, memory."""
        key = (job.model, job.batch_size, job.num_gpus)
        v = self._static_cache.get(key)
        if v is None:
            costs = state.costs
            iso = costs.isolated_iteration_s(job)
            half = min(2, state.spb.max_level)
            table = costs.table(job.model, job.batch_size, state.cluster.main_gpu_type)
            gain = spb_compute_bound(table, half, Pattern.ROTATING, job.num_gpus, state.spb) if half > 0 else 1.0
            gpus = tuple(range(job.num_gpus))
            eta = costs.profile(job, half, Pattern.ROTATING, gpus).eta
            peak = float(costs.worker_peaks(job, 0, Pattern.ROTATING).max())
            mem = peak / state.cluster.memory_of(0)
            v = (math.log1p(iso * 1000) / 10, gain - 1.0, eta, min(mem, 2.0))
            self._static_cache[key] = v
        return v

    def _round_part(self, state: ClusterState) -> tuple[float, float, float]:
        """The cluster features that do not change within a round (waiting/running counts),
        cached for the round: the state changes only between rounds. A new round also makes
        the window's job blocks anew."""
        key = (state.round, state.time_s, len(state.active_ids))
        # the state object itself is held (not its id, which a new episode's state may reuse)
        if self._round_state is state and self._round_key == key:
            return self._round_val
        if self._round_state is not state:
            self._job_consts = {}
        G = state.cluster.num_gpus
        running = JobStatus.RUNNING
        n_wait = gpus_wait = 0
        jobs = state.jobs
        for x in state.active_ids:
            j = jobs[x]
            if j.status is not running:
                n_wait += 1
                gpus_wait += j.num_gpus
        stats = (math.log1p(n_wait) / 8, math.log1p(len(state.active_ids) - n_wait) / 8,
                 min(4.0, gpus_wait / G) / 4)
        self._round_state, self._round_key, self._round_val = state, key, stats
        if self._las_t is not None and state.time_s < self._las_t:
            self._las.reset()  # time went back: another episode, begun without reset()
        if self._las_t != state.time_s:  # once per round (a state rebuilt for the same round: no-op)
            self._las.observe(state)
            self._las_t = state.time_s
        self._rank_ids = None  # the arrival ranks, made when a row first needs them this round
        self._las_rank = None  # the 2D-LAS ranks, likewise
        self._las_order = self._las.order_active(state)
        self._fill = self._las_fill(state)
        self._block_window = None
        self._rows = {}
        return stats

    def _las_fill(self, state: ClusterState) -> dict[int, tuple[float, float, float, float]]:
        """Features 22-25 of every active job (module docstring): walk this round's 2D-LAS order
        (:meth:`LASQueues.order_active` with this encoder's queue) taking each job whose GPUs fit
        in the GPUs left, as ``agents.common.select_by_budget`` does."""
        G = state.cluster.num_gpus
        ahead = 0
        left = G
        skipped = 0
        out = {}
        log1p = math.log1p
        for j in self._las_order:
            n = j.num_gpus
            takes = n <= left
            out[j.job_id] = (min(2.0, ahead / G) / 2, left / G, 1.0 if takes else 0.0, min(1.0, log1p(skipped) / 4))
            ahead += n
            if takes:
                left -= n
            else:
                skipped += 1
        return out

    def _job_row(self, state: ClusterState, jid: int) -> np.ndarray:
        """One job's row (float32, :meth:`_job_row_values`), made once per round: the state does
        not change within a round, and what does (features 2, 3 and 26) is written per step."""
        row = self._rows.get(jid)
        if row is None:
            row = self._rows[jid] = np.array(self._job_row_values(state, jid), dtype=np.float32)
        return row

    def _job_row_values(self, state: ClusterState, jid: int) -> tuple:
        """One job's JOB_FEATURES values, with features 2, 3 and 26 (set per step) zero."""
        j = state.jobs[jid]
        c = self._job_consts.get(jid)
        if c is None:  # what depends only on the job's size, model and the cluster
            G = state.cluster.num_gpus
            c = self._job_consts[jid] = (math.log2(1 + j.num_gpus) / 8, min(1.0, j.num_gpus / G),
                                         *self._job_static(state, j))
        log1p = math.log1p
        ranks = self._rank_ids
        if ranks is None:  # active_ids is in arrival order
            n = len(state.active_ids)
            ranks = self._rank_ids = {x: i / (n - 1) for i, x in enumerate(state.active_ids)} if n > 1 else {}
        since = j.status_start_s
        if since != since:  # NaN: a running job of a state built without either time
            since = j.arrival_s
        if self.observe_remaining:
            rem = log1p(j.remaining * state.costs.isolated_iteration_s(j)) / 16
            frac = j.progress / j.iterations if j.iterations > 0 else 0.0
        else:
            rem = frac = 0.0
        q, service, starve = self._las.job_features(j, state.time_s)
        return (1.0, j.status is JobStatus.RUNNING, 0.0, 0.0, c[0], c[1],
                log1p(max(0.0, state.time_s - j.arrival_s)) / 16, log1p(j.attained_gpu_s) / 20, rem, frac,
                j.level / max(1, state.spb.max_level), j.pattern is Pattern.STATIC, c[2], c[3], c[4], c[5],
                ranks.get(jid, 0.0), log1p(max(0.0, state.time_s - since)) / 16, log1p(j.last_run_s) / 16,
                q, log1p(max(0.0, service)) / 20, starve, *self._fill.get(jid, _NOT_QUEUED), 0.0)

    def encode(self, state: ClusterState, window: list[int], ledger, acted: set[int], steps_in_round: int = 0,
               hosts: list[int] | tuple = (), proposal: Decision | None = None) -> np.ndarray:
        """The observation of the round's state with the decision being built (``ledger``, the
        jobs ``acted`` on this round); ``hosts``: the host slots' jobs, in slot order
        (``RoundBuilder.hosts``; at most H are shown); ``proposal``: the proposer's decision for
        the round, which an encoder with the ``proposal`` group needs (ValueError without it)."""
        obs = self._encode_jobs_and_cluster(state, window, ledger, acted, steps_in_round, hosts)
        if self.proposal is None:
            return obs
        if proposal is None:
            raise ValueError("the observation has the 'proposal' feature group: encode() needs the round's "
                             "proposed decision (proposal=..., the proposer's Decision for this state)")
        block = np.zeros(self.proposal.size(self.window_k), dtype=np.float32)
        win = list(window[:self.window_k])
        host_ids = list(hosts)[:self.host_slots]
        slots = (win + [None] * (self.window_k - len(win)) + host_ids
                 + [None] * (self.host_slots - len(host_ids)))
        self.proposal.write(block, state, proposal, slots, ledger.decision, host_ids)
        return np.concatenate((obs, block))

    def _encode_jobs_and_cluster(self, state: ClusterState, window: list[int], ledger, acted: set[int],
                                 steps_in_round: int, hosts) -> np.ndarray:
        """:meth:`encode`'s job slots and cluster features (everything but the proposal block)."""
        k = self.window_k
        kf = k * JOB_FEATURES
        hf = self.host_slots * JOB_FEATURES
        stats = self._round_part(state)
        win = window[:k]
        w = len(win)
        # the job blocks of the window: made at the round's first step, then only the slots the
        # sliding window changed are rewritten
        prev = self._block_window
        if prev is None or len(prev) != w:
            block = self._block = np.zeros(kf, dtype=np.float32)
            if w:
                block[:w * JOB_FEATURES] = np.concatenate([self._job_row(state, jid) for jid in win])
        else:
            block = self._block
            for slot, jid in enumerate(win):
                if prev[slot] != jid:
                    o = slot * JOB_FEATURES
                    block[o:o + JOB_FEATURES] = self._job_row(state, jid)
        self._block_window = win
        obs = np.empty(kf + hf + CLUSTER_FEATURES, dtype=np.float32)
        obs[:kf] = block
        obs[kf:kf + hf] = 0.0
        self._host_rows(state, obs, kf, hosts, ledger, acted)
        in_dec = ledger.decision
        G = state.cluster.num_gpus
        n_free = ledger.num_with_workers(0)
        n_one = ledger.num_with_workers(1)
        wl = ledger.workers_per_gpu if n_free + n_one < G else None  # workers per GPU, when any GPU is shared
        o = 2
        for jid in win:  # features 2, 3 and 26 are 0.0 in the block
            jd = in_dec.get(jid)
            if jd is not None:
                obs[o] = 1.0
                if wl is not None:
                    for g in jd.gpus:
                        if wl[g] > 1:
                            obs[o + 24] = 1.0
                            break
            if jid in acted:
                obs[o + 1] = 1.0
            o += JOB_FEATURES
        cap_w = state.max_workers_per_gpu
        # GPUs under the worker cap (workers are never negative: a count of each value below it)
        n_open = n_free + n_one if cap_w == 2 else sum(ledger.num_with_workers(v) for v in range(cap_w))
        n_shared = G - n_free - n_one
        if n_free < G:
            cap = ledger.capacity
            if cap is not self._cap_arr:
                self._cap_arr, self._cap0 = cap, (float(cap[0]) if cap.size and (cap == cap[0]).all() else None)
            if self._cap0 is not None:
                # one capacity: the occupied GPUs' bytes over their capacity. Memory is whole bytes
                # (CostTable.process_peak_bytes is an integer) and a GPU without workers holds exactly
                # 0.0, so the sum over every GPU is the occupied GPUs' sum, exact in any order, and
                # cap0 x GPUs is exact too (capacities are whole bytes): one rounding, the correctly
                # rounded mean. Python's sum of the list mirror up to 256 GPUs (faster there than
                # numpy's call), numpy's above
                total = sum(ledger.bytes_per_gpu) if G <= 256 else float(np.add.reduce(ledger.mem))
                mem_use = total / (self._cap0 * (G - n_free))
            else:
                occ = ledger.workers > 0
                mem_use = float(np.add.reduce(ledger.mem[occ] / cap[occ])) / (G - n_free)
        else:
            mem_use = 0.0
        obs[kf + hf:] = (n_free / G, n_open / G, n_shared / G, mem_use, *stats,
                    len(acted) / k, min(1.0, steps_in_round / (2 * k + 2)), min(len(window), k) / k)
        if self._keep is not None:
            return obs[self._keep]
        return obs

    def _host_rows(self, state: ClusterState, obs: np.ndarray, start: int, hosts, ledger, acted: set[int]) -> None:
        """Write the host slots' job rows from ``obs[start]`` on: each host's features as a window
        slot's, with feature 2 (in the decision) set, 3 as the job was acted on this round, and 26
        zero (a host is alone on its GPUs)."""
        o = start
        for hid in list(hosts)[: self.host_slots]:
            obs[o:o + JOB_FEATURES] = self._job_row(state, hid)
            obs[o + 2] = 1.0 if hid in ledger.decision else 0.0
            obs[o + 3] = 1.0 if hid in acted else 0.0
            o += JOB_FEATURES
