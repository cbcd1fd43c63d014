"""Bytes counted at the transport (jigsaw_executor.transport; docs/executor.md, "Bytes at the
transport"): the parser of /proc/net/dev on hand-written text, its errors, and the kernel's
loopback count around a real gloo all-reduce and a real SPB job, which must hold at least the
bytes the ring algorithm has to send."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from jigsaw_executor.transport import (LoopbackWindow, TransportCounterUnavailable, loopback_bytes,
                                       parse_net_dev)
from net_helpers import free_port

SAMPLE = """Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo: 34238967409 13287111    0    0    0     0          0         0 34238967411 13287111    0    0    0     0       0          0
  eth0: 2191997331   80583    0    0    0     0          0         0  4393313   45865    0    0    0     0       0          0
"""

HAS_LO = Path("/proc/net/dev").is_file() and "lo:" in Path("/proc/net/dev").read_text()


def test_parse_net_dev_reads_receive_and_transmit_bytes():
    assert parse_net_dev(SAMPLE) == {"lo": (34238967409, 34238967411), "eth0": (2191997331, 4393313)}


def test_loopback_bytes_reads_the_transmit_counter_of_the_named_interface(tmp_path):
    f = tmp_path / "dev"
    f.write_text(SAMPLE)
    assert loopback_bytes("lo", f) == 34238967411
    assert loopback_bytes("eth0", f) == 4393313


def test_bad_counter_files_are_one_clear_error(tmp_path):
    f = tmp_path / "dev"
    with pytest.raises(TransportCounterUnavailable, match=rf"{f}: cannot read the interface byte counters"):
        loopback_bytes("lo", f)
    f.write_text(SAMPLE)
    with pytest.raises(TransportCounterUnavailable, match=r"no interface 'lo0' \(interfaces: \['eth0', 'lo'\]\)"):
        loopback_bytes("lo0", f)
    f.write_text(SAMPLE.replace("eth0: 2191997331", "eth0: lots"))
    with pytest.raises(ValueError, match=rf"{f}: line 4: expected 'interface: rx_bytes"):
        loopback_bytes("lo", f)
    with LoopbackWindow(path=tmp_path / "missing", required=False) as w:
        pass
    assert w.bytes is None
    with pytest.raises(TransportCounterUnavailable):
        with LoopbackWindow(path=tmp_path / "missing"):
            pass


def _allreduce_worker(rank: int, world: int, port: int, numel: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    x = torch.full((numel,), float(rank + 1))
    dist.all_reduce(x)
    assert float(x[0]) == world * (world + 1) / 2
    dist.destroy_process_group()


@pytest.mark.skipif(not HAS_LO, reason="no loopback counters (/proc/net/dev) on this system")
@pytest.mark.timeout(120)
def test_a_gloo_allreduce_raises_the_loopback_count_by_at_least_the_ring_bytes():
    """W = 2 processes all-reduce M = 8 MB of float32 over loopback: the ring algorithm sends
    2 (W - 1) / W * M per rank, 2 (W - 1) M = 16 MB in all (eq. N3). The kernel's count around the
    processes' whole lives holds that plus the rendezvous, the headers and other processes'
    traffic, so it is at least 16 MB."""
    import torch.multiprocessing as mp

    world, numel = 2, 2 * 1024 * 1024
    m = numel * 4
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with LoopbackWindow() as w:
        mp.spawn(_allreduce_worker, args=(world, free_port(), numel), nprocs=world, join=True)
    assert w.bytes >= 2 * (world - 1) * m


@pytest.mark.skipif(not HAS_LO, reason="no loopback counters (/proc/net/dev) on this system")
@pytest.mark.timeout(300)
@pytest.mark.slow
def test_an_spb_jobs_loopback_count_holds_its_formula_bytes():
    """A two-worker SPB job over gloo: the kernel's loopback count over the job is at least the
    formula's bytes (every iteration's gradient bytes and the initial state broadcast), and with
    count_loopback every iteration's report carries its own window's count (None without)."""
    from jigsaw_executor.launcher import Decision, run_job_local

    res = run_job_local("tiny_mlp", 2, 4, Decision(0, "rotating"), batch_size=16, count_loopback=True)
    formula = sum(res.bytes_per_iteration()) + sum(res.setup_bytes_sent)
    assert formula > 0 and res.loopback_bytes >= formula
    assert all(isinstance(rep.loopback_bytes, int) and rep.loopback_bytes >= 0 for rk in res.reports for rep in rk)
    off = run_job_local("tiny_mlp", 2, 2, Decision(0, "rotating"), batch_size=16)
    assert all(rep.loopback_bytes is None for rk in off.reports for rep in rk)
