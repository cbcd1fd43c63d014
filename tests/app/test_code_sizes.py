"""Package code stays readable in pieces: no function over 100 lines and no class over 500, read
from the sources' AST (tests and bench aside)."""
from __future__ import annotations

import ast

import pytest

from test_import_layout import ROOT, package_sources  # the package code: the same files the import rules read

MAX_FUNCTION_LINES = 100
MAX_CLASS_LINES = 500


def oversized(source: str, max_function: int = MAX_FUNCTION_LINES, max_class: int = MAX_CLASS_LINES) -> list[str]:
    """``kind name: lines`` for each function or class of ``source`` longer than its limit
    (decorators aside, docstring and body included)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            lines = node.end_lineno - node.lineno + 1
            kind, limit = ("class", max_class) if isinstance(node, ast.ClassDef) else ("function", max_function)
            if lines > limit:
                found.append(f"{kind} {node.name}: {lines} lines")
    return found


def test_no_package_function_over_100_lines_nor_class_over_500():
    files = package_sources()
    assert len(files) > 50
    found = [f"{f.relative_to(ROOT)}: {o}" for f in files for o in oversized(f.read_text())]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("body_lines, flagged", [(98, []), (99, ["function f: 101 lines"])])
def test_the_size_check_counts_a_functions_lines_from_def_to_its_last_line(body_lines, flagged):
    source = "def f():\n    '''doc'''\n" + "    x = 1\n" * body_lines
    assert oversized(source) == flagged


def test_the_size_check_flags_a_long_class_and_a_long_method_inside_it():
    method = "    def m(self):\n" + "        x = 1\n" * 120
    source = "class C:\n" + method + "".join(f"    a{i} = {i}\n" for i in range(400))
    assert oversized(source) == ["class C: 522 lines", "function m: 121 lines"]
