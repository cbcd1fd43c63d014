"""bench/refit_clone.py: more behaviour cloning on a warm-started run's own demonstrations, on a
tiny run (6 synthetic jobs on 8 GPUs, Tiresias cloned for 1 s of play)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from bench.refit_clone import main


@pytest.fixture(scope="module")
def warm_run(tmp_path_factory):
    from jigsaw_env.cli import main as jigsaw

    run = tmp_path_factory.mktemp("refit") / "run"
    rc = jigsaw(["train", "--trace", "synthetic", "--gpus", "8", "--max-jobs", "6", "--window-k", "4",
                 "--spb-levels", "1", "--timesteps", "128", "--n-steps", "128", "--batch-size", "64", "--n-envs", "1",
                 "--vec", "dummy", "--eval-freq", "100000", "--checkpoint-freq", "100000", "--no-progress",
                 "--no-tensorboard", "--warm-start", "tiresias", "--warm-start-s", "1", "--bc-epochs", "1",
                 "--dagger-rounds", "1", "--dagger-s", "0.5", "--dagger-epochs", "1", "--seed", "4",
                 "--run-dir", str(run)])
    assert rc == 0
    return run


def _weights(folder):
    from sb3_contrib import MaskablePPO

    return {k: v.numpy().copy() for k, v in MaskablePPO.load(str(folder / "model.zip"), device="cpu").policy.state_dict().items()}


def test_refit_fits_all_the_demonstrations_keeps_the_statistics_and_is_reproducible(warm_run, tmp_path):
    from agents.rl import LearnedAgent
    from agents.vecnorm_file import read_vecnormalize
    from jigsaw_env.env import JigsawClusterEnv
    from train_agent import load_demos

    outs = [tmp_path / "a", tmp_path / "b", tmp_path / "c"]
    for out, seed in zip(outs, (0, 0, 1)):
        assert main([str(warm_run), "--epochs", "2", "--seed", str(seed), "--out", str(out)]) == 0
    rec = json.loads((outs[0] / "refit.json").read_text())
    assert rec["transitions"] == len(load_demos(warm_run / "warm_start" / "demos.npz"))
    assert rec["transitions"] == json.loads((warm_run / "config.json").read_text())["warm_start"]["total_steps"]
    assert [h["epoch"] for h in rec["history"]] == [1, 2] and 0.0 <= rec["history"][-1]["accuracy"] <= 1.0
    clone = _weights(warm_run / "warm_start")
    a, b, c = (_weights(o) for o in outs)
    assert all(np.array_equal(a[k], b[k]) for k in a)          # same seed: the same minibatches, the same weights
    assert any(not np.array_equal(a[k], c[k]) for k in a)      # another minibatch order: other weights
    assert any(not np.array_equal(a[k], clone[k]) for k in a)  # it fitted
    before, after = read_vecnormalize(warm_run / "warm_start" / "vecnormalize.npz"), read_vecnormalize(outs[0] / "vecnormalize.npz")
    assert np.array_equal(before.obs_mean, after.obs_mean) and np.array_equal(before.obs_var, after.obs_var)
    assert before.ret_var == after.ret_var
    cfg = json.loads((outs[0] / "config.json").read_text())
    assert cfg["refit"]["epochs"] == 2 and cfg["env"] == json.loads((warm_run / "warm_start" / "config.json").read_text())["env"]
    agent = LearnedAgent(outs[0])
    env = JigsawClusterEnv(gpus=8, window_k=4, spb_levels=1, trace="synthetic", max_jobs=6)
    obs, _ = env.reset(seed=0)
    mask = env.action_masks()
    assert mask[agent.act(obs, mask)]


def test_refit_refuses_a_run_without_a_warm_start_and_bad_numbers(warm_run, tmp_path, capsys):
    cases = [([str(tmp_path), "--out", str(tmp_path / "o")],
              f"{tmp_path}/warm_start lacks config.json, model.zip, vecnormalize.npz, demos.npz"),
             ([str(warm_run), "--epochs", "0", "--out", str(tmp_path / "o")], "--epochs and --threads must be >= 1, got 0 and 1"),
             ([str(warm_run), "--learning-rate", "0", "--out", str(tmp_path / "o")], "--learning-rate must be > 0, got 0.0")]
    for argv, msg in cases:
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
        assert msg in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
