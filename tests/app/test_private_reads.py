"""Package code reads another object's private attribute (``x._name``, ``x`` not ``self`` or
``cls``) only where that name is defined in the same module: classes of one module may read each
other's fields, other modules go through public methods. Read from the sources' AST (tests and
bench aside)."""
from __future__ import annotations

import ast

import pytest

from test_import_layout import ROOT, package_sources  # the package code: the same files the import rules read

# the standard library's own spellings of public behaviour
ALLOWED = {"os._exit", "argparse._SubParsersAction", "argparse._HelpAction", "p._actions", "build_parser()._actions"}


def defined_names(tree: ast.AST) -> set[str]:
    """Names a module defines: its functions and classes, the names it assigns, the attributes
    it assigns on ``self`` or ``cls``, and the strings it holds (``__slots__`` entries,
    ``setattr`` names). A write to another object's private attribute defines nothing."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
              and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)
    return names


def foreign_private_reads(source: str) -> list[str]:
    """``line: expression`` for each read of another object's private attribute that ``source``
    does not define."""
    tree = ast.parse(source)
    own = defined_names(tree)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
            continue
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        text = ast.unparse(node)
        if node.attr not in own and text not in ALLOWED:
            found.append(f"{node.lineno}: {text}")
    return sorted(found)


def test_package_code_reads_no_other_modules_private_fields():
    files = package_sources()
    assert len(files) > 50
    found = [f"{f.relative_to(ROOT)}:{o}" for f in files for o in foreign_private_reads(f.read_text())]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("source, flagged", [
    ("def f(sim):\n    return sim._cset\n", ["2: sim._cset"]),
    ("class A:\n    def __init__(self):\n        self._x = 1\n\ndef f(a):\n    return a._x\n", []),
    ("class A:\n    def f(self):\n        return self._x + type(self).__name__.__len__()\n", []),
    ("import os\nos._exit(0)\n", []),
    ("def f(sim):\n    sim._formed += 1\n    return sim._formed\n", ["2: sim._formed", "3: sim._formed"]),
    ("from . import evaluate as ev\nev._CACHE['k'] = 1\n", ["2: ev._CACHE"]),
])
def test_the_rule_flags_a_private_read_defined_elsewhere(source, flagged):
    assert foreign_private_reads(source) == flagged
