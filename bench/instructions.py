"""Instructions one replay executes, counted by valgrind: replay cost without the machine's noise.

    python -m bench.instructions --trace synthetic:jobs=10000,load=0.7,seed=0 --gpus 512 --agent tiresias

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
    total, out = count_instructions(replay_command(trace, gpus, agent, max_jobs))
    load, _ = count_instructions(replay_command(trace, gpus, agent, max_jobs, load_only=True))
    res = json.loads(out.strip().splitlines()[-1])
    res.update(instructions=total - load, instructions_total=total, instructions_load=load)
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", required=True)
    p.add_argument("--gpus", type=int, default=512)
    p.add_argument("--agent", default="tiresias")
    p.add_argument("--max-jobs", type=int, default=None)
    a = p.parse_args(argv)
    print(json.dumps(replay_instructions(a.trace, a.gpus, a.agent, a.max_jobs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
