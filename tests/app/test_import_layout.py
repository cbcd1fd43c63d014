"""Imports sit at the top of their module, so the import graph is what the module heads say.

An import inside a function is allowed only for a module of the lists below, each with its reason:
an optional dependency (pyproject's extras: the core install has none of them), a core dependency
that is slow to import and needed by one command only, a module of the package that imports torch
or stable-baselines3 at import time, the executor layer seen from below it, and the few cases of
:data:`LAZY_IN` (one file importing one module). The checker reads the sources with :mod:`ast`;
nothing is imported.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("jigsaw_env", "agents", "traces", "jigsaw_executor")
SCRIPTS = ("train_agent.py",)

#: module (and its submodules) -> why an import of it may stay inside a function anywhere
LAZY_ANYWHERE = {
    # optional dependencies: pyproject's extras (docs/design.md section 3, tests/app/test_light_core.py)
    "torch": "extras calibrate, rl, executor",
    "stable_baselines3": "extra rl",
    "sb3_contrib": "extra rl",
    "ray": "extra executor",
    "onnx": "extra executor",
    "onnxruntime": "extra executor",
    "sklearn": "extra executor",
    "platformdirs": "extra executor (the demo calibration's cache folder)",
    "Cython": "extra accel (jigsaw accel build)",
    "setuptools": "the build of extra accel",
    "psutil": "no dependency: physical_cores uses it when it is there",
    "tomllib": "Python 3.10 has none; read only for a training preset, with tomli as the fallback",
    "tomli": "no dependency: the TOML reader on Python 3.10",
    # core dependencies slow to import, used by one command each
    "matplotlib": "about 0.2 s: only the plots of evaluate, train and colocation check need it",
    "scipy": "0.4 to 0.7 s: only the fits (link, colocation, eta) and the report's intervals need it",
    # modules of the package that import torch or stable-baselines3 at import time
    # (test_torch_modules_import_an_optional_package checks it)
    "jigsaw_env.zoo": "imports torch",
    "jigsaw_env.table_builder": "imports torch (through jigsaw_env.zoo)",
    "agents.semi_mdp": "imports stable-baselines3",
    "agents.slot_policy": "imports torch and sb3-contrib",
    "agents.train_callbacks": "imports stable-baselines3",
    "agents.ray_vec_env": "imports stable-baselines3",
    "jigsaw_executor.data": "imports torch",
    "jigsaw_executor.models": "imports torch",
    "jigsaw_executor.spb_checkpoint": "imports torch",
    "jigsaw_executor.spb_worker": "imports torch",
    "jigsaw_executor.launcher": "imports torch",
}
HEAVY_FIRST_PARTY = [m for m in LAZY_ANYWHERE if m.split(".")[0] in PACKAGES]

#: (importing package, imported module) -> why every module of that package imports it lazily
LAZY_FROM_PACKAGE = {
    ("jigsaw_env", "jigsaw_executor"): "the executor layer sits above the simulator (docs/design.md section 3): "
                                       "only --ray, --executor and the ONNX paths use it",
    ("agents", "jigsaw_executor"): "the executor layer sits above the schedulers: only ONNX policies and Ray "
                                   "training use it",
    ("traces", "jigsaw_executor"): "the executor layer sits above the traces",
}

#: (source file, imported module) -> why this one import stays inside a function
LAZY_IN = {
    ("jigsaw_env/network.py", "pandas"):
        "only the link fit needs it: importing the cost tables (every scheduler does) stays without pandas",
    ("jigsaw_env/evaluate.py", "jigsaw_env.ray_sweep"):
        "cycle: ray_sweep imports evaluate for the tasks it runs; only --ray needs it",
    ("jigsaw_executor/onnx_policy.py", "jigsaw_env"):
        "a deployed policy runs with numpy and onnxruntime alone (tests/executor/test_export.py)",
    ("jigsaw_executor/onnx_policy.py", "agents"):
        "a deployed policy runs with numpy and onnxruntime alone (tests/executor/test_export.py)",
}


def _covers(prefix: str, module: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _package_of(rel: str) -> str:
    parts = Path(rel).with_suffix("").parts
    return ".".join(parts[:-1])


def imported_modules(node: ast.Import | ast.ImportFrom, package: str) -> list[str]:
    """The absolute dotted names an import statement imports: ``import X`` gives X, ``from X
    import y`` gives X.y (a submodule, as in ``from . import evaluate``, or a name of X); relative
    imports are resolved against ``package``."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        parts = package.split(".") if package else []
        module = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
    else:
        module = node.module or ""
    return [f"{module}.{a.name}" for a in node.names]


def in_function_imports(source: str, rel: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import inside a function (or a method, or a block
    within one) of ``source``, the text of the file ``rel`` (a path relative to the project)."""
    package = _package_of(rel)
    found: list[tuple[int, str]] = []

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                found.extend((child.lineno, m) for m in imported_modules(child, package))
            walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    walk(ast.parse(source), False)
    return found


def lazy_reason(rel: str, module: str) -> str | None:
    """Why ``module`` may be imported inside a function of ``rel``; None: it may not."""
    for prefix, why in LAZY_ANYWHERE.items():
        if _covers(prefix, module):
            return why
    top = Path(rel).parts[0]
    for (pkg, prefix), why in LAZY_FROM_PACKAGE.items():
        if top == pkg and _covers(prefix, module):
            return why
    for (path, prefix), why in LAZY_IN.items():
        if path == rel and _covers(prefix, module):
            return why
    return None


def violations(source: str, rel: str) -> list[str]:
    return [f"{rel}:{line}: import of {module} inside a function (move it to the top of the module, or list "
            f"it with its reason in tests/app/test_import_layout.py)"
            for line, module in in_function_imports(source, rel) if lazy_reason(rel, module) is None]


def package_sources() -> list[Path]:
    files = [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]
    return files + [ROOT / s for s in SCRIPTS]


def test_imports_inside_functions_are_the_listed_lazy_ones():
    found = [v for p in package_sources() for v in violations(p.read_text(), p.relative_to(ROOT).as_posix())]
    assert not found, "\n".join(found)


def test_every_single_file_entry_is_used():
    # an entry of LAZY_IN whose import moved to the top (or went away) is dropped from the list
    used = {(p.relative_to(ROOT).as_posix(), prefix)
            for p in package_sources()
            for _, module in in_function_imports(p.read_text(), p.relative_to(ROOT).as_posix())
            for (path, prefix) in LAZY_IN if path == p.relative_to(ROOT).as_posix() and _covers(prefix, module)}
    assert set(LAZY_IN) - used == set()


def _top_level_imports(module: str) -> list[str]:
    rel = Path(*module.split("."))
    path = ROOT / rel.with_suffix(".py")
    if not path.exists():
        path = ROOT / rel / "__init__.py"
    tree = ast.parse(path.read_text())
    rel_path = path.relative_to(ROOT).as_posix()
    return [m for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
            for m in imported_modules(node, _package_of(rel_path))]


@pytest.mark.parametrize("module", HEAVY_FIRST_PARTY)
def test_torch_modules_import_an_optional_package(module):
    """Each module of the package listed as heavy imports an optional package (or another listed
    module) at its top level, so importing it inside a function is what keeps the core light."""
    optional = {"torch", "stable_baselines3", "sb3_contrib", "ray", "onnx", "onnxruntime"}
    heads = _top_level_imports(module)
    assert any(m.split(".")[0] in optional or any(_covers(h, m) for h in HEAVY_FIRST_PARTY if h != module)
               for m in heads), (module, heads)


# ------------------------------------------------------------------------------- the checker itself
def test_the_checker_flags_an_in_function_import_of_a_listed_nowhere_module():
    src = "import os\n\n\ndef f():\n    import json\n    return json.dumps(os.sep)\n"
    assert in_function_imports(src, "jigsaw_env/x.py") == [(5, "json")]
    assert violations(src, "jigsaw_env/x.py") == [
        "jigsaw_env/x.py:5: import of json inside a function (move it to the top of the module, or list it "
        "with its reason in tests/app/test_import_layout.py)"]


def test_the_checker_sees_methods_blocks_and_relative_imports():
    src = ("class A:\n"
           "    def m(self):\n"
           "        if self:\n"
           "            from .cost_table import get_table\n"
           "        try:\n"
           "            from . import evaluate, report\n"
           "        except ImportError:\n"
           "            pass\n")
    assert in_function_imports(src, "jigsaw_env/x.py") == [
        (4, "jigsaw_env.cost_table.get_table"), (6, "jigsaw_env.evaluate"), (6, "jigsaw_env.report")]
    assert len(violations(src, "jigsaw_env/x.py")) == 3


def test_the_checker_allows_the_listed_lazy_imports_only_where_listed():
    src = ("import json\n\n\ndef f():\n    import torch\n    import ray.util\n    from matplotlib import pyplot\n"
           "    from jigsaw_executor.cluster_ray import connect\n    import pandas as pd\n")
    assert violations(src, "jigsaw_env/network.py") == []          # pandas: this file's entry
    assert [v.split(": ")[1] for v in violations(src, "jigsaw_env/report.py")] == [
        "import of pandas inside a function (move it to the top of the module, or list it with its reason in "
        "tests/app/test_import_layout.py)"]
    # the executor layer is lazy only from below it: train_agent imports it at the top
    assert len(violations(src, "train_agent.py")) == 2
    assert in_function_imports("import json\n", "agents/x.py") == []  # a top-level import is no finding
