"""What the study benches (headroom, lookahead, translation_gap) record about a run and write to
their ``--out`` folder."""
from __future__ import annotations

import json
import os
import platform
import re
import sys
import time
from pathlib import Path
from typing import Callable


def portable_text(text: str) -> str:
    """``text`` (a command line or a trace spec) with the data folder's absolute path
    (``traces.data_dir``) written ``$JIGSAW_DATA``, so that what a results file records reads the
    same on every machine. For display only: what runs keeps the path as given."""
    from traces import data_dir

    folder = data_dir()
    if not folder.is_absolute():
        folder = folder.resolve()
    return re.sub(re.escape(str(folder)) + r"(?=[/\s'\"`,;)\]]|$)", "$JIGSAW_DATA", text)


def command_line(module: str, argv=None) -> str:
    """``python -m MODULE ARGS`` as run (``argv``, default the process's arguments), written
    portably (:func:`portable_text`)."""
    return portable_text(f"python -m {module} " + " ".join(argv if argv is not None else sys.argv[1:]))


def run_record(module: str, argv, t0: float) -> dict:
    """The run's wall seconds since ``t0`` (``time.perf_counter``), command line (the data folder
    written ``$JIGSAW_DATA``, :func:`portable_text`), git commit and machine, for its results."""
    from jigsaw_env.evaluate import git_commit

    return {"wall_s": time.perf_counter() - t0,
            "command": command_line(module, argv),
            "git_commit": git_commit(), "machine": f"{platform.machine()}, {os.cpu_count()} cores"}


def run_line(res: dict) -> str:
    """The results.md line that names how ``res`` was made: its command, commit, machine and wall
    seconds (the fields of :func:`run_record`)."""
    return f"`{res['command']}` at commit `{res['git_commit']}` ({res['machine']}, {res['wall_s']:.0f} s)."


def write_results(out: str | Path, res: dict, write_md: Callable[[Path, dict], None]) -> Path:
    """``OUT/results.json`` (``res``) and ``OUT/results.md`` (``write_md``), the folder made if
    needed; returns the folder."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    write_md(out / "results.md", res)
    return out


def write_and_show(out: str | Path, res: dict, write_md: Callable[[Path, dict], None], module: str, argv,
                   t0: float) -> Path:
    """Add :func:`run_record` to ``res``, write the folder (:func:`write_results`) and print its
    results.md; returns the folder."""
    res.update(run_record(module, argv, t0))
    folder = write_results(out, res, write_md)
    print((folder / "results.md").read_text())
    return folder
