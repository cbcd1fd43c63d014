"""Train a learned scheduler on ``JigsawCluster-v0`` (also ``jigsaw train``).

    python train_agent.py --trace synthetic --gpus 64 --max-jobs 50 --timesteps 200000 --run-dir runs/ppo1
    jigsaw train --algo ppo --n-envs 4 --timesteps 50000 --run-dir runs/ppo-plain
    jigsaw train --run-dir runs/ppo1 --resume --timesteps 400000      # continue to 400k steps

A resumed run keeps its config.json: besides --timesteps and --max-wall-s (and the output options
--progress, --tensorboard, --verbose), an option given with --resume must equal the run's value.
Options are checked, and the envs and the model built, before the run folder is written; a new
run that fails before saving any model removes what it wrote, so the same --run-dir can be reused.

MaskablePPO (sb3-contrib) by default, with the env's exact action masks (``action_masks()``,
fetched from every SubprocVecEnv worker through ``env_method``); ``--algo ppo|a2c`` train the
plain stable-baselines3 algorithms on the same env, where a masked action is a no-op.

Training uses N environments (``--n-envs`` or ``--num-envs``, SubprocVecEnv; ``--vec dummy`` keeps
them in this process; ``--ray [ADDRESS]`` runs them as Ray actors, agents/ray_vec_env.py and
docs/scale.md), VecNormalize on observations and rewards, a MaskableEvalCallback on a validation split
of the trace (``--val F``, default 0.1; synthetic: generator seeds of its own; real traces: the F
of the jobs before the held-out ``--holdout``; see agents/rl_env.py), so the held-out jobs stay
unseen until the final evaluation (``--val 0``: no in-training evaluation and no best/; a
warm-started run is also evaluated before its first update), checkpoints, TensorBoard logs and a
progress bar. Every episode draws new jobs (a new synthetic trace, or a random window of the
trace), optionally with a sampled load (``--load 0.5,1.0,1.5``) and a curriculum
(``--curriculum``), so one agent generalises across trace windows.

``--preset NAME`` and ``--config FILE`` read options from TOML (agents/presets/); flags on the
command line override them. ``--gamma-per-hour`` discounts per simulated second
(agents/semi_mdp.py); ``--obs-features`` chooses the observation's feature groups. SIGINT and
SIGTERM stop a run in any phase with its folder kept; ``--resume`` finishes it.

RUN_DIR/ gets model.zip, vecnormalize.npz, config.json, eval.csv, eval.png, reference.json
(Tiresias's and Jigsaw's values on the validation episodes), best/ (the best evaluation's model
as a RUN_DIR of its own, beside SB3's best_model.zip), checkpoints/, warm_start/ and tb/
(TensorBoard). docs/evaluation.md describes them.
"""
from __future__ import annotations

import argparse
import contextlib
import errno
import importlib.util
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from agents.imitation import (Demonstrations, HeuristicExpert, behaviour_clone, collect, collect_on_policy, concat,
                              episode_seed_base, expert_names, policy_actor)
from agents.rl import (ALGOS, POLICIES, RUN_FORMAT, algo_class, json_kind, read_run_config, run_pause_mode, run_spill,
                       run_window_order,
                       spaces_signature)
from agents.rl_env import ENV_KEYS, make_env_fn, proposer_name
from agents.vecnorm_file import legacy_refusal, read_vecnormalize, wrap_vecnormalize, write_vecnormalize
from jigsaw_env.actions import PAUSE_MODES, WINDOW_ORDERS
from jigsaw_env.cli import error_line
from jigsaw_env.cli_args import int_at_least, non_negative_float, positive_float, positive_int
from jigsaw_env.cluster import ClusterSpec
from jigsaw_env.cost_table import CostTable, register_tables_dir, table_files
from jigsaw_env.encoder import FEATURE_GROUPS, check_features
from jigsaw_env.simulate_cli import add_cluster_arguments
from jigsaw_executor.cluster_ray import connect, physical_cores, probe_address

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

EVAL_COLUMNS = ["timesteps", "mean_reward", "std_reward", "mean_ep_length", "episodes", "mean_avg_jct_s",
                "mean_makespan_s", "mean_cluster_efficiency", "mean_gpu_utilization", "difficulty", "wall_s"]
CHECKPOINT_PREFIX = "rl_model"


# ----------------------------------------------------------------------------------------------- CLI
def _loads(text: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--load must be a number or a comma-separated list, got {text!r}") from None
    if not vals or any(not v > 0 for v in vals):
        raise argparse.ArgumentTypeError(f"--load values must be > 0, got {text!r}")
    return vals


def _positive_ints(flag: str, what: str):
    """An argparse type: a comma-separated list of integers >= 1 (``what`` names them)."""
    def parse(text: str) -> list[int]:
        try:
            v = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be comma-separated {what}, got {text!r}") from None
        if not v or any(x < 1 for x in v):
            raise argparse.ArgumentTypeError(f"{flag} must be comma-separated {what} >= 1, got {text!r}")
        return v
    return parse


def _gamma(text: str) -> float:
    """--gamma: a discount factor in (0, 1]."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--gamma must be a number, got {text!r}") from None
    if not 0.0 < x <= 1.0:
        raise argparse.ArgumentTypeError(f"--gamma must be in (0, 1], got {text}")
    return x


SEED_MAX = 2**32 - 1  # numpy's global seed (stable-baselines3's set_random_seed) takes no more


def _seed(text: str) -> int:
    """--seed: an integer in [0, 2**32 - 1]."""
    x = int_at_least("--seed", 0)(text)
    if x > SEED_MAX:
        raise argparse.ArgumentTypeError(f"--seed must be <= {SEED_MAX} (2**32 - 1), got {x}")
    return x


def _gamma_per_hour(text: str) -> float:
    """--gamma-per-hour: a discount factor per simulated hour, in (0, 1]."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--gamma-per-hour must be a number, got {text!r}") from None
    if not 0.0 < x <= 1.0:
        raise argparse.ArgumentTypeError(f"--gamma-per-hour must be in (0, 1], got {text}")
    return x


def _obs_features(text: str) -> list[str]:
    """--obs-features: comma-separated feature groups (``jigsaw_env.encoder.FEATURE_GROUPS``)."""
    try:
        return list(check_features(text, "--obs-features"))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


#: --val's default: in-training evaluation and best/ on a validation split, never on held-out jobs
DEFAULT_VAL = 0.1


def preset_dir() -> Path:
    """The folder of the shipped presets: ``presets/`` of the ``agents`` package (package data)."""
    spec = importlib.util.find_spec("agents")
    return Path(list(spec.submodule_search_locations)[0]) / "presets"


def preset_names() -> list[str]:
    """The shipped presets (agents/presets/*.toml), sorted."""
    return sorted(f.stem for f in preset_dir().glob("*.toml"))


_gpu_list = _positive_ints("--train-gpus", "GPU counts")
_val_gpu_list = _positive_ints("--val-gpus", "GPU counts")
_net_arch = _positive_ints("--net-arch", "layer sizes")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``jigsaw train``, by group (each a function below)."""
    add_cluster_arguments(p)
    _episode_arguments(p)
    _environment_arguments(p)
    _training_arguments(p)
    _warm_start_arguments(p)
    _output_arguments(p)
    _track_explicit(p)


def _episode_arguments(p: argparse.ArgumentParser) -> None:
    """Where episodes come from: the trace, its splits, cluster sizes, the curriculum."""
    t = p.add_argument_group("episodes")
    t.add_argument("--trace", default="synthetic", metavar="KIND:PATH",
                   help="trace to draw episodes from: synthetic[:...] (a new trace per episode) or KIND:PATH "
                        "(windows of --max-jobs consecutive jobs) (default: synthetic)")
    t.add_argument("--trace-gpu-type", default=None, metavar="TYPE",
                   help="GPU type the trace ran on, for iterations (default: per format)")
    t.add_argument("--max-jobs", type=positive_int("--max-jobs"), default=50, help="jobs per episode (default 50)")
    t.add_argument("--load", type=_loads, default=None, metavar="X[,X...]",
                   help="offered load per episode; several values are sampled uniformly per episode "
                        "(default: synthetic 1.0, a real trace's own arrivals)")
    t.add_argument("--holdout", type=float, default=0.2,
                   help="held-out fraction of a real trace for evaluation (default 0.2: the last 20%% of jobs)")
    t.add_argument("--val", type=float, default=DEFAULT_VAL, metavar="F",
                   help="validation fraction of a real trace (of all jobs, cut from the end of the training part; "
                        "synthetic: its own generator seeds): the evaluation callback, eval.csv and best/ use it, "
                        "so the held-out split stays unseen until the final evaluation; 0 turns the in-training "
                        f"evaluation and best/ off (default {DEFAULT_VAL})")
    t.add_argument("--wide-share", type=float, default=0.0, metavar="F",
                   help="share of training episodes (real traces) built around a job of at least --wide-gpus GPUs: "
                        "one drawn uniformly, then a window holding it (default 0: uniform windows)")
    t.add_argument("--wide-gpus", type=positive_int("--wide-gpus"), default=8, metavar="G",
                   help="what --wide-share counts as a wide job (default 8 GPUs)")
    t.add_argument("--train-gpus", type=_gpu_list, default=None, metavar="G[,G...]",
                   help="cluster sizes of training episodes, one drawn per episode (the held-out evaluation "
                        "uses --gpus, validation --val-gpus); small clusters show jobs that take half or all of "
                        "the cluster, which a real trace rarely has (default: --gpus)")
    t.add_argument("--val-gpus", type=_val_gpu_list, default=None, metavar="G[,G...]",
                   help="cluster sizes of validation episodes (--val), one drawn per episode: validating on the "
                        "training sizes lets best/ be chosen on the crowded episodes (queues, preemptions, "
                        "starvation promotions) that the validation windows rarely hold at --gpus "
                        "(default: --gpus)")
    t.add_argument("--curriculum", action="store_true",
                   help="grow episodes from max_jobs/4 jobs at half load to the full task over --curriculum-steps")
    t.add_argument("--curriculum-steps", type=positive_int("--curriculum-steps"), default=None,
                   help="timesteps of the curriculum ramp (default: half of --timesteps)")
    t.add_argument("--max-time-s", type=float, default=None,
                   help="truncate episodes after this simulated time (default: none)")


def _environment_arguments(p: argparse.ArgumentParser) -> None:
    """The environment's window, SPB levels, reward and observation."""
    e = p.add_argument_group("environment")
    e.add_argument("--window-k", type=positive_int("--window-k"), default=16, help="jobs visible per round, K (default 16)")
    e.add_argument("--spb-levels", type=int, default=3, help="deepest SPB level L (default 3)")
    e.add_argument("--spb-slots", type=positive_int("--spb-slots"), default=4, help="start slots per level (default 4)")
    e.add_argument("--reward", choices=("jct", "efficiency"), default="jct", help="reward (default jct)")
    e.add_argument("--reward-scale", type=float, default=3600.0, help="reward divisor in seconds (default 3600)")
    e.add_argument("--observe-remaining", action=argparse.BooleanOptionalAction, default=True,
                   help="observe remaining work (an oracle, as SRTF has; default on)")
    e.add_argument("--work-conserving", action=argparse.BooleanOptionalAction, default=False,
                   help="mask advance while the round's decision runs nothing and a window job could start, "
                        "as learned agents run at evaluation (default off)")
    e.add_argument("--window-order", choices=WINDOW_ORDERS, default="attained",
                   help="the window's order of waiting jobs: least attained GPU-seconds, or the round's 2D-LAS "
                        "rank (Tiresias's and Jigsaw's order, starvation guard included) (default attained)")
    e.add_argument("--pause", choices=PAUSE_MODES, default="leave",
                   help="what a pause does with the job: decide it for the round, or requeue it at the back of the "
                        "round's line, where it can be placed again (a running job released and moved after "
                        "others) (default leave)")
    e.add_argument("--spill", action=argparse.BooleanOptionalAction, default=False,
                   help="on advance, run every job the decision leaves waiting that can run: on free GPUs, or on "
                        "the free GPUs plus GPUs of the lowest-priority jobs, shared (jigsaw_env/spill.py; "
                        "default off)")
    e.add_argument("--obs-features", type=_obs_features, default=None, metavar="G[,G...]",
                   help=f"observation feature groups, from {','.join(FEATURE_GROUPS)}; 'base' is required "
                        f"(docs/environment.md lists each group's features) (default: every group but proposal)")
    e.add_argument("--proposer", default=None, metavar="NAME",
                   help="with the 'proposal' feature group: the scheduler whose decision for each round the "
                        "observation shows (default jigsaw)")


def _training_arguments(p: argparse.ArgumentParser) -> None:
    """The algorithm, its budget, sampling and hyperparameters, the policy network."""
    a = p.add_argument_group("training")
    a.add_argument("--algo", choices=ALGOS, default="maskable_ppo", help="algorithm (default maskable_ppo)")
    a.add_argument("--timesteps", type=positive_int("--timesteps"), default=100_000,
                   help="total env steps to train to (with --resume: the new total) (default 100000)")
    a.add_argument("--max-wall-s", type=positive_float("--max-wall-s"), default=None, metavar="S",
                   help="stop learning after S seconds of wall time in all (resumed runs included) and save, "
                        "whichever comes first with --timesteps (default: no limit)")
    a.add_argument("--n-envs", "--num-envs", type=positive_int("--n-envs"), default=max(1, min(4, os.cpu_count() or 1)),
                   help="parallel environments (default min(4, CPUs))")
    a.add_argument("--vec", choices=("subproc", "dummy", "ray"), default="subproc",
                   help="SubprocVecEnv (default), DummyVecEnv (all envs in this process) or Ray actors (--ray)")
    a.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   help="run the training envs as Ray actors (agents/ray_vec_env.py): --ray alone in an embedded "
                        "Ray, --ray auto or --ray HOST:PORT on a running cluster (docs/scale.md)")
    a.add_argument("--seed", type=_seed, default=0, help="random seed, 0 .. 2**32 - 1 (default 0)")
    a.add_argument("--eval-freq", type=positive_int("--eval-freq"), default=10_000,
                   help="evaluate on the validation split every this many timesteps (default 10000)")
    a.add_argument("--eval-episodes", type=positive_int("--eval-episodes"), default=3, help="episodes per evaluation (default 3)")
    a.add_argument("--checkpoint-freq", type=positive_int("--checkpoint-freq"), default=10_000,
                   help="save a checkpoint every this many timesteps (default 10000)")
    a.add_argument("--learning-rate", type=positive_float("--learning-rate"), default=3e-4,
                   help="optimizer learning rate, > 0 (default 0.0003)")
    a.add_argument("--n-steps", type=positive_int("--n-steps"), default=None,
                   help="rollout steps per env per update (default: 256 for (maskable) PPO, 5 for A2C)")
    a.add_argument("--batch-size", type=positive_int("--batch-size"), default=64, help="PPO minibatch size (default 64)")
    a.add_argument("--n-epochs", type=positive_int("--n-epochs"), default=10, help="PPO epochs per update (default 10)")
    a.add_argument("--clip-range", type=positive_float("--clip-range"), default=0.2, help="PPO clip range (default 0.2)")
    a.add_argument("--target-kl", type=positive_float("--target-kl"), default=None,
                   help="PPO: stop an update's epochs early once the approximate KL exceeds this (default: off); "
                        "keeps fine-tuning after --warm-start close to the cloned policy")
    a.add_argument("--gamma", type=_gamma, default=0.99,
                   help="discount factor per env step, in (0, 1] (default 0.99)")
    a.add_argument("--gamma-per-hour", type=_gamma_per_hour, default=None, metavar="G",
                   help="discount per simulated hour instead (semi-MDP): a step that takes dt simulated seconds "
                        "(info['dt_s']: a round's length on an advance, 0 on a decision step) is discounted by "
                        "G^(dt/3600); docs/evaluation.md (default: off, --gamma per step)")
    a.add_argument("--ent-coef", type=non_negative_float("--ent-coef"), default=0.01,
                   help="entropy bonus coefficient, >= 0 (default 0.01)")
    a.add_argument("--net-arch", type=_net_arch, default=[128, 128], help="hidden layers (default 128,128)")
    a.add_argument("--policy", choices=POLICIES, default="mlp",
                   help="policy network: mlp (SB3's MlpPolicy on the flat observation) or slots (every window "
                        "slot scored by the same layers, agents/slot_policy.py; the value net stays an MLP of "
                        "--net-arch) (default mlp)")
    a.add_argument("--slot-hidden", type=positive_int("--slot-hidden"), default=64,
                   help="width of the slot policy's shared layers (default 64)")


def _warm_start_arguments(p: argparse.ArgumentParser) -> None:
    """Behaviour cloning and DAgger before RL."""
    w = p.add_argument_group("imitation warm start (agents/imitation.py)")
    w.add_argument("--warm-start", default=None, metavar="HEURISTIC",
                   help="before RL, clone this heuristic's decisions (e.g. jigsaw, tiresias): play it on training "
                        "episodes, fit the policy to its actions and the value head to its returns (default: off)")
    w.add_argument("--warm-start-s", type=positive_float("--warm-start-s"), default=120.0, metavar="S",
                   help="wall seconds of expert play to record (default 120; counts against --max-wall-s)")
    w.add_argument("--warm-start-order", choices=("slot", "heuristic"), default="slot",
                   help="order of the expert's actions within a round: larger jobs first, then by window slot "
                        "(default, learnable from the observation), or the heuristic's own order")
    w.add_argument("--bc-epochs", type=positive_int("--bc-epochs"), default=4,
                   help="behaviour-cloning epochs on the expert's own episodes (default 4)")
    w.add_argument("--bc-batch-size", type=positive_int("--bc-batch-size"), default=1024,
                   help="behaviour-cloning minibatch size (default 1024)")
    w.add_argument("--bc-act-weight", type=positive_float("--bc-act-weight"), default=3.0,
                   help="loss weight of the steps where the expert acts, against 1 where it advances (default 3)")
    w.add_argument("--bc-width-power", type=float, default=0.0, metavar="P",
                   help="a step whose widest undecided job has g GPUs weighs g^P more (default 0: width does not "
                        "count); P > 0 makes the rare states with wide jobs count more")
    w.add_argument("--dagger-rounds", type=int, default=2, metavar="N",
                   help="DAgger rounds after cloning: play the policy, label its states with the expert, refit "
                        "on everything so far (default 2; 0 = plain behaviour cloning)")
    w.add_argument("--dagger-s", type=positive_float("--dagger-s"), default=60.0, metavar="S",
                   help="wall seconds of policy play per DAgger round (default 60)")
    w.add_argument("--dagger-epochs", type=positive_int("--dagger-epochs"), default=2,
                   help="epochs over all the data so far after each DAgger round (default 2)")
    w.add_argument("--bc-learning-rate", type=positive_float("--bc-learning-rate"), default=1e-3,
                   help="behaviour-cloning Adam learning rate (default 1e-3)")
    cores = physical_cores()
    w.add_argument("--bc-threads", type=positive_int("--bc-threads"), default=cores, metavar="N",
                   help="torch threads while the policy is fitted to the demonstrations (default: every physical "
                        f"core this process may use, {cores} here); the env workers are idle then, and RL keeps one "
                        "thread")


def _output_arguments(p: argparse.ArgumentParser) -> None:
    """Presets, config files and where and how the run is written."""
    c = p.add_argument_group("presets and config files (flags given on the command line override them)")
    c.add_argument("--preset", choices=preset_names(), default=None, metavar="NAME",
                   help=f"options of a shipped recipe (agents/presets/NAME.toml): {', '.join(preset_names())} "
                        f"(default: none)")
    c.add_argument("--config", default=None, metavar="FILE",
                   help="options from a TOML file with a [train] table of option = value (names as the flags, "
                        "without the dashes); over --preset's (default: none)")
    o = p.add_argument_group("output")
    o.add_argument("--run-dir", default=None, help="output folder (default runs/<algo>-<time>)")
    o.add_argument("--resume", action="store_true",
                   help="continue RUN_DIR from its latest checkpoint (or final model) to --timesteps in total")
    o.add_argument("--tensorboard", action=argparse.BooleanOptionalAction, default=True,
                   help="write TensorBoard logs to RUN_DIR/tb (default on)")
    o.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True, help="progress bar (default on)")
    o.add_argument("--verbose", type=int, default=0, help="stable-baselines3 verbosity (default 0)")


# ----------------------------------------------------------------------------------------------- explicit options
EXPLICIT_ATTR = "_explicit_options"
_TRACKING: dict[type, type] = {}


def _track_explicit(p: argparse.ArgumentParser) -> None:
    """Make every option of ``p`` record, when given on the command line, its dest and spelling in
    ``args._explicit_options`` ({dest: option string}): argparse fills defaults without calling
    the actions, so what is recorded is exactly what the user passed (``--resume`` compares
    those with the run's config.json)."""
    for action in p._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        cls = type(action)
        if cls not in _TRACKING:
            def __call__(self, parser, namespace, values, option_string=None, _base=cls):
                _base.__call__(self, parser, namespace, values, option_string)
                seen = getattr(namespace, EXPLICIT_ATTR, None)
                if seen is None:
                    seen = {}
                    setattr(namespace, EXPLICIT_ATTR, seen)
                seen[self.dest] = option_string or self.option_strings[0]
            _TRACKING[cls] = type(f"Tracked{cls.__name__}", (cls,), {"__call__": __call__})
        action.__class__ = _TRACKING[cls]


def explicit_options(args) -> dict[str, str]:
    """{dest: option string} of the options given on the command line (empty for a Namespace that
    did not come from this module's parser)."""
    return dict(getattr(args, EXPLICIT_ATTR, None) or {})


def register(subparsers) -> None:
    # every option's help says its default once (no ArgumentDefaultsHelpFormatter on top)
    p = subparsers.add_parser("train", help="train a learned scheduler (MaskablePPO / PPO / A2C)",
                              description=__doc__.split("\n\n")[0])
    add_arguments(p)
    p.set_defaults(func=run)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="train_agent.py", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return p


# ----------------------------------------------------------------------------------------------- option files
FROM_FILES_ATTR = "_options_from_files"
#: options a preset or a config file cannot set
_NOT_IN_FILES = frozenset({"preset", "config", "run_dir", "resume", "help"})


def _load_toml(path: Path, label: str) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise ValueError(f"{label}: reading TOML needs Python 3.11 or the tomli package") from None
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{label}: not valid TOML ({e})") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{label}: not a text file ({e.reason})") from None


def read_options_file(path: Path, label: str) -> tuple[dict[str, Any], list[str], str]:
    """A preset or config file: ``([train] options, needs, description)``. The file holds an optional
    ``description`` (text), an optional ``needs`` (options that must come from the command line,
    e.g. a trace path) and a ``[train]`` table of ``option = value`` (the flags' names without the
    leading dashes). ValueError (one line naming the file and the key) otherwise."""
    d = _load_toml(path, label)
    unknown = sorted(set(d) - {"description", "needs", "train"})
    if unknown:
        raise ValueError(f"{label}: unknown key {unknown[0]!r}; expected description, needs and a [train] table")
    train = d.get("train", {})
    if not isinstance(train, dict):
        raise ValueError(f"{label}: 'train' must be a table ([train] with option = value lines)")
    needs = d.get("needs", [])
    if not isinstance(needs, list) or not all(isinstance(x, str) for x in needs):
        raise ValueError(f"{label}: 'needs' must be a list of option names, e.g. [\"trace\"]")
    return train, needs, str(d.get("description", ""))


def apply_option_files(args) -> dict[str, str]:
    """Set the options of ``--preset`` then ``--config`` (later files win) on ``args``, except those
    given on the command line, which win over both; returns {dest: file label} of what they set.
    Each value goes through the flag's own parser (type, choices), so a bad one gets the flag's
    message, prefixed by the file. ValueError (one line) for an unknown option or a missing ``needs``."""
    sources = []
    if getattr(args, "preset", None):
        sources.append((f"--preset {args.preset}", preset_dir() / f"{args.preset}.toml"))
    if getattr(args, "config", None):
        path = Path(args.config)
        if not path.is_file():
            raise ValueError(f"--config: no such file: {path}")
        sources.append((f"--config {path}", path))
    explicit = explicit_options(args)
    actions = {a.dest: a for a in build_parser()._actions if a.option_strings}
    applied: dict[str, str] = {}
    needs_of: list[tuple[str, str]] = []
    for label, path in sources:
        options, needs, _ = read_options_file(path, label)
        needs_of += [(label, n) for n in needs]
        for key, value in options.items():
            dest = str(key).replace("-", "_")
            act = actions.get(dest)
            if act is None or dest in _NOT_IN_FILES:
                raise ValueError(f"{label}: unknown option {key!r} in [train]; expected a `jigsaw train` flag "
                                 f"without its dashes (e.g. max-jobs = 50)")
            flag = act.option_strings[0]
            if act.nargs == 0:  # a switch: true or false
                if not isinstance(value, bool):
                    raise ValueError(f"{label}: option {key!r}: expected true or false, got {value!r}")
            else:
                if isinstance(value, bool) or isinstance(value, dict):
                    raise ValueError(f"{label}: option {key!r}: expected a value for {flag}, got {value!r}")
                text = ",".join(str(x) for x in value) if isinstance(value, list) else str(value)
                if act.type is not None:
                    try:
                        value = act.type(text)
                    except (argparse.ArgumentTypeError, ValueError, TypeError) as e:
                        raise ValueError(f"{label}: option {key!r}: {e}") from None
                else:
                    value = text
                if act.choices is not None and value not in act.choices:
                    raise ValueError(f"{label}: option {key!r}: expected one of {list(act.choices)}, got {value!r}")
            if dest not in explicit:
                setattr(args, dest, value)
                applied[dest] = label
    for label, n in needs_of:
        dest = n.replace("-", "_")
        if dest not in explicit and dest not in applied:
            raise ValueError(f"{label} needs --{n.replace('_', '-')} on the command line (the preset cannot know it)")
    setattr(args, FROM_FILES_ATTR, applied)
    return applied


def options_from_files(args) -> dict[str, str]:
    """{dest: file label} of the options a preset or config file set (:func:`apply_option_files`)."""
    return dict(getattr(args, FROM_FILES_ATTR, None) or {})


# ----------------------------------------------------------------------------------------------- config
def config_from_args(args) -> dict[str, Any]:
    """The JSON config of a run (written to RUN_DIR/config.json)."""
    loads = args.load
    env = {
        "gpus": args.gpus, "gpus_per_node": args.gpus_per_node, "gpu_type": args.gpu_type,
        "gpu_memory_gib": args.gpu_memory_gib, "trace": args.trace, "max_jobs": args.max_jobs,
        "load": loads[0] if loads and len(loads) == 1 else None, "window_k": args.window_k,
        "spb_levels": args.spb_levels, "spb_slots": args.spb_slots, "max_workers_per_gpu": args.max_workers_per_gpu,
        "round_s": args.round_s, "restart_s": args.restart_s, "reward": args.reward,
        "reward_scale": args.reward_scale, "observe_remaining": args.observe_remaining,
        "backlogged": args.backlogged, "max_time_s": args.max_time_s, "sharing": args.sharing,
        "pace": args.pace, "obs_features": list(check_features(args.obs_features)),
        "work_conserving": args.work_conserving, "window_order": args.window_order, "pause": args.pause,
        "spill": args.spill,
    }
    env["proposer"] = proposer_name({"obs_features": env["obs_features"], "proposer": args.proposer},
                                    ("--proposer", "--obs-features"))  # None without the proposal group
    n_steps = args.n_steps or (5 if args.algo == "a2c" else 256)
    return {
        "format": RUN_FORMAT,
        "algo": args.algo,
        "policy": "MlpPolicy" if args.policy == "mlp" else "slots",
        "hyperparameters": {"learning_rate": args.learning_rate, "n_steps": n_steps, "batch_size": args.batch_size,
                            "n_epochs": args.n_epochs, "gamma": args.gamma, "ent_coef": args.ent_coef,
                            "net_arch": list(args.net_arch), "slot_hidden": args.slot_hidden, "clip_range": args.clip_range, "target_kl": args.target_kl,
                            "gamma_per_hour": args.gamma_per_hour},
        "env": env,
        "sampling": {"loads": loads, "holdout": args.holdout, "val": args.val, "trace_gpu_type": args.trace_gpu_type,
                     "wide_share": args.wide_share, "wide_gpus": args.wide_gpus,
                     "train_gpus": args.train_gpus, "val_gpus": args.val_gpus,
                     "curriculum": bool(args.curriculum),
                     "curriculum_steps": args.curriculum_steps or (args.timesteps // 2 if args.curriculum else None),
                     "train_split": "synthetic seeds [0, 2^30)" if args.trace.startswith("synthetic")
                     else f"first {1 - args.holdout - args.val:.0%} of the jobs",
                     "eval_split": "synthetic seeds [2^30, 2^31)" if args.trace.startswith("synthetic")
                     else f"last {args.holdout:.0%} of the jobs",
                     "val_split": None if args.val <= 0 else ("synthetic seeds [2^31, 2^31 + 2^30)"
                                                              if args.trace.startswith("synthetic") else
                                                              f"the {args.val:.0%} of the jobs before the last "
                                                              f"{args.holdout:.0%}"),
                     # best/ and eval.csv: the validation split, never the held-out one (none without --val)
                     "select_on": "val" if args.val > 0 else None},
        "spaces": spaces_signature(args.window_k, args.spb_levels, args.spb_slots, env["obs_features"]),
        "preset": getattr(args, "preset", None),
        "config_file": str(Path(args.config).resolve()) if getattr(args, "config", None) else None,
        "normalize_obs": True, "normalize_reward": True,
        "n_envs": args.n_envs, "vec": "ray" if getattr(args, "ray", None) is not None else args.vec, "seed": args.seed,
        "timesteps": args.timesteps, "trained_timesteps": 0, "max_wall_s": args.max_wall_s,
        "eval": {"freq": args.eval_freq, "episodes": args.eval_episodes},
        "checkpoint_freq": args.checkpoint_freq,
        "warm_start": ({"expert": args.warm_start, "order": args.warm_start_order, "record_s": args.warm_start_s,
                        "epochs": args.bc_epochs,
                        "batch_size": args.bc_batch_size, "learning_rate": args.bc_learning_rate,
                        "act_weight": args.bc_act_weight, "width_power": args.bc_width_power,
                        "dagger_rounds": args.dagger_rounds, "dagger_s": args.dagger_s,
                        "dagger_epochs": args.dagger_epochs, "threads": args.bc_threads}
                       if args.warm_start else None),
        "tables": str(Path(args.tables).resolve()) if args.tables else None,
        "versions": _versions(), "git_commit": _git_commit(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(sys.argv),
    }


def _versions() -> dict[str, str]:
    out = {}
    for pkg in ("jigsaw", "numpy", "pandas", "torch", "gymnasium", "stable-baselines3", "sb3-contrib"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def _git_commit() -> str:
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True,
                           text=True, timeout=10)
        return r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str) + "\n")
    tmp.replace(path)


# ----------------------------------------------------------------------------------------------- envs
def env_factories(cfg: dict, split: str, n: int, seed: int, subprocess_workers: bool = False):
    """The env factories of ``n`` envs of a split; ``subprocess_workers``: for SubprocVecEnv
    workers, which then ignore SIGINT/SIGTERM (the trainer handles them, ``make_env_fn``)."""
    s = cfg["sampling"]
    difficulty = 0.0 if (split == "train" and s.get("curriculum")) else 1.0
    return [make_env_fn(cfg["env"], split=split, rank=i, seed=seed, holdout=s["holdout"], val=float(s.get("val") or 0.0),
                        ignore_signals=subprocess_workers,
                        loads=s["loads"], wide_share=float(s.get("wide_share") or 0.0),
                        wide_gpus=int(s.get("wide_gpus") or 8),
                        cluster_sizes={"train": s.get("train_gpus"), "val": s.get("val_gpus")}.get(split),
                        trace_gpu_type=s.get("trace_gpu_type"), tables=cfg.get("tables"), difficulty=difficulty)
            for i in range(n)]


def _check_env(cfg: dict) -> None:
    """Build and reset one train and one eval env here, so that a bad config fails with its own
    message before any worker process starts."""
    for split in ("train", "eval") + (("val",) if float(cfg["sampling"].get("val") or 0.0) > 0 else ()):
        env = env_factories(cfg, split, 1, cfg["seed"])[0]()
        env.reset(seed=cfg["seed"])
        env.close()


def _atomic_write(path: Path, write) -> None:
    """``write(file)`` to a temporary file beside ``path``, flushed to disk, then renamed over
    ``path``: a process killed at any moment leaves either the previous file or the complete new one."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_state(model, venv, model_path: Path, vecnorm_path: Path) -> None:
    """Save the VecNormalize statistics, then the model, each atomically: a model file on disk
    always has its statistics beside it, and no file is ever half-written (``--resume`` after a
    SIGKILL finds the last complete checkpoint). The statistics are plain arrays
    (``vecnormalize.npz``, agents/vecnorm_file.py)."""
    if venv is not None:
        _atomic_write(Path(vecnorm_path), lambda f: write_vecnormalize(venv, f))
    _atomic_write(Path(model_path), lambda f: model.save(f))


def _readable(model_path: Path, vn_path: Path | None) -> bool:
    try:
        with zipfile.ZipFile(model_path) as z:
            if z.testzip() is not None or "policy.pth" not in z.namelist():
                return False
        if vn_path is not None and vn_path.stat().st_size == 0:
            return False
    except (OSError, zipfile.BadZipFile):
        return False
    return True


def _latest_checkpoint(run_dir: Path) -> tuple[int, Path, Path | None] | None:
    """(steps, model path, vecnormalize path) of the most advanced complete saved state, or None
    (a checkpoint that cannot be read, e.g. one written by an older version killed mid-save, is
    skipped)."""
    cands: list[tuple[int, Path, Path | None]] = []
    ck = run_dir / "checkpoints"
    if ck.is_dir():
        for f in ck.glob(f"{CHECKPOINT_PREFIX}_*_steps.zip"):
            m = re.fullmatch(rf"{CHECKPOINT_PREFIX}_(\d+)_steps\.zip", f.name)
            if m:
                steps = int(m.group(1))
                cands.append((steps, f, _stats_beside(ck, f"{CHECKPOINT_PREFIX}_vecnormalize_{steps}_steps")))
    final = run_dir / "model.zip"
    if final.is_file():
        try:
            c = json.loads((run_dir / "config.json").read_text())
            steps = int(c.get("trained_timesteps") or 0) if isinstance(c, dict) else 0
        except (OSError, ValueError, TypeError):
            steps = 0
        cands.append((steps, final, _stats_beside(run_dir, "vecnormalize")))
    cands = [c for c in cands if _readable(c[1], c[2])]
    return max(cands, key=lambda c: (c[0], c[1].name == "model.zip")) if cands else None


def _stats_beside(folder: Path, stem: str) -> Path | None:
    """``folder/<stem>.npz``, else ``<stem>.pkl`` (refused when read, by :func:`_resume_venv`), else None."""
    for suffix in (".npz", ".pkl"):
        if (folder / f"{stem}{suffix}").is_file():
            return folder / f"{stem}{suffix}"
    return None


def _resume_venv(venv, vn_path: Path):
    """``venv`` wrapped in a VecNormalize with the statistics of ``vn_path`` (an .npz), training
    and normalizing rewards; a pickled file is refused unread (one line)."""
    if vn_path.suffix != ".npz":
        raise ValueError(legacy_refusal(vn_path))
    vn = wrap_vecnormalize(venv, read_vecnormalize(vn_path), vn_path)
    vn.training, vn.norm_reward = True, True
    return vn


# ----------------------------------------------------------------------------------------------- callbacks
def _callbacks(cfg: dict, run_dir: Path, eval_env, n_envs: int, t_start: float):
    """The callbacks of a training run (agents/train_callbacks.py): atomic checkpoints, the
    step durations of the semi-MDP discount, validation to eval.csv with best/ saved as a RUN_DIR,
    the wall-time limit and the curriculum."""
    from stable_baselines3.common.callbacks import CallbackList

    from agents.train_callbacks import AtomicCheckpoint, Curriculum, EvalToCSV, SaveBestRun, StopAtWallTime

    eval_seed = int(cfg["seed"]) + 1_000_003
    csv_path = run_dir / "eval.csv"
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    cbs = [AtomicCheckpoint(save_freq=max(1, cfg["checkpoint_freq"] // n_envs), save_path=str(run_dir / "checkpoints"),
                            name_prefix=CHECKPOINT_PREFIX,  # it saves the statistics itself
                            save=lambda model, m, v: save_state(model, model.get_vec_normalize_env(), m, v))]
    if (cfg["hyperparameters"] or {}).get("gamma_per_hour") is not None:
        from agents.semi_mdp import record_step_durations_callback
        cbs.append(record_step_durations_callback())  # before the others: it only records info["dt_s"]
    evaluator = None
    if eval_env is not None:  # validation episodes only (best/ is never chosen on held-out jobs)
        save_best = SaveBestRun(run_dir / "best", cfg, write_config=_write_json,
                                save=lambda model, d: save_state(model, model.get_vec_normalize_env(),
                                                                 d / "model.zip", d / "vecnormalize.npz"))
        evaluator = EvalToCSV(eval_env, eval_seed=eval_seed, write_row=lambda row: _append_eval_row(csv_path, row),
                              reference=reference_values(cfg, run_dir, eval_seed), t_start=t_start,
                              evaluate_first=bool(cfg.get("warm_start")) and int(cfg.get("trained_timesteps") or 0) == 0,
                              n_eval_episodes=cfg["eval"]["episodes"], eval_freq=max(1, cfg["eval"]["freq"] // n_envs),
                              best_model_save_path=str(run_dir / "best"), log_path=str(run_dir / "best"),
                              deterministic=True, callback_on_new_best=save_best,
                              use_masking=cfg["algo"] == "maskable_ppo", warn=False, verbose=cfg.get("verbose", 0))
        # a resumed run: best/ stays the best of the whole run, so a new evaluation replaces it only
        # if it beats every evaluation eval.csv kept (the same episodes are replayed at each one)
        kept = _eval_rewards(csv_path)
        if kept:
            evaluator.best_mean_reward = max(kept)
        cbs.append(evaluator)
    if cfg.get("max_wall_s"):
        cbs.append(StopAtWallTime(float(cfg["max_wall_s"]) - float(cfg.get("train_wall_s") or 0.0), evaluator, t_start,
                                  on_stop=lambda: cfg.__setitem__("stopped_at_wall_limit", True)))
    if cfg["sampling"].get("curriculum"):
        cbs.append(Curriculum(cfg["sampling"].get("curriculum_steps") or cfg["timesteps"] // 2))
    return CallbackList(cbs)


def _append_eval_row(csv_path: Path, row: list) -> None:
    """One row of eval.csv (EVAL_COLUMNS; the header first in a new file)."""
    new = not csv_path.exists()
    with open(csv_path, "a") as f:
        if new:
            f.write(",".join(EVAL_COLUMNS) + "\n")
        f.write(",".join(_fmt_csv(x) for x in row) + "\n")


REFERENCE_AGENTS = ("tiresias", "jigsaw")
REFERENCE_FILE = "reference.json"


def play_reference(cfg: dict, name: str, episodes: int, eval_seed: int) -> dict:
    """Heuristic ``name`` played as env actions (agents/imitation.py's HeuristicExpert) on the very
    episodes the in-training evaluation replays: the validation env made as the evaluation's, reset
    with ``eval_seed``, then reset without a seed between episodes, as SB3's DummyVecEnv does.
    Returns its mean episode return and mean JCT (s) over them."""
    env = env_factories(cfg, "val", 1, eval_seed)[0]()
    base = env.unwrapped
    expert = HeuristicExpert(name)
    returns, jcts = [], []
    try:
        env.reset(seed=eval_seed)
        for i in range(episodes):
            if i:
                env.reset()
            ret = 0.0
            while True:
                _, r, term, trunc, info = env.step(expert.act(base))
                ret += float(r)
                if term or trunc:
                    break
            returns.append(ret)
            m = info.get("episode_metrics") or {}
            if m.get("avg_jct_s") is not None:
                jcts.append(float(m["avg_jct_s"]))
    finally:
        env.close()
    return {"mean_reward": sum(returns) / len(returns),
            "mean_avg_jct_s": sum(jcts) / len(jcts) if jcts else None, "episodes": episodes}


def reference_values(cfg: dict, run_dir: Path, eval_seed: int) -> dict[str, dict]:
    """Tiresias's and Jigsaw's values on the validation episodes (:func:`play_reference`), kept in
    RUN_DIR/reference.json (a resumed run reads them back); eval.png and TensorBoard draw them as
    flat reference lines."""
    path = run_dir / REFERENCE_FILE
    episodes = int(cfg["eval"]["episodes"])
    with contextlib.suppress(OSError, ValueError):
        d = json.loads(path.read_text())
        if isinstance(d, dict) and d.get("eval_seed") == eval_seed and d.get("episodes") == episodes:
            return d["agents"]
    out = {name: play_reference(cfg, name, episodes, eval_seed) for name in REFERENCE_AGENTS}
    _write_json(path, {"split": "val", "eval_seed": eval_seed, "episodes": episodes, "agents": out})
    return out


def _fmt_csv(x) -> str:
    if isinstance(x, float):
        return "" if math.isnan(x) else repr(x)
    return str(x)


def plot_eval_curve(run_dir: Path) -> Path | None:
    """eval.png from eval.csv: validation mean reward (+- sd) and mean JCT against timesteps, with
    reference.json's heuristics (Tiresias, Jigsaw on the same episodes) as flat lines."""
    csv_path = run_dir / "eval.csv"
    if not csv_path.is_file():
        return None
    df = pd.read_csv(csv_path)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ref = {}
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        ref = json.loads((run_dir / REFERENCE_FILE).read_text())["agents"]
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    if len(df):
        ax[0].errorbar(df["timesteps"], df["mean_reward"], yerr=df["std_reward"], marker="o", capsize=3,
                       label="policy")
        ax[1].plot(df["timesteps"], df["mean_avg_jct_s"] / 3600.0, marker="o", label="policy")
    for (name, r), style in zip(sorted(ref.items()), ("--", ":", "-.")):
        if r.get("mean_reward") is not None:
            ax[0].axhline(float(r["mean_reward"]), ls=style, color="grey", label=name)
        if r.get("mean_avg_jct_s") is not None:
            ax[1].axhline(float(r["mean_avg_jct_s"]) / 3600.0, ls=style, color="grey", label=name)
    ax[0].set(xlabel="timesteps", ylabel="validation episode return", title="evaluation return (mean +- sd)")
    ax[1].set(xlabel="timesteps", ylabel="mean JCT (h)", title="validation mean JCT")
    for a in ax:
        a.grid(alpha=0.3)
        if ref:
            a.legend(fontsize=8)
    fig.tight_layout()
    out = run_dir / "eval.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


# ----------------------------------------------------------------------------------------------- training
def train(args) -> dict:
    """Train (or resume) per ``args``; returns the final config dict.

    Every option is checked, the envs are built and the model is made before anything is written;
    a start that fails later, before any model was saved, removes what it wrote (never what the
    folder held before), so the same --run-dir can be used again. A run stopped by SIGINT or
    SIGTERM keeps its folder once config.json is written, whatever the phase: ``--resume`` goes on
    from what it saved (or starts the recorded run afresh when nothing was saved yet)."""
    import torch
    torch.set_num_threads(1)

    apply_option_files(args)
    if getattr(args, "ray", None) not in (None, "local"):
        probe_address(args.ray)  # an address nobody answers: one line now, before anything is built
    if not args.run_dir:
        args.run_dir = f"runs/{args.algo}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir = Path(args.run_dir)
    cfg_path = run_dir / "config.json"
    resume_from = None
    if args.resume:
        cfg, resume_from = _resume_config(args, run_dir)
        if resume_from is None:
            print(f"{run_dir}: no model saved yet; the recorded run starts again"
                  + (" from its last finished warm-start stage" if (run_dir / WARM_DIR / WARM_STATE).is_file()
                     else ""), file=sys.stderr)
    else:
        if run_dir.exists() and not run_dir.is_dir():
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(run_dir))
        if cfg_path.exists():
            raise ValueError(f"{run_dir} already holds a run (config.json); pass --resume to continue it "
                             f"or choose another --run-dir")
        _check_new_run(args)
        cfg = config_from_args(args)
    if cfg.get("tables"):
        register_tables_dir(cfg["tables"])
    if not args.resume:
        _check_env(cfg)
    else:
        try:
            _check_env(cfg)
        except (TypeError, KeyError) as e:  # options recorded by hand or by another version
            raise ValueError(f"{cfg_path}: the recorded env options cannot build the env "
                             f"({type(e).__name__}: {e})") from None
    before = _dir_state(run_dir)
    try:
        cfg = _train(args, cfg, run_dir, resume_from)
    except BaseException as e:
        interrupted = isinstance(e, KeyboardInterrupt) and cfg_path.is_file()
        if not args.resume and not interrupted:
            _undo_failed_start(run_dir, before, e)
        raise
    plot_eval_curve(run_dir)
    return cfg


def _check_new_run(args) -> None:
    """Cross-option checks of a new run (each option's own range is checked by its argparse type)."""
    if getattr(args, "ray", None) is not None and explicit_options(args).get("vec") and args.vec != "ray":
        raise ValueError(f"--ray runs the training envs as Ray actors; drop --vec {args.vec}")
    if args.spb_levels < 0:
        raise ValueError(f"--spb-levels must be >= 0, got {args.spb_levels}")
    if args.dagger_rounds < 0:
        raise ValueError(f"--dagger-rounds must be >= 0, got {args.dagger_rounds}")
    if args.gamma_per_hour is not None and "gamma" in {**options_from_files(args), **explicit_options(args)}:
        raise ValueError("--gamma-per-hour replaces --gamma (a discount per env step); give one of them")
    if 0.0 < args.holdout < 1.0 and not 0.0 <= args.val < 1.0 - args.holdout:
        raise ValueError(f"--val must be in [0, 1 - --holdout) = [0, {1.0 - args.holdout:g}), got {args.val}")
    if not 0.0 <= args.wide_share <= 1.0:
        raise ValueError(f"--wide-share must be in [0, 1], got {args.wide_share}")
    if args.val_gpus and args.val <= 0:
        raise ValueError("--val-gpus needs a validation split: pass --val F with F > 0")
    for flag, sizes in (("--train-gpus", args.train_gpus), ("--val-gpus", args.val_gpus)):
        for g in sizes or ():
            try:
                ClusterSpec.from_gpus(g, gpus_per_node=args.gpus_per_node)
            except ValueError as e:
                raise ValueError(f"{flag}: a cluster of {g} GPUs: {e}") from None
    if not (args.bc_width_power >= 0 and math.isfinite(args.bc_width_power)):
        raise ValueError(f"--bc-width-power must be a finite number >= 0, got {args.bc_width_power}")
    if args.warm_start:
        if args.warm_start not in expert_names():
            raise ValueError(f"--warm-start: unknown heuristic {args.warm_start!r}; allowed: {list(expert_names())}")
    if args.algo in ("maskable_ppo", "ppo"):
        # PPO normalizes the advantages over each minibatch (mean and standard deviation): a
        # minibatch of one sample has no standard deviation, and MaskablePPO's update then turns
        # every weight into NaN ("Expected parameter logits ... invalid values"); PPO asserts
        n_steps = args.n_steps or 256
        buf, bs = n_steps * args.n_envs, args.batch_size
        if bs < 2:
            raise ValueError(f"--batch-size must be >= 2 for {args.algo} (advantages are normalized over each "
                             f"minibatch; one sample has no standard deviation), got {bs}")
        if buf < 2:
            raise ValueError(f"--n-steps x --n-envs must be >= 2 for {args.algo} (a rollout of one sample cannot "
                             f"have its advantages normalized), got {n_steps} x {args.n_envs}")
        if args.algo == "maskable_ppo" and buf % bs == 1:
            raise ValueError(f"--n-steps x --n-envs = {n_steps} x {args.n_envs} = {buf} leaves a last minibatch of 1 "
                             f"sample with --batch-size {bs} (maskable_ppo normalizes advantages over each minibatch; "
                             f"one sample has no standard deviation); choose values where n_steps x n_envs is not a "
                             f"multiple of the batch size plus 1")


# --resume: the options a resumed run takes from the command line; every other option is the run's
RESUME_OWN = frozenset({"timesteps", "max_wall_s", "run_dir", "resume", "progress", "tensorboard", "verbose",
                        "preset", "config", "ray"})
#: option dest -> where config.json records it
RESUME_PATHS: dict[str, tuple[str, ...]] = {
    **{d: ("env", d) for d in ("gpus", "gpus_per_node", "gpu_type", "gpu_memory_gib", "trace", "max_jobs", "window_k",
                               "spb_levels", "spb_slots", "max_workers_per_gpu", "round_s", "restart_s", "reward",
                               "reward_scale", "observe_remaining", "backlogged", "max_time_s", "sharing", "pace",
                               "obs_features", "work_conserving", "window_order", "pause", "proposer", "spill")},
    "load": ("sampling", "loads"),
    **{d: ("sampling", d) for d in ("trace_gpu_type", "holdout", "val", "wide_share", "wide_gpus", "train_gpus",
                                    "val_gpus", "curriculum", "curriculum_steps")},
    **{d: (d,) for d in ("algo", "policy", "n_envs", "vec", "seed", "checkpoint_freq", "tables")},
    **{d: ("hyperparameters", d) for d in ("learning_rate", "n_steps", "batch_size", "n_epochs", "gamma", "ent_coef",
                                           "net_arch", "slot_hidden", "clip_range", "target_kl",
                                           "gamma_per_hour")},
    "eval_freq": ("eval", "freq"), "eval_episodes": ("eval", "episodes"),
    "warm_start": ("warm_start", "expert"), "warm_start_s": ("warm_start", "record_s"),
    "warm_start_order": ("warm_start", "order"), "bc_epochs": ("warm_start", "epochs"),
    "bc_batch_size": ("warm_start", "batch_size"), "bc_learning_rate": ("warm_start", "learning_rate"),
    "bc_act_weight": ("warm_start", "act_weight"), "bc_width_power": ("warm_start", "width_power"),
    "dagger_rounds": ("warm_start", "dagger_rounds"), "dagger_s": ("warm_start", "dagger_s"),
    "dagger_epochs": ("warm_start", "dagger_epochs"), "bc_threads": ("warm_start", "threads"),
}
_ABSENT = object()


def _as_recorded(dest: str, value: Any) -> Any:
    """An option's value as config_from_args records it."""
    if dest == "policy":
        return "MlpPolicy" if value == "mlp" else value
    if dest == "tables" and value:
        return str(Path(value).resolve())
    return value


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
    return a == b


def _shown(v: Any) -> str:
    if v is _ABSENT:
        return "none"
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return ",".join(_shown(x) for x in v)
    return str(v)


#: env fields a run's config.json may lack, and the value such a run plays with (what a resumed
#: run is compared against)
RESUME_ABSENT_MEANS = {"window_order": "attained", "pause": "leave", "proposer": None, "spill": False}


def _check_resume_options(args, cfg: dict, cfg_path: Path) -> None:
    """ValueError (one line) when an option given on the command line (not a default) differs from
    what the run's config.json records: a resumed run keeps its config."""
    differ = []
    given = {d: f"--{d.replace('_', '-')} ({label})" for d, label in options_from_files(args).items()}
    given.update(explicit_options(args))
    for dest, flag in given.items():
        if dest in RESUME_OWN:
            continue
        given = _as_recorded(dest, getattr(args, dest))
        recorded: Any = cfg
        for key in RESUME_PATHS.get(dest, (dest,)):
            recorded = recorded.get(key, _ABSENT) if isinstance(recorded, dict) else _ABSENT
        if recorded is _ABSENT and dest in RESUME_ABSENT_MEANS:
            recorded = RESUME_ABSENT_MEANS[dest]
        if recorded is _ABSENT or not _same_value(given, recorded):
            differ.append(f"{flag} (given {_shown(given)}, config.json {_shown(recorded)})")
    if differ:
        raise ValueError(f"--resume keeps the run's config: {', '.join(differ)} "
                         f"differ{'s' if len(differ) == 1 else ''} from {cfg_path}; "
                         f"drop {'it' if len(differ) == 1 else 'them'} or start a new --run-dir")


def _check_resumable(cfg: dict, cfg_path: Path) -> None:
    """The fields a resumed run reads from config.json (beyond read_run_config's algo, env and
    spaces), with their types; ValueError naming the file and the field otherwise."""
    def is_int(lo):
        return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= lo

    def is_loads(v):
        return v is None or (isinstance(v, list) and len(v) > 0 and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 for x in v))

    checks = (("seed", f"an integer in [0, {SEED_MAX}]", lambda v: is_int(0)(v) and v <= SEED_MAX),
              ("n_envs", "an integer >= 1", is_int(1)),
              ("checkpoint_freq", "an integer >= 1", is_int(1)),
              ("eval", "a JSON object (freq, episodes)", lambda v: isinstance(v, dict)),
              ("eval.freq", "an integer >= 1", is_int(1)),
              ("eval.episodes", "an integer >= 1", is_int(1)),
              ("sampling", "a JSON object (the episode sampling options)", lambda v: isinstance(v, dict)),
              ("sampling.holdout", "a number in (0, 1)",
               lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1),
              ("sampling.loads", "null or a list of numbers > 0", is_loads))
    for field, what, ok in checks:
        v: Any = cfg
        for key in field.split("."):
            v = v.get(key, _ABSENT) if isinstance(v, dict) else _ABSENT
        if v is _ABSENT:
            raise ValueError(f"{cfg_path}: missing field {field!r} ({what}); --resume needs the config "
                             f"`jigsaw train` wrote")
        if not ok(v):
            raise ValueError(f"{cfg_path}: field {field!r}: expected {what}, got {json_kind(v)}")
    unknown = sorted(set(cfg["env"]) - set(ENV_KEYS))
    if unknown:
        raise ValueError(f"{cfg_path}: field 'env': unknown option(s) {unknown}; expected some of {list(ENV_KEYS)}")
    run_window_order(cfg, cfg_path)
    run_pause_mode(cfg, cfg_path)
    run_spill(cfg, cfg_path)
    try:
        proposer_name(cfg["env"])
    except ValueError as e:
        raise ValueError(f"{cfg_path}: {e}") from None


def _resume_config(args, run_dir: Path) -> tuple[dict, tuple[int, Path, Path | None] | None]:
    """The config of the run to resume (checked, with this invocation's --timesteps and
    --max-wall-s) and the saved state it continues from; nothing is written."""
    cfg_path = run_dir / "config.json"
    if not cfg_path.is_file():
        raise ValueError(f"--resume needs a run folder with config.json; {run_dir} has none")
    cfg = read_run_config(run_dir)
    _check_resumable(cfg, cfg_path)
    _check_resume_options(args, cfg, cfg_path)
    resume_from = _latest_checkpoint(run_dir)
    # a run stopped before it saved any model (in its warm start, say) has no saved state: the
    # recorded run starts again (resume_from None), its warm start from the last finished stage
    saved_any = int(cfg.get("trained_timesteps") or 0) > 0 or (run_dir / "model.zip").exists() or any(
        (run_dir / "checkpoints").glob("*.zip"))
    if resume_from is None and saved_any:
        unreadable = sorted(str(f) for f in [run_dir / "model.zip", *(run_dir / "checkpoints").glob("*.zip")]
                            if f.is_file())
        if unreadable:
            raise ValueError(f"--resume: no readable saved model in {run_dir}: {', '.join(unreadable)} "
                             f"cannot be loaded (corrupt or cut short)")
        raise ValueError(f"--resume: {run_dir} has no checkpoint and no model.zip to continue from")
    given = {**options_from_files(args), **explicit_options(args)}
    if "timesteps" in given:  # else the run's own target
        cfg["timesteps"] = args.timesteps
    if args.max_wall_s is not None:
        cfg["max_wall_s"] = args.max_wall_s
    cfg.setdefault("resumed", []).append({"from_timesteps": resume_from[0] if resume_from else 0,
                                          "from": resume_from[1].name if resume_from else None,
                                          "to_timesteps": cfg["timesteps"],
                                          "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    return cfg, resume_from


def _dir_state(run_dir: Path) -> tuple[bool, frozenset[str], Path]:
    """(whether run_dir exists, the names in it, the highest of its folders that does not exist)."""
    if run_dir.is_dir():
        return True, frozenset(os.listdir(run_dir)), run_dir
    top = run_dir
    while not top.parent.exists() and top.parent != top:
        top = top.parent
    return False, frozenset(), top


def _saved_models(run_dir: Path, before: frozenset[str]) -> list[Path]:
    """Model files this start saved under run_dir (final, checkpoints, best/, warm_start/)."""
    if not run_dir.is_dir():
        return []
    return sorted(p for p in run_dir.rglob("*.zip") if p.relative_to(run_dir).parts[0] not in before)


def _undo_failed_start(run_dir: Path, state: tuple[bool, frozenset[str], Path], e: BaseException) -> None:
    """After a new run failed: if it saved no model, remove what it wrote (the folders it made, or
    in a folder that existed the entries that were not there before), so that the same --run-dir
    can be used again; if it saved one, keep everything and say so (a ValueError is re-raised
    with that note)."""
    existed, before, top = state
    saved = _saved_models(run_dir, before)
    if saved:
        if isinstance(e, ValueError):
            resumable = _latest_checkpoint(run_dir) is not None
            note = (f"; what it saved before failing is kept in {run_dir}"
                    + (" (--resume continues from its latest checkpoint)" if resumable else ""))
            raise ValueError(_one_line(e) + note) from e
        return
    if not run_dir.is_dir():
        return
    if not existed:
        shutil.rmtree(run_dir, ignore_errors=True)
        d = run_dir.parent
        while d != top.parent and d.is_dir() and not os.listdir(d):  # folders mkdir(parents=True) made
            d.rmdir()
            d = d.parent
        return
    for name in sorted(set(os.listdir(run_dir)) - before):
        p = run_dir / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                p.unlink()


def _one_line(e: BaseException) -> str:
    return error_line(e)


def _train(args, cfg: dict, run_dir: Path, resume_from) -> dict:
    """Build the envs and the model, then write config.json and learn (train's second half).

    SIGTERM is turned into KeyboardInterrupt for the whole of it (`kill PID`, Slurm and `timeout`
    stop a run as Ctrl-C does): during the warm start its finished stages are on disk
    (:func:`warm_start`), during learning the model is saved, and ``--resume`` goes on from there.
    Neither signal interrupts an optimizer step (:class:`DeferredInterrupts`)."""
    prev = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in prev:
        signal.signal(s, _INTERRUPTS.handler)
    try:
        return _train_inner(args, cfg, run_dir, resume_from)
    finally:
        for s, h in prev.items():
            signal.signal(s, h)


def sb3_gamma_of(cfg: dict) -> float:
    """SB3's scalar gamma (VecNormalize's return, a truncated episode's bootstrap): --gamma, or
    one round's discount under --gamma-per-hour (agents/semi_mdp.py)."""
    hp = cfg["hyperparameters"]
    if hp.get("gamma_per_hour") is not None:
        from agents.semi_mdp import round_discount
        return round_discount(hp["gamma_per_hour"], cfg["env"].get("round_s"))
    return hp["gamma"]


def _build_model(args, cfg: dict, venv, resume_from, sb3_gamma: float, tb: str | None):
    """The model to train: loaded from ``resume_from``'s checkpoint, or new from the config's
    algorithm, policy and hyperparameters. A model file or option SB3 refuses: one line."""
    from agents.slot_policy import policy_for, slot_proposal_features

    cls = algo_class(cfg["algo"])
    if resume_from is not None:
        try:
            model = cls.load(str(resume_from[1]), env=venv, device="cpu", tensorboard_log=tb)
        except Exception as e:  # noqa: BLE001 - a foreign or corrupted model: one line naming the file
            raise ValueError(f"{resume_from[1]}: cannot load it as a {cfg['algo']} model "
                             f"({type(e).__name__}: {_one_line(e)})") from None
        model.num_timesteps = max(model.num_timesteps, resume_from[0])
        return model
    hp = cfg["hyperparameters"]
    kw: dict[str, Any] = dict(learning_rate=hp["learning_rate"], n_steps=hp["n_steps"], gamma=sb3_gamma,
                              ent_coef=hp["ent_coef"],
                              policy_kwargs=dict(net_arch=dict(pi=hp["net_arch"], vf=hp["net_arch"])))
    if cfg["policy"] == "slots":
        kw["policy_kwargs"].update(slot_hidden=int(hp.get("slot_hidden", 64)),
                                   proposal_features=slot_proposal_features(cfg["env"]))
    if cfg["algo"] in ("maskable_ppo", "ppo"):
        kw.update(batch_size=hp["batch_size"], n_epochs=hp["n_epochs"], clip_range=hp.get("clip_range", 0.2),
                  target_kl=hp.get("target_kl"))
    if hp.get("gamma_per_hour") is not None:
        from agents.semi_mdp import buffer_class_for
        kw.update(rollout_buffer_class=buffer_class_for(cfg["algo"]),
                  rollout_buffer_kwargs={"gamma_per_hour": float(hp["gamma_per_hour"])})
    try:
        return cls(policy_for(cfg["policy"], cfg["algo"]), venv, seed=int(cfg["seed"]), device="cpu",
                   tensorboard_log=tb, verbose=getattr(args, "verbose", 0), **kw)
    except (ValueError, AssertionError) as e:  # SB3 / torch refusing an option value
        raise ValueError(f"cannot build the {cfg['algo']} model from these options: {_one_line(e)}") from None


def _train_inner(args, cfg: dict, run_dir: Path, resume_from) -> dict:
    from stable_baselines3.common.utils import set_random_seed
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecNormalize

    cfg_path = run_dir / "config.json"
    seed = int(cfg["seed"])
    set_random_seed(seed)
    n_envs = int(cfg["n_envs"])
    vec_cls = SubprocVecEnv if cfg.get("vec", "subproc") == "subproc" and n_envs > 1 else DummyVecEnv
    ray_address = getattr(args, "ray", None)
    if ray_address is None and cfg.get("vec") == "ray":
        ray_address = "local"
    sb3_gamma = sb3_gamma_of(cfg)
    venv = eval_raw = eval_env = None
    ray_owned = False
    try:
        if ray_address is not None:
            venv, ray_owned = _ray_venv(cfg, ray_address, n_envs, seed)
        else:
            venv = vec_cls(env_factories(cfg, "train", n_envs, seed, subprocess_workers=vec_cls is SubprocVecEnv))
        # the evaluation callback (and so best/) uses the validation split, never the held-out one
        if cfg["sampling"].get("select_on") == "val":
            eval_raw = DummyVecEnv(env_factories(cfg, "val", 1, seed + 1_000_003))
        if resume_from is not None:
            steps, model_path, vn_path = resume_from
            if vn_path is None:
                raise ValueError(f"--resume: {run_dir} has {model_path.name} but no VecNormalize statistics beside it")
            venv = _resume_venv(venv, vn_path)
        else:
            venv = VecNormalize(venv, norm_obs=True, norm_reward=True, gamma=sb3_gamma)
        if eval_raw is not None:
            eval_env = VecNormalize(eval_raw, norm_obs=True, norm_reward=False, training=False)
        from sb3_contrib.common.maskable.utils import is_masking_supported
        cfg["masking_supported"] = bool(is_masking_supported(venv))  # env_method("action_masks") reaches every worker
        if cfg["algo"] == "maskable_ppo" and not cfg["masking_supported"]:
            raise ValueError("the training envs do not expose action_masks(); MaskablePPO needs them")
        tb = str(run_dir / "tb") if getattr(args, "tensorboard", True) else None
        model = _build_model(args, cfg, venv, resume_from, sb3_gamma, tb)
        if tb is None:
            model.set_logger(_logger_without_folder(getattr(args, "verbose", 0)))
        # everything is built: from here on the run folder is written
        run_dir.mkdir(parents=True, exist_ok=True)
        if resume_from is not None:
            _truncate_eval_csv(run_dir / "eval.csv", resume_from[0])
        _write_json(cfg_path, cfg)
        target = int(cfg["timesteps"])
        remaining = target - int(model.num_timesteps)
        if resume_from is None and cfg.get("warm_start"):
            warm_start(model, venv, cfg, run_dir, progress=bool(getattr(args, "progress", True)))
            # its wall time counts against --max-wall-s
            cfg["train_wall_s"] = float(cfg.get("train_wall_s") or 0.0) + cfg["warm_start"]["wall_s"]
            _save(model, venv, run_dir, cfg, 0.0)
        t0 = time.perf_counter()
        if remaining > 0:
            callbacks = _callbacks(cfg, run_dir, eval_env, n_envs, t0)
            cfg["stopped_at_wall_limit"] = False
            _INTERRUPTS.guard(model.policy.optimizer)
            try:
                model.learn(total_timesteps=remaining, callback=callbacks, progress_bar=bool(getattr(args, "progress", True)),
                            reset_num_timesteps=resume_from is None, tb_log_name=cfg["algo"])
            except KeyboardInterrupt:
                _save(model, venv, run_dir, cfg, time.perf_counter() - t0)
                raise
        else:
            print(f"{run_dir}: already trained for {model.num_timesteps} >= {target} timesteps; nothing to do")
        _save(model, venv, run_dir, cfg, time.perf_counter() - t0)
    finally:
        if venv is not None:
            _close_vec_env(venv)
        if eval_raw is not None:
            eval_raw.close()
        if ray_owned:
            import ray
            ray.shutdown()
    return cfg


def _ray_venv(cfg: dict, address: str, n_envs: int, seed: int):
    """The training envs as Ray actors (agents/ray_vec_env.py) and whether this call started Ray:
    ``address`` "local" is an embedded Ray with one CPU per env (as SubprocVecEnv has one process
    per env); else the cluster there. The ``--tables`` cost tables travel with the env factories
    (the workers need no copy of the folder); ``cfg["ray"]`` records where the envs ran."""
    from agents.ray_vec_env import RayVecEnv, with_tables

    owned = connect(address, num_cpus=max(1, n_envs))
    try:
        tables = [CostTable.load(f).to_dict() for f in table_files(cfg["tables"])] if cfg.get("tables") else []
        fns = [with_tables(fn, tables) for fn in env_factories({**cfg, "tables": None}, "train", n_envs, seed)]
        venv = RayVecEnv(fns)
    except BaseException:
        if owned:
            import ray
            ray.shutdown()
        raise
    nodes = sorted({p["node"] for p in venv.placement})
    cfg["ray"] = {"address": "local (embedded)" if address == "local" else address,
                  "env_nodes": [nodes.index(p["node"]) for p in venv.placement],
                  "nodes": [n[:12] for n in nodes]}
    return venv, owned


def _logger_without_folder(verbose: int):
    """SB3's logger for a run without TensorBoard: the progress table on stdout when ``verbose >= 1``,
    nothing otherwise. Left to itself, ``learn()`` makes one for this case by calling
    ``stable_baselines3.common.logger.configure(None, ...)``, which creates an empty
    ``$TMPDIR/SB3-<timestamp>`` folder on every run that nobody ever removes."""
    from stable_baselines3.common.logger import HumanOutputFormat, Logger
    return Logger(folder=None, output_formats=[HumanOutputFormat(sys.stdout)] if int(verbose) >= 1 else [])


WARM_DIR = "warm_start"
WARM_STATE = "progress.json"


def save_demos(path: Path, demos) -> None:
    """The demonstrations as plain arrays (np.savez, no pickle), written atomically."""
    def write(f):
        np.savez(f, obs=demos.obs, masks=demos.masks, actions=demos.actions, rewards=demos.rewards,
                 dones=demos.dones, widths=demos.widths, dt_s=demos.dt_s,
                 episodes=np.frombuffer(json.dumps(demos.episodes).encode(), dtype=np.uint8))
    _atomic_write(path, write)


def load_demos(path: Path):
    """The demonstrations :func:`save_demos` wrote to ``path`` (a run's ``warm_start/demos.npz``)."""
    with np.load(path, allow_pickle=False) as d:
        return Demonstrations(d["obs"], d["masks"], d["actions"], d["rewards"], d["dones"], d["widths"],
                              json.loads(d["episodes"].tobytes().decode()), dt_s=d["dt_s"])


def load_stats_into(venv, path: Path) -> None:
    """VecNormalize statistics of ``path`` (an .npz) into the VecNormalize ``venv``, in place."""
    st = read_vecnormalize(path)
    venv.obs_rms.mean, venv.obs_rms.var, venv.obs_rms.count = st.obs_mean.copy(), st.obs_var.copy(), st.obs_count
    venv.ret_rms.mean, venv.ret_rms.var, venv.ret_rms.count = np.float64(st.ret_mean), np.float64(st.ret_var), st.ret_count


def warm_start_env_factory(cfg: dict):
    """The factory of the one training-split env the warm start records and plays DAgger on (its
    own seed stream, apart from the RL phase's envs); each episode is reset with its own seed."""
    return env_factories(cfg, "train", 1, int(cfg["seed"]) + 7_000_003)[0]


def warm_start(model, venv, cfg: dict, run_dir: Path, progress: bool = True) -> None:
    """Imitation warm start from ``cfg["warm_start"]["expert"]`` (agents/imitation.py):

    1. record the expert on training-split episodes for ``record_s`` seconds and clone it
       (``epochs`` epochs; this also sets VecNormalize's observation and return statistics);
    2. ``dagger_rounds`` DAgger rounds: play the policy for ``dagger_s`` seconds on new training
       episodes, label each state it visits with the expert's action, refit on all data so far.

    Each stage plays episodes of its own (:func:`agents.imitation.episode_seed_base`), so runs with
    different ``--seed`` learn from different episodes.

    Each finished stage is checkpointed in RUN_DIR/warm_start/: the demonstrations so far
    (``demos.npz``), the policy and statistics fitted to them (``fit/``) and ``progress.json`` (the
    stages done, the fit history); a run stopped by a signal and resumed (``--resume``) goes on
    from the last finished stage (a stage cut short is done again).

    Writes RUN_DIR/warm_start.csv (one row per epoch: stage, loss, accuracy, value MSE) and the
    cloned policy as RUN_DIR/warm_start/ (a RUN_DIR of its own), and records in
    ``cfg["warm_start"]`` the data sizes, the expert's and each DAgger round's mean JCT on their
    training episodes and the first of their episode seeds (``first_episode_seed``), the final fit
    and the wall time."""
    ws = cfg["warm_start"]
    seed = int(cfg["seed"])
    hp = cfg["hyperparameters"]
    # VecNormalize's discount (one round's under --gamma-per-hour) for the return statistics
    gamma = float(getattr(venv, "gamma", hp["gamma"]))
    t0 = time.perf_counter()
    bc_dir = run_dir / WARM_DIR
    fit_dir = bc_dir / "fit"
    fit_dir.mkdir(parents=True, exist_ok=True)
    state_path = bc_dir / WARM_STATE
    state: dict[str, Any] = {"stages_done": 0, "hist": [], "rounds": [], "recorded": {}, "wall_s": 0.0}
    if state_path.is_file():  # a resumed warm start
        state = json.loads(state_path.read_text())
    wall_before = float(state.get("wall_s") or 0.0)

    def checkpoint(demos, fitted: bool) -> None:
        save_demos(bc_dir / "demos.npz", demos)
        if fitted:
            save_state(model, venv, fit_dir / "model.zip", fit_dir / "vecnormalize.npz")
        state["wall_s"] = wall_before + time.perf_counter() - t0
        _write_json(state_path, state)

    # with the proposal group showing the expert's own heuristic, the expert reads the env's proposal
    expert = HeuristicExpert(ws["expert"], order=ws.get("order", "slot"),
                             use_proposal=proposer_name(cfg["env"]) == ws["expert"])
    make = warm_start_env_factory(cfg)
    fit = dict(batch_size=int(ws.get("batch_size", 1024)), learning_rate=float(ws["learning_rate"]), gamma=gamma,
               gamma_per_hour=hp.get("gamma_per_hour"), act_weight=float(ws.get("act_weight", 1.0)),
               width_power=float(ws.get("width_power", 0.0)), progress=progress)
    threads = int(ws.get("threads") or 1)
    done = int(state["stages_done"])
    if done == 0:
        first = episode_seed_base(seed, 0)
        demos = collect(make, expert, max_wall_s=float(ws["record_s"]), seed=first, progress=progress)
        state["recorded"] = dict(episodes=len(demos.episodes), steps=len(demos), record_wall_s=time.perf_counter() - t0,
                                 expert_mean_avg_jct_s=_mean_jct(demos.episodes), first_episode_seed=first)
        with torch_threads(threads):
            state["hist"] = [dict(stage="clone", **h) for h in behaviour_clone(
                model, demos, venv=venv, epochs=int(ws["epochs"]), seed=seed, **fit)]
        state["stages_done"] = done = 1
        checkpoint(demos, True)
    else:
        demos = load_demos(bc_dir / "demos.npz")
        model.set_parameters(str(fit_dir / "model.zip"), exact_match=True, device="cpu")
        load_stats_into(venv, fit_dir / "vecnormalize.npz")
    ws.update(state["recorded"])
    for r in range(done - 1, int(ws.get("dagger_rounds") or 0)):
        t_r = time.perf_counter()
        first = episode_seed_base(seed, r + 1)
        new = collect_on_policy(make, expert, policy_actor(model, venv), max_wall_s=float(ws["dagger_s"]), seed=first)
        demos = concat([demos, new])
        with torch_threads(threads):
            h = behaviour_clone(model, demos, venv=venv, epochs=int(ws["dagger_epochs"]), seed=seed + r + 1,
                                fit_stats=False, **fit)
        state["hist"] += [dict(stage=f"dagger{r + 1}", **x) for x in h]
        state["rounds"].append({"round": r + 1, "steps": len(new), "episodes": len(new.episodes),
                                "policy_mean_avg_jct_s": _mean_jct(new.episodes), "first_episode_seed": first,
                                "policy_avg_jct_s": _episode_jcts(new.episodes),
                                "wall_s": time.perf_counter() - t_r})
        state["stages_done"] = r + 2
        checkpoint(demos, True)
    hist = state["hist"]
    ws.update(dagger=state["rounds"], total_steps=len(demos), final_accuracy=hist[-1]["accuracy"],
              final_nll=hist[-1]["nll"], final_value_mse=hist[-1]["value_mse"],
              wall_s=wall_before + time.perf_counter() - t0, done=True)
    # the cloned policy before RL, as a RUN_DIR of its own (jigsaw evaluate --agents RUN_DIR/warm_start)
    save_state(model, venv, bc_dir / "model.zip", bc_dir / "vecnormalize.npz")
    _write_json(bc_dir / "config.json", dict(cfg, trained_timesteps=0))
    cols = list(hist[0])
    (run_dir / "warm_start.csv").write_text(",".join(cols) + "\n" + "".join(
        ",".join(h[c] if c == "stage" else _fmt_csv(h[c]) for c in cols) + "\n" for h in hist))


@contextlib.contextmanager
def torch_threads(n: int):
    """Run the block with ``n`` torch intra-op threads, then restore the previous count. Fitting
    the demonstrations runs in this process alone (the vec-env workers wait), so it may use every
    core; measured on the 2-core VM, 2 threads fit 1.5-1.6x as many transitions per second as 1
    (docs/evaluation.md §1)."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _episode_jcts(episodes: list[dict]) -> list[float | None]:
    """Each episode's mean JCT in seconds, in play order; None for an episode cut short."""
    return [None if e.get("truncated") or e.get("avg_jct_s") is None else float(e["avg_jct_s"]) for e in episodes]


def _mean_jct(episodes: list[dict]) -> float | None:
    """The mean of :func:`_episode_jcts` over the finished episodes (None when none finished)."""
    v = [x for x in _episode_jcts(episodes) if x is not None]
    return float(sum(v) / len(v)) if v else None


def _eval_rewards(path: Path) -> list[float]:
    """The finite mean_reward of every evaluation row of eval.csv (none without the file or the column)."""
    if not path.is_file():
        return []
    lines = path.read_text().splitlines()
    if not lines:
        return []
    head = lines[0].split(",")
    if "mean_reward" not in head:
        return []
    col = head.index("mean_reward")
    vals = [float(line.split(",")[col]) for line in lines[1:] if line.strip()]
    return [v for v in vals if math.isfinite(v)]


def _truncate_eval_csv(path: Path, steps: int) -> None:
    """On resume: evaluations after the checkpoint belong to the lost part of the run (a run killed
    after its last checkpoint); drop them, so eval.csv has one row per evaluation of the run that
    continues."""
    if not path.is_file():
        return
    lines = path.read_text().splitlines()
    if not lines:
        return
    keep = [lines[0]] + [ln for ln in lines[1:] if ln.strip() and int(float(ln.split(",")[0])) <= steps]
    if len(keep) != len(lines):
        _atomic_write(path, lambda f: f.write(("\n".join(keep) + "\n").encode()))


def _close_vec_env(venv) -> None:
    """Close the training envs, also after an interruption (SIGINT, or SIGTERM turned into one)
    that came while the trainer was between sending a step to SubprocVecEnv's workers and reading
    every reply: SB3's close() would then wait for replies already read or never coming, so the
    wait is dropped (a worker reads its "close" command after its pending reply and ends)."""
    inner = venv
    while hasattr(inner, "venv"):
        inner = inner.venv
    if getattr(inner, "waiting", False):
        inner.waiting = False
    with contextlib.suppress(Exception):  # workers already stopped by the same Ctrl-C
        venv.close()


class DeferredInterrupts:
    """SIGINT and SIGTERM as KeyboardInterrupt (:meth:`handler`), held back while an optimizer
    step runs (:meth:`guard`) and raised once it returns. An interruption inside Adam's first step
    would leave a parameter's state half made (``step`` without ``exp_avg``): the saved model
    would keep it, and ``--resume`` would fail on it."""

    def __init__(self) -> None:
        self.depth = 0  # optimizer steps in progress
        self.pending: int | None = None  # the signal that came during one

    def handler(self, signum, frame) -> None:
        if self.depth:
            self.pending = signum
            return
        raise KeyboardInterrupt(f"signal {signum}")

    @contextlib.contextmanager
    def held(self):
        """Signals that come inside the block interrupt at its end."""
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if not self.depth and self.pending is not None:
                signum, self.pending = self.pending, None
                raise KeyboardInterrupt(f"signal {signum}")

    def guard(self, optimizer) -> None:
        """Hold interruptions back during each ``optimizer.step()``."""
        step = optimizer.step

        def step_held(*args, **kwargs):
            with self.held():
                return step(*args, **kwargs)

        optimizer.step = step_held


_INTERRUPTS = DeferredInterrupts()


def _save(model, venv, run_dir: Path, cfg: dict, wall_s: float) -> None:
    save_state(model, venv, run_dir / "model.zip", run_dir / "vecnormalize.npz")
    cfg["trained_timesteps"] = int(model.num_timesteps)
    cfg["train_wall_s"] = float(cfg.get("train_wall_s", 0.0)) + float(wall_s)
    _write_json(run_dir / "config.json", cfg)


def run(args) -> int:
    try:
        cfg = train(args)
    except KeyboardInterrupt:
        run_dir = getattr(args, "run_dir", None)
        if run_dir and (Path(run_dir) / "config.json").is_file():
            what = ("the model so far is saved" if _latest_checkpoint(Path(run_dir)) is not None
                    else "its finished stages are kept")
            print(f"jigsaw train: interrupted; {what} in {run_dir} (`jigsaw train --run-dir {run_dir} --resume` "
                  f"finishes it)", file=sys.stderr)
        else:
            print("jigsaw train: interrupted before the run folder was written; nothing was kept", file=sys.stderr)
        return 130
    run_dir = Path(args.run_dir) if args.run_dir else None
    print(json.dumps({"run_dir": str(run_dir) if run_dir else None, "algo": cfg["algo"],
                      "trained_timesteps": cfg["trained_timesteps"], "train_wall_s": round(cfg.get("train_wall_s", 0), 1)}))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except (ValueError, OSError) as e:
        print(f"train_agent.py: error: {_one_line(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
