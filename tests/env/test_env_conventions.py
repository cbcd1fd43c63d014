"""The env follows Gymnasium's conventions: rgb_array frames, the action mask in info, the registered
max_episode_steps, and SB3's make_vec_env (Dummy and Subproc) with MaskablePPO on top."""
from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import gymnasium as gym
import numpy as np
import pandas as pd
import pytest

from jigsaw_env import MAX_EPISODE_STEPS
from jigsaw_env.env import JigsawClusterEnv
from jigsaw_env.render import (BAND_H, CELL_EDGE, FREE_GPU, GLYPHS, HEADER_H, LEVEL_BAR_H, SHARED_EDGE, STATIC_BAR,
                               FrameRenderer, clock_text, draw_text, job_colour)
from jigsaw_env.spb import Pattern
from jigsaw_env.state import JobDecision

ROOT = Path(__file__).resolve().parents[2]
#: a tiny setting that the subprocesses of SubprocVecEnv can build too (a spec, no registered tables)
TINY = dict(gpus=8, gpus_per_node=4, trace="synthetic", max_jobs=6, window_k=4, spb_levels=1)


def _three_jobs() -> pd.DataFrame:
    """Three zoo jobs that all arrive at t=0 and run for hours: 2, 1 and 1 GPUs."""
    return pd.DataFrame({"job_id": [0, 1, 2], "arrival_s": 0.0, "num_gpus": [2, 1, 1],
                         "model": ["vgg16", "vgg16", "recommendation"], "batch_size": [32, 32, 1024],
                         "iterations": 1e6})


def make_env(**kw) -> JigsawClusterEnv:
    cfg = dict(gpus=8, gpus_per_node=4, trace=_three_jobs(), max_jobs=3, window_k=4, round_s=60.0,
               render_mode="rgb_array")
    cfg.update(kw)
    return JigsawClusterEnv(**cfg)


def _band_pixel(env: JigsawClusterEnv, gpu: int, index: int = 0) -> tuple[int, ...]:
    """The colour of the middle of a GPU cell's ``index``-th worker band, above its level bar."""
    frame = env.render()
    y0, y1, x0, x1 = env._renderer.band_box(gpu, index)
    return tuple(int(v) for v in frame[y0 + 2, (x0 + x1) // 2])


# ------------------------------------------------------------------ rgb_array
def test_frame_is_uint8_rgb_and_changes_when_a_job_starts():
    env = make_env()
    env.reset(seed=0)
    before = env.render()
    assert before.dtype == np.uint8 and before.ndim == 3 and before.shape[2] == 3
    assert before.shape[0] % 16 == 0 and before.shape[1] % 16 == 0
    slot = env.builder.window.index(0)
    _, _, _, _, info = env.step(env.codec.encode(slot, "consolidated"))
    gpus = env.builder.ledger.decision[0].gpus
    after = env.render()
    assert after.shape == before.shape
    assert not np.array_equal(after, before)
    for g in gpus:  # the job's GPUs show its colour; they were free
        assert _band_pixel(env, g) == job_colour(0)
    free = next(g for g in range(8) if g not in gpus)
    assert _band_pixel(env, free) == FREE_GPU


def test_advancing_with_nothing_started_changes_only_the_clock():
    """An advance with no job started: the simulated clock goes from 0:00:00 to 0:01:00 (round_s=60);
    the GPUs and the queue below the header are drawn the same."""
    env = make_env()
    env.reset(seed=0)
    before = env.render()
    env.step(env.codec.advance)
    after = env.render()
    assert env.sim.state.time_s == 60.0
    assert np.array_equal(after[HEADER_H:], before[HEADER_H:])
    assert not np.array_equal(after[:HEADER_H], before[:HEADER_H])
    expected = np.zeros_like(after[:HEADER_H])
    expected[:] = after[0, 0]
    draw_text(expected, 8, 8, "T 0:01:00  ROUND 1  RUN 0  WAIT 3  DONE 0/3")
    assert np.array_equal(after[:HEADER_H], expected)


def test_pixels_show_colours_levels_sharing_and_the_queue():
    """A hand-made decision: job 0 on GPUs 0 and 1 at SPB level 2 of 3, static pattern; job 1
    beside it on GPU 1 at level 0; job 2 waits."""
    env = make_env(spb_levels=3)
    env.reset(seed=0)
    r = FrameRenderer(num_nodes=2, gpus_per_node=4, max_workers_per_gpu=2, max_level=3)
    decision = {0: JobDecision((0, 1), 2, Pattern.STATIC), 1: JobDecision((1,), 0, Pattern.ROTATING)}
    img = r.frame(env.sim.state, decision, num_finished=0)
    y0, y1, x0, x1 = r.band_box(0, 0)
    assert tuple(img[y0, x0]) == job_colour(0)
    # the level bar: 2/3 of the band's width, white for the static pattern, at the band's bottom
    bar = round((x1 - x0) * 2 / 3)
    assert (img[y1 - LEVEL_BAR_H:y1, x0:x0 + bar] == STATIC_BAR).all()
    assert tuple(img[y1 - 1, x0 + bar]) == job_colour(0)
    y0, y1, x0, x1 = r.band_box(1, 1)  # GPU 1's second worker: job 1, level 0 (no bar)
    assert (img[y0:y1, x0:x1] == job_colour(1)).all()
    assert tuple(img[y0 + BAND_H // 2, x0]) != job_colour(0)
    # GPU 1 is shared (white border), GPU 0 is not
    x, y = r.cell_xy[1]
    assert tuple(img[y, x]) == SHARED_EDGE
    x, y = r.cell_xy[0]
    assert tuple(img[y, x]) == CELL_EDGE
    # the queue holds job 2 alone: one block of its colour after the "WAIT 1" line
    assert (img[r.queue_blocks_y:r.queue_blocks_y + 4, 8:12] == job_colour(2)).all()
    assert not (img[r.queue_blocks_y:, :] == job_colour(0)).all(axis=2).any()


def test_job_colours_differ_from_free_gpus_and_from_their_neighbours():
    colours = [job_colour(j) for j in range(200)]
    assert FREE_GPU not in colours
    assert all(a != b for a, b in zip(colours, colours[1:]))


def test_clock_text_and_glyphs():
    assert clock_text(0) == "0:00:00"
    assert clock_text(3725.9) == "1:02:05"
    assert clock_text(100 * 3600) == "100:00:00"
    img = np.zeros((10, 6, 3), dtype=np.uint8)
    draw_text(img, 0, 0, "1", colour=(255, 0, 0))
    assert np.array_equal(img[..., 0] == 255, GLYPHS["1"])


def test_render_modes_are_listed_and_an_unknown_one_names_them():
    assert JigsawClusterEnv.metadata["render_modes"] == ["ansi", "rgb_array"]
    with pytest.raises(ValueError, match=r"render_mode must be None or one of \['ansi', 'rgb_array'\], got 'human'"):
        make_env(render_mode="human")
    text_env = make_env(render_mode="ansi")
    text_env.reset(seed=0)
    assert text_env.render().startswith("t=0s round=0 waiting=3")
    assert make_env(render_mode=None).render() is None
    with pytest.raises(RuntimeError, match=r"call reset\(\) first"):
        make_env().render()


def test_gymnasium_checker_renders_every_listed_mode_without_a_warning():
    """With a spec, Gymnasium's checker makes the env again in each of metadata["render_modes"]
    and checks its frames; any warning fails."""
    import warnings

    from gymnasium.utils.env_checker import check_env

    env = gym.make("jigsaw_env:JigsawCluster-v0", render_mode="rgb_array", **TINY)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped, skip_render_check=False)


# ------------------------------------------------------------------ the mask in info
def test_info_action_mask_is_action_masks_after_reset_and_every_step():
    env = make_env(trace="synthetic", max_jobs=8, gpus=8, load=2.0)
    rng = np.random.default_rng(0)
    _, info = env.reset(seed=3)
    steps = 0
    while True:
        mask = env.action_masks()
        assert mask.dtype == bool and mask.shape == (env.action_space.n,)
        assert np.array_equal(info["action_mask"], mask)
        if steps == 0:  # the start of an episode: the advance and some run actions are feasible
            assert mask[env.codec.advance] and mask[:env.codec.advance].any()
        _, _, term, trunc, info = env.step(int(rng.choice(np.flatnonzero(mask))))
        steps += 1
        if term or trunc:
            break
    assert term and steps > 20
    # the episode is over: no action is feasible, and step says so
    assert not info["action_mask"].any() and not env.action_masks().any()
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step(env.codec.advance)
    # and the last frame shows every GPU free (every job finished)
    assert all(_band_pixel(env, g, i) == FREE_GPU for g in range(8) for i in range(2))


def test_masks_handed_out_are_copies():
    env = make_env()
    _, info = env.reset(seed=0)
    info["action_mask"][:] = False
    first = env.action_masks()
    first[:] = False
    assert env.action_masks()[env.codec.advance]


def test_action_masks_before_reset_says_to_reset():
    with pytest.raises(RuntimeError, match=r"action_masks\(\) needs a state: call reset\(\) first"):
        make_env().action_masks()


# ------------------------------------------------------------------ max_episode_steps
def test_registered_max_episode_steps_truncates_through_time_limit():
    assert MAX_EPISODE_STEPS == 200_000
    env = gym.make("jigsaw_env:JigsawCluster-v0", **TINY)
    assert env.spec.max_episode_steps == MAX_EPISODE_STEPS
    short = gym.make("jigsaw_env:JigsawCluster-v0", max_episode_steps=3, **TINY)
    short.reset(seed=0)
    ends = [short.step(short.unwrapped.codec.advance)[2:4] for _ in range(3)]
    assert ends == [(False, False), (False, False), (False, True)]  # (terminated, truncated)
    unlimited = gym.make("jigsaw_env:JigsawCluster-v0", max_episode_steps=-1, **TINY)
    wrappers = []
    e = unlimited
    while isinstance(e, gym.Wrapper):
        wrappers.append(type(e).__name__)
        e = e.env
    assert "TimeLimit" not in wrappers


# ------------------------------------------------------------------ SB3
def _check_vec_env(venv) -> None:
    """Render mode, frames and masks of a 2-env VecEnv, over a few masked steps."""
    from sb3_contrib.common.maskable.utils import get_action_masks

    assert venv.render_mode == "rgb_array"  # make_vec_env's default
    venv.reset()
    frames = venv.get_images()
    assert [f.shape for f in frames] == [(176, 512, 3)] * 2  # 2 nodes of 4 GPUs, 2 workers per GPU
    for _ in range(6):
        masks = get_action_masks(venv)
        actions = np.array([int(np.flatnonzero(m)[0]) for m in masks])  # the first feasible action
        _, _, dones, infos = venv.step(actions)
        now = get_action_masks(venv)
        for i, info in enumerate(infos):
            if not dones[i]:
                assert np.array_equal(info["action_mask"], now[i])


def test_make_vec_env_with_dummy_vec_env_and_maskable_ppo_learns():
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv

    venv = make_vec_env("jigsaw_env:JigsawCluster-v0", n_envs=2, vec_env_cls=DummyVecEnv, env_kwargs=TINY, seed=0)
    _check_vec_env(venv)
    model = MaskablePPO("MlpPolicy", venv, n_steps=8, batch_size=16, n_epochs=1, seed=0, device="cpu")
    model.learn(16)
    assert model.num_timesteps == 16
    venv.close()


@pytest.mark.slow
def test_make_vec_env_with_subproc_vec_env_and_maskable_ppo_learns():
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import SubprocVecEnv

    venv = make_vec_env("jigsaw_env:JigsawCluster-v0", n_envs=2, vec_env_cls=SubprocVecEnv, env_kwargs=TINY, seed=0)
    try:
        _check_vec_env(venv)
        model = MaskablePPO("MlpPolicy", venv, n_steps=8, batch_size=16, n_epochs=1, seed=0, device="cpu")
        model.learn(16)
        assert model.num_timesteps == 16
    finally:
        venv.close()


# ------------------------------------------------------------------ examples/record_video.py
def _example():
    spec = importlib.util.spec_from_file_location("record_video", ROOT / "examples" / "record_video.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_example_saves_one_png_per_frame(tmp_path):
    from PIL import Image

    ex = _example()
    steps = ex.save_frames(tmp_path, ex.make_policy("random", 0), seed=0, max_steps=5)
    files = sorted(tmp_path.glob("frame-*.png"))
    assert steps == 5 and len(files) == 6  # the reset's frame, then one per step
    assert np.asarray(Image.open(files[0])).shape == (400, 512, 3)  # 8 nodes of 8 GPUs


def test_example_records_through_gymnasiums_record_video(tmp_path, monkeypatch):
    """RecordVideo's path, with a stand-in for MoviePy's ImageSequenceClip that keeps the frames."""
    clips = []

    class FakeClip:
        def __init__(self, frames, fps):
            self.frames, self.fps = frames, fps
            clips.append(self)

        def write_videofile(self, path, logger=None):
            self.path = path

    clip_module = types.ModuleType("moviepy.video.io.ImageSequenceClip")
    clip_module.ImageSequenceClip = FakeClip
    for name in ("moviepy", "moviepy.video", "moviepy.video.io"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "moviepy.video.io.ImageSequenceClip", clip_module)
    ex = _example()
    steps = ex.record_video(tmp_path / "videos", ex.make_policy("random", 0), seed=0, max_steps=5, fps=8)
    assert steps == 5 and len(clips) == 1
    clip = clips[0]
    assert clip.fps == 8 and clip.path.endswith("jigsaw-episode-0.mp4")
    assert len(clip.frames) == 6 and all(f.shape == (400, 512, 3) and f.dtype == np.uint8 for f in clip.frames)
