"""More behaviour cloning on a run's own demonstrations: what further fitting of the clone gives,
beside what the run's RL phase gave.

    python -m bench.refit_clone runs/learned --epochs 6 --learning-rate 3e-4 --out runs/learned_refit

Loads RUN/warm_start (the clone a warm-started ``jigsaw train`` saved before RL, its VecNormalize
statistics and ``demos.npz``: the expert's episodes and every DAgger round's labelled states) and
fits the clone ``--epochs`` more epochs on all of them, with the run's own fit settings (minibatch,
act weight, width power) and its observation and return statistics unchanged. Writes OUT as a run
folder of its own (``model.zip``, ``vecnormalize.npz``, ``config.json``: the clone's, with a
``refit`` record), which ``jigsaw evaluate --agents OUT`` and ``python -m bench.validation_choice``
take, and ``OUT/refit.json`` (each epoch's loss, accuracy over feasible actions and value MSE).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from bench.results_folder import portable_text


def refit(run: Path, out: Path, epochs: int, learning_rate: float, seed: int = 0, threads: int = 1,
          progress: bool = True) -> dict:
    """Fit RUN's clone ``epochs`` more epochs on RUN's demonstrations and save it as OUT (module
    docstring); returns the record written to OUT/refit.json."""
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    import train_agent as ta
    from agents.imitation import behaviour_clone

    clone = run / ta.WARM_DIR
    cfg = json.loads((clone / "config.json").read_text())
    ws = cfg["warm_start"]
    venv = VecNormalize(DummyVecEnv([ta.warm_start_env_factory(cfg)]), norm_obs=True, norm_reward=True,
                        gamma=ta.sb3_gamma_of(cfg))
    ta.load_stats_into(venv, clone / "vecnormalize.npz")
    model = MaskablePPO.load(str(clone / "model.zip"), env=venv, device="cpu")
    t0 = time.perf_counter()
    demos = ta.load_demos(clone / "demos.npz")
    with ta.torch_threads(threads):
        hist = behaviour_clone(model, demos, venv=venv, epochs=epochs, seed=seed, fit_stats=False,
                               batch_size=int(ws.get("batch_size", 1024)), learning_rate=learning_rate,
                               gamma=float(venv.gamma), gamma_per_hour=cfg["hyperparameters"].get("gamma_per_hour"),
                               act_weight=float(ws.get("act_weight", 1.0)),
                               width_power=float(ws.get("width_power", 0.0)), progress=progress)
    record = {"run": portable_text(str(run)), "transitions": len(demos), "epochs": epochs,
              "learning_rate": learning_rate, "seed": seed, "history": hist, "wall_s": time.perf_counter() - t0}
    out.mkdir(parents=True, exist_ok=True)
    ta.save_state(model, venv, out / "model.zip", out / "vecnormalize.npz")
    (out / "config.json").write_text(json.dumps(dict(cfg, refit={k: v for k, v in record.items() if k != "history"}),
                                                indent=1) + "\n")
    (out / "refit.json").write_text(json.dumps(record, indent=1) + "\n")
    venv.close()
    return record


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", help="a run folder trained with --warm-start (it holds warm_start/demos.npz)")
    p.add_argument("--epochs", type=int, default=6, help="epochs over all the run's demonstrations (default 6)")
    p.add_argument("--learning-rate", type=float, default=3e-4, help="Adam learning rate (default 3e-4)")
    p.add_argument("--seed", type=int, default=0, help="minibatch order (default 0)")
    p.add_argument("--threads", type=int, default=1, help="torch threads for the fit (default 1)")
    p.add_argument("--out", required=True, help="the refitted clone's run folder")
    a = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    run = Path(a.run)
    missing = [f for f in ("config.json", "model.zip", "vecnormalize.npz", "demos.npz")
               if not (run / "warm_start" / f).is_file()]
    if missing:
        p.error(f"{run}/warm_start lacks {', '.join(missing)}: RUN must be a run folder trained with --warm-start")
    if a.epochs < 1 or a.threads < 1:
        p.error(f"--epochs and --threads must be >= 1, got {a.epochs} and {a.threads}")
    if not a.learning_rate > 0:
        p.error(f"--learning-rate must be > 0, got {a.learning_rate}")
    rec = refit(run, Path(a.out), a.epochs, a.learning_rate, a.seed, a.threads)
    last = rec["history"][-1]
    print(f"{a.out}: {rec['transitions']} transitions, {a.epochs} epochs, accuracy {last['accuracy']:.4f}, "
          f"{rec['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
