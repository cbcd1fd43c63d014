"""Does a scheduling pass cost more as jobs finish? Replay a trace, time every scheduler call, and
report per quarter of the calls: jobs finished so far, mean active (waiting + running) jobs, the
scheduler's time per call and per active job, and the simulator's time per round beside it.

    python -m bench.per_round_cost --trace synthetic:jobs=82247,load=0.7,seed=0 --gpus 512 --agent tiresias

A cost that is flat per active job while the finished count grows says the per-round work depends
on the jobs in the system, not on the finished ones. Times are wall seconds of
``Scheduler.schedule`` alone and of ``Simulator.step`` alone (perf_counter), one thread.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from bench.replay import add_replay_args


def per_round_cost(trace: str, gpus: int, agent: str, max_jobs: int | None = None, load: float | None = None,
                   parts: int = 4) -> dict:
    """Replay ``trace`` on ``gpus`` GPUs with ``agent``; the scheduler's calls split into ``parts``
    equal runs, each with ``finished_at_start`` (jobs), ``mean_active`` (jobs), ``sched_ms_per_call``
    (ms), ``sched_us_per_active_job`` (microseconds per active job, averaged over calls), and the
    simulator's ``rounds`` from the run's first call to the next run's (quiet rounds included)
    with ``sim_ms_per_round`` (ms of ``Simulator.step`` per round)."""
    import numpy as np

    from agents import make_scheduler
    from bench.replay import load_replay_jobs, replay_simulator

    sim = replay_simulator(*load_replay_jobs(trace, gpus, max_jobs, load))
    sched = make_scheduler(agent)
    inner = sched.schedule
    # per call: finished jobs, active jobs, its seconds, the simulator's step seconds and rounds so far
    samples: list[tuple[int, int, float, float, int]] = []
    step_s = [0.0]
    inner_step = sim.step

    def timed(state, *a, **k):
        t = time.perf_counter()
        out = inner(state, *a, **k)
        samples.append((sim.num_finished, len(state.active_ids), time.perf_counter() - t, step_s[0], state.round))
        return out

    def timed_step(*a, **k):
        t = time.perf_counter()
        out = inner_step(*a, **k)
        step_s[0] += time.perf_counter() - t
        return out

    sched.schedule = timed
    sim.step = timed_step
    t0 = time.perf_counter()
    sim.run(sched)
    run_s = time.perf_counter() - t0
    s = np.array(samples, dtype=np.float64).reshape(-1, 5)
    rows = []
    chunks = [x for x in np.array_split(s, max(1, min(parts, len(s)))) if len(x)]
    for i, x in enumerate(chunks):
        step_end, round_end = (chunks[i + 1][0, 3], chunks[i + 1][0, 4]) if i + 1 < len(chunks) else (
            step_s[0], sim.state.round)
        rounds = int(round_end - x[0, 4])
        rows.append({"finished_at_start": int(x[0, 0]), "calls": int(len(x)), "mean_active": float(x[:, 1].mean()),
                     "sched_ms_per_call": 1000.0 * float(x[:, 2].mean()),
                     "sched_us_per_active_job": 1e6 * float((x[:, 2] / np.maximum(x[:, 1], 1.0)).mean()),
                     "rounds": rounds, "sim_ms_per_round": 1000.0 * float(step_end - x[0, 3]) / max(rounds, 1)})
    return {"trace": trace, "gpus": gpus, "agent": agent, "jobs": len(sim.state.jobs), "run_s": run_s,
            "scheduler_calls": int(len(s)), "rounds": int(sim.state.round), "parts": rows}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_replay_args(p, agent="tiresias")
    p.add_argument("--parts", type=int, default=4, help="split the scheduler calls into this many runs (default 4)")
    a = p.parse_args(argv)
    if a.gpus < 1 or a.parts < 1:
        p.error("--gpus and --parts must be at least 1")
    print(json.dumps(per_round_cost(a.trace, a.gpus, a.agent, a.max_jobs, a.load, a.parts)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
