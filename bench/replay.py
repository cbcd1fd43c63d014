"""Replay one trace with one scheduler; print wall time, peak memory and the metrics as JSON.

    python -m bench.replay --trace philly:$JIGSAW_DATA/philly/philly.csv --gpus 512 --agent jigsaw

Run in its own process by ``python -m bench`` so that the peak resident memory belongs to this
replay alone (``peak_rss_mib``: the kernel's high-water mark of this process image). Round logs
(rounds.csv rows) are off, as in a large replay; the cluster log and every metric are kept.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sys
import time


def load_replay_jobs(trace: str, gpus: int, max_jobs: int | None = None, load: float | None = None):
    """(cluster, jobs) of a replay: ``gpus`` GPUs, the trace's first ``max_jobs`` jobs (GPU demands
    capped at ``gpus``), arrivals rescaled to offered ``load`` when given."""
    from jigsaw_env.cluster import ClusterSpec
    from traces import load_trace

    cluster = ClusterSpec.from_gpus(gpus)
    return cluster, load_trace(trace, cluster_gpus=gpus, max_gpus=gpus, max_jobs=max_jobs, load_scale=load).jobs


def replay_simulator(cluster, jobs):
    """The simulator of a large replay: round logs off (rounds.csv grows with jobs x rounds)."""
    from jigsaw_env.simulator import SimConfig, Simulator

    return Simulator(cluster, jobs, SimConfig(log_rounds=False))


def add_replay_args(p: argparse.ArgumentParser, agent: str) -> None:
    """--trace, --gpus, --agent (default ``agent``), --max-jobs, --load: what a replay is run on."""
    p.add_argument("--trace", required=True)
    p.add_argument("--gpus", type=int, default=512)
    p.add_argument("--agent", default=agent)
    p.add_argument("--max-jobs", type=int, default=None)
    p.add_argument("--load", type=float, default=None, help="rescale arrivals to this offered load")


def peak_rss_mib() -> float:
    """Peak resident memory of this process image, MiB: ``VmHWM`` of /proc/self/status on Linux.
    Not ``ru_maxrss``: Linux carries it across exec, so a replay started by a larger parent (the
    bench runner, with torch loaded) would report the parent's peak (docs/simulator.md section 8).
    Elsewhere ``ru_maxrss`` (KiB on Linux, bytes on macOS)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / 2**20 if sys.platform == "darwin" else r / 1024


class GcTimer:
    """Wall time spent in CPython's cyclic garbage collector while the block runs, per generation,
    via ``gc.callbacks`` (each collection reports its start and stop). Units: seconds."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.collections = [0, 0, 0]
        self._t = 0.0

    def _cb(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        else:
            g = int(info["generation"])
            self.seconds[g] += time.perf_counter() - self._t
            self.collections[g] += 1

    def __enter__(self) -> "GcTimer":
        gc.callbacks.append(self._cb)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._cb)


def replay(trace: str, gpus: int, agent: str, max_jobs: int | None = None, load: float | None = None,
           progress: bool = False) -> dict:
    from agents import make_scheduler
    from jigsaw_env import accel

    t0 = time.perf_counter()
    cluster, jobs = load_replay_jobs(trace, gpus, max_jobs, load)
    t_load = time.perf_counter() - t0
    sim = replay_simulator(cluster, jobs)
    t_build = time.perf_counter() - t0 - t_load
    t1 = time.perf_counter()
    with GcTimer() as gct:
        m = sim.run(make_scheduler(agent), progress=progress)
    t_run = time.perf_counter() - t1
    # jobs in the system (waiting + running) at each round's start, summed over rounds: the work a
    # replay's per-round passes scale with (docs/simulator.md section 8)
    active_job_rounds = int(sim.cluster_frame()["active"].sum())
    return {"trace": trace, "gpus": gpus, "agent": agent, "jobs": len(sim.state.jobs), "load": load,
            "rounds": int(sim.state.round), "quiet_rounds": int(sim.quiet_rounds),
            "active_job_rounds": active_job_rounds,
            "load_s": round(t_load, 3), "build_s": round(t_build, 3), "run_s": round(t_run, 3),
            "wall_s": round(time.perf_counter() - t0, 3), "peak_rss_mib": round(peak_rss_mib(), 1),
            "gc_s": round(sum(gct.seconds), 3), "gc_full_collections": gct.collections[2],
            "compiled": sum(v == "compiled" for v in accel.status().values()),
            "avg_jct_s": m["avg_jct_s"], "makespan_s": m["makespan_s"],
            "cluster_efficiency": m["cluster_efficiency"], "jobs_completed": m["jobs_completed"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_replay_args(p, agent="jigsaw")
    p.add_argument("--progress", action="store_true")
    p.add_argument("--load-only", action="store_true",
                   help="load the trace and stop (what bench.instructions subtracts from a replay's count)")
    a = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if a.load_only:
        import agents  # noqa: F401  (imported by a replay too: its instructions are not the replay's)
        _, jobs = load_replay_jobs(a.trace, a.gpus, a.max_jobs, a.load)
        print(json.dumps({"trace": a.trace, "jobs": len(jobs)}))
        return 0
    print(json.dumps(replay(a.trace, a.gpus, a.agent, a.max_jobs, a.load, a.progress)))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
