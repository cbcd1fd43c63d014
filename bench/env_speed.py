"""Env steps per second under a random masked policy, over whole episodes (masks included).

    python -m bench.env_speed --gpus 64 --window-k 16 --episodes 3 --max-jobs 200

Reports steps/s (every env.step, masks computed before each), decisions/s (non-advance actions
that changed the decision), rounds/s and simulated seconds per wall second.
"""
from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np


def measure(gpus: int, window_k: int, episodes: int, max_jobs: int, load: float, seed: int = 0,
            trace="synthetic", round_s: float | None = 300.0) -> dict:
    import traces  # noqa: F401  (the env's first reset imports it: a one-off import is not env time)
    from jigsaw_env.env import JigsawClusterEnv

    env = JigsawClusterEnv(gpus=gpus, window_k=window_k, max_jobs=max_jobs, load=load, trace=trace, round_s=round_s)
    rng = np.random.default_rng(seed)
    steps = decisions = rounds = 0
    sim_s = 0.0
    t0 = time.perf_counter()
    for ep in range(episodes):
        env.reset(seed=seed + ep)
        t_start = env.sim.state.time_s
        while True:
            mask = env.action_masks()
            feasible = mask.nonzero()[0]
            # the draw of rng.choice(feasible) (the same integers(0, n) underneath, so the same
            # actions for a seed) without its per-call argument handling, which cost as much as
            # a tenth of a step: the policy's time is not the env's
            a = int(feasible[rng.integers(feasible.size)])
            _, _, term, trunc, info = env.step(a)
            steps += 1
            if a == env.codec.advance or "round" in info:
                rounds += 1
            else:
                decisions += 1
            if term or trunc:
                break
        sim_s += env.sim.state.time_s - t_start
    wall = time.perf_counter() - t0
    return {"gpus": gpus, "window_k": window_k, "episodes": episodes, "max_jobs": max_jobs, "load": load,
            "steps": steps, "decisions": decisions, "rounds": rounds, "wall_s": wall, "steps_per_s": steps / wall,
            "decisions_per_s": decisions / wall, "rounds_per_s": rounds / wall, "sim_s_per_wall_s": sim_s / wall,
            "machine": platform.processor() or platform.machine()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", type=int, default=64)
    p.add_argument("--window-k", type=int, default=16)
    p.add_argument("--episodes", type=int, default=3,
                   help="episodes to play (0: build the env and play none, the baseline bench.instructions subtracts)")
    p.add_argument("--max-jobs", type=int, default=200)
    p.add_argument("--load", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.episodes < 0:
        p.error(f"--episodes must be >= 0, got {a.episodes}")
    print(json.dumps(measure(a.gpus, a.window_k, a.episodes, a.max_jobs, a.load, a.seed), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
