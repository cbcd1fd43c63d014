"""The ``jigsaw`` command line.

Each subcommand lives in the module that owns its work and exposes ``register(subparsers)``, which
adds its parser and sets ``func`` (a callable taking the parsed ``argparse.Namespace`` and returning
an exit code). User errors (``ValueError``, which includes ``InfeasibleDecision`` and
``TraceFormatError``, and ``OSError``: a missing file, a folder where a file is expected, no
permission) print one line on stderr and exit with status 2, with no traceback. docs/bad_inputs.md
lists every bad input and its message.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

# module path -> registers these subcommands
SUBCOMMAND_MODULES = (
    "jigsaw_env.simulate_cli",   # simulate
    "jigsaw_env.calibrate",      # calibrate
    "traces.cli",                # traces describe
    "train_agent",               # train
    "jigsaw_env.evaluate",       # evaluate
    "jigsaw_executor.export",    # export
    "jigsaw_executor.deploy",    # deploy
    "jigsaw_env.accel",          # accel build, accel status
    "jigsaw_env.colocation_cli",  # colocation predict, check, fit
    "jigsaw_env.tables_cli",     # tables list, tables show
)


#: optional packages -> the extra of ``pyproject.toml`` that installs them (the core install has none)
OPTIONAL_PACKAGES = {"torch": "calibrate", "stable_baselines3": "rl", "sb3_contrib": "rl", "tensorboard": "rl",
                     "ray": "executor", "onnx": "executor", "onnxruntime": "executor", "sklearn": "executor"}
#: subcommand -> the extra its work needs
SUBCOMMAND_EXTRAS = {"train": "rl", "deploy": "executor", "export": "executor", "calibrate": "calibrate"}


def missing_package_line(command: str, e: ModuleNotFoundError) -> str | None:
    """One line naming the extra to install when ``e`` is an optional package that is not
    installed; None for any other missing module (a bug, shown with its traceback)."""
    top = (e.name or "").split(".")[0]
    if top not in OPTIONAL_PACKAGES:
        return None
    extra = SUBCOMMAND_EXTRAS.get(command, OPTIONAL_PACKAGES[top])
    return (f"jigsaw {command}: error: needs the Python package {top!r}, which is not installed: "
            f"pip install 'jigsaw[{extra}]' (or 'jigsaw[all]')")


class UserError(Exception):
    """An error caused by the user's input; printed as one line, exit status 2."""


class OneLineErrorParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr (exit status 2)."""

    def error(self, message: str):  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="jigsaw",
        description="SPB-aware GPU cluster simulator, schedulers and live executor.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineErrorParser)
    sub.required = True
    for mod_name in SUBCOMMAND_MODULES:
        try:
            mod = importlib.import_module(mod_name)
        except ModuleNotFoundError as e:
            # an optional part that is not installed: its subcommands are simply absent
            if e.name and (e.name == mod_name or mod_name.startswith(e.name)):
                continue
            raise
        mod.register(sub)
    return parser


def error_line(e: BaseException) -> str:
    """One line for the user: the message's first line; for an OSError raised by the operating
    system (errno set), "PATH: reason" (e.g. "runs/x: File exists", "out.csv: Is a directory")."""
    if isinstance(e, OSError) and e.errno is not None and e.strerror:
        where = " -> ".join(str(f) for f in (e.filename, e.filename2) if f is not None)
        return f"{where}: {e.strerror}" if where else e.strerror
    s = str(e).strip()
    return s.splitlines()[0] if s else type(e).__name__


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc = args.func(args)
    except ModuleNotFoundError as e:
        line = missing_package_line(args.command, e)
        if line is None:
            raise
        print(line, file=sys.stderr)
        return 2
    except (UserError, ValueError, OSError) as e:
        print(f"jigsaw {args.command}: error: {error_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"jigsaw {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(rc or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
