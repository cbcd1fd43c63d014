"""The cluster layer on Ray: one Ray resource per slot, worker hosts pinned to their slot, the hub.

* :class:`RaySession` starts Ray or connects to one. The default is embedded: ``ray.init()`` in
  this process with ``num_cpus = slots`` and one custom resource per slot, ``{"slot_0": 1, ...}``.
  ``address="HOST:PORT"`` (``--address``) connects to a running Ray cluster instead, which must
  offer the ``slot_k`` resources itself (``ray start --head --resources '{"slot_0": 1, "slot_1": 1}'``);
  a missing slot is a clear error. By default no more slots than this machine's physical cores
  (``allow_oversubscribe`` lifts it): a slot stands for one GPU, here one CPU core.
* :class:`SlotHost` is a Ray actor holding a fraction ``1 / max_workers_per_gpu`` of one slot's
  resource, so Ray places it on that slot's node and at most ``max_workers_per_gpu`` hosts share a
  slot (co-located workers time-slice it, as the simulator's jobs on one GPU do). It pins its
  process to the slot's core (``os.sched_setaffinity``), imports torch once, and then runs one rank
  of one job incarnation at a time (:func:`jigsaw_executor.control.run_worker`). Hosts are detached
  and named (``jigsaw-<run>-s<slot>h<k>``) and restart when their process dies (``max_restarts``),
  so a failed worker costs one fresh process, and a restarted scheduler finds them by name.
* :class:`SlotPool` creates and tracks the hosts; :func:`get_or_create_hub` the
  :class:`~jigsaw_executor.control.ControlHub` (the decision and state store).
* :func:`connect` is the one ``ray.init`` of every jigsaw command on Ray (the executor here,
  ``jigsaw evaluate --ray`` and ``jigsaw train --ray``): an embedded instance, or a cluster at an
  address, checked to be reachable within :data:`CONNECT_TIMEOUT_S` first (``ray.init`` itself
  waits minutes for an address nobody answers). :func:`code_runtime_env` makes Ray's workers import
  the same jigsaw source tree as the driver.
"""
from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jigsaw_env

from .control import ControlHub, run_worker

NAMESPACE = "jigsaw"


def slot_resource(g: int) -> str:
    return f"slot_{int(g)}"


def physical_cores() -> int:
    """Physical cores this process may use (logical CPUs in its affinity set, divided by threads
    per core when psutil knows it)."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        usable = os.cpu_count() or 1
    try:
        import psutil

        phys, logical = psutil.cpu_count(logical=False), psutil.cpu_count(logical=True)
        if phys and logical and logical > phys:
            usable = max(1, usable * phys // logical)
    except Exception:  # noqa: BLE001 - psutil missing or unsure: keep the affinity count
        pass
    return max(1, int(usable))


def default_slots() -> int:
    return physical_cores()


#: seconds :func:`connect` waits for a TCP connection to a cluster's address before giving up
CONNECT_TIMEOUT_S = 5.0


def probe_address(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """ValueError (one line naming the address) unless something accepts a TCP connection at
    ``address`` (``HOST:PORT`` or ``ray://HOST:PORT``) within ``timeout_s``; ``"auto"`` is left to
    Ray (which finds a cluster started on this machine, or fails at once)."""
    if address == "auto":
        return
    hostport = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"Ray address {address!r} is not HOST:PORT (e.g. 10.0.0.5:6379), ray://HOST:PORT or auto")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as e:
        why = "no answer" if isinstance(e, TimeoutError) else (e.strerror or type(e).__name__)
        raise ValueError(f"cannot reach a Ray cluster at {address} within {timeout_s:g} s ({why}); start one there "
                         f"(`ray start --head --port {port}`) or give the address `ray start` printed") from None


def source_root() -> str | None:
    """The folder holding the imported ``jigsaw_env`` package when it is a source tree (a checkout,
    or an editable install), None when it is an installed package (under site-packages)."""
    root = Path(jigsaw_env.__file__).resolve().parent.parent
    if root.name in ("site-packages", "dist-packages"):
        return None
    return str(root)


def code_runtime_env() -> dict:
    """The Ray ``runtime_env`` of jigsaw's tasks and actors: for a driver running from a source tree,
    that tree first on the workers' ``PYTHONPATH`` (so they run the driver's code, not another copy
    installed on the node); nothing for an installed package (every node imports its own install)."""
    root = source_root()
    if root is None:
        return {}
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]
    return {"env_vars": {"PYTHONPATH": os.pathsep.join([root, *rest])}}


def connect(address: str | None = None, *, num_cpus: int | None = None, resources: dict | None = None,
            namespace: str = NAMESPACE, log_to_driver: bool = False) -> bool:
    """``ray.init`` for jigsaw: ``address`` None or ``"local"`` starts an embedded instance in this
    process (``num_cpus``, ``resources``; never a cluster someone started on this machine, which a
    bare ``ray.init()`` would join); ``"auto"`` or ``HOST:PORT`` joins a running cluster after
    :func:`probe_address`. Returns whether this call started the connection (False when Ray was
    already initialised in this process, which is then used as it is)."""
    import ray  # not installed: jigsaw_env.cli names the extra to install

    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    if ray.is_initialized():
        return False
    if address in (None, "local"):
        ray.init(address="local", num_cpus=num_cpus, resources=resources, namespace=namespace,
                 include_dashboard=False, log_to_driver=log_to_driver, configure_logging=True,
                 logging_level="WARNING")
        return True
    probe_address(address)
    try:
        ray.init(address=address, namespace=namespace, log_to_driver=log_to_driver, logging_level="WARNING")
    except ConnectionError as e:
        if address == "auto":
            raise ValueError("--ray auto: no running Ray cluster found on this machine (start one with "
                             "`ray start --head`, or give its HOST:PORT)") from None
        raise ValueError(f"cannot connect to the Ray cluster at {address}: {str(e).splitlines()[0]}") from None
    return True


def check_slots(slots: int, allow_oversubscribe: bool = False) -> int:
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
        raise ValueError(f"slots must be an integer >= 1, got {slots!r}")
    cores = physical_cores()
    if slots > cores and not allow_oversubscribe:
        raise ValueError(f"--slots {slots} is more than the {cores} physical core(s) of this machine: each slot "
                         f"stands for one GPU, here one core (use --allow-oversubscribe to run anyway)")
    return slots


class RaySession:
    """Start an embedded Ray (default) or connect to a cluster (``address``); see module docstring.

    Use as a context manager or call :meth:`start` / :meth:`stop`. If Ray is already initialised in
    this process, the session reuses it (and checks its slot resources) and ``stop`` leaves it up.
    """

    def __init__(self, slots: int, address: str | None = None, allow_oversubscribe: bool = False,
                 log_to_driver: bool = False):
        self.slots = int(slots)
        self.address = address
        self.allow_oversubscribe = allow_oversubscribe
        self.log_to_driver = log_to_driver
        self.owned = False
        self.started = False

    def start(self) -> "RaySession":
        if self.address is None:
            check_slots(self.slots, self.allow_oversubscribe)
        self.owned = connect(self.address, num_cpus=self.slots,
                             resources={slot_resource(g): 1.0 for g in range(self.slots)},
                             log_to_driver=self.log_to_driver)
        self.started = True
        self.check_resources()
        return self

    def check_resources(self) -> None:
        import ray

        res = ray.cluster_resources()
        missing = [slot_resource(g) for g in range(self.slots) if res.get(slot_resource(g), 0) < 1.0]
        if missing:
            where = f"the Ray cluster at {self.address}" if self.address else "this Ray session"
            spec = ", ".join(f'"{slot_resource(g)}": 1' for g in range(self.slots))
            raise ValueError(f"{where} has no resource {missing[0]} (needs {self.slots} slots: start it with "
                             f"`ray start --head --resources '{{{spec}}}'`)")

    def stop(self) -> None:
        import ray

        if self.owned and ray.is_initialized():
            ray.shutdown()
        self.owned = self.started = False

    def __enter__(self) -> "RaySession":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# --------------------------------------------------------------------------------------------
# worker hosts
# --------------------------------------------------------------------------------------------
class SlotHost:
    """One worker process bound to one slot (module docstring). Wrapped with ``ray.remote`` by
    :class:`SlotPool`; ``max_concurrency=2`` so :meth:`info` answers while a worker runs."""

    def __init__(self, slot: int, pin: bool = True, threads: int = 1):
        os.environ["OMP_NUM_THREADS"] = str(threads)
        os.environ["MKL_NUM_THREADS"] = str(threads)
        self.slot = int(slot)
        self.core = None
        if pin and hasattr(os, "sched_setaffinity"):
            cores = sorted(os.sched_getaffinity(0))
            self.core = cores[self.slot % len(cores)]
            os.sched_setaffinity(0, {self.core})
        import torch  # noqa: F401 - warm: the first job on this host should not pay for imports
        import torch.distributed  # noqa: F401

        torch.set_num_threads(threads)
        import sklearn.datasets  # noqa: F401

        from . import data, models, spb_worker  # noqa: F401
        import torch._dynamo  # noqa: F401 - the first optimizer imports it lazily (seconds)

        data.digits_arrays()
        self.started = time.time()
        self.jobs_run = 0

    def info(self) -> dict:
        import ray

        return {"pid": os.getpid(), "slot": self.slot, "core": self.core, "host": socket.gethostname(),
                "node_id": ray.get_runtime_context().get_node_id(), "started": self.started,
                "jobs_run": self.jobs_run}

    def run_worker(self, spec) -> dict:
        self.jobs_run += 1
        return run_worker(spec)


@dataclass
class HostRef:
    slot: int
    k: int
    name: str
    handle: Any
    pid: int | None = None
    core: int | None = None
    owner: tuple[int, int, int] | None = None  # (job, incarnation, rank) running on it
    dirty: bool = False  # its process was killed or died: restarting (cold) until refreshed
    node: str | None = None  # host name of the machine its process runs on
    node_id: str | None = None  # the Ray node its process runs on
    dirty_since: float = 0.0  # when it was killed or died

    def mark_dirty(self) -> None:
        if not self.dirty:
            self.dirty, self.dirty_since = True, time.time()


class SlotPool:
    """``max_workers_per_gpu`` :class:`SlotHost` actors per slot, created up front (in parallel)
    and warmed, so starting or resuming a job costs a rendezvous and a model build, not a process.
    ``attach=True`` finds hosts that already exist by name (a restarted scheduler)."""

    def __init__(self, slots: int, max_workers_per_gpu: int = 2, prefix: str = "jigsaw", pin: bool = True,
                 threads: int = 1, attach: bool = False, ready_timeout_s: float = 300.0):
        import ray

        self.slots = int(slots)
        self.cap = int(max_workers_per_gpu)
        self.prefix = prefix
        self.pin = pin
        remote = ray.remote(SlotHost)
        frac = 1.0 / self.cap
        self.hosts: dict[tuple[int, int], HostRef] = {}
        for g in range(self.slots):
            for k in range(self.cap):
                name = f"{prefix}-s{g}h{k}"
                handle = None
                if attach:
                    try:
                        handle = ray.get_actor(name, namespace=NAMESPACE)
                    except ValueError:
                        handle = None
                if handle is None:
                    handle = remote.options(name=name, namespace=NAMESPACE, lifetime="detached", num_cpus=0,
                                            resources={slot_resource(g): frac}, max_concurrency=2, max_restarts=-1,
                                            max_task_retries=0, get_if_exists=True).remote(g, pin, threads)
                self.hosts[(g, k)] = HostRef(g, k, name, handle)
        self.refresh(timeout_s=ready_timeout_s)

    def refresh(self, timeout_s: float = 300.0, hosts: list[HostRef] | None = None) -> None:
        """Wait until every host (or the given ones) is up, retrying while one restarts; record
        its pid and core."""
        import ray

        todo = list(self.hosts.values()) if hosts is None else list(hosts)
        deadline = time.time() + timeout_s
        while todo:
            refs = [h.handle.info.remote() for h in todo]
            left = []
            for h, ref in zip(todo, refs):
                try:
                    info = ray.get(ref, timeout=max(1.0, deadline - time.time()))
                    h.pid, h.core, h.node, h.node_id = info["pid"], info["core"], info.get("host"), info.get("node_id")
                    h.dirty = False
                except ray.exceptions.GetTimeoutError:
                    raise RuntimeError(f"worker host {h.name} did not start within {timeout_s:.0f} s (is every "
                                       f"slot resource free? another run may hold it)") from None
                except (ray.exceptions.ActorUnavailableError, ray.exceptions.RayActorError):
                    left.append(h)  # restarting after its process died: ask again
            if left and time.time() > deadline:
                raise RuntimeError(f"worker hosts {[h.name for h in left]} are not available after {timeout_s:.0f} s")
            if left:
                time.sleep(0.2)
            todo = left

    def free_host(self, slot: int) -> HostRef:
        """A free host of the slot: a warm one (not restarting after a failure) if there is one,
        else the first of the restarting ones to answer (the caller refreshes it)."""
        import ray

        free = [self.hosts[(slot, k)] for k in range(self.cap) if self.hosts[(slot, k)].owner is None]
        if free:
            clean = [h for h in free if not h.dirty]
            if clean:
                return clean[0]
            probes = {h.handle.info.remote(): h for h in free}
            ready, _ = ray.wait(list(probes), num_returns=1, timeout=0.5)
            for ref in ready:
                try:
                    info = ray.get(ref)
                    h = probes[ref]
                    h.pid, h.core, h.node, h.dirty = info["pid"], info["core"], info.get("host"), False
                    return h
                except Exception:  # noqa: BLE001 - still restarting
                    pass
            return min(free, key=lambda h: h.dirty_since)  # restarting the longest
        raise RuntimeError(f"slot {slot}: all {self.cap} worker hosts are busy "
                           f"({[self.hosts[(slot, k)].owner for k in range(self.cap)]})")

    def alive(self, h: HostRef) -> bool | None:
        """Whether the host's process (as last refreshed) still exists: checked directly when it
        runs on this machine (a killed process is seen at once, Ray notices it a second or two
        later); None when unknown (another machine)."""
        if h.pid is None or h.node != socket.gethostname():
            return None
        try:
            os.kill(int(h.pid), 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        try:  # a killed process stays a zombie until its parent reaps it
            with open(f"/proc/{int(h.pid)}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
        except (OSError, IndexError):
            return True

    def owned_by(self, job_id: int, inc: int | None = None) -> list[HostRef]:
        return [h for h in self.hosts.values() if h.owner is not None and h.owner[0] == job_id
                and (inc is None or h.owner[1] == inc)]

    def release(self, job_id: int, inc: int | None = None) -> None:
        for h in self.owned_by(job_id, inc):
            h.owner = None

    def kill(self, h: HostRef) -> None:
        """Kill a host's process (it restarts: max_restarts); its worker, if any, dies with it."""
        import ray

        try:
            ray.kill(h.handle, no_restart=False)
        except Exception:  # noqa: BLE001 - already dead
            pass
        h.owner = None
        h.mark_dirty()

    def occupancy(self) -> dict[str, Any]:
        return {h.name: list(h.owner) if h.owner else None for h in self.hosts.values()}

    def restore_occupancy(self, occ: dict[str, Any]) -> None:
        for h in self.hosts.values():
            o = occ.get(h.name)
            h.owner = tuple(o) if o else None

    def close(self) -> None:
        import ray

        for h in self.hosts.values():
            try:
                ray.kill(h.handle, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        self.hosts.clear()


def store_host() -> str | None:
    """The address the hub's store listens on: loopback when every alive Ray node is this
    machine (an embedded Ray, or a one-node cluster here); None otherwise, so that the hub binds
    to its own node's address as Ray knows it (``ray.util.get_node_ip_address()`` in the actor)."""
    import ray

    here = ray.util.get_node_ip_address()
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if nodes and all(n.get("NodeManagerAddress") == here for n in nodes):
        return "127.0.0.1"
    return None


def get_or_create_hub(name: str, advertise_host: str | None = None):
    """The named, detached :class:`~jigsaw_executor.control.ControlHub` (created if absent).
    ``advertise_host``: the address its store binds to and advertises; default :func:`store_host`."""
    import ray

    host = advertise_host if advertise_host is not None else store_host()
    return ray.remote(ControlHub).options(name=name, namespace=NAMESPACE, lifetime="detached", num_cpus=0,
                                          get_if_exists=True, max_restarts=0).remote(host)


def kill_actor(handle) -> None:
    import ray

    try:
        ray.kill(handle, no_restart=True)
    except Exception:  # noqa: BLE001
        pass
