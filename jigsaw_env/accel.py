"""An optional compiled build of the hot modules: the simulator's, Jigsaw's and the env's.

Cython compiles the modules of :data:`MODULES` as they are into ``.accel/<python tag>-<platform>/``
beside the packages; an import hook then loads each compiled module instead of its source, but only
while the source is the one it was compiled from (the SHA-256 of the ``.py`` and of its ``.pxd``,
when it has one, is in the build's manifest): an edited module, a missing build or
``JIGSAW_PURE_PYTHON=1`` imports the Python source, so results never depend on a stale build.

The only declarations are in ``.pxd`` files beside six of the modules (Cython's "augmenting
.pxd"; the sources read only their class declarations, :mod:`jigsaw_env.declared`): they make
the simulator's hot classes extension types whose attributes are C fields, so compiled code
reads them without a dictionary lookup, and type GpuLedger's per-GPU lists and the GPU indices of its scalar loops. Values stay Python
objects and the operations the Python ones, in the same order (the whole-trace replays give the
same rounds and metrics; ``tests/sim/test_accel.py`` compares a replay's frames and an env episode in
both modes). A declared class behaves the same in both modes (:mod:`jigsaw_env.declared` gives the
sources' classes what an extension type does): it cannot be patched (``Simulator.X = 1`` raises
TypeError: set it on the instance, or subclass); :class:`JobState`, :class:`ClusterState` and
``engine.Member`` hold their fields only (setting another attribute raises AttributeError, as on a
slotted dataclass); the other declared classes' listed attributes are not in their ``__dict__``.
The build saves the interpreter's dispatch and those
lookups (docs/simulator.md section 8, "The optional compiled build").

``make venv`` builds it when Cython and a C compiler are there (``jigsaw accel build``) and goes
on without it otherwise. ``jigsaw accel status`` says which modules load compiled, and why not.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.abc
import importlib.util
import json
import os
import shutil
import sys
import sysconfig
import time
import warnings
from pathlib import Path

from .cli_args import positive_int

#: the modules compiled, in the order they are built
MODULES = ("jigsaw_env.placement", "jigsaw_env.las", "jigsaw_env.engine", "jigsaw_env.state",
           "jigsaw_env.interference", "jigsaw_env.free_running", "jigsaw_env.sim_validation",
           "jigsaw_env.sim_components", "jigsaw_env.sim_advance", "jigsaw_env.sim_logs", "jigsaw_env.simulator",
           "jigsaw_env.pairing",
           "agents.common", "agents.jigsaw",
           "jigsaw_env.encoder", "jigsaw_env.actions", "jigsaw_env.env")
#: set to 1 (or any non-empty value but 0) to import every module from its Python source
ENV_OFF = "JIGSAW_PURE_PYTHON"
ROOT = Path(__file__).resolve().parent.parent
_COMPILER_DIRECTIVES = {"language_level": 3, "annotation_typing": False, "binding": True}


def build_dir() -> Path:
    """Where this interpreter's build lives: ``.accel/<cache tag>-<platform>`` under the project."""
    tag = f"{sys.implementation.cache_tag}-{sysconfig.get_platform()}".replace("/", "_")
    return ROOT / ".accel" / tag


def source_of(module: str) -> Path:
    """The Python source of one of :data:`MODULES`."""
    return ROOT.joinpath(*module.split(".")).with_suffix(".py")


def declarations_of(module: str) -> Path:
    """The ``.pxd`` beside a module's source (Cython's declarations for it; it may not exist)."""
    return source_of(module).with_suffix(".pxd")


def source_hash(module: str) -> str:
    """SHA-256 of what a module's compiled build is made from: its ``.py``, then its ``.pxd``
    when it has one (a build whose ``.pxd`` changed, appeared or went is as stale as one whose
    ``.py`` changed)."""
    h = hashlib.sha256(source_of(module).read_bytes())
    pxd = declarations_of(module)
    if pxd.is_file():
        h.update(b"\0pxd\0" + pxd.read_bytes())
    return h.hexdigest()


def _off() -> bool:
    return os.environ.get(ENV_OFF, "").strip() not in ("", "0")


def read_manifest(where: Path | None = None) -> dict | None:
    """The build's manifest (``{"modules": {name: {"file", "sha256"}}, ...}``), or None when
    there is no readable build."""
    path = (where or build_dir()) / "manifest.json"
    try:
        m = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) and isinstance(m.get("modules"), dict) else None


def build(jobs: int = 2, quiet: bool = True) -> dict:
    """Compile :data:`MODULES` into :func:`build_dir` and write its manifest; returns the
    manifest. Raises ImportError without Cython and whatever the compiler raises without a
    working C compiler (an existing build, if any, is left as it is until the new one is done)."""
    from Cython import __version__ as cython_version
    from Cython.Build import cythonize
    from setuptools import Distribution, Extension
    from setuptools.command.build_ext import build_ext

    out = build_dir()
    staging = out.with_name(out.name + ".new")
    shutil.rmtree(staging, ignore_errors=True)  # (what a failed build left: every module is built anew)
    t0 = time.perf_counter()
    hashes = {m: source_hash(m) for m in MODULES}  # what is compiled is what is hashed
    exts = [Extension(m, [str(source_of(m))], extra_compile_args=["-g0"]) for m in MODULES]
    exts = cythonize(exts, compiler_directives=_COMPILER_DIRECTIVES, build_dir=str(staging / "c"),
                     nthreads=max(1, jobs), quiet=quiet)
    cmd = build_ext(Distribution({"ext_modules": exts, "script_name": "jigsaw_env.accel"}))
    cmd.build_lib = str(staging)
    cmd.build_temp = str(staging / "tmp")
    cmd.parallel = max(1, jobs)
    cmd.ensure_finalized()
    cmd.run()
    changed = [m for m in MODULES if source_hash(m) != hashes[m]]
    if changed:  # the manifest would vouch for a file compiled from other text
        raise RuntimeError(f"{', '.join(changed)} changed during the build; build again")
    files = {}
    for m in MODULES:
        name = cmd.get_ext_filename(m)  # e.g. jigsaw_env/state.cpython-311-x86_64-linux-gnu.so
        if not (staging / name).is_file():
            raise RuntimeError(f"the compiled build of {m} is missing: {staging / name}")
        files[m] = {"file": name, "sha256": hashes[m]}
    manifest = {"modules": files, "cython": cython_version, "python": sys.version.split()[0],
                "build_s": round(time.perf_counter() - t0, 1)}
    (staging / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    for scratch in ("c", "tmp"):  # the generated C (a few MB a module) and the object files
        shutil.rmtree(staging / scratch, ignore_errors=True)
    if out.exists():
        shutil.rmtree(out)
    staging.rename(out)
    return manifest


class _CompiledFinder(importlib.abc.MetaPathFinder):
    """Finds the compiled build of a module whose source still hashes to the manifest's."""

    def __init__(self, where: Path, manifest: dict):
        self.where = where
        self.modules = manifest["modules"]
        self.skipped: dict[str, str] = {}  # module -> why its source was imported instead

    def find_spec(self, fullname, path=None, target=None):
        entry = self.modules.get(fullname)
        if entry is None:
            return None
        why = _why_not(fullname, entry, self.where)
        if why is not None:
            if fullname not in self.skipped:
                self.skipped[fullname] = why
                if why.startswith("its source changed"):
                    warnings.warn(f"{fullname}: {why}; importing the Python source (rebuild: "
                                  f"jigsaw accel build)", RuntimeWarning, stacklevel=2)
            return None
        return importlib.util.spec_from_file_location(fullname, self.where / entry["file"])


def _why_not(module: str, entry: dict, where: Path) -> str | None:
    """Why ``module`` would not load compiled (None: it would)."""
    try:
        if source_hash(module) != entry.get("sha256"):
            return "its source changed since the compiled build"
    except OSError as e:
        return f"its source cannot be read ({e})"
    if not (where / str(entry.get("file", ""))).is_file():
        return "the compiled file is missing"
    return None


_installed: _CompiledFinder | None = None


def install() -> bool:
    """Put the compiled build in front of the sources for :data:`MODULES` (idempotent; the
    packages call it on import). False when it is off (:data:`ENV_OFF`) or there is no build."""
    global _installed
    if _installed is not None:
        return True
    if _off():
        return False
    where = build_dir()
    manifest = read_manifest(where)
    if manifest is None:
        return False
    _installed = _CompiledFinder(where, manifest)
    sys.meta_path.insert(0, _installed)
    return True


def status() -> dict[str, str]:
    """Per module of :data:`MODULES`: "compiled" when it is (or would be) imported from the
    build, else why its source is imported ("python: ...")."""
    if _off():
        return {m: f"python: {ENV_OFF} is set" for m in MODULES}
    where = build_dir()
    manifest = read_manifest(where)
    out = {}
    for m in MODULES:
        mod = sys.modules.get(m)
        if mod is not None:  # already imported: say what it is
            f = str(getattr(mod, "__file__", "") or "")
            if not f.endswith(".py"):
                out[m] = "compiled"
                continue
            why = None if _installed is None else _installed.skipped.get(m)
            out[m] = f"python: {why or 'imported before the build was found'}"
            continue
        if manifest is None:
            out[m] = f"python: no compiled build at {where} (jigsaw accel build)"
            continue
        entry = manifest["modules"].get(m)
        why = "not in the build" if entry is None else _why_not(m, entry, where)
        out[m] = "compiled" if why is None else f"python: {why}"
    return out


def _run(args: argparse.Namespace) -> int:
    if args.accel_cmd == "status":
        for m, s in status().items():
            print(f"{m}: {s}")
        return 0
    try:
        m = build(jobs=args.jobs)
    except Exception as e:  # noqa: BLE001 - no Cython, no compiler, a compile error: say it in one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        msg = f"compiled build not made ({type(e).__name__}{': ' + first if first else ''})"
        if args.optional:
            print(f"jigsaw accel: {msg}; the Python sources will be used", file=sys.stderr)
            return 0
        print(f"jigsaw accel: error: {msg}", file=sys.stderr)
        return 1
    print(f"jigsaw accel: compiled {len(m['modules'])} modules in {m['build_s']} s into {build_dir()}")
    return 0


def register(subparsers) -> None:
    """``jigsaw accel build [--jobs N] [--optional]`` and ``jigsaw accel status``."""
    p = subparsers.add_parser("accel", help="the optional compiled build of the hot modules",
                              description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="accel_cmd", metavar="{build,status}", parser_class=type(p))
    sub.required = True
    b = sub.add_parser("build", help="compile the hot modules (needs Cython and a C compiler)")
    b.add_argument("--jobs", type=positive_int("--jobs"), default=os.cpu_count() or 1, metavar="N",
                   help="parallel compiles (default: CPUs)")
    b.add_argument("--optional", action="store_true",
                   help="on failure say why and exit 0 (the Python sources are used): for install scripts")
    sub.add_parser("status", help="which modules load compiled, and why not")
    p.set_defaults(func=_run)
