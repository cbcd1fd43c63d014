"""Record one short episode of ``JigsawCluster-v0`` as a video (or as PNG frames).

    python examples/record_video.py --out videos/ [--policy jigsaw|random] [--max-steps 400]

One frame per env step (docs/environment.md, "Rendering", says what a frame shows). With MoviePy
installed (``pip install "gymnasium[other]"``) Gymnasium's ``RecordVideo`` wrapper writes
``OUT/jigsaw-episode-0.mp4`` at ``--fps`` frames per second. Without it, the script saves the
same frames as ``OUT/frame-00000.png``, ... with Pillow (a dependency of matplotlib, so always
installed) and says so; ``ffmpeg -framerate 8 -i OUT/frame-%05d.png out.mp4`` makes a video of them.

The policy is the ``jigsaw`` heuristic played as env actions (``agents.imitation.HeuristicExpert``)
or a uniformly random feasible action (``random``). The episode is 12 synthetic jobs on 64 GPUs,
cut after ``--max-steps`` steps.
"""
from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import gymnasium as gym
import numpy as np

import jigsaw_env  # noqa: F401  (registers JigsawCluster-v0)

POLICIES = ("jigsaw", "random")


def make_policy(name: str, seed: int):
    """``act(env) -> int`` for the unwrapped env."""
    if name == "random":
        rng = np.random.default_rng(seed)
        return lambda env: int(rng.choice(np.flatnonzero(env.action_masks())))
    from agents.imitation import HeuristicExpert

    return HeuristicExpert(name).act


def play(env: gym.Env, act, seed: int, max_steps: int, on_frame=None) -> int:
    """Play one episode (at most ``max_steps`` steps); ``on_frame(frame)`` after reset and each step.
    Returns the steps taken."""
    env.reset(seed=seed)
    if on_frame is not None:
        on_frame(env.render())
    for step in range(1, max_steps + 1):
        _, _, terminated, truncated, _ = env.step(act(env.unwrapped))
        if on_frame is not None:
            on_frame(env.render())
        if terminated or truncated:
            break
    return step


def record_video(out: Path, act, seed: int, max_steps: int, fps: int) -> int:
    """With MoviePy: Gymnasium's RecordVideo writes the episode as an mp4."""
    from gymnasium.wrappers import RecordVideo

    env = gym.make("jigsaw_env:JigsawCluster-v0", render_mode="rgb_array", max_jobs=12, max_episode_steps=max_steps)
    env = RecordVideo(env, str(out), episode_trigger=lambda episode: episode == 0, name_prefix="jigsaw", fps=fps)
    steps = play(env, act, seed, max_steps)
    env.close()  # writes the video
    return steps


def save_frames(out: Path, act, seed: int, max_steps: int) -> int:
    """Without MoviePy: each frame as a PNG (Pillow)."""
    from PIL import Image

    out.mkdir(parents=True, exist_ok=True)
    env = gym.make("jigsaw_env:JigsawCluster-v0", render_mode="rgb_array", max_jobs=12, max_episode_steps=max_steps)
    count = [0]

    def save(frame: np.ndarray) -> None:
        Image.fromarray(frame).save(out / f"frame-{count[0]:05d}.png")
        count[0] += 1

    steps = play(env, act, seed, max_steps, on_frame=save)
    env.close()
    return steps


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("videos"), help="folder for the video or the frames")
    p.add_argument("--policy", choices=POLICIES, default="jigsaw")
    p.add_argument("--max-steps", type=int, default=400, help="steps recorded at most (env steps)")
    p.add_argument("--fps", type=int, default=8, help="frames per second of the video")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.max_steps < 1:
        p.error(f"--max-steps must be >= 1, got {a.max_steps}")
    if a.fps < 1:
        p.error(f"--fps must be >= 1, got {a.fps}")
    act = make_policy(a.policy, a.seed)
    if importlib.util.find_spec("moviepy") is not None:
        steps = record_video(a.out, act, a.seed, a.max_steps, a.fps)
        print(f"{steps} steps recorded as a video in {a.out}/")
    else:
        steps = save_frames(a.out, act, a.seed, a.max_steps)
        print(f"MoviePy is not installed (pip install \"gymnasium[other]\" for RecordVideo's mp4): "
              f"saved {steps + 1} frames as PNG in {a.out}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
