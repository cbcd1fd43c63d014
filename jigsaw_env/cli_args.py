"""argparse value parsers shared by every ``jigsaw`` subcommand (one wording for one mistake)."""
from __future__ import annotations

import argparse
import math
from pathlib import Path


def int_at_least(flag: str, low: int):
    """Parser for an integer >= ``low``; accepts integer-valued notations such as ``1e5``."""
    def parse(v: str) -> int:
        try:
            f = float(v)
            if not f.is_integer():
                raise ValueError(v)
            x = int(f)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"{flag} must be an integer, got {v!r}") from None
        if x < low:
            raise argparse.ArgumentTypeError(f"{flag} must be >= {low}, got {x}")
        return x
    return parse


def positive_int(flag: str):
    """Parser for an integer >= 1."""
    return int_at_least(flag, 1)


def non_negative_int(flag: str):
    """Parser for an integer >= 0."""
    return int_at_least(flag, 0)


def positive_float(flag: str):
    """Parser for a finite number > 0."""
    def parse(v: str) -> float:
        try:
            x = float(v)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be a number, got {v!r}") from None
        if not x > 0 or x == float("inf"):
            raise argparse.ArgumentTypeError(f"{flag} must be > 0, got {v}")
        return x
    return parse


def non_negative_float(flag: str):
    """Parser for a finite number >= 0."""
    def parse(v: str) -> float:
        try:
            x = float(v)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be a number, got {v!r}") from None
        if not (x >= 0 and math.isfinite(x)):
            raise argparse.ArgumentTypeError(f"{flag} must be a finite number >= 0, got {v}")
        return x
    return parse


def file_above(path) -> Path | None:
    """The nearest existing path above ``path`` when it is a file, not a folder (so ``path`` can
    never be created); None when that path is a folder (or nothing above ``path`` exists)."""
    for parent in Path(path).parents:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None
