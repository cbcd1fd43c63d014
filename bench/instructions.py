"""Instructions one replay or env episode executes, counted by valgrind: cost without the machine's noise.

    python -m bench.instructions --trace synthetic:jobs=10000,load=0.7,seed=0 --gpus 512 --agent tiresias
    python -m bench.instructions --env --gpus 64 --max-jobs 200 --seed 0

Runs ``python -m bench.replay`` under valgrind's cachegrind with ``--cache-sim=no`` (it counts the
instructions executed, its ``I refs`` line, and simulates no cache), once in full and once with
``--load-only`` (the imports and the trace load), and reports the difference: the instructions of
building the simulator, the replay and its metrics. The count moves by about 0.2 % from run to
run (string hashing and addresses differ per process), where wall time on this project's VMs
moves by 10-40 % within hours, so a scaling fit from counts (``python -m bench --only
instructions``) shows the code's growth with job count.
Counts are not time: cache misses and memory stalls, which grow with the working set, are not in
them; the timed fit (``python -m bench --only scaling``) still says what a user waits.
Under valgrind a replay runs about 20x slower (82,247 synthetic jobs with Tiresias: 10 minutes).

``--env`` counts one env episode of ``python -m bench.env_speed`` (the bench's env part, one seed)
the same way, less the same command with no episode, and reports instructions per env step: the
env's speed as a count the VM cannot move.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_IREFS = re.compile(r"I\s+refs:\s+([\d,]+)")


def valgrind() -> str | None:
    """The valgrind executable on PATH, or None."""
    return shutil.which("valgrind")


def count_instructions(cmd: list[str]) -> tuple[int, str]:
    """(instructions executed, stdout) of ``cmd`` run under cachegrind from the repository root,
    one thread per process. Raises RuntimeError naming the command when valgrind is missing, the
    command fails, or valgrind prints no count."""
    vg = valgrind()
    if vg is None:
        raise RuntimeError("valgrind is not on PATH (Debian/Ubuntu: apt install valgrind)")
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    r = subprocess.run([vg, "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null", *cmd],
                       capture_output=True, text=True, cwd=ROOT, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} under valgrind failed ({r.returncode}): {r.stderr.strip()[-1500:]}")
    m = _IREFS.search(r.stderr)
    if m is None:
        raise RuntimeError(f"{' '.join(cmd)}: valgrind printed no 'I refs' count: {r.stderr.strip()[-800:]}")
    return int(m.group(1).replace(",", "")), r.stdout


def count_less_baseline(cmd: list[str], baseline: list[str]) -> tuple[int, int, str]:
    """(``cmd``'s instructions, ``baseline``'s, ``cmd``'s stdout), each counted by
    :func:`count_instructions`; the difference is the work ``cmd`` does beyond ``baseline``."""
    total, out = count_instructions(cmd)
    base, _ = count_instructions(baseline)
    return total, base, out


def replay_command(trace: str, gpus: int, agent: str, max_jobs: int | None = None, load_only: bool = False) -> list[str]:
    """The ``bench.replay`` command whose instructions are counted (``load_only``: its baseline)."""
    cmd = [sys.executable, "-m", "bench.replay", "--trace", trace, "--gpus", str(gpus), "--agent", agent]
    if max_jobs is not None:
        cmd += ["--max-jobs", str(max_jobs)]
    return cmd + (["--load-only"] if load_only else [])


def replay_instructions(trace: str, gpus: int, agent: str, max_jobs: int | None = None) -> dict:
    """The replay's JSON (``bench.replay``: jobs, rounds, jobs in the system summed over rounds,
    mean JCT, ...) plus ``instructions`` (the full run's count less the load-only run's),
    ``instructions_total`` and ``instructions_load``."""
    total, load, out = count_less_baseline(replay_command(trace, gpus, agent, max_jobs),
                                           replay_command(trace, gpus, agent, max_jobs, load_only=True))
    res = json.loads(out.strip().splitlines()[-1])
    res.update(instructions=total - load, instructions_total=total, instructions_load=load)
    return res


def env_command(gpus: int, max_jobs: int, seed: int, episodes: int = 1) -> list[str]:
    """The ``bench.env_speed`` command whose instructions are counted (one episode, as the bench's
    env part plays each seed; ``episodes=0``: its baseline, the imports and the env's construction)."""
    return [sys.executable, "-m", "bench.env_speed", "--gpus", str(gpus), "--window-k", "16", "--episodes",
            str(episodes), "--max-jobs", str(max_jobs), "--load", "1.0", "--seed", str(seed)]


def env_instructions(gpus: int, max_jobs: int, seed: int) -> dict:
    """Instructions of one env episode under the random masked policy of ``bench.env_speed``
    (masks included): the episode's count less the count of the same command with no episode.
    Returns its steps, decisions and rounds, ``instructions``, ``instructions_base`` and
    ``per_step`` (instructions per env step)."""
    total, base, out = count_less_baseline(env_command(gpus, max_jobs, seed), env_command(gpus, max_jobs, seed, episodes=0))
    res = json.loads(out)
    steps = res["steps"]
    if steps <= 0:
        raise RuntimeError(f"{' '.join(env_command(gpus, max_jobs, seed))}: the episode took no step")
    return {"gpus": gpus, "jobs": max_jobs, "seed": seed, "steps": steps, "rounds": res["rounds"],
            "decisions": res["decisions"], "instructions": total - base, "instructions_base": base,
            "per_step": (total - base) / steps}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", help="the replay's trace (bench.replay --trace); not with --env")
    p.add_argument("--env", action="store_true", help="count one env episode (bench.env_speed) instead of a replay")
    p.add_argument("--gpus", type=int, default=512)
    p.add_argument("--agent", default="tiresias")
    p.add_argument("--max-jobs", type=int, default=None)
    p.add_argument("--seed", type=int, default=0, help="the env episode's seed (with --env)")
    a = p.parse_args(argv)
    if a.env:
        if a.trace is not None:
            p.error("--env counts an env episode on the synthetic trace; leave out --trace")
        print(json.dumps(env_instructions(a.gpus, a.max_jobs if a.max_jobs is not None else 200, a.seed)))
    elif a.trace is None:
        p.error("--trace is required (or --env)")
    else:
        print(json.dumps(replay_instructions(a.trace, a.gpus, a.agent, a.max_jobs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
