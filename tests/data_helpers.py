"""Finding the reference data folder in tests (docs/design.md section 6).

    from data_helpers import require_data
    path = require_data("philly/philly.csv")

The folder is the data folder (``JIGSAW_DATA``, resolved by ``traces.data_dir()``). A test that
needs a file skips with a reason when it is absent, except under CI (``CI=true``), where a missing
file is a failure, not a skip.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest


def data_dir() -> Path:
    from traces import data_dir as _data_dir

    return _data_dir()


def require_data(relpath: str) -> Path:
    """The path of ``relpath`` inside the data folder; skip (or, under CI, fail) if it is absent."""
    base = data_dir()
    path = base / relpath
    if path.exists():
        return path
    reason = (f"reference data {relpath!r} not found in {base} "
              "(set JIGSAW_DATA to the data folder; docs/design.md section 6)")
    if os.environ.get("CI", "").strip().lower() == "true":
        pytest.fail(f"{reason}; CI=true requires the data folder", pytrace=False)
    pytest.skip(reason)
