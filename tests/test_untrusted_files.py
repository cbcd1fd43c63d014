"""Files a user hands to the CLI are data: no code runs from them (docs/security.md).

Known answers: a doctored ``scheduler_state.json`` whose ``scheduler_pickle`` would create a marker
file when unpickled is refused in one line and the marker is never created; and, statically, no
user-reachable module calls ``pickle.load(s)`` or ``torch.load(..., weights_only=False)``.
"""
from __future__ import annotations

import ast
import base64
import json
import pickle
from pathlib import Path

import pytest

from jigsaw_env.cli import main

ROOT = Path(__file__).resolve().parents[1]


class _Marker:
    """Unpickling it opens (creates) a file: what a hostile pickle could do."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def _doctored_run(tmp_path: Path, marker: Path) -> Path:
    out = tmp_path / "run"
    out.mkdir()
    blob = base64.b64encode(pickle.dumps(_Marker(marker))).decode("ascii")
    (out / "scheduler_state.json").write_text(json.dumps({"format": "jigsaw-live-state/1", "scheduler_pickle": blob}))
    return out


def test_the_doctored_pickle_would_run_code(tmp_path):
    """The known answer has teeth: unpickling the blob does create the marker."""
    marker = tmp_path / "would"
    out = _doctored_run(tmp_path, marker)
    blob = json.loads((out / "scheduler_state.json").read_text())["scheduler_pickle"]
    pickle.loads(base64.b64decode(blob)).close()
    assert marker.exists()


def test_deploy_resume_refuses_a_pickled_scheduler_and_runs_nothing(tmp_path, capsys):
    marker = tmp_path / "marker"
    out = _doctored_run(tmp_path, marker)
    assert main(["deploy", "--resume", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"jigsaw deploy: error: {out}/scheduler_state.json: written by an earlier version")
    assert "scheduler_pickle" in err and "\n" not in err
    assert not marker.exists()


def test_restore_from_a_state_with_the_field_anywhere_is_refused(tmp_path):
    """Even with the current format, a state carrying ``scheduler_pickle`` is refused unread."""
    from jigsaw_executor.live import SNAPSHOT_FORMAT, LiveExecutor

    marker = tmp_path / "marker"
    out = _doctored_run(tmp_path, marker)
    snap = json.loads((out / "scheduler_state.json").read_text())
    snap["format"] = SNAPSHOT_FORMAT
    (out / "scheduler_state.json").write_text(json.dumps(snap))
    with pytest.raises(ValueError, match="written by an earlier version"):
        LiveExecutor.restore(out)
    assert not marker.exists()


# ------------------------------------------------------------------------------------------ static check
#: packages and scripts whose code runs on files a user names on the command line
USER_REACHABLE = ["agents", "jigsaw_env", "jigsaw_executor", "train_agent.py"]
#: readers of VecNormalize statistics pickles still in place: the part of the issue not yet done
#: (docs/security.md, "Known gaps"); a strict xfail below turns into a failure once they are gone
KNOWN_PICKLE_READERS = {"agents/rl.py", "jigsaw_executor/export.py"}


def _modules() -> list[Path]:
    out = []
    for name in USER_REACHABLE:
        p = ROOT / name
        out += [p] if p.is_file() else sorted(p.rglob("*.py"))
    return out


def _unsafe_calls(path: Path) -> list[str]:
    """``pickle.load``/``pickle.loads`` calls and ``torch.load`` calls without ``weights_only=True``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        owner = node.func.value.id if isinstance(node.func.value, ast.Name) else None
        if owner == "pickle" and node.func.attr in ("load", "loads", "Unpickler"):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: pickle.{node.func.attr}")
        if owner == "torch" and node.func.attr == "load":
            kw = {k.arg: k.value for k in node.keywords}
            safe = isinstance(kw.get("weights_only"), ast.Constant) and kw["weights_only"].value is True
            if not safe:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: torch.load without weights_only=True")
    return found


def test_no_user_reachable_module_unpickles():
    bad = [c for p in _modules() if str(p.relative_to(ROOT)) not in KNOWN_PICKLE_READERS for c in _unsafe_calls(p)]
    assert bad == []


@pytest.mark.xfail(strict=True, reason="VecNormalize statistics are still read from pickles (docs/security.md)")
def test_the_known_pickle_readers_are_gone():
    assert [c for p in _modules() if str(p.relative_to(ROOT)) in KNOWN_PICKLE_READERS for c in _unsafe_calls(p)] == []
