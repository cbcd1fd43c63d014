"""The control plane of the live executor: a versioned decision store, and the worker loop that
reads it at every iteration boundary (docs/deploy.md section 2).

**Store.** :class:`ControlHub` is a Ray actor (detached and named, namespace ``"jigsaw"``: it
outlives the scheduler process that created it). It holds, per run and job, the latest
*versioned* decision record, the scheduler's state snapshot, and hosts a
``torch.distributed.TCPStore`` (OS-chosen port) that is the wire between the scheduler and the
workers: a Ray actor call costs about a millisecond, a store read tens of microseconds, which is
what a per-iteration read can afford. Every key is under the run's prefix (``PrefixStore``).
The store listens only on the hub's node address as Ray knows it (loopback for an embedded Ray),
and decision records are sealed with the run's secret token (:mod:`jigsaw_executor.store_seal`:
encrypted and authenticated; the token reaches the workers as a Ray actor argument), so a client
without the token can neither read nor forge them (docs/security.md).

Keys (all JSON unless said otherwise)::

    ctl/{job}                the job's latest decision record (below), sealed with the run's token
    npub/{job}               publication counter (int, TCPStore ``add``)
    pub/{job}/{seq}          "1" once publication ``seq`` is in ``ctl/{job}`` (workers ``wait`` on it)
    pg/{job}/{inc}/...       the job incarnation's gloo rendezvous (torch's own keys)
    ready/{job}/{inc}        rank 0 after setup: next iteration, setup seconds, loaded state hash
    lk/{round}.{comp}/{k}/.. the lockstep barrier of a co-location component at step k
    lk/{round}.{comp}/abort  set by the executor when a member failed: the others hold
    rep/{job}/{inc}/{round}/{rank}   a rank's iteration reports of one round (segment)
    fin/{job}/{inc}          rank 0 when the incarnation ends: paused / done / stopped, hash, accuracy
    err/{job}/{inc}/{rank}   a failed rank's error: type, message, traceback, iteration
    rcv/{job}/{inc}/{gen}/{rank}, rcvn/{job}/{inc}/{gen}   partial recovery: a surviving rank whose
                             collective failed asks to continue as process-group generation gen
    rgo/{job}/{inc}/{gen}    the executor's answer: the source rank, or abort
    rok/{job}/{inc}/{gen}    rank 0 once generation gen runs: iteration, wall time, state bytes
    inj/{job}/{idx}          fault injection idx has fired (each fires once per run)

A decision record: ``{v, seq, job, round, inc, action, gpus, level, pattern, comp, comp_size,
steps, finish_at}``. ``action`` is ``run`` (step), ``hold`` (stop at the next iteration boundary,
report the round, wait for the next record), ``pause`` (checkpoint to disk and exit) or ``stop``
(exit without a checkpoint). ``finish_at``: the iteration at which the job has done its work (the
executor computes it from the remaining progress and eta, as the simulator does). ``steps``: a
fixed number of steps for this round (``-1``: until a ``hold``).

**Worker loop** (:func:`run_worker`, one per rank of a job incarnation, inside a
:class:`~jigsaw_executor.cluster_ray.SlotHost` actor on the rank's slot). At every iteration
boundary job rank 0 reads its decision record and decides what comes next (between rounds from
the store; inside a round from a copy that a watcher thread keeps current by waiting on the
store for the next publication, so a new record is seen at the first boundary after it is
published without a store round trip per iteration); a tiny gloo broadcast of six
integers (command, level, pattern, publication, round, spare) gives every rank the same decision,
so level and pattern changes take effect at the next iteration on every rank together. Commands:
STEP (one :meth:`SPBTrainer.step` at the record's level and pattern), HOLD (write this round's
reports, then look again), WAIT (every rank waits on the store for the next publication: no gloo
call is pending, so a long wait never hits the collective timeout), PAUSE (collective checkpoint,
exit), DONE (checkpoint, held-out accuracy, exit), STOP.

**Lockstep.** Jobs that share slots form a component (the record's ``comp`` and ``comp_size``);
their rank 0s meet at a store barrier before every step, so they advance one iteration each per
step, as the simulator's engine assumes (docs/simulator.md section 4). The last to arrive decides
for everyone whether the component steps or holds (a hold seen by any member holds all, so a
round ends at the same step for all of them) and how many members the next step has (a member
whose work is done leaves through the barrier). A single job skips the store barrier.

**Failures.** A rank that raises writes ``err/...`` and exits its process (``os._exit``: its state
may be broken; the host actor restarts). A rank whose collective failed because of a peer (a
connection closed, a timeout) writes ``err/...`` too, but drops the broken process group and
returns the error instead, so its host stays warm for the job's next incarnation. Its peers' next collective fails after
the process-group timeout, and lockstep partners' barrier waits after the store timeout, so no
path hangs; the executor names the root-cause rank (the first error that is not a peer-failure
symptom) as the launcher does, and restarts the job (docs/executor.md, "Fault tolerance").

**Checkpoints** every ``checkpoint_every`` iterations (collective, durable: the previous one stays
loadable until the new one is complete), besides the ones at pause and done.

**Partial recovery** (``recovery="partial"``, CPR-style): a rank whose collective fails because a
peer died does not exit. It writes ``rcv`` (the iteration it has completed), drops its process
group and waits for ``rgo``; the executor starts a replacement for each dead rank, which joins the
job's next process-group generation (``pg/{job}/{inc}/g{gen}/``); the source rank (the survivor
that got furthest, lowest rank on ties) sends its weights and optimizer state to every rank
(:meth:`SPBTrainer.broadcast_state`), and the job goes on from there without rolling back. Steps
are transactional (a step that fails before its optimizer update leaves the replica as it was),
so the failed iteration is simply run again.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

from jigsaw_env.network import INTRA_NODE, Link
from jigsaw_env.spb import Pattern, SPBConfig

from .peer_failure import is_peer_failure
from .store_seal import RecordSeal

__all__ = ["ControlHub", "WorkerSpec", "run_worker", "Keys", "FastDigits", "CMD_NAMES", "ACTIONS",
           "read_json", "read_record", "wait_key"]

ACTIONS = ("run", "hold", "pause", "stop")
CMD_STEP, CMD_HOLD, CMD_WAIT, CMD_PAUSE, CMD_DONE, CMD_STOP = range(6)
CMD_NAMES = ("step", "hold", "wait", "pause", "done", "stop")
PATTERN_CODE = {"rotating": 0, "static": 1}
CODE_PATTERN = {0: "rotating", 1: "static"}


class Keys:
    """Store key names (module docstring); all relative to the run's prefix."""

    @staticmethod
    def ctl(j: int) -> str:
        return f"ctl/{j}"

    @staticmethod
    def npub(j: int) -> str:
        return f"npub/{j}"

    @staticmethod
    def pub(j: int, seq: int) -> str:
        return f"pub/{j}/{seq}"

    @staticmethod
    def pg(j: int, inc: int) -> str:
        return f"pg/{j}/{inc}/"

    @staticmethod
    def ready(j: int, inc: int) -> str:
        return f"ready/{j}/{inc}"

    @staticmethod
    def rep(j: int, inc: int, rnd: int, rank: int) -> str:
        return f"rep/{j}/{inc}/{rnd}/{rank}"

    @staticmethod
    def fin(j: int, inc: int) -> str:
        return f"fin/{j}/{inc}"

    @staticmethod
    def err(j: int, inc: int, rank: int) -> str:
        return f"err/{j}/{inc}/{rank}"

    @staticmethod
    def lk(seg: str, k: int) -> str:
        return f"lk/{seg}/{k}"

    @staticmethod
    def lk_abort(seg: str) -> str:
        return f"lk/{seg}/abort"

    @staticmethod
    def rcv(j: int, inc: int, gen: int, rank: int) -> str:
        return f"rcv/{j}/{inc}/{gen}/{rank}"

    @staticmethod
    def rcvn(j: int, inc: int, gen: int) -> str:
        return f"rcvn/{j}/{inc}/{gen}"

    @staticmethod
    def rgo(j: int, inc: int, gen: int) -> str:
        return f"rgo/{j}/{inc}/{gen}"

    @staticmethod
    def rok(j: int, inc: int, gen: int) -> str:
        return f"rok/{j}/{inc}/{gen}"

    @staticmethod
    def inj(j: int, idx: int) -> str:
        return f"inj/{j}/{idx}"


def read_json(store, key: str) -> Any | None:
    """The JSON value at ``key``, or None if the key is absent (never blocks)."""
    if not store.check([key]):
        return None
    return json.loads(store.get(key))


def read_record(store, key: str, seal) -> Any | None:
    """The decision record at ``key`` opened with the run's :class:`~jigsaw_executor.store_seal.RecordSeal`,
    or None if absent; ForgedRecord (a ValueError) if it was not sealed with the run's token."""
    if not store.check([key]):
        return None
    return seal.open(key, store.get(key))


def wait_key(store, key: str, timeout_s: float) -> None:
    store.wait([key], timedelta(seconds=float(timeout_s)))


def _node_address() -> str:
    """The address of this node as Ray knows it (the hub actor's own node)."""
    import ray

    return str(ray.util.get_node_ip_address())


def _listening_socket(host: str):
    """A TCP socket bound to ``host`` on an OS-chosen port and listening (the store's server
    takes it over, ``master_listen_fd``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.listen(512)
    return sock


# --------------------------------------------------------------------------------------------
# the store (a Ray actor; created by jigsaw_executor.cluster_ray)
# --------------------------------------------------------------------------------------------
class ControlHub:
    """The versioned decision store and state store of the live executor (module docstring).

    Wrapped with ``ray.remote`` by :func:`jigsaw_executor.cluster_ray.get_or_create_hub` (detached,
    named, ``num_cpus=0``). Several runs may share one hub: everything is keyed by ``run_id``.
    """

    def __init__(self, advertise_host: str | None = None):
        import torch.distributed as dist

        # the server listens on one address only, the one clients connect to: the node address
        # Ray uses (loopback for an embedded Ray), never every interface
        self.host = advertise_host or _node_address()
        self._listener = _listening_socket(self.host)
        self.port = int(self._listener.getsockname()[1])
        self._server = dist.TCPStore(self.host, self.port, None, True, timeout=timedelta(seconds=60),
                                     wait_for_workers=False, master_listen_fd=self._listener.fileno())
        self._runs: dict[str, dict[str, Any]] = {}

    def address(self) -> tuple[str, int]:
        """(host, port) the store listens on and clients connect to."""
        return self.host, self.port

    def open_run(self, run_id: str, token: str) -> str:
        """Register the run's secret token (decision records are sealed with it,
        :mod:`jigsaw_executor.store_seal`). The first token registered for a run stays: a
        restarted scheduler gets it back here and hands it to its workers. Returns the run's token."""
        r = self._run(run_id)
        if r["token"] is None:
            r["seal"], r["token"] = RecordSeal(token), token
        return r["token"]

    def pid(self) -> int:
        return os.getpid()

    def _run(self, run_id: str) -> dict[str, Any]:
        r = self._runs.get(run_id)
        if r is None:
            import torch.distributed as dist

            r = self._runs[run_id] = {"version": 0, "decisions": {}, "snapshot": None, "published": 0,
                                      "store": dist.PrefixStore(run_id + "/", self._server),
                                      "token": None, "seal": None}
        return r

    def publish(self, run_id: str, records: dict) -> int:
        """Store a new version of the given jobs' decision records and wake their workers.
        Returns the version number (one per call, shared by every record of the call)."""
        r = self._run(run_id)
        if r["seal"] is None:
            raise ValueError(f"run {run_id}: no secret token registered (ControlHub.open_run first)")
        r["version"] += 1
        v = r["version"]
        st = r["store"]
        for jid, rec in records.items():
            jid = int(jid)
            if rec.get("action") not in ACTIONS:
                raise ValueError(f"job {jid}: unknown action {rec.get('action')!r}; allowed: {list(ACTIONS)}")
            seq = int(st.add(Keys.npub(jid), 1))
            full = dict(rec, v=v, seq=seq, job=jid)
            r["decisions"][jid] = full
            st.set(Keys.ctl(jid), r["seal"].seal(Keys.ctl(jid), full))
            st.set(Keys.pub(jid, seq), "1")
        r["published"] += 1
        return v

    def version(self, run_id: str) -> int:
        return int(self._run(run_id)["version"])

    def decision(self, run_id: str, job_id: int) -> dict | None:
        return self._run(run_id)["decisions"].get(int(job_id))

    def decisions(self, run_id: str) -> dict:
        return dict(self._run(run_id)["decisions"])

    def put_snapshot(self, run_id: str, snapshot: dict) -> None:
        """The scheduler's persisted state (a JSON-able dict), kept where a restarted scheduler
        finds it."""
        self._run(run_id)["snapshot"] = snapshot

    def get_snapshot(self, run_id: str) -> dict | None:
        r = self._runs.get(run_id)
        return None if r is None else r["snapshot"]

    def runs(self) -> list[str]:
        return sorted(self._runs)

    def forget(self, run_id: str) -> None:
        self._runs.pop(run_id, None)


# --------------------------------------------------------------------------------------------
# worker side
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WorkerSpec:
    """Everything one rank of one job incarnation needs (picklable; sent to a SlotHost).

    fail_at: fault injection for tests: ``(rank, iteration, mode[, repeat])`` or a tuple of them;
        mode ``"raise"``, ``"hang"``, ``"exit"`` (as :func:`jigsaw_executor.launcher.run_job_local`)
        or ``"kill"`` (SIGKILL of the worker's own process). Each fires at the start of that
        iteration, once per run (a store key marks it), or in every incarnation with ``repeat``.
    checkpoint_every: save a checkpoint every this many iterations (0: only at pause and done).
    recovery: ``"full"`` (a rank that sees a peer fail exits; the executor restarts the job from its
        checkpoint) or ``"partial"`` (it waits for a replacement and goes on; module docstring).
    recover_gen: > 0 for a replacement rank: join process-group generation ``recover_gen`` and copy
        the state from the source rank named by ``rgo``.
    count_loopback: count the loopback interface's bytes around every gradient sync
        (``SPBTrainer(count_loopback=True)``; ``jigsaw_executor.transport``).
    """

    run_id: str
    job_id: int
    incarnation: int
    rank: int
    world: int
    slot: int
    model: str
    batch_size: int
    store_host: str
    store_port: int
    checkpoint_dir: str
    #: the run's secret (ControlHub.open_run): decision records are opened with it; never printed
    store_token: str = field(default="", repr=False)
    data: str = "digits"
    seed: int = 0
    lr: float | None = None
    model_kwargs: tuple = ()
    spb: SPBConfig = field(default_factory=SPBConfig)
    average_over: str | None = None
    link: Link = INTRA_NODE
    timeout_s: float = 60.0
    hold_timeout_s: float = 600.0
    measure_activations: bool = True
    threads: int = 1
    evaluate: bool = True
    fail_at: tuple | None = None
    exit_on_error: bool = True
    checkpoint_every: int = 0
    recovery: str = "full"
    recover_gen: int = 0
    count_loopback: bool = False

    def injections(self) -> list[tuple[int, int, str, bool, int]]:
        """``fail_at`` as a list of ``(rank, iteration, mode, repeat, index)``."""
        if not self.fail_at:
            return []
        items = [self.fail_at] if not isinstance(self.fail_at[0], (tuple, list)) else list(self.fail_at)
        return [(int(x[0]), int(x[1]), str(x[2]), bool(x[3]) if len(x) > 3 else False, i) for i, x in enumerate(items)]


class FastDigits:
    """:class:`jigsaw_executor.data.DigitsData` batches, with the split and each epoch's
    permutation computed once instead of at every call (the same batches, bit for bit: tested)."""

    def __init__(self, seed: int, world: int, batch_size: int):
        from .data import DigitsData, digits_arrays, mix_seed

        self.data = DigitsData(seed=seed)
        self.x, self.y = digits_arrays()
        self.train, _ = self.data.split()
        self.world, self.bs = int(world), int(batch_size)
        self.ipe = self.data.iterations_per_epoch(self.world, self.bs)
        self._mix = mix_seed
        self._epoch, self._perm = None, None

    def __call__(self, t: int, rank: int):
        import torch

        epoch, pos = divmod(int(t), self.ipe)
        if epoch != self._epoch:
            self._perm = np.random.default_rng(self._mix(self.data.seed, 0xE90C, epoch)).permutation(len(self.train))
            self._epoch = epoch
        start = pos * self.world * self.bs + rank * self.bs
        idx = self.train[self._perm[start:start + self.bs]]
        return torch.from_numpy(self.x[idx]), torch.from_numpy(self.y[idx])


def _compact(rep, t: int, wall: float) -> dict:
    """One iteration of one rank, as it goes into the reports (IterationReport, short keys)."""
    return {"t": t, "lvl": rep.level, "pat": rep.pattern, "sg": rep.start_group, "loss": rep.loss,
            "step_s": rep.step_s, "fwd_s": rep.forward_s, "bwd_s": rep.backward_s, "sync_s": rep.sync_s,
            "opt_s": rep.optimizer_s, "bytes": rep.bytes_sent, "wire": rep.bytes_on_wire_total,
            "buf_bytes": rep.buffer_bytes_sent, "by": rep.bytes_by_collective, "act": rep.peak_activation_bytes,
            "wall": wall, "iter_s": None, "lo": rep.loopback_bytes}


class _Worker:
    def __init__(self, spec: WorkerSpec, store):
        self.s = spec
        self.st = store
        self.rank = spec.rank
        self.world = spec.world
        self.jid = spec.job_id
        self.inc = spec.incarnation

        self.seal = RecordSeal(spec.store_token)  # ValueError without the run's token
        # segment (one round of one component) state, rank 0
        self.in_seg = False
        self.seg: tuple[int, int] | None = None
        self.closed_round = -1
        self.k = 0
        self.size = 1
        self.budget = -1
        self.round = -1
        self.records: list[dict] = []
        self.cached: dict | None = None   # the newest decision record seen (rank 0)
        self._watch_stop = None
        # what every rank knows of the segment from the commands it received (a replacement rank
        # 0 takes it over from its source in partial recovery)
        self.mirror = {"open": False, "round": -1, "k": 0, "closed": -1}
        self.pending: tuple | None = None  # rank 0: the command decided and not yet carried out
        self.gen = int(spec.recover_gen)    # process-group generation (partial recoveries)
        self.t = 0                          # the next iteration to run
        self.finishing = False
        self.model = self.optimizer = self.trainer = None
        self.recovered: dict | None = None

        self._lock = threading.Lock()

    # ----- rank 0: what comes next -----
    def _leave(self, done: bool = True) -> None:
        if self.in_seg and self.size > 1:
            self._barrier(hold=False, leaving=True)
        self.in_seg = False

    def _barrier(self, hold: bool, leaving: bool) -> dict | None:
        seg = f"{self.seg[0]}.{self.seg[1]}"
        st, base, abort = self.st, Keys.lk(seg, self.k), Keys.lk_abort(seg)
        if st.check([abort]):  # a member of the component failed: everyone holds until the next round
            return None if leaving else {"hold": True, "size": self.size}
        if hold:
            st.set(base + "/hold", "1")
        if leaving:
            st.add(base + "/leave", 1)
        n = int(st.add(base + "/n", 1))
        if n == self.size:
            h = hold or st.check([base + "/hold"])
            left = int(st.add(base + "/leave", 0))
            st.set(base + "/go", json.dumps({"hold": bool(h), "size": self.size - left}))
        if leaving:
            return None
        deadline = time.time() + self.s.timeout_s
        while True:
            try:
                wait_key(st, base + "/go", min(1.0, max(0.01, deadline - time.time())))
                break
            except Exception as e:  # noqa: BLE001 - DistStoreError on a wait timeout
                if st.check([base + "/go"]):
                    break
                if st.check([abort]):
                    return {"hold": True, "size": self.size}
                if time.time() >= deadline:
                    raise TimeoutError(f"lockstep barrier {base}: partners did not arrive within "
                                       f"{self.s.timeout_s:.0f} s") from e
        return json.loads(st.get(base + "/go"))

    # ----- rank 0: the decision record, kept current by a watcher thread -----
    def _offer(self, ctl: dict) -> None:
        with self._lock:
            if self.cached is None or int(ctl["seq"]) > int(self.cached["seq"]):
                self.cached = ctl

    def _start_watcher(self) -> None:
        """A thread that waits on the store for the job's next publication and reads it as soon
        as it is set (TCPStore ``wait`` is answered by the server when the key appears, and
        releases the GIL), so the iteration loop reads its decision from memory: a store round
        trip per iteration costs milliseconds when the slots' cores are busy and the store's
        process waits for CPU."""
        self._watch_stop = threading.Event()
        st = connect_store(self.s.store_host, self.s.store_port, self.s.run_id, self.s.timeout_s)
        stop = self._watch_stop

        def loop() -> None:
            nxt = int(self.cached["seq"]) + 1
            while not stop.is_set():
                try:
                    wait_key(st, Keys.pub(self.jid, nxt), 1.0)
                    ctl = self.seal.open(Keys.ctl(self.jid), st.get(Keys.ctl(self.jid)))
                except Exception as e:  # noqa: BLE001 - a wait timeout: look again; else back off
                    if "timeout" not in str(e).lower():
                        time.sleep(0.2)
                    continue
                self._offer(ctl)
                nxt = max(nxt, int(ctl["seq"])) + 1

        threading.Thread(target=loop, daemon=True, name=f"jigsaw-ctl-{self.jid}-{self.inc}").start()

    def stop_watcher(self) -> None:
        if self._watch_stop is not None:
            self._watch_stop.set()

    def decide(self, t: int) -> tuple[int, int, int, int, int]:
        """(command, level, pattern code, publication seq, round). Inside a round the record
        comes from the watcher's copy (no store round trip); between rounds it is read from the
        store."""
        if self.in_seg and self.cached is not None:
            ctl = self.cached
        else:
            fresh = read_record(self.st, Keys.ctl(self.jid), self.seal)
            if fresh is None:
                return CMD_WAIT, 0, 0, 0, self.round
            self._offer(fresh)
            ctl = self.cached
            if self._watch_stop is None:
                self._start_watcher()
        seq = int(ctl["seq"])
        if int(ctl["inc"]) > self.inc:
            self._leave()
            return CMD_STOP, 0, 0, seq, self.round
        if int(ctl["inc"]) < self.inc:
            return CMD_WAIT, 0, 0, seq, self.round
        act = ctl["action"]
        rnd = int(ctl["round"])
        if act in ("stop", "pause"):
            # reports go under the round being stepped, or the record's round if between rounds
            report_round = self.round if self.in_seg else rnd
            self._leave()
            return (CMD_STOP if act == "stop" else CMD_PAUSE), 0, 0, seq, report_round
        seg = (rnd, int(ctl["comp"]))
        if not self.in_seg:
            if rnd <= self.closed_round:
                return CMD_WAIT, 0, 0, seq, self.round
            # a new round: open its segment. A "hold" may come before the first step (a slow
            # start-up): the segment is opened anyway and held at step 0, so the round gets its
            # (empty) report and lockstep partners waiting at step 0 are released with it
            self.in_seg, self.seg, self.k = True, seg, 0
            self.size, self.budget, self.round = int(ctl["comp_size"]), int(ctl.get("steps", -1)), rnd
        done = t >= int(ctl["finish_at"])
        hold = act == "hold" or (0 <= self.budget <= self.k) or seg != self.seg
        level, pat = int(ctl["level"]), PATTERN_CODE[Pattern.parse(ctl["pattern"]).value]
        if self.size > 1:
            go = self._barrier(hold=hold, leaving=done)
        else:
            go = {"hold": hold, "size": 1}
        if done:
            self.in_seg = False
            return CMD_DONE, level, pat, seq, self.round
        if go["hold"]:
            self.in_seg = False
            self.closed_round = self.seg[0]
            return CMD_HOLD, level, pat, seq, self.round
        self.size = int(go["size"])
        self.k += 1
        return CMD_STEP, level, pat, seq, self.round

    def _catch_up_report(self, mirror: dict) -> None:
        """A replacement rank: if its predecessor died after its round was held but before it
        wrote that round's report, write it (empty: those iterations' reports died with it; the
        survivors' reports stand for the job), so the executor is not left waiting for it."""
        closed = int(mirror["closed"])
        if closed >= 0 and not self.st.check([Keys.rep(self.jid, self.inc, closed, self.rank)]):
            self.write_report(closed)

    def _take_over_segment(self, mirror: dict) -> None:
        """A replacement rank 0 continues the segment its predecessor had open (partial recovery)."""
        self.mirror = dict(mirror)
        self.closed_round = int(mirror["closed"])
        self.round = int(mirror["round"])
        if mirror["open"]:
            ctl = read_record(self.st, Keys.ctl(self.jid), self.seal)
            if ctl is not None and int(ctl["round"]) == self.round:
                self._offer(ctl)
                self._start_watcher()
                self.in_seg, self.k = True, int(mirror["k"])
                self.seg = (self.round, int(ctl["comp"]))
                self.size, self.budget = 1, int(ctl.get("steps", -1))

    # ----- all ranks -----
    def write_report(self, rnd: int) -> None:
        self.st.set(Keys.rep(self.jid, self.inc, rnd, self.rank),
                    json.dumps({"rank": self.rank, "slot": self.s.slot, "pid": os.getpid(), "round": rnd,
                                "gen": self.gen, "iterations": self.records}))
        self.records = []

    def _init_group(self) -> None:
        import torch.distributed as dist

        if self.world > 1:
            prefix = Keys.pg(self.jid, self.inc) + (f"g{self.gen}/" if self.gen else "")
            dist.init_process_group("gloo", store=dist.PrefixStore(prefix, self.st), rank=self.rank,
                                    world_size=self.world, timeout=timedelta(seconds=self.s.timeout_s))

    def _make_trainer(self, sync_initial_state: bool):
        from .spb_worker import SPBTrainer

        s = self.s
        self.trainer = SPBTrainer(self.model, self.optimizer, spb_config=s.spb, average_over=s.average_over,
                                  link=s.link, measure_activations=s.measure_activations, timeout_s=s.timeout_s,
                                  sync_initial_state=sync_initial_state, transactional=s.recovery == "partial",
                                  count_loopback=s.count_loopback)
        return self.trainer

    def _inject(self, t: int) -> None:
        for rank, it, mode, repeat, idx in self.s.injections():
            if rank == self.rank and it == t and (repeat or int(self.st.add(Keys.inj(self.jid, idx), 1)) == 1):
                _inject(mode, self.rank, t)

    def peer_failure(self, e: BaseException) -> bool:
        """Did ``e`` come from a peer that died or stalled (a collective or a barrier failing), not
        from this rank itself?"""
        if self.world < 2 or not isinstance(e, Exception) or "injected failure" in str(e):
            return False

        import torch.distributed as dist

        return isinstance(e, dist.DistError) or is_peer_failure({"type": type(e).__name__, "message": str(e)})

    def _recoverable(self, e: BaseException) -> bool:
        return self.s.recovery == "partial" and not self.finishing and self.peer_failure(e)

    def _recover(self, e: BaseException) -> None:
        """A collective failed because a peer died or stalled: ask for partial recovery, wait for
        the executor's answer, join the next process-group generation, copy the source's state."""
        import torch.distributed as dist

        t_fail = time.time()
        t_done = self.t + 1 if self.trainer.completed_iteration == self.t else self.t
        self.gen += 1
        self.st.set(Keys.rcv(self.jid, self.inc, self.gen, self.rank),
                    json.dumps({"rank": self.rank, "t_done": t_done, "pid": os.getpid(), "wall": t_fail,
                                "error": f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}",
                                "mirror": self.mirror}))
        self.st.add(Keys.rcvn(self.jid, self.inc, self.gen), 1)
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - a broken group: nothing left to tear down
            pass
        go = self._wait_go()
        self._join(go, t_done)

    def _wait_go(self) -> dict:
        try:
            wait_key(self.st, Keys.rgo(self.jid, self.inc, self.gen), self.s.hold_timeout_s)
        except Exception as e:  # noqa: BLE001
            raise TimeoutError(f"job {self.jid}: no recovery decision for {self.s.hold_timeout_s:.0f} s") from e
        go = json.loads(self.st.get(Keys.rgo(self.jid, self.inc, self.gen)))
        if go.get("abort"):
            raise RuntimeError(f"job {self.jid}: partial recovery abandoned by the executor ({go.get('why')})")
        return go

    def _join(self, go: dict, t_done: int) -> None:
        """Generation ``self.gen``: a new process group; every rank takes the source's state."""
        t0 = time.time()
        self._init_group()
        self._make_trainer(sync_initial_state=False)
        src = int(go["src"])
        extra, nbytes = self.trainer.broadcast_state(src, {"t": t_done, "mirror": self.mirror})
        if self.s.recover_gen == self.gen and self.rank == 0:
            self._take_over_segment(extra["mirror"])
        self.t = int(extra["t"])
        self.trainer.completed_iteration = self.t - 1
        self.recovered = {"gen": self.gen, "t": self.t, "src": src, "state_bytes": nbytes}
        if self.rank == 0:
            self.st.set(Keys.rok(self.jid, self.inc, self.gen),
                        json.dumps({"t": self.t, "wall": time.time(), "join_s": time.time() - t0, "src": src,
                                    "state_bytes": nbytes, "hash": self.trainer.state_hash(),
                                    "replacement": self.s.recover_gen == self.gen}))

    def _start(self, t_setup: float):
        """Set up this rank: the process group, the model and optimizer (the same construction as
        ``jigsaw_executor.launcher._run_worker``: same seeds, same order), their state (from a
        peer for a replacement rank, else from the job's checkpoint when there is one), and the
        batches; rank 0 writes the ready record. Returns (the batch function, the hash of the
        state loaded from a checkpoint or None)."""
        import torch

        from .data import make_batch_fn, mix_seed
        from .models import build_executor_model
        from .spb_worker import read_checkpoint_meta

        s = self.s
        torch.set_num_threads(s.threads)
        go = self._wait_go() if s.recover_gen else None
        self._init_group()
        # no try/finally: after a failure the process exits (run_worker); tearing down a broken
        # process group could block
        # the same construction as jigsaw_executor.launcher._run_worker (same seeds, same order)
        torch.manual_seed(s.seed)
        model = build_executor_model(s.model, **dict(s.model_kwargs))
        if s.lr is not None:
            model.lr = s.lr
        self.model = model.train()
        self.optimizer = self.model.make_optimizer()
        if go is not None:  # a replacement rank (partial recovery): the state comes from a peer
            self._make_trainer(sync_initial_state=False)
            torch.manual_seed(mix_seed(s.seed, 0xD40, s.rank))
            extra, nbytes = self.trainer.broadcast_state(int(go["src"]), {})
            self.mirror = dict(extra["mirror"])
            self._catch_up_report(extra["mirror"])
            if s.rank == 0:
                self._take_over_segment(extra["mirror"])
            self.t = int(extra["t"])
            self.trainer.completed_iteration = self.t - 1
            loaded = None
            if s.rank == 0:
                self.st.set(Keys.rok(self.jid, self.inc, self.gen),
                            json.dumps({"t": self.t, "wall": time.time(), "join_s": time.time() - t_setup,
                                        "src": int(go["src"]), "state_bytes": nbytes,
                                        "hash": self.trainer.state_hash(), "replacement": True}))
        else:
            self._make_trainer(sync_initial_state=True)
            torch.manual_seed(mix_seed(s.seed, 0xD40, s.rank))
            loaded = None
            if read_checkpoint_meta(s.checkpoint_dir) is not None:
                self.t = self.trainer.load_checkpoint(s.checkpoint_dir)
                loaded = self.trainer.state_hash()
        batch = FastDigits(s.seed, s.world, s.batch_size) if s.data == "digits" else \
            make_batch_fn(s.data, self.model, s.seed, s.world, s.batch_size)
        ready = time.time()
        if s.rank == 0 and go is None:
            self.st.set(Keys.ready(self.jid, self.inc),
                        json.dumps({"t": self.t, "wall": ready, "setup_s": ready - t_setup, "loaded_hash": loaded,
                                    "pid": os.getpid()}))
        return batch, loaded

    def _step(self, batch, lv: int, pt: int, rnd: int) -> dict:
        """One iteration at level ``lv`` and pattern code ``pt`` in round ``rnd`` (a checkpoint
        after it every ``checkpoint_every`` iterations); its compact report record."""
        s = self.s
        mirror = self.mirror
        if not mirror["open"] or mirror["round"] != rnd:
            mirror.update(open=True, round=rnd, k=0)
        mirror["k"] += 1
        t = self.t
        if s.fail_at is not None:
            self._inject(t)
        wall = time.time()
        rep = self.trainer.step(batch(t, s.rank), t, lv, CODE_PATTERN[pt])
        rec = _compact(rep, t, wall)
        self.records.append(rec)
        self.t = t + 1
        if s.checkpoint_every and self.t % s.checkpoint_every == 0:
            c0 = time.perf_counter()
            self.trainer.save_checkpoint(s.checkpoint_dir, self.t)
            rec["ckpt_s"] = time.perf_counter() - c0
        return rec

    def _end(self, c: int, rnd: int, loaded: str | None) -> str:
        """The incarnation ends (command ``c``: pause, done or stop): the final checkpoint (pause,
        done), the held-out accuracy (done), rank 0's end record, the last report and a barrier.
        Returns the status."""
        s = self.s
        status = {CMD_PAUSE: "paused", CMD_DONE: "done", CMD_STOP: "stopped"}[c]
        end_wall = time.time()
        if c in (CMD_PAUSE, CMD_DONE):
            self.trainer.save_checkpoint(s.checkpoint_dir, self.t)
        acc = None
        if c == CMD_DONE and s.evaluate and s.data == "digits" and s.rank == 0:
            from .data import DigitsData

            acc = DigitsData(seed=s.seed).accuracy(self.model)
        self.finishing = True
        if s.rank == 0:  # before the reports: whoever sees rank 0's report sees this
            self.st.set(Keys.fin(self.jid, self.inc),
                        json.dumps({"status": status, "t": self.t, "wall": end_wall,
                                    "hash": self.trainer.state_hash(), "accuracy": acc,
                                    "loaded_hash": loaded, "round": rnd, "gen": self.gen}))
        self.write_report(rnd)
        try:
            self.trainer.barrier()
        except Exception:  # noqa: BLE001 - the checkpoint and the end record are written
            if s.recovery != "partial":
                raise
        return status

    def run(self) -> dict:
        """Set up, then follow the decisions (rank 0 decides, and broadcasts each command to the
        job) until the incarnation ends; this rank's result."""
        import torch
        import torch.distributed as dist

        s = self.s
        t_setup = time.time()
        batch, loaded = self._start(t_setup)
        cmd = torch.zeros(6, dtype=torch.int64)
        prev, prev_t0 = None, 0.0
        status = None
        while True:
            try:
                if s.rank == 0:
                    if self.pending is None:
                        self.pending = self.decide(self.t)
                    cmd[:] = torch.tensor([*self.pending, 0])
                if s.world > 1:
                    dist.broadcast(cmd, src=0)
                c, lv, pt, seq, rnd = (int(x) for x in cmd[:5])
                now = time.perf_counter()
                if prev is not None:  # the iteration before ends at this boundary
                    prev["iter_s"] = now - prev_t0
                    prev = None
                if c == CMD_STEP:
                    prev, prev_t0 = self._step(batch, lv, pt, rnd), now
                elif c == CMD_HOLD:
                    self.mirror.update(open=False, closed=rnd)
                    self.write_report(rnd)
                elif c == CMD_WAIT:
                    _wait_publication(self.st, self.jid, seq + 1, s.hold_timeout_s)
                else:
                    status = self._end(c, rnd, loaded)
                    break
                self.pending = None
            except BaseException as e:  # noqa: BLE001
                if not self._recoverable(e):
                    raise
                self._recover(e)
                prev = None
        self.stop_watcher()
        out = {"status": status, "t": self.t, "rank": s.rank, "hash": self.trainer.state_hash(),
               "hash_full": self.trainer.state_hash(include_optimizer=True), "loaded_hash": loaded,
               "gen": self.gen}
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                pass
        return out


def _wait_publication(st, job_id: int, seq: int, timeout_s: float) -> None:
    try:
        wait_key(st, Keys.pub(job_id, seq), timeout_s)
    except Exception as e:  # noqa: BLE001 - DistStoreError
        raise TimeoutError(f"job {job_id}: no new decision for {timeout_s:.0f} s (hold_timeout_s); "
                           f"is the scheduler gone? ({type(e).__name__})") from None


def _inject(mode: str, rank: int, t: int) -> None:
    if mode == "raise":
        raise RuntimeError(f"injected failure on rank {rank} at iteration {t}")
    if mode == "hang":
        time.sleep(10 ** 6)
    if mode == "exit":
        os._exit(3)
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(10)
    raise ValueError(f"unknown fail mode {mode!r}")


def _record_error(store, spec: WorkerSpec, e: BaseException, t: int | None = None) -> None:
    rec = {"rank": spec.rank, "slot": spec.slot, "job": spec.job_id, "inc": spec.incarnation,
           "type": type(e).__name__, "message": str(e), "time": time.time(), "traceback": traceback.format_exc(),
           "pid": os.getpid(), "t": t}
    sys.stderr.write(f"[jigsaw job {spec.job_id} inc {spec.incarnation} rank {spec.rank} slot {spec.slot}] "
                     f"{type(e).__name__}: {e}\n")
    sys.stderr.flush()
    if store is not None:
        try:
            store.set(Keys.err(spec.job_id, spec.incarnation, spec.rank), json.dumps(rec))
        except Exception:  # noqa: BLE001 - the store itself may be what failed
            pass


def connect_store(host: str, port: int, run_id: str, timeout_s: float):
    """A client of the hub's TCPStore, under the run's prefix."""
    import torch.distributed as dist

    client = dist.TCPStore(host, int(port), None, False, timeout=timedelta(seconds=float(timeout_s)))
    return dist.PrefixStore(run_id + "/", client)


def run_worker(spec: WorkerSpec) -> dict:
    """Run one rank of one job incarnation until it pauses, finishes or stops (module docstring).
    A failure is written to ``err/...`` and, with ``exit_on_error``, ends the process."""
    st = w = None
    try:
        st = connect_store(spec.store_host, spec.store_port, spec.run_id, spec.timeout_s)
        Path(spec.checkpoint_dir).mkdir(parents=True, exist_ok=True)
        w = _Worker(spec, st)
        return w.run()
    except BaseException as e:  # noqa: BLE001 - every failure must reach the executor
        _record_error(st, spec, e, t=None if w is None else w.t)
        if w is not None and w.peer_failure(e):
            # a peer died or stalled; this process is healthy: drop the broken group and return the
            # error to the executor, keeping the host warm for the job's next incarnation
            w.stop_watcher()
            try:
                import torch.distributed as dist

                if dist.is_initialized():
                    dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                if spec.exit_on_error:
                    os._exit(1)
            raise
        if spec.exit_on_error:
            os._exit(1)
        raise
