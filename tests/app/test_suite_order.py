"""The suite's own schedule (tests/conftest.py): every file it collects first exists and is a
test file of the suite, so a renamed file cannot drop silently to the end of the run."""
from __future__ import annotations

from pathlib import Path

from conftest import LONGEST_FILES_FIRST

ROOT = Path(__file__).resolve().parents[2]


def test_the_files_collected_first_are_test_files_of_the_suite():
    assert len(set(LONGEST_FILES_FIRST)) == len(LONGEST_FILES_FIRST)
    for path in LONGEST_FILES_FIRST:
        p = ROOT / path
        assert p.is_file() and p.name.startswith("test_") and p.parts[-3] == "tests", path


def test_the_longest_files_are_collected_first(request):
    collected = []
    for item in request.session.items:
        path = item.nodeid.split("::", 1)[0]
        if not collected or collected[-1] != path:
            collected.append(path)
    ran = [p for p in LONGEST_FILES_FIRST if p in collected]  # (a run of some files collects only those)
    assert collected[:len(ran)] == ran
