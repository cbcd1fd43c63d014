"""The stable-baselines3 callbacks of ``jigsaw train``: validation rows to eval.csv, best/ as a
RUN_DIR of its own, the curriculum, atomic checkpoints and the wall-time limit.

They know nothing of the run's files beyond what they are handed: ``save(model, dir)`` writes a
model and its observation statistics, ``write_config(path, cfg)`` a config.json and
``write_row(values)`` one row of eval.csv (train_agent supplies them).
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Callable

from sb3_contrib.common.maskable.callbacks import MaskableEvalCallback
from stable_baselines3.common.callbacks import BaseCallback, CheckpointCallback


def _mean(values) -> float:
    return float(sum(values) / len(values))


def _std(values) -> float:
    """Population standard deviation (as SB3's evaluation reports it)."""
    m = sum(values) / len(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / len(values))


class EvalToCSV(MaskableEvalCallback):
    """MaskableEvalCallback that replays the same validation episodes at every evaluation (the
    env reseeded with ``eval_seed``) and hands a row -- timesteps, reward mean/sd, episode length,
    episodes, the episodes' mean JCT (s), makespan (s), cluster efficiency and GPU utilization,
    the curriculum's difficulty, seconds since ``t_start`` -- to ``write_row``. ``reference``
    (agent -> its values on the same episodes) is logged beside it as flat lines.
    ``evaluate_first``: evaluate at the first step too (a warm-started policy before any update)."""

    def __init__(self, eval_env, *, eval_seed: int, write_row: Callable[[list], None], reference: dict | None,
                 t_start: float, evaluate_first: bool, **kwargs):
        super().__init__(eval_env, **kwargs)
        self.eval_seed = eval_seed
        self.write_row = write_row
        self.reference = reference or {}
        self.t_start = t_start
        self.evaluate_first = evaluate_first
        self.last_eval_s = 0.0
        self._metrics_buffer: list[dict] = []

    def _log_success_callback(self, locals_, globals_):
        super()._log_success_callback(locals_, globals_)
        info = locals_.get("info") or {}
        if locals_.get("done") and "episode_metrics" in info:
            self._metrics_buffer.append(info["episode_metrics"])

    def _on_step(self) -> bool:
        if self.n_calls == 1 and self.eval_freq != 1 and self.evaluate_first:
            # a warm-started run: evaluate the cloned policy first (no update has happened yet),
            # so that best/ is the clone when no PPO update beats it
            return self._evaluate_now()
        due = self.eval_freq > 0 and self.n_calls % self.eval_freq == 0
        if due:
            t_eval = time.perf_counter()
            self._metrics_buffer = []
            self.eval_env.seed(self.eval_seed)
        n_before = len(self.evaluations_timesteps)
        cont = super()._on_step()
        if due and len(self.evaluations_timesteps) > n_before:
            self._record(self._row())
            self.last_eval_s = time.perf_counter() - t_eval
        return cont

    def _row(self) -> list:
        rewards, lengths, ms = self.evaluations_results[-1], self.evaluations_length[-1], self._metrics_buffer

        def mean_of(key):
            v = [m.get(key) for m in ms if m.get(key) is not None]
            return _mean(v) if v else float("nan")

        diff = self.training_env.get_attr("difficulty")[0] if self.training_env is not None else 1.0
        return [self.num_timesteps, _mean(rewards), float(_std(rewards)), _mean(lengths), len(rewards),
                mean_of("avg_jct_s"), mean_of("makespan_s"), mean_of("cluster_efficiency"), mean_of("gpu_utilization"),
                float(diff), time.perf_counter() - self.t_start]

    def _record(self, row: list) -> None:
        self.write_row(row)
        self.logger.record("eval/mean_avg_jct_s", row[5])
        self.logger.record("eval/mean_cluster_efficiency", row[7])
        for name, ref in self.reference.items():  # flat lines: the heuristics on the same episodes
            for key in ("mean_reward", "mean_avg_jct_s"):
                if ref.get(key) is not None:
                    self.logger.record(f"eval/{key}_{name}", float(ref[key]))

    def _on_training_end(self) -> None:
        # the model learning ends with (at the step budget or at the wall-time limit; not on
        # Ctrl-C, which skips this) is a candidate for best/ too, unless the last evaluation saw it
        if self.num_timesteps > (self.evaluations_timesteps[-1] if self.evaluations_timesteps else -1):
            self._evaluate_now()
        super()._on_training_end()

    def _evaluate_now(self) -> bool:
        """One evaluation at this step, whatever the step count (the step is due at frequency 1)."""
        freq, self.eval_freq = self.eval_freq, 1
        try:
            return self._on_step()
        finally:
            self.eval_freq = freq


class SaveBestRun(BaseCallback):
    """On a new best evaluation: ``best_dir`` becomes a RUN_DIR of its own -- model.zip, the
    observation statistics the evaluation used (the training envs', synced just before it) and
    config.json with the timestep -- beside SB3's best/best_model.zip."""

    def __init__(self, best_dir: Path, cfg: dict, save: Callable, write_config: Callable):
        super().__init__()
        self.best_dir, self.cfg, self.save, self.write_config = Path(best_dir), cfg, save, write_config

    def _on_step(self) -> bool:
        d = self.best_dir
        d.mkdir(parents=True, exist_ok=True)
        self.save(self.model, d)
        self.write_config(d / "config.json", dict(self.cfg, trained_timesteps=int(self.model.num_timesteps),
                                                  selected_on="val"))
        return True


class Curriculum(BaseCallback):
    """Sets the training envs' difficulty to ``min(1, timesteps / steps)`` before every rollout."""

    def __init__(self, steps: int):
        super().__init__()
        self.steps = max(1, int(steps))

    def _set(self) -> None:
        d = min(1.0, self.num_timesteps / self.steps)
        self.training_env.env_method("set_difficulty", d)
        self.logger.record("train/difficulty", d)

    def _on_training_start(self) -> None:
        self._set()

    def _on_rollout_start(self) -> None:
        self._set()

    def _on_step(self) -> bool:
        return True


class AtomicCheckpoint(CheckpointCallback):
    """CheckpointCallback whose files are written by ``save(model, model_path, stats_path)``
    (atomically, statistics first)."""

    def __init__(self, *args, save: Callable, **kwargs):
        super().__init__(*args, **kwargs)
        self.save = save

    def _on_step(self) -> bool:
        if self.n_calls % self.save_freq == 0:
            self.save(self.model, Path(self._checkpoint_path(extension="zip")),
                      Path(self._checkpoint_path("vecnormalize_", extension="npz")))
        return True


class StopAtWallTime(BaseCallback):
    """Ends learning once ``limit_s`` seconds have passed since ``t_start`` less the time the final
    evaluation will take (as long as ``evaluator``'s last one took), so that the final model is
    evaluated within the limit; ``on_stop()`` is called then (the model is saved as at a normal end)."""

    def __init__(self, limit_s: float, evaluator, t_start: float, on_stop: Callable[[], None]):
        super().__init__()
        self.limit_s = float(limit_s)
        self.evaluator = evaluator
        self.t_start = t_start
        self.on_stop = on_stop

    def _on_step(self) -> bool:
        reserve = float(getattr(self.evaluator, "last_eval_s", 0.0))
        if time.perf_counter() - self.t_start < self.limit_s - reserve:
            return True
        self.on_stop()
        return False
