"""`jigsaw train` options people reproduce runs with: shipped presets and --config files (flags on
the command line win), --help printing each default once, validation on by default (best/ and
eval.csv never on held-out jobs), the heuristics' reference values on the validation episodes."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

import train_agent
from jigsaw_env.cli import build_parser, main
from train_helpers import tables_dir, tiny_args  # noqa: F401  (module-scoped toy cost tables fixture)


def _parse(argv):
    return build_parser().parse_args(["train", *argv])


def test_every_preset_is_valid_and_matches_its_readme_recipe():
    names = train_agent.preset_names()
    assert names == ["imitation", "imitation-sizes", "learned", "philly-study", "quick", "slots", "wall-30m"]
    for name in names:
        args = _parse(["--preset", name] + (["--trace", "philly:x.csv"] if name == "philly-study" else []))
        applied = train_agent.apply_option_files(args)
        assert applied and set(applied.values()) == {f"--preset {name}"}
        train_agent.config_from_args(args)  # every value goes into a config
    args = _parse(["--preset", "imitation"])
    train_agent.apply_option_files(args)
    assert (args.warm_start, args.learning_rate, args.target_kl, args.ent_coef) == ("jigsaw", 3e-5, 0.02, 0.0)
    args = _parse(["--preset", "philly-study", "--trace", "philly:x.csv"])
    train_agent.apply_option_files(args)
    assert (args.policy, args.train_gpus, args.val_gpus, args.gamma, args.n_steps, args.dagger_rounds) == \
        ("slots", [16, 32], [16, 32], 0.9995, 1024, 4)
    assert (args.max_jobs, args.load, args.val, args.n_envs, args.max_wall_s) == (80, [1.0], 0.1, 2, 1800.0)
    # the shipped policy's recipe: the study's options on the reference Philly trace, seed 0 (the
    # shipped run's; test_shipped_policy.py checks the shipped config against the preset)
    study = vars(args)
    args = _parse(["--preset", "learned"])
    train_agent.apply_option_files(args)
    assert (args.trace, args.seed, args.holdout) == ("philly", 0, 0.2)
    # ... on clusters of 16 to 64 GPUs, taught by jigsaw-srtf in a window in its order (remaining
    # GPU-seconds), under work-conserving masks, on 200-job episodes with longer budgets of expert
    # play, DAgger and wall time, the observation showing jigsaw-srtf's round decision
    wider = {"train_gpus": [16, 32, 64], "val_gpus": [16, 32, 64], "work_conserving": True,
             "window_order": "remaining", "warm_start": "jigsaw-srtf",
             "max_jobs": 200, "warm_start_s": 240.0, "dagger_s": 150.0, "max_wall_s": 3600.0,
             "obs_features": ["base", "oracle", "history", "las", "fill", "proposal"], "proposer": "jigsaw-srtf"}
    assert {k: getattr(args, k) for k in wider} == wider
    assert {k: v for k, v in vars(args).items() if k not in ("trace", "seed", "preset", *wider) and not k.startswith("_")} == \
        {k: v for k, v in study.items() if k not in ("trace", "seed", "preset", *wider) and not k.startswith("_")}


def test_command_line_flags_override_the_config_and_the_config_the_preset(tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text('description = "mine"\n[train]\nlearning-rate = 1e-4\nmax_jobs = 30\nload = [0.5, 1.0]\n'
                 'observe-remaining = false\nobs-features = ["base", "las"]\n')
    args = _parse(["--preset", "imitation", "--config", str(f), "--max-jobs", "20"])
    applied = train_agent.apply_option_files(args)
    assert args.learning_rate == 1e-4 and applied["learning_rate"] == f"--config {f}"  # config over preset
    assert args.target_kl == 0.02 and applied["target_kl"] == "--preset imitation"
    assert args.max_jobs == 20 and "max_jobs" not in applied  # the command line over both
    assert args.load == [0.5, 1.0] and args.observe_remaining is False and args.obs_features == ["base", "las"]


@pytest.mark.parametrize("text, message", [
    ("[train]\nnope = 1\n", "--config {f}: unknown option 'nope' in [train]; expected a `jigsaw train` flag without "
                            "its dashes (e.g. max-jobs = 50)"),
    ("[train]\ngamma = 2\n", "--config {f}: option 'gamma': --gamma must be in (0, 1], got 2"),
    ("[train]\nalgo = \"dqn\"\n", "--config {f}: option 'algo': expected one of ['maskable_ppo', 'ppo', 'a2c'], "
                                  "got 'dqn'"),
    ("[train]\ncurriculum = 1\n", "--config {f}: option 'curriculum': expected true or false, got 1"),
    ("[train]\nrun-dir = \"x\"\n", "--config {f}: unknown option 'run-dir' in [train]; expected a `jigsaw train` "
                                   "flag without its dashes (e.g. max-jobs = 50)"),
    ("seed = 3\n", "--config {f}: unknown key 'seed'; expected description, needs and a [train] table"),
    ("[train\n", "--config {f}: not valid TOML (…)"),
])
def test_bad_config_files_one_line(tmp_path, capsys, text, message):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    rc = main(["train", "--config", str(f), "--run-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    want = f"jigsaw train: error: {message.format(f=f)}"
    assert rc == 2 and len(err) == 1
    if want.endswith("(…)"):  # the TOML parser's own words change with Python's version
        assert err[0].startswith(want[:-2]) and err[0].endswith(")")
    else:
        assert err == [want]
    assert not (tmp_path / "out").exists()


def test_help_prints_each_default_once():
    text = build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    blocks = re.split(r"\n  (?=-)", text)
    options = [b for b in blocks if b.startswith("-")]
    assert len(options) > 60
    twice = [b.split()[0] for b in options if len(re.findall(r"\(default", b)) > 1 or b.count("default") > 1]
    assert twice == []
    assert "(default: every group but proposal)" in text and "(default 0.1)" in text


def test_validation_is_on_by_default():
    cfg = train_agent.config_from_args(_parse([]))
    assert cfg["sampling"]["val"] == 0.1 and cfg["sampling"]["select_on"] == "val"
    cfg = train_agent.config_from_args(_parse(["--val", "0"]))
    assert cfg["sampling"]["select_on"] is None


@pytest.mark.slow
def test_without_validation_no_evaluation_and_no_best(tables_dir, tmp_path):  # noqa: F811
    run = tmp_path / "noval"
    assert main(tiny_args(tables_dir, run, "--vec", "dummy", "--n-envs", "1", "--timesteps", "128", "--n-steps", "64",
                          "--eval-freq", "64", "--no-tensorboard", "--val", "0")) == 0
    assert (run / "model.zip").is_file()
    assert not (run / "eval.csv").exists() and not (run / "best").exists() and not (run / "reference.json").exists()


@pytest.mark.slow
def test_reference_values_are_the_heuristics_on_the_evaluation_episodes(tables_dir):  # noqa: F811
    """play_reference's returns are those SB3's evaluate_policy gets on the evaluation callback's
    env (DummyVecEnv of the validation split, VecNormalize, seeded as the callback seeds it) when the
    policy plays the same heuristic: the same episodes, in the same order."""
    from sb3_contrib.common.maskable.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    from agents.imitation import HeuristicExpert
    from jigsaw_env.cost_table import register_tables_dir

    register_tables_dir(tables_dir)
    args = _parse(tiny_args(tables_dir, "unused")[1:] + ["--eval-episodes", "3"])
    cfg = train_agent.config_from_args(args)
    eval_seed = int(cfg["seed"]) + 1_000_003
    raw = DummyVecEnv(train_agent.env_factories(cfg, "val", 1, eval_seed))
    venv = VecNormalize(raw, norm_obs=True, norm_reward=False, training=False)
    base = raw.envs[0].unwrapped

    class Heuristic:
        def __init__(self):
            self.expert = HeuristicExpert("tiresias")

        def predict(self, obs, state=None, episode_start=None, deterministic=True, action_masks=None):
            return np.array([self.expert.act(base)]), None

    venv.seed(eval_seed)
    rewards, _ = evaluate_policy(Heuristic(), venv, n_eval_episodes=3, deterministic=True, return_episode_rewards=True,
                                 use_masking=True)
    ref = train_agent.play_reference(cfg, "tiresias", 3, eval_seed)
    assert ref["mean_reward"] == pytest.approx(float(np.mean(rewards)), rel=1e-6)
    assert len(set(np.round(rewards, 6))) == 3  # three different episodes


@pytest.mark.parametrize("flag, field, value", [([], "window_order", "attained"),
                                                (["--window-order", "las"], "window_order", "las"),
                                                ([], "pause", "leave"), (["--pause", "requeue"], "pause", "requeue")])
def test_window_order_and_pause_reach_the_config_and_every_training_env(tables_dir, tmp_path, flag, field,  # noqa: F811
                                                                        value):
    from train_agent import env_factories

    args = _parse(tiny_args(tables_dir, tmp_path / "run", "--val", "0.1", *flag)[1:])
    train_agent.apply_option_files(args)
    cfg = train_agent.config_from_args(args)
    assert cfg["env"][field] == value
    for split in ("train", "eval", "val"):
        env = env_factories(cfg, split, 1, 0)[0]()
        assert getattr(env.unwrapped, field) == value
        if field == "pause":
            env.reset(seed=0)
            assert env.unwrapped.builder.pause == value
        env.close()


@pytest.mark.parametrize("flag, on", [([], False), (["--work-conserving"], True)])
def test_work_conserving_reaches_the_config_and_every_training_env(tables_dir, tmp_path, flag, on):  # noqa: F811
    from train_agent import env_factories

    args = _parse(tiny_args(tables_dir, tmp_path / "run", "--val", "0.1", *flag)[1:])
    train_agent.apply_option_files(args)
    cfg = train_agent.config_from_args(args)
    assert cfg["env"]["work_conserving"] is on
    for split in ("train", "eval", "val"):
        env = env_factories(cfg, split, 1, 0)[0]()
        assert env.unwrapped.work_conserving is on
        env.reset(seed=0)
        assert env.unwrapped.builder.work_conserving is on
        env.close()
