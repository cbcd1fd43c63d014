"""Training runs survive a crash and are reproducible (train_agent.py / `jigsaw train`).

* A run really killed mid-way (a subprocess, SIGKILL once a checkpoint is on disk) continues with
  ``--resume`` from its newest complete checkpoint to the same total number of timesteps; the
  evaluations of the lost part are dropped from eval.csv.
* Two runs with the same ``--seed`` give bit-identical policies and evaluation curves (one env in
  this process, and two SubprocVecEnv workers); another seed gives another policy.

Tiny settings: hand-built cost tables (names of their own) in a folder passed with ``--tables``,
an 8-GPU cluster, 8-job episodes, 64-step rollouts.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("sb3_contrib")

from jigsaw_env.cli import main  # noqa: E402
from jigsaw_env.cost_table import CostTable, LayerGroup, unregister_table  # noqa: E402

GiB = 1 << 30
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    d = tmp_path_factory.mktemp("tables")
    for name, groups, fixed, act, t in (("rsA", 4, 5.0, 0.5, 0.05), ("rsB", 6, 6.0, 1.0, 0.08)):
        gs = tuple(LayerGroup(f"g{i}", 4_000_000 * (i + 1), int(act * GiB), t, t, t) for i in range(groups))
        CostTable(name, 8, "v100", gs, 0.01, int(fixed * GiB), {"all": "hand-built test table"}).save(
            d / f"{name}-bs8-v100.json")
    yield str(d)
    for m in ("rsA", "rsB"):
        unregister_table(m, 8, "v100")


def tiny(tables: str, run_dir, *extra: str) -> list[str]:
    return ["--tables", tables, "--trace", "synthetic:models=rsA+rsB", "--gpus", "8", "--window-k", "4",
            "--max-jobs", "8", "--n-steps", "64", "--batch-size", "32", "--n-epochs", "2", "--eval-episodes", "1",
            "--no-progress", "--no-tensorboard", "--run-dir", str(run_dir), *extra]


def policy_hash(path: Path) -> str:
    import torch

    with zipfile.ZipFile(path) as z:
        sd = torch.load(io.BytesIO(z.read("policy.pth")), weights_only=False)
    h = hashlib.sha256()
    for k in sorted(sd):
        h.update(k.encode())
        h.update(sd[k].numpy().tobytes())
    return h.hexdigest()


def eval_rows(run: Path) -> list[list[str]]:
    """eval.csv without its wall-clock column."""
    lines = (run / "eval.csv").read_text().splitlines()
    assert lines[0].split(",")[-1] == "wall_s"
    return [ln.split(",")[:-1] for ln in lines[1:]]


def checkpoints(run: Path) -> list[int]:
    """Steps of the complete checkpoints (model and statistics both on disk)."""
    ck = run / "checkpoints"
    out = []
    for f in ck.glob("rl_model_*_steps.zip") if ck.is_dir() else []:
        m = re.fullmatch(r"rl_model_(\d+)_steps\.zip", f.name)
        if m and (ck / f"rl_model_vecnormalize_{m.group(1)}_steps.npz").is_file():
            out.append(int(m.group(1)))
    return sorted(out)


@pytest.mark.slow
@pytest.mark.timeout(300)  # a hang guard, not a speed target
def test_killed_training_resumes_to_the_same_total(tables, tmp_path):
    run = tmp_path / "run"
    total = 1536
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [sys.executable, str(ROOT / "train_agent.py"),
           *tiny(tables, run, "--timesteps", str(total), "--checkpoint-freq", "128", "--eval-freq", "256",
                 "--n-envs", "2", "--seed", "1")]
    log = open(tmp_path / "train.log", "wb")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
    try:
        while not (checkpoints(run) and checkpoints(run)[-1] >= 512):
            assert p.poll() is None, (tmp_path / "train.log").read_text()[-2000:]
            time.sleep(0.01)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # its SubprocVecEnv workers, if any are left
        except OSError:
            pass
        log.close()
    assert not (run / "model.zip").exists(), "the run ended before it was killed"
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["trained_timesteps"] == 0 and cfg["timesteps"] == total
    newest = checkpoints(run)[-1]
    assert newest < total
    rc = main(["train", "--run-dir", str(run), "--resume", "--timesteps", str(total), "--no-progress",
               "--no-tensorboard"])
    assert rc == 0
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["trained_timesteps"] == total
    assert cfg["resumed"][-1]["from_timesteps"] == newest and cfg["resumed"][-1]["to_timesteps"] == total
    steps = [int(r[0]) for r in eval_rows(run)]
    assert steps == sorted(set(steps)) and steps[-1] == total  # no evaluation twice, up to the end
    assert checkpoints(run)[-1] == total
    # the final model loads and acts
    from sb3_contrib import MaskablePPO

    model = MaskablePPO.load(run / "model.zip", device="cpu")
    assert model.num_timesteps == total


@pytest.mark.slow
def test_resume_skips_a_checkpoint_cut_short(tables, tmp_path):
    """A newest checkpoint that is not a readable zip (an older writer killed mid-save) is passed
    over: --resume continues from the one before."""
    run = tmp_path / "run"
    assert main(["train", *tiny(tables, run, "--timesteps", "256", "--checkpoint-freq", "128", "--eval-freq", "128",
                                "--n-envs", "1", "--vec", "dummy", "--seed", "2")]) == 0
    (run / "model.zip").unlink()
    ck = run / "checkpoints"
    (ck / "rl_model_256_steps.zip").write_bytes((ck / "rl_model_256_steps.zip").read_bytes()[:500])
    assert main(["train", "--run-dir", str(run), "--resume", "--timesteps", "384", "--no-progress",
                 "--no-tensorboard"]) == 0
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["resumed"][-1]["from_timesteps"] == 128 and cfg["trained_timesteps"] == 384


@pytest.mark.slow
@pytest.mark.parametrize("n_envs", [1, 2])
def test_same_seed_same_policy_and_eval_curve(tables, tmp_path, n_envs):
    vec = ["--vec", "dummy"] if n_envs == 1 else []
    hashes, curves = [], []
    for name, seed in (("a", 4), ("b", 4), ("c", 5)):
        run = tmp_path / name
        assert main(["train", *tiny(tables, run, "--timesteps", "384", "--eval-freq", "128", "--checkpoint-freq",
                                    "128", "--n-envs", str(n_envs), "--seed", str(seed), *vec)]) == 0
        hashes.append(policy_hash(run / "model.zip"))
        curves.append(eval_rows(run))
    assert hashes[0] == hashes[1] and curves[0] == curves[1]
    assert len(curves[0]) == 3
    assert hashes[2] != hashes[0] and curves[2] != curves[0]  # the seed matters, in the subprocess workers too


@pytest.mark.timeout(120)  # a hang guard, not a speed target
def test_max_wall_s_stops_learning_and_saves(tables, tmp_path):
    """--max-wall-s ends learning long before --timesteps; the model and config are saved as at a
    normal end, and the config says why it stopped."""
    run = tmp_path / "run"
    assert main(["train", *tiny(tables, run, "--timesteps", "10000000", "--max-wall-s", "2", "--n-envs", "1",
                                "--vec", "dummy", "--eval-freq", "1000000", "--checkpoint-freq", "1000000")]) == 0
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["stopped_at_wall_limit"] is True and cfg["max_wall_s"] == 2.0
    assert 0 < cfg["trained_timesteps"] < 10_000_000
    assert cfg["train_wall_s"] >= 2.0
    assert (run / "model.zip").is_file() and (run / "vecnormalize.npz").is_file()
    # the model learning stopped with is evaluated (no periodic evaluation came at freq 1000000),
    # so best/ can be it
    ev = pd.read_csv(run / "eval.csv")
    assert ev["timesteps"].tolist() == [cfg["trained_timesteps"]]
    assert json.loads((run / "best" / "config.json").read_text())["trained_timesteps"] == cfg["trained_timesteps"]


@pytest.mark.slow
@pytest.mark.timeout(300)  # a hang guard, not a speed target
def test_sigterm_saves_the_model(tables, tmp_path):
    """`kill PID` (SIGTERM) during learning saves model.zip like Ctrl-C does, and exits 130 with one line."""
    run = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [sys.executable, str(ROOT / "train_agent.py"),
           *tiny(tables, run, "--timesteps", "10000000", "--checkpoint-freq", "128", "--eval-freq", "1000000",
                 "--n-envs", "1", "--vec", "dummy", "--seed", "3")]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    while not checkpoints(run):
        assert p.poll() is None, p.stderr.read().decode()[-2000:]
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err.decode()[-2000:]
    lines = [ln for ln in err.decode().splitlines() if ln.strip()]
    assert lines[-1] == (f"jigsaw train: interrupted; the model so far is saved in {run} "
                         f"(`jigsaw train --run-dir {run} --resume` finishes it)")
    cfg = json.loads((run / "config.json").read_text())
    assert (run / "model.zip").is_file() and cfg["trained_timesteps"] >= checkpoints(run)[-1] > 0


def _wait_for(p, cond, what: str) -> None:
    """Poll until ``cond()``; the process ending first fails the test with its stderr (a hang is
    the test's timeout)."""
    while not cond():
        assert p.poll() is None, f"the run ended before its {what}: " + p.stderr.read().decode()[-2000:]
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.timeout(300)  # a hang guard, not a speed target
@pytest.mark.parametrize("when", ["recording", "dagger"])
def test_sigterm_in_the_warm_start_leaves_a_run_that_resume_finishes(tables, tmp_path, when):
    """SIGTERM while the expert is recorded (nothing saved yet) or during the first DAgger round
    (the clone checkpointed in warm_start/): exit 130 with one line, the folder is kept, and
    `--resume` (no other option) finishes the run: the warm start goes on from its last finished
    stage and learning reaches the recorded --timesteps."""
    run = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "jigsaw_env.cli", "train",
           *tiny(tables, run, "--timesteps", "128", "--checkpoint-freq", "64", "--eval-freq", "100000",
                 "--n-envs", "1", "--vec", "dummy", "--seed", "3", "--warm-start", "fifo", "--warm-start-s", "4",
                 "--bc-epochs", "1", "--dagger-rounds", "2", "--dagger-s", "4", "--dagger-epochs", "1")]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    progress = run / "warm_start" / "progress.json"
    if when == "recording":
        _wait_for(p, lambda: (run / "config.json").is_file(), "config.json")
        time.sleep(1.0)
        assert not progress.exists()
    else:
        _wait_for(p, progress.is_file, "warm-start checkpoint")
        time.sleep(1.0)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err.decode()[-2000:]
    lines = [ln for ln in err.decode().splitlines() if ln.strip()]
    assert lines[-1] == (f"jigsaw train: interrupted; its finished stages are kept in {run} "
                         f"(`jigsaw train --run-dir {run} --resume` finishes it)")
    assert (run / "config.json").is_file() and not (run / "model.zip").exists()
    if when == "dagger":
        st = json.loads(progress.read_text())
        assert st["stages_done"] == 1 and (run / "warm_start" / "fit" / "model.zip").is_file()
    r = subprocess.run([sys.executable, "-m", "jigsaw_env.cli", "train", "--run-dir", str(run), "--resume",
                        "--no-progress"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["trained_timesteps"] >= 128 and cfg["timesteps"] == 128
    ws = cfg["warm_start"]
    assert ws["done"] and len(ws["dagger"]) == 2 and json.loads(progress.read_text())["stages_done"] == 3
    assert (run / "warm_start" / "model.zip").is_file() and (run / "model.zip").is_file()
    assert [ln.split(",")[0] for ln in (run / "warm_start.csv").read_text().splitlines()[1:]] == \
        ["clone", "dagger1", "dagger2"]


@pytest.mark.slow
@pytest.mark.timeout(300)  # a hang guard, not a speed target
def test_sigterm_to_the_process_group_with_subprocess_workers(tables, tmp_path):
    """SIGTERM to the whole process group (what `timeout` and Slurm send) while two SubprocVecEnv
    workers run: the workers ignore it, the trainer saves the model and exits 130, and `--resume`
    finishes the run."""
    run = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "jigsaw_env.cli", "train",
           *tiny(tables, run, "--timesteps", "100000000", "--checkpoint-freq", "128", "--eval-freq", "1000000",
                 "--n-envs", "2", "--seed", "3", "--val", "0")]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT,
                         start_new_session=True)
    _wait_for(p, lambda: bool(checkpoints(run)), "checkpoint")
    os.killpg(p.pid, signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err.decode()[-2000:]
    lines = [ln for ln in err.decode().splitlines() if ln.strip()]
    assert lines[-1] == (f"jigsaw train: interrupted; the model so far is saved in {run} "
                         f"(`jigsaw train --run-dir {run} --resume` finishes it)")
    saved = json.loads((run / "config.json").read_text())["trained_timesteps"]
    assert saved >= checkpoints(run)[-1] > 0
    r = subprocess.run([sys.executable, "-m", "jigsaw_env.cli", "train", "--run-dir", str(run), "--resume",
                        "--timesteps", str(saved + 256), "--no-progress"], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((run / "config.json").read_text())["trained_timesteps"] >= saved + 256


def test_a_signal_inside_an_optimizer_step_interrupts_once_the_step_is_done():
    """SIGTERM that lands inside Adam's first step: without the hold, the step stops before the
    parameter's state is made (what a saved model then keeps and --resume fails on)."""
    import torch

    from train_agent import DeferredInterrupts

    def signalled_adam():
        p = torch.nn.Parameter(torch.zeros(3))
        p.grad = torch.ones(3)
        opt = torch.optim.Adam([p], lr=0.1)
        step = opt.step

        def step_after_a_signal(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs at the next bytecode, in here
            return step(*args, **kwargs)

        opt.step = step_after_a_signal
        return p, opt

    interrupts = DeferredInterrupts()
    prev = signal.signal(signal.SIGTERM, interrupts.handler)
    try:
        p, opt = signalled_adam()
        with pytest.raises(KeyboardInterrupt, match=f"signal {int(signal.SIGTERM)}"):
            opt.step()
        assert opt.state[p] == {}  # unguarded: interrupted before the step made any state
        p, opt = signalled_adam()
        interrupts.guard(opt)
        with pytest.raises(KeyboardInterrupt, match=f"signal {int(signal.SIGTERM)}"):
            opt.step()
        assert set(opt.state[p]) == {"step", "exp_avg", "exp_avg_sq"}  # the whole step, then the interrupt
        assert torch.allclose(p.detach(), torch.full((3,), -0.1))
        assert interrupts.pending is None and interrupts.depth == 0
        with pytest.raises(KeyboardInterrupt):  # outside a step: at once
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
    finally:
        signal.signal(signal.SIGTERM, prev)
