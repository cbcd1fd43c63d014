"""Convert a pickled ``vecnormalize.pkl`` to the ``vecnormalize.npz`` jigsaw reads.

    python tools/convert_vecnormalize.py RUN_DIR/vecnormalize.pkl [...]

Unpickling runs whatever code the file carries: convert only files whose origin you trust
(docs/security.md). Each ``X.pkl`` becomes ``X.npz`` beside it (agents/vecnorm_file.py).
This script is not part of the ``jigsaw`` command line.
"""
from __future__ import annotations

import pickle
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.vecnorm_file import read_vecnormalize, write_vecnormalize  # noqa: E402


def convert(pkl: Path) -> Path:
    """Unpickle ``pkl`` (trusted), write its statistics to ``pkl`` with the .npz suffix, read them back."""
    with open(pkl, "rb") as f:
        venv = pickle.load(f)  # trusted input only: see the module docstring
    out = pkl.with_suffix(".npz")
    with open(out, "wb") as f:
        write_vecnormalize(venv, f)
    read_vecnormalize(out)
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    for name in argv:
        print(convert(Path(name)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
