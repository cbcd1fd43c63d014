"""Reading the project's small JSON files (cost tables, ``link.json``, ``lockstep.json``) with the
one-line errors of docs/bad_inputs.md."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_json_file(path: str | Path, what: str) -> Any:
    """The parsed content of the JSON file ``path``. A missing file raises FileNotFoundError
    ``"{what} not found: {path}"``; text that is not JSON, or bytes that are not UTF-8 text, raise
    ValueError ``"{path}: not valid JSON (...)"``. Checking the content's fields is the caller's."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{what} not found: {p}")
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not valid JSON ({e})") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{p}: not valid JSON (not UTF-8 text: {e.reason} at byte {e.start})") from None
