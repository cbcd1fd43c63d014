"""Bad inputs of `jigsaw train` and `jigsaw evaluate` around trained runs: each gives one line that
names the option, file or field and what was expected, and nothing already computed is lost.

* evaluate: an agent that fails (a diverged model: NaN weights) is named with its seed; the runs
  that finished are written (metrics.csv, metadata.json, report.html) before the exit with status 2;
* train --resume: options given on the command line that differ from the run's config.json;
* train: synthetic trace specs (bad values, jobs=/seed=, conflicting loads);
* train: a failed start leaves the run folder as it found it (retry possible);
* train: option ranges (--gamma, --learning-rate, --ent-coef, --seed, PPO minibatches);
* config.json with the wrong structure (evaluate, export, deploy, train --resume).

Runs are tiny: randomly initialised policies saved as RUN_DIRs (no training) and a few training
runs of 64-128 steps on an 8-GPU cluster with 3 jobs per episode.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

import train_agent  # noqa: E402
from jigsaw_env.cli import main  # noqa: E402

ENV_KW = dict(gpus=8, gpus_per_node=8, trace="synthetic", max_jobs=3, window_k=4)
TINY = ["--gpus", "8", "--max-jobs", "3", "--window-k", "4", "--n-envs", "1", "--vec", "dummy", "--n-steps", "64",
        "--batch-size", "32", "--n-epochs", "1", "--eval-freq", "100000", "--eval-episodes", "1",
        "--checkpoint-freq", "100000", "--no-progress", "--no-tensorboard"]


def run_cli(argv: list[str], capsys) -> tuple[int, str, list[str]]:
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse usage errors
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, [x for x in err.splitlines() if x.strip()]


def one_line(argv: list[str], capsys) -> str:
    rc, _, err = run_cli(argv, capsys)
    assert rc == 2, (rc, err)
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


# ----------------------------------------------------------------------------------------------- run dirs
def _ppo_run(p: Path, *, nan: bool = False) -> Path:
    """A RUN_DIR with a randomly initialised PPO policy (window K 4, SPB 3 levels x 4 slots, no
    observation statistics); ``nan``: every weight NaN, as a diverged training leaves it."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    from agents.rl import RUN_FORMAT, spaces_signature
    from agents.rl_env import make_env_fn

    venv = DummyVecEnv([make_env_fn(ENV_KW, split="train", rank=0, seed=0, monitor=False)])
    model = PPO("MlpPolicy", venv, seed=0, device="cpu", n_steps=8, batch_size=8, policy_kwargs=dict(net_arch=[8]))
    if nan:
        with torch.no_grad():
            for t in model.policy.parameters():
                t.fill_(float("nan"))
    p.mkdir(parents=True)
    model.save(str(p / "model.zip"))
    venv.close()
    (p / "config.json").write_text(json.dumps({"format": RUN_FORMAT, "algo": "ppo", "env": ENV_KW,
                                               "spaces": spaces_signature(4, 3, 4), "normalize_obs": False,
                                               "seed": 0}))
    return p


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("runs")
    return {"ok": _ppo_run(base / "okrun"), "nan": _ppo_run(base / "nanrun", nan=True)}


def _train_config(run: Path, *extra: str) -> dict:
    """config.json as `jigsaw train` writes it for TINY + extra (no model: enough for the checks
    --resume makes before it looks for a checkpoint)."""
    args = train_agent.build_parser().parse_args([*TINY, "--run-dir", str(run), *extra])
    cfg = train_agent.config_from_args(args)
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(cfg, default=str))
    return cfg


# ----------------------------------------------------------------------------------------------- 1. evaluate
def test_a_diverged_policy_names_itself(runs):
    from agents.rl import LearnedAgent

    agent = LearnedAgent(runs["nan"], name="mine")
    obs = np.zeros(agent.model.observation_space.shape, dtype=np.float32)
    mask = np.ones(agent.model.action_space.n, dtype=bool)
    with pytest.raises(ValueError) as e:
        agent.act(obs, mask)
    assert str(e.value) == (f"agent mine ({runs['nan']}): the policy produced non-finite logits (a diverged model?)")
    ok = LearnedAgent(runs["ok"])
    assert ok.name == "okrun"
    obs[3] = np.nan
    with pytest.raises(ValueError, match=r"^agent okrun \(.*okrun\): the observation has non-finite values at \[3\]"):
        ok.act(obs, mask)


def _check_partial_evaluation(out: Path, nan_run: Path, err: str, workers: int) -> None:
    assert err == (f"jigsaw evaluate: error: 2 of 6 runs failed (agent nanrun); first: agent nanrun ({nan_run}), "
                   f"seed 0: the policy produced non-finite logits (a diverged model?); the 4 finished runs are "
                   f"written to {out} (metrics.csv, report.html; metadata.json lists every failed run)")
    df = pd.read_csv(out / "metrics.csv")
    assert list(zip(df["agent"], df["seed"])) == [("fifo", 0), ("fifo", 1), ("tiresias", 0), ("tiresias", 1)]
    assert (df["jobs_completed"] == 3).all()
    for r in df["run_dir"]:
        assert (out / r / "jobs.csv").is_file()
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["runs"] == {"total": 6, "finished": 4, "failed": 2}
    assert meta["workers"] == workers
    assert [(f["agent"], f["seed"], f["error_type"]) for f in meta["failed_runs"]] == [
        ("nanrun", 0, "ValueError"), ("nanrun", 1, "ValueError")]
    assert meta["failed_runs"][1]["error"] == (f"agent nanrun ({nan_run}), seed 1: the policy produced non-finite "
                                               f"logits (a diverged model?)")
    assert meta["failed_runs"][0]["traceback"] is None  # a user error, not a bug
    report = (out / "report.html").read_text()
    assert "<h2>Failed runs</h2>" in report and "2 of 6 runs failed" in report
    assert report.index("Failed runs") < report.index("<h2>Summary</h2>")


def test_evaluate_keeps_the_finished_agents_when_one_fails(runs, tmp_path, capsys):
    out = tmp_path / "ev"
    rc, stdout, err = run_cli(["evaluate", "--agents", f"fifo,tiresias,{runs['nan']}", "--gpus", "8", "--max-jobs",
                               "3", "--seeds", "2", "--workers", "1", "--no-progress", "--out", str(out)], capsys)
    assert rc == 2 and len(err) == 1, err
    _check_partial_evaluation(out, runs["nan"], err[0], 1)
    assert "fifo" in stdout and "tiresias" in stdout and "(4 of 6 runs)" in stdout  # the summary of what finished


@pytest.mark.slow
def test_evaluate_keeps_the_finished_agents_when_one_fails_in_a_worker(runs, tmp_path, capsys):
    out = tmp_path / "ev"
    rc, _, err = run_cli(["evaluate", "--agents", f"fifo,{runs['nan']},tiresias", "--gpus", "8", "--max-jobs", "3",
                          "--seeds", "2", "--workers", "2", "--no-progress", "--out", str(out)], capsys)
    assert rc == 2 and len(err) == 1, err
    _check_partial_evaluation(out, runs["nan"], err[0], 2)


def test_evaluate_where_every_run_fails_writes_the_failures(runs, tmp_path, capsys):
    out = tmp_path / "ev"
    err = one_line(["evaluate", "--agents", str(runs["nan"]), "--gpus", "8", "--max-jobs", "3", "--seeds", "1",
                    "--workers", "1", "--no-progress", "--out", str(out)], capsys)
    assert err == (f"jigsaw evaluate: error: 1 of 1 runs failed (agent nanrun); agent nanrun ({runs['nan']}), seed 0: "
                   f"the policy produced non-finite logits (a diverged model?); no run finished; "
                   f"{out}/metadata.json lists every failed run")
    assert len(pd.read_csv(out / "metrics.csv")) == 0
    assert json.loads((out / "metadata.json").read_text())["runs"] == {"total": 1, "finished": 0, "failed": 1}
    assert not (out / "report.html").exists()


def test_a_heuristic_that_raises_is_named_with_its_seed(tmp_path, capsys, monkeypatch):
    """A failure that is not a user error (a bug) is named the same way and keeps its traceback
    in metadata.json."""
    from jigsaw_env import evaluate as ev

    real = ev.run_task

    def run_task(task):
        if task.agent.label == "tiresias" and task.seed == 1:
            raise ZeroDivisionError("boom")
        return real(task)

    monkeypatch.setattr(ev, "run_task", run_task)
    out = tmp_path / "ev"
    err = one_line(["evaluate", "--agents", "fifo,tiresias", "--gpus", "8", "--max-jobs", "3", "--seeds", "2",
                    "--workers", "1", "--no-progress", "--out", str(out)], capsys)
    assert err == (f"jigsaw evaluate: error: 1 of 4 runs failed (agent tiresias); agent tiresias, seed 1: "
                   f"ZeroDivisionError: boom; the 3 finished runs are written to {out} (metrics.csv, report.html; "
                   f"metadata.json lists every failed run)")
    meta = json.loads((out / "metadata.json").read_text())
    assert "ZeroDivisionError: boom" in meta["failed_runs"][0]["traceback"]
    assert len(pd.read_csv(out / "metrics.csv")) == 3


# ----------------------------------------------------------------------------------------------- 2. --resume
def test_resume_refuses_options_that_differ_from_the_run(tmp_path, capsys):
    run = tmp_path / "R"
    _train_config(run)
    err = one_line(["train", "--resume", "--run-dir", str(run), "--timesteps", "256", "--learning-rate", "0.5",
                    "--gpus", "64", "--algo", "a2c", "--max-jobs", "40", "--trace", "synthetic:jobs=7"], capsys)
    assert err == (f"jigsaw train: error: --resume keeps the run's config: --learning-rate (given 0.5, config.json "
                   f"0.0003), --gpus (given 64, config.json 8), --algo (given a2c, config.json maskable_ppo), "
                   f"--max-jobs (given 40, config.json 3), --trace (given synthetic:jobs=7, config.json synthetic) "
                   f"differ from {run}/config.json; drop them or start a new --run-dir")
    err = one_line(["train", "--resume", "--run-dir", str(run), "--timesteps", "256", "--no-observe-remaining"], capsys)
    assert err == (f"jigsaw train: error: --resume keeps the run's config: --no-observe-remaining (given false, "
                   f"config.json true) differs from {run}/config.json; drop it or start a new --run-dir")
    err = one_line(["train", "--resume", "--run-dir", str(run), "--timesteps", "256", "--load", "0.5,1",
                    "--warm-start", "fifo"], capsys)
    assert err == (f"jigsaw train: error: --resume keeps the run's config: --load (given 0.5,1, config.json none), "
                   f"--warm-start (given fifo, config.json none) differ from {run}/config.json; drop them or start "
                   f"a new --run-dir")


def test_resume_accepts_the_same_options_and_ignores_defaults(tmp_path, capsys):
    """The run's own values given again, and defaults that differ from the run (not given), pass
    the comparison: the next check (a model.zip that does not load) answers. (A folder with only
    config.json is a run stopped before it saved a model: --resume starts it again.)"""
    run = tmp_path / "R"
    _train_config(run, "--gpus", "16", "--learning-rate", "0.001", "--net-arch", "32,32")
    (run / "model.zip").write_text("not a zip")
    no_model = (f"jigsaw train: error: --resume: no readable saved model in {run}: {run}/model.zip cannot be loaded "
                f"(corrupt or cut short)")
    assert one_line(["train", "--resume", "--run-dir", str(run), "--timesteps", "256"], capsys) == no_model
    assert one_line(["train", "--resume", "--run-dir", str(run), "--timesteps", "256", "--gpus", "16",
                     "--learning-rate", "1e-3", "--net-arch", "32,32", "--policy", "mlp", "--max-wall-s", "60",
                     "--no-progress", "--verbose", "1", "--max-jobs", "3", "--window-k", "4"], capsys) == no_model
    # a config without the window order or pause mode plays the defaults, so they are its values
    cfg = json.loads((run / "config.json").read_text())
    for field in ("window_order", "pause"):
        cfg["env"].pop(field)
    (run / "config.json").write_text(json.dumps(cfg))
    assert one_line(["train", "--resume", "--run-dir", str(run), "--timesteps", "256", "--window-order", "attained",
                     "--pause", "leave"], capsys) == no_model
    assert one_line(["train", "--resume", "--run-dir", str(run), "--timesteps", "256", "--pause", "requeue"],
                    capsys) == (f"jigsaw train: error: --resume keeps the run's config: --pause (given requeue, "
                                f"config.json leave) differs from {run}/config.json; drop it or start a new --run-dir")


def test_every_train_option_is_either_kept_or_taken_on_resume():
    dests = {a.dest for a in train_agent.build_parser()._actions if a.option_strings and a.dest != "help"}
    assert dests - set(train_agent.RESUME_PATHS) - train_agent.RESUME_OWN == set()
    cfg = train_agent.config_from_args(train_agent.build_parser().parse_args(["--warm-start", "fifo"]))
    for dest, path in train_agent.RESUME_PATHS.items():  # every path is one config_from_args writes
        v = cfg
        for k in path[:-1]:
            v = v[k]
        assert path[-1] in v, (dest, path)


# ----------------------------------------------------------------------------------------------- 3. synthetic specs
@pytest.mark.parametrize("spec, extra, message", [
    ("synthetic:jobs=abc", [], "synthetic: bad value for jobs: 'abc'"),
    ("synthetic:seed=abc", [], "synthetic: bad value for seed: 'abc'"),
    ("synthetic:jobs=2", [], "synthetic: jobs= cannot be set in a training trace: every episode has --max-jobs jobs "
                             "(set the episode size there); drop it from --trace 'synthetic:jobs=2'"),
    ("synthetic:seed=5", [], "synthetic: seed= cannot be set in a training trace: each episode draws its generator "
                             "seed from its split, so that training, validation and held-out episodes stay apart "
                             "(--seed seeds the draws); drop it from --trace 'synthetic:seed=5'"),
    ("synthetic:jobs=2,seed=5", [], "synthetic: jobs= and seed= cannot be set in a training trace: every episode has "
                                    "--max-jobs jobs (set the episode size there); each episode draws its generator "
                                    "seed from its split, so that training, validation and held-out episodes stay "
                                    "apart (--seed seeds the draws); drop them from --trace 'synthetic:jobs=2,seed=5'"),
    ("synthetic:load=0.5", ["--load", "2"], "conflicting loads: the spec says load=0.5, the option says 2.0"),
    ("synthetic:load=0.5", ["--load", "0.5,1"], "conflicting loads: the spec says load=0.5, the option says 1.0"),
])
def test_train_checks_the_synthetic_spec(spec, extra, message, tmp_path, capsys):
    run = tmp_path / "r"
    err = one_line(["train", *TINY, "--timesteps", "64", "--trace", spec, *extra, "--run-dir", str(run)], capsys)
    assert err == f"jigsaw train: error: {message}"
    assert not run.exists()


def test_a_spec_load_is_the_episodes_load(monkeypatch):
    """synthetic:load=X without --load: the episodes are drawn at X (scaled by the curriculum),
    not at the default 1.0; the same load given both ways is no conflict."""
    from agents import rl_env
    from agents.rl_env import TrainingEnv, synthetic_spec

    assert synthetic_spec("synthetic:load=0.5,models=resnet18", 3, 0.25, 7) == \
        "synthetic:models=resnet18,jobs=3,load=0.25,seed=7"
    seen = []
    real = rl_env.load_trace
    monkeypatch.setattr(rl_env, "load_trace", lambda spec, **kw: (seen.append(spec), real(spec, **kw))[1])
    env = TrainingEnv(trace="synthetic:load=0.5", gpus=8, max_jobs=3)
    env._episode_jobs(0)
    env.set_difficulty(0.0)
    env._episode_jobs(0)
    assert [s.split(",")[1] for s in seen] == ["load=0.5", "load=0.25"]
    TrainingEnv(trace="synthetic:load=0.5", gpus=8, max_jobs=3, load=0.5, loads=[0.5])


# ----------------------------------------------------------------------------------------------- 4. failed starts
def test_a_refused_start_writes_nothing_and_the_folder_stays_usable(tmp_path, capsys):
    run = tmp_path / "tr" / "r3"
    err = one_line(["train", *TINY, "--timesteps", "64", "--learning-rate", "-1", "--run-dir", str(run)], capsys)
    assert err == ("jigsaw train: error: argument --learning-rate: --learning-rate must be > 0, got -1 "
                   "(see jigsaw train --help)")
    assert not (tmp_path / "tr").exists()
    rc, _, err = run_cli(["train", *TINY, "--timesteps", "64", "--run-dir", str(run)], capsys)
    assert rc == 0, err
    assert json.loads((run / "config.json").read_text())["trained_timesteps"] == 64


def _fail_in_learning(monkeypatch, at_step: int | None = None):
    """Make training fail in its callbacks: at once, or at ``at_step`` (after a checkpoint)."""
    from stable_baselines3.common.callbacks import BaseCallback, CallbackList

    real = train_agent._callbacks

    class Boom(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps >= at_step:
                raise ValueError("simulated failure")
            return True

    def callbacks(*a, **kw):
        if at_step is None:
            raise ValueError("simulated failure")
        return CallbackList([real(*a, **kw), Boom()])

    monkeypatch.setattr(train_agent, "_callbacks", callbacks)


def test_a_start_that_fails_before_saving_a_model_removes_what_it_wrote(tmp_path, capsys, monkeypatch):
    _fail_in_learning(monkeypatch)
    run = tmp_path / "new" / "r"
    assert one_line(["train", *TINY, "--timesteps", "64", "--run-dir", str(run)], capsys) == \
        "jigsaw train: error: simulated failure"
    assert not (tmp_path / "new").exists()
    # a folder that was there: only what this start wrote goes
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me\n")
    (mine / "checkpoints").mkdir()
    assert one_line(["train", *TINY, "--timesteps", "64", "--run-dir", str(mine)], capsys) == \
        "jigsaw train: error: simulated failure"
    assert sorted(os.listdir(mine)) == ["checkpoints", "notes.txt"]
    assert (mine / "notes.txt").read_text() == "keep me\n"


def test_a_start_that_fails_after_a_checkpoint_keeps_it(tmp_path, capsys, monkeypatch):
    _fail_in_learning(monkeypatch, at_step=96)
    run = tmp_path / "r"
    argv = ["train", *TINY, "--timesteps", "128", "--checkpoint-freq", "64", "--run-dir", str(run)]
    assert one_line(argv, capsys) == (f"jigsaw train: error: simulated failure; what it saved before failing is kept "
                                      f"in {run} (--resume continues from its latest checkpoint)")
    assert (run / "config.json").is_file() and (run / "checkpoints" / "rl_model_64_steps.zip").is_file()


def test_a_run_dir_that_is_a_file(tmp_path, capsys):
    f = tmp_path / "a_file"
    f.write_text("x\n")
    assert one_line(["train", *TINY, "--timesteps", "64", "--run-dir", str(f)], capsys) == \
        f"jigsaw train: error: {f}: File exists"
    assert f.read_text() == "x\n"


# ----------------------------------------------------------------------------------------------- 5. ranges
@pytest.mark.parametrize("extra, message", [
    (["--gamma", "2"], "argument --gamma: --gamma must be in (0, 1], got 2 (see jigsaw train --help)"),
    (["--gamma", "0"], "argument --gamma: --gamma must be in (0, 1], got 0 (see jigsaw train --help)"),
    (["--gamma", "nan"], "argument --gamma: --gamma must be in (0, 1], got nan (see jigsaw train --help)"),
    (["--gamma", "x"], "argument --gamma: --gamma must be a number, got 'x' (see jigsaw train --help)"),
    (["--learning-rate", "0"], "argument --learning-rate: --learning-rate must be > 0, got 0 (see jigsaw train --help)"),
    (["--ent-coef", "-0.1"], "argument --ent-coef: --ent-coef must be a finite number >= 0, got -0.1 "
                             "(see jigsaw train --help)"),
    (["--seed", "-1"], "argument --seed: --seed must be >= 0, got -1 (see jigsaw train --help)"),
    (["--seed", "4294967296"], "argument --seed: --seed must be <= 4294967295 (2**32 - 1), got 4294967296 "
                               "(see jigsaw train --help)"),
    (["--n-steps", "1"], "--n-steps x --n-envs must be >= 2 for maskable_ppo (a rollout of one sample cannot have "
                         "its advantages normalized), got 1 x 1"),
    (["--algo", "ppo", "--n-steps", "1"], "--n-steps x --n-envs must be >= 2 for ppo (a rollout of one sample cannot "
                                          "have its advantages normalized), got 1 x 1"),
    (["--batch-size", "1"], "--batch-size must be >= 2 for maskable_ppo (advantages are normalized over each "
                            "minibatch; one sample has no standard deviation), got 1"),
    (["--n-steps", "65", "--batch-size", "64"],
     "--n-steps x --n-envs = 65 x 1 = 65 leaves a last minibatch of 1 sample with --batch-size 64 (maskable_ppo "
     "normalizes advantages over each minibatch; one sample has no standard deviation); choose values where "
     "n_steps x n_envs is not a multiple of the batch size plus 1"),
])
def test_train_option_ranges(extra, message, tmp_path, capsys):
    run = tmp_path / "r"
    assert one_line(["train", *TINY, "--timesteps", "64", *extra, "--run-dir", str(run)], capsys) == \
        f"jigsaw train: error: {message}"
    assert not run.exists()


@pytest.mark.parametrize("allowed, refused", [
    # one sample in a rollout: fine where no advantage is normalized (A2C), not under PPO
    (["--algo", "a2c", "--n-steps", "1", "--n-envs", "1"], ["--algo", "ppo", "--n-steps", "1", "--n-envs", "1"]),
    # two samples make a minibatch of two; a minibatch size of one is refused
    (["--n-steps", "1", "--n-envs", "2", "--batch-size", "2"], ["--n-steps", "1", "--n-envs", "2", "--batch-size", "1"]),
    # a last minibatch of one sample: PPO tolerates it, MaskablePPO (the default) does not
    (["--algo", "ppo", "--n-steps", "65", "--n-envs", "1", "--batch-size", "64"],
     ["--n-steps", "65", "--n-envs", "1", "--batch-size", "64"]),
])
def test_what_the_minibatch_bounds_allow(allowed, refused):
    """Each allowed setting beside the one step over the bound that is refused."""
    parse = train_agent.build_parser().parse_args
    train_agent._check_new_run(parse(allowed))
    with pytest.raises(ValueError, match="minibatch|rollout of one sample"):
        train_agent._check_new_run(parse(refused))


@pytest.mark.filterwarnings("ignore:std\\(\\)")
def test_a_minibatch_of_one_sample_makes_maskable_ppo_diverge():
    """Why the bound: MaskablePPO normalizes advantages over every minibatch, and the standard
    deviation of one sample is NaN, so one update turns the weights into NaN (if sb3-contrib
    guards against it one day, as stable-baselines3's PPO does, this fails: relax the check)."""
    import torch
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    from agents.rl_env import make_env_fn

    venv = DummyVecEnv([make_env_fn(ENV_KW, split="train", rank=0, seed=0, monitor=False)])
    model = MaskablePPO("MlpPolicy", venv, seed=0, device="cpu", n_steps=1, batch_size=8, n_epochs=1,
                        policy_kwargs=dict(net_arch=[8]))
    model.learn(total_timesteps=1)
    venv.close()
    assert all(torch.isnan(t).all() for t in model.policy.action_net.parameters())


# ----------------------------------------------------------------------------------------------- 6. config.json
SHAPE = ("expected a JSON object with algo (one of ['maskable_ppo', 'ppo', 'a2c']), env (object: the env options) "
         "and spaces (object with window_k, spb_levels, spb_slots, ...), as written by `jigsaw train`")
BAD_CONFIGS = [
    ("number", 123, f"{SHAPE}; got a number (123)"),
    ("null", None, f"{SHAPE}; got null"),
    ("list", [1], f"{SHAPE}; got a list"),
    ("env-list", {"algo": "ppo", "env": [], "spaces": {}},
     "field 'env': expected a JSON object (the env options), got a list"),
    ("spaces-empty", {"algo": "ppo", "env": {}, "spaces": {}},
     "field 'spaces.window_k': expected an integer >= 1 (the policy's window K), got nothing"),
    ("spaces-text", {"algo": "ppo", "env": {}, "spaces": "x"},
     "field 'spaces': expected a JSON object (window_k, spb_levels, spb_slots, ...), got a string ('x')"),
    ("window-text", {"algo": "ppo", "env": {}, "spaces": {"window_k": "4"}},
     "field 'spaces.window_k': expected an integer >= 1 (the policy's window K), got a string ('4')"),
    ("algo-number", {"algo": 7, "env": {}, "spaces": {"window_k": 4}},
     "field 'algo': expected one of ['maskable_ppo', 'ppo', 'a2c'], got a number (7)"),
    ("algo-missing", {"env": {}, "spaces": {"window_k": 4}},
     "missing field 'algo'; expected a config written by `jigsaw train`"),
    ("sampling-list", {"algo": "ppo", "env": {}, "spaces": {"window_k": 4}, "sampling": []},
     "field 'sampling': expected a JSON object (the episode sampling options), got a list"),
]


@pytest.mark.parametrize("config, message", [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS])
def test_config_json_of_the_wrong_shape(config, message, runs, tmp_path, capsys):
    import shutil
    run = tmp_path / "run"
    shutil.copytree(runs["ok"], run)
    (run / "config.json").write_text(json.dumps(config))
    cfg = f"{run}/config.json"
    assert one_line(["evaluate", "--agents", str(run), "--gpus", "8", "--max-jobs", "3", "--out", str(tmp_path / "o")],
                    capsys) == f"jigsaw evaluate: error: {cfg}: {message}"
    assert one_line(["export", str(run)], capsys) == f"jigsaw export: error: {cfg}: {message}"
    assert one_line(["train", "--resume", "--run-dir", str(run), "--timesteps", "64"], capsys) == \
        f"jigsaw train: error: {cfg}: {message}"


def test_deploy_reads_the_config_the_same_way(runs, tmp_path, capsys):
    import shutil
    run = tmp_path / "run"
    shutil.copytree(runs["ok"], run)
    (run / "config.json").write_text("null")
    assert one_line(["deploy", "--policy", str(run), "--demo", "--slots", "2", "--allow-oversubscribe", "--out",
                     str(tmp_path / "o")], capsys) == f"jigsaw deploy: error: {run}/config.json: {SHAPE}; got null"


@pytest.mark.parametrize("edit, message", [
    (lambda c: c.pop("sampling"), "missing field 'sampling' (a JSON object (the episode sampling options)); --resume "
                                  "needs the config `jigsaw train` wrote"),
    (lambda c: c.update(seed="x"), "field 'seed': expected an integer in [0, 4294967295], got a string ('x')"),
    (lambda c: c.update(n_envs=0), "field 'n_envs': expected an integer >= 1, got a number (0)"),
    (lambda c: c["eval"].pop("freq"), "missing field 'eval.freq' (an integer >= 1); --resume needs the config "
                                      "`jigsaw train` wrote"),
    (lambda c: c["sampling"].update(holdout=2), "field 'sampling.holdout': expected a number in (0, 1), got a "
                                                "number (2)"),
    (lambda c: c["sampling"].update(loads="1"), "field 'sampling.loads': expected null or a list of numbers > 0, "
                                                "got a string ('1')"),
    (lambda c: c["env"].update(bogus=1), "field 'env': unknown option(s) ['bogus']; expected some of ['gpus', "
                                         "'gpus_per_node', 'gpu_type', 'gpu_memory_gib', 'trace', 'max_jobs', 'load', "
                                         "'window_k', 'spb_levels', 'spb_slots', 'max_workers_per_gpu', 'round_s', "
                                         "'restart_s', 'reward', 'reward_scale', 'observe_remaining', 'backlogged', "
                                         "'max_time_s', 'eta_scale', 'eta_override', 'sharing', 'pace', 'obs_features', "
                                         "'work_conserving', 'window_order', 'pause', 'proposer', 'spill']"),
    (lambda c: c["env"].update(proposer="jigsaw"), "field 'env.proposer' is 'jigsaw' but 'env.obs_features' has no "
                                                   "'proposal' group to show its decision; add 'proposal' there or "
                                                   "leave the proposer out"),
    (lambda c: c["env"].update(window_order="arrival"), "field 'env.window_order': expected one of ['attained', "
                                                       "'las', 'remaining'], got 'arrival'"),
    (lambda c: c["env"].update(pause="drop"), "field 'env.pause': expected one of ['leave', 'requeue'], got 'drop'"),
    (lambda c: c["env"].update(spill="yes"), "field 'env.spill': expected true or false, got a string ('yes')"),
])
def test_resume_checks_the_fields_it_reads(edit, message, tmp_path, capsys):
    run = tmp_path / "R"
    cfg = _train_config(run)
    edit(cfg)
    (run / "config.json").write_text(json.dumps(cfg))
    assert one_line(["train", "--resume", "--run-dir", str(run), "--timesteps", "64"], capsys) == \
        f"jigsaw train: error: {run}/config.json: {message}"


def test_evaluate_refuses_a_load_it_cannot_apply(tmp_path, capsys):
    # every kept job arrives at once: there is no inter-arrival time to scale, so a run would go
    # ahead at the trace's own timing while metrics.csv said load 1.0 (offered_load inf)
    from jigsaw_env.cli import main

    p = tmp_path / "burst.csv"
    p.write_text("job_id,arrival_s,num_gpus,duration_s,model\n1,0,1,100,resnet18\n2,0,1,200,resnet18\n"
                 "3,0,2,300,resnet18\n")
    out = tmp_path / "ev"
    rc = main(["evaluate", "--agents", "fifo", "--trace", f"csv:{p}", "--load", "1", "--gpus", "8", "--seeds", "1",
               "--no-progress", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert f"trace 'csv:{p}', seed 0: cannot scale to load 1: all 3 kept jobs arrive at the same time" in err, err
    assert not (out / "metrics.csv").exists()
