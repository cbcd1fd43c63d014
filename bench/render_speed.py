"""Frames per second of the env's ``rgb_array`` render, over the states of a random masked episode.

    python -m bench.render_speed --gpus 64 --frames 500

Plays a random masked policy (as bench.env_speed) and draws a frame after every step; only the
``render()`` calls are timed (the env's steps are not). Reports frames/s and the frame's shape.
The target for recording videos is at least 20 frames/s at 64 GPUs.
"""
from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np


def measure(gpus: int, frames: int, seed: int = 0, load: float = 2.0) -> dict:
    """Frames/s of ``render()`` over ``frames`` consecutive states (episodes restart as needed)."""
    from jigsaw_env.env import JigsawClusterEnv

    env = JigsawClusterEnv(gpus=gpus, load=load, render_mode="rgb_array")
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    shape = env.render().shape  # the first frame draws the empty cluster once: not timed
    render_s = 0.0
    for i in range(frames):
        feasible = np.flatnonzero(env.action_masks())
        _, _, term, trunc, _ = env.step(int(feasible[rng.integers(feasible.size)]))
        t0 = time.perf_counter()
        env.render()
        render_s += time.perf_counter() - t0
        if term or trunc:
            env.reset(seed=seed + i + 1)
    return {"gpus": gpus, "frames": frames, "frame_shape": list(shape), "render_s": render_s,
            "frames_per_s": frames / render_s, "machine": platform.processor() or platform.machine()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", type=int, default=64)
    p.add_argument("--frames", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.frames < 1:
        p.error(f"--frames must be >= 1, got {a.frames}")
    print(json.dumps(measure(a.gpus, a.frames, a.seed), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
