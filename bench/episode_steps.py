"""Steps per episode of ``JigsawCluster-v0`` with its default settings (64 GPUs, 50 synthetic jobs
at load 1.0, K=16): the measurement behind the registered ``max_episode_steps``.

    python -m bench.episode_steps --policy random --seeds 120
    python -m bench.episode_steps --policy jigsaw --seeds 5

``random`` draws uniformly among the feasible actions (an untrained masked policy); any other
name plays that heuristic scheduler as env actions (``agents.imitation.HeuristicExpert``).
Reports the median, 90th and 99th percentiles and the maximum of the steps, and how each episode
ended (terminated, or truncated by the env itself).
"""
from __future__ import annotations

import argparse
import json

import numpy as np


def episode_steps(env, act, seed: int) -> tuple[int, bool]:
    """Steps of one episode reset with ``seed``, and whether it terminated (all jobs finished)."""
    env.reset(seed=seed)
    steps = 0
    while True:
        _, _, term, trunc, _ = env.step(act(env))
        steps += 1
        if term or trunc:
            return steps, term


def measure(policy: str, seeds: int) -> dict:
    from jigsaw_env.env import JigsawClusterEnv

    env = JigsawClusterEnv()
    if policy == "random":
        rng = np.random.default_rng(0)

        def act(e):
            feasible = np.flatnonzero(e.action_masks())
            return int(feasible[rng.integers(feasible.size)])
    else:
        from agents.imitation import HeuristicExpert

        act = HeuristicExpert(policy).act
    runs = [episode_steps(env, act, s) for s in range(seeds)]
    steps = np.array([n for n, _ in runs])
    p50, p90, p99 = np.percentile(steps, [50, 90, 99])
    return {"policy": policy, "seeds": seeds, "median": float(p50), "p90": float(p90), "p99": float(p99),
            "max": int(steps.max()), "argmax_seed": int(steps.argmax()),
            "terminated": int(sum(t for _, t in runs)), "truncated": int(sum(not t for _, t in runs))}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policy", default="random", help="random, or a scheduler name (jigsaw, tiresias, ...)")
    p.add_argument("--seeds", type=int, default=120, help="episodes, reset with seeds 0..N-1")
    a = p.parse_args(argv)
    if a.seeds < 1:
        p.error(f"--seeds must be >= 1, got {a.seeds}")
    print(json.dumps(measure(a.policy, a.seeds), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
