"""The optional compiled build (jigsaw_env/accel.py): it gives the same results as the Python
sources, is used only while each source is the one compiled, and can be switched off."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from jigsaw_env import accel

ROOT = Path(__file__).resolve().parents[2]

# a replay that reaches Jigsaw's pairing, its exclusive pass and the simulator's completions
REPLAY = """
import json, sys
from agents import make_scheduler
from jigsaw_env.cluster import ClusterSpec
from jigsaw_env.simulator import SimConfig, Simulator
from jigsaw_env import accel
from traces import load_trace
jobs = load_trace("synthetic:jobs=160,load=2.5,seed=4", cluster_gpus=32).jobs
sim = Simulator(ClusterSpec.from_gpus(32), jobs, SimConfig())
m = sim.run(make_scheduler("jigsaw"))
# and an env episode under a random masked policy: every observation, reward and mask
import hashlib
import numpy as np
from jigsaw_env.env import JigsawClusterEnv
env = JigsawClusterEnv(gpus=16, window_k=8, max_jobs=40, load=2.0, trace="synthetic")
rng = np.random.default_rng(1)
obs, _ = env.reset(seed=1)
h, steps = hashlib.sha256(), 0
while True:
    mask = env.action_masks()
    a = int(mask.nonzero()[0][rng.integers(mask.sum())])
    obs, r, term, trunc, info = env.step(a)
    h.update(obs.tobytes()); h.update(mask.tobytes()); h.update(repr(r).encode())
    steps += 1
    if term or trunc:
        break
print(json.dumps({"status": accel.status(), "metrics": {k: repr(v) for k, v in m.items() if "wall" not in k},
                  "jobs": sim.jobs_frame().to_csv(), "rounds": sim.rounds_frame().to_csv(),
                  "n_rounds": sim.state.round, "env": h.hexdigest(), "env_steps": steps}))
"""


def _run(code: str, **env) -> dict:
    e = {k: v for k, v in os.environ.items() if k != accel.ENV_OFF}  # (the caller's switch only)
    e.update(OMP_NUM_THREADS="1", **env)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=e, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _require_build() -> dict:
    m = accel.read_manifest()
    if m is None or any(s != "compiled" for s in accel.status().values()):
        why = f"no current compiled build at {accel.build_dir()} (make accel)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why}: CI builds it (make test depends on it)")
        pytest.skip(why)
    return m


def test_compiled_and_python_runs_give_the_same_frames_metrics_and_env_episode():
    _require_build()
    compiled = _run(REPLAY)
    python = _run(REPLAY, **{accel.ENV_OFF: "1"})
    assert set(compiled["status"].values()) == {"compiled"}
    assert all(s.startswith("python:") for s in python["status"].values())
    assert compiled["n_rounds"] > 100 and compiled["env_steps"] > 100
    for part in ("metrics", "jobs", "rounds", "n_rounds", "env", "env_steps"):
        assert compiled[part] == python[part], part


def test_a_changed_source_is_imported_from_python_with_a_warning(tmp_path):
    m = {"modules": {"jigsaw_env.las": {"file": "jigsaw_env/las.so", "sha256": "0" * 64}}}
    (tmp_path / "jigsaw_env").mkdir()
    (tmp_path / "jigsaw_env" / "las.so").write_bytes(b"")
    finder = accel._CompiledFinder(tmp_path, m)
    with pytest.warns(RuntimeWarning, match=r"jigsaw_env\.las: its source changed since the compiled build"):
        assert finder.find_spec("jigsaw_env.las") is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        assert finder.find_spec("jigsaw_env.las") is None
    assert finder.find_spec("jigsaw_env.env") is None  # not compiled: the usual finders
    assert finder.skipped == {"jigsaw_env.las": "its source changed since the compiled build"}


def test_a_current_source_loads_its_compiled_file_and_a_missing_file_the_source(tmp_path):
    sha = accel.source_hash("jigsaw_env.las")
    m = {"modules": {"jigsaw_env.las": {"file": "jigsaw_env/las.cpython-311-x86_64-linux-gnu.so", "sha256": sha}}}
    finder = accel._CompiledFinder(tmp_path, m)
    assert finder.find_spec("jigsaw_env.las") is None
    assert finder.skipped == {"jigsaw_env.las": "the compiled file is missing"}
    so = tmp_path / "jigsaw_env" / "las.cpython-311-x86_64-linux-gnu.so"
    so.parent.mkdir()
    so.write_bytes(b"")
    spec = accel._CompiledFinder(tmp_path, m).find_spec("jigsaw_env.las")
    assert spec.name == "jigsaw_env.las" and Path(spec.origin) == so


def test_switched_off_or_without_a_build_every_module_comes_from_python(tmp_path):
    code = "import json; from jigsaw_env import accel; import agents.jigsaw; print(json.dumps({'status': accel.status()}))"
    off = _run(code, **{accel.ENV_OFF: "1"})["status"]
    assert set(off) == set(accel.MODULES)
    assert all(s == f"python: {accel.ENV_OFF} is set" for s in off.values())
    # an empty project copy of the manifest's place: no build found
    assert accel.read_manifest(tmp_path) is None
    (tmp_path / "manifest.json").write_text("not json")
    assert accel.read_manifest(tmp_path) is None
    (tmp_path / "manifest.json").write_text(json.dumps({"modules": []}))
    assert accel.read_manifest(tmp_path) is None


def test_build_failures_are_one_line_and_optional_ones_exit_0(monkeypatch, capsys):
    from jigsaw_env.cli import main

    def no_cython(jobs=2, quiet=True):
        raise ImportError("No module named 'Cython'")

    monkeypatch.setattr(accel, "build", no_cython)
    assert main(["accel", "build", "--optional"]) == 0
    err = capsys.readouterr().err
    assert err.strip() == ("jigsaw accel: compiled build not made (ImportError: No module named 'Cython'); "
                           "the Python sources will be used")
    assert main(["accel", "build"]) == 1
    assert "error: compiled build not made (ImportError" in capsys.readouterr().err


def test_the_makefile_rebuilds_on_a_change_of_each_compiled_module():
    text = (ROOT / "Makefile").read_text()
    block = re.search(r"ACCEL_SRC := (.*?)\n(?!\t)", text, re.S).group(1)
    listed = block.replace("\\\n", " ").split()
    assert listed == [str(accel.source_of(m).relative_to(ROOT)) for m in accel.MODULES]
    # and of each module's declarations: the stamp depends on the .pxd files beside those sources
    assert "ACCEL_PXD := $(wildcard $(ACCEL_SRC:.py=.pxd))" in text
    assert re.search(r"^\$\(ACCEL_STAMP\): .*\$\(ACCEL_SRC\) \$\(ACCEL_PXD\)$", text, re.M)
    # every .pxd in the packages declares one of the compiled modules (a stray one would be ignored)
    pxds = sorted(str(p.relative_to(ROOT)) for d in ("jigsaw_env", "agents") for p in (ROOT / d).glob("*.pxd"))
    assert pxds and pxds == sorted(str(accel.declarations_of(m).relative_to(ROOT)) for m in accel.MODULES
                                   if accel.declarations_of(m).is_file())


def test_a_module_hash_covers_its_declarations(tmp_path, monkeypatch):
    (tmp_path / "jigsaw_env").mkdir()
    src = tmp_path / "jigsaw_env" / "las.py"
    src.write_text("x = 1\n")
    monkeypatch.setattr(accel, "ROOT", tmp_path)
    alone = accel.source_hash("jigsaw_env.las")
    pxd = tmp_path / "jigsaw_env" / "las.pxd"
    pxd.write_text("cdef class A:\n    cdef public object a\n")
    declared = accel.source_hash("jigsaw_env.las")
    pxd.write_text("cdef class A:\n    cdef public object b\n")
    assert len({alone, declared, accel.source_hash("jigsaw_env.las")}) == 3
    pxd.unlink()
    assert accel.source_hash("jigsaw_env.las") == alone
    # a build whose declarations changed is stale like one whose source changed
    m = {"modules": {"jigsaw_env.las": {"file": "jigsaw_env/las.so", "sha256": declared}}}
    (tmp_path / "jigsaw_env" / "las.so").write_bytes(b"")
    with pytest.warns(RuntimeWarning, match="its source changed"):
        assert accel._CompiledFinder(tmp_path, m).find_spec("jigsaw_env.las") is None


# what differs least visibly between the modes: comparisons, copies and pickles of the declared classes
OBJECTS = """
import copy, json, pickle, dataclasses
from jigsaw_env import accel
from jigsaw_env.cluster import ClusterSpec
from jigsaw_env.las import LASQueues
from jigsaw_env.placement import GpuLedger
from jigsaw_env.simulator import SimConfig, Simulator
from jigsaw_env.state import JobState, JobDecision, Decision
from agents import make_scheduler
from traces import load_trace
out = {"status": accel.status()}
j = JobState(1, 0.0, 2, "resnet50", 32, 100.0)  # NaN fields
k = JobState(1, 0.0, 2, "resnet50", 32, 100.0)
out["job"] = [j == j, j == copy.deepcopy(j), j == k, j != k, j == pickle.loads(pickle.dumps(j)),
              (j == 1), repr(j), [f.name for f in dataclasses.fields(j)], dataclasses.replace(j, progress=2.0).progress]
try:
    hash(j)
    out["job_hash"] = "hashable"
except TypeError:
    out["job_hash"] = "unhashable"
sim = Simulator(ClusterSpec.from_gpus(16), load_trace("synthetic:jobs=30,load=2,seed=1", cluster_gpus=16).jobs, SimConfig())
sched = make_scheduler("jigsaw")
for _ in range(6):
    sim.step(sched.schedule(sim.state))
st = sim.state
out["state"] = [st == st, st == copy.copy(st), st == copy.deepcopy(st)]
led = GpuLedger(st, st.current_decision())
_ = led.mem  # the views exist
c = copy.deepcopy(led)
p = pickle.loads(pickle.dumps(led))
out["ledger"] = [c._views_ro is None, list(c.mem) == list(led.mem), c.decision == led.decision,
                 p._wl == led._wl, p._ml == led._ml, list(p.workers) == list(led.workers), c.origin is None]
# every attribute a ledger has is kept by its copies (GpuLedger._STATE), in either mode
own = set(vars(led)) | {n for n in GpuLedger._STATE if hasattr(led, n)}
out["ledger_extra"] = sorted(own - set(GpuLedger._STATE) - {"_views_ro"})
las = LASQueues()
las.observe(st)
las.order_active(st)
q = pickle.loads(pickle.dumps(las))
out["las"] = [q._kept is None and q._changes is None, q.thresholds == las.thresholds, q._run_since == las._run_since,
              [x.job_id for x in q.order_active(st)] == [x.job_id for x in las.order_active(st)]]
out["las_extra"] = sorted(set(vars(las)) - set(LASQueues._STATE) - {"_kept", "_changes"})
d = copy.deepcopy(sim)
out["sim_copy"] = [d.state.round == sim.state.round, d.state is not sim.state,
                   d.jobs_frame().to_csv() == sim.jobs_frame().to_csv()]
print(json.dumps(out))
"""


def test_declared_classes_compare_copy_and_pickle_alike_in_both_modes():
    _require_build()
    compiled = _run(OBJECTS)
    python = _run(OBJECTS, **{accel.ENV_OFF: "1"})
    assert set(compiled["status"].values()) == {"compiled"}
    for part in ("job", "job_hash", "state", "ledger", "ledger_extra", "las", "las_extra", "sim_copy"):
        assert compiled[part] == python[part], part
    # the known answers (those of the Python dataclasses and of the copies' rules)
    assert python["job"][:6] == [True, True, True, False, False, False]
    assert python["job_hash"] == "unhashable"
    assert python["state"] == [True, True, False]  # (a deep copy's CostModel is another object: compared by identity)
    assert all(python["ledger"]) and all(python["las"]) and all(python["sim_copy"])
    assert python["ledger_extra"] == [] and python["las_extra"] == []


def test_status_names_every_compiled_module():
    s = accel.status()
    assert list(s) == list(accel.MODULES)
    assert all(v == "compiled" or v.startswith("python: ") for v in s.values())


@pytest.mark.slow
def test_golden_metrics_and_jigsaw_equivalences_hold_with_the_python_sources():
    # the rest of the suite runs the compiled build when there is one: these run the sources
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env.update({accel.ENV_OFF: "1", "OMP_NUM_THREADS": "1"})
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/sim/test_golden.py",
                          "tests/agents/test_scheduler_speed.py", "tests/sim/test_sim_step_parity.py"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert re.search(r"\d+ passed", out.stdout)


# what a user can meet on a declared class (a .pxd's `cdef class`), run in each mode
DECLARED = """
import json, weakref
from pathlib import Path
from jigsaw_env import accel, engine, las, placement, sim_components, simulator, state
from jigsaw_env.declared import read_declarations
from jigsaw_env.cluster import ClusterSpec
from jigsaw_env.simulator import SimConfig, Simulator
from agents import make_scheduler
from traces import load_trace

def outcome(f):
    try:
        f()
        return "ok"
    except Exception as e:  # noqa: BLE001 -- the outcome is what is compared
        return f"{type(e).__name__}: {e}"

def patch_class(cls):
    setattr(cls, "extra_method", lambda self: 1)

out = {"status": accel.status(), "classes": {}, "instances": {}}
modules = {"state": state, "engine": engine, "las": las, "placement": placement, "sim_components": sim_components,
           "simulator": simulator}
declarations = {}
for name, module in modules.items():
    in_module = read_declarations(Path(f"jigsaw_env/{name}.pxd"))
    declarations.update(in_module)
    for cls_name in in_module:
        cls = getattr(module, cls_name)
        sub = type("Sub", (cls,), {})
        out["classes"][cls_name] = [outcome(lambda: patch_class(cls)), outcome(lambda: delattr(cls, "__init__")),
                                    outcome(lambda: patch_class(sub)), hasattr(cls, "extra_method")]
sim = Simulator(ClusterSpec.from_gpus(16), load_trace("synthetic:jobs=30,load=2,seed=1", cluster_gpus=16).jobs, SimConfig())
sched = make_scheduler("jigsaw")
for _ in range(4):
    sim.step(sched.schedule(sim.state))
st = sim.state
job = next(iter(st.jobs.values()))
member = engine.Member(1, None, (0,), 0, 1.0, 0)
objects = {"JobState": job, "ClusterState": st, "CostModel": st.costs, "Member": member, "LASQueues": las.LASQueues(),
           "GpuLedger": placement.GpuLedger(st, st.current_decision()), "LiveComponents": sim.live,
           "RunningJobs": sim.live.rjobs, "Simulator": sim}
for cls_name, obj in objects.items():
    def add_attribute():
        obj.not_declared = 1
    in_dict = sorted(set(declarations[cls_name].attributes) & set(getattr(obj, "__dict__", {})))
    out["instances"][cls_name] = [outcome(add_attribute).split(":")[0], outcome(lambda: weakref.ref(obj)).split(":")[0], in_dict]
print(json.dumps(out))
"""


def test_declared_classes_refuse_patching_and_undeclared_attributes_alike_in_both_modes():
    _require_build()
    compiled = _run(DECLARED)
    python = _run(DECLARED, **{accel.ENV_OFF: "1"})
    assert set(compiled["status"].values()) == {"compiled"}
    assert set(python["status"].values()) != {"compiled"}
    assert compiled["classes"] == python["classes"]
    assert compiled["instances"] == python["instances"]


def test_the_sources_declared_classes_refuse_what_extension_types_refuse():
    # the known answers, from the sources (what the compiled build is held to above)
    out = _run(DECLARED, **{accel.ENV_OFF: "1"})
    assert len(out["classes"]) == 12
    refused = "TypeError: cannot set 'extra_method' attribute of immutable type 'jigsaw_env.simulator.Simulator'"
    assert out["classes"]["Simulator"] == [
        refused, "TypeError: cannot set '__init__' attribute of immutable type 'jigsaw_env.simulator.Simulator'",
        "ok", False]
    assert all(v[0].startswith("TypeError: cannot set") and v[2] == "ok" for v in out["classes"].values())
    # fields only (no __dict__, no weak references) for the dataclasses; the others take both
    for name in ("JobState", "ClusterState", "Member"):
        assert out["instances"][name] == ["AttributeError", "TypeError", []], name
    for name in ("CostModel", "LASQueues", "GpuLedger", "LiveComponents", "RunningJobs", "Simulator"):
        assert out["instances"][name] == ["ok", "ok", []], name


def test_every_module_sees_the_sealed_declared_classes():
    # sealing runs last in each module: no module kept the class it replaced
    code = """
import json, sys, pkgutil, importlib
import jigsaw_env, agents
from jigsaw_env.declared import DeclaredClass
for pkg in (jigsaw_env, agents):
    for m in pkgutil.iter_modules(pkg.__path__):
        try:
            importlib.import_module(f"{pkg.__name__}.{m.name}")
        except ImportError:
            pass  # an optional dependency
stale = []
declared = {}
from jigsaw_env import accel
from jigsaw_env.declared import read_declarations
for mod in [importlib.import_module(m) for m in accel.MODULES if accel.declarations_of(m).is_file()]:
    for name in read_declarations(accel.declarations_of(mod.__name__)):
        declared[(mod.__name__, name)] = getattr(mod, name)
for modname, module in list(sys.modules.items()):
    if not modname.startswith(("jigsaw_env", "agents")):
        continue
    for attr, value in vars(module).items():
        if isinstance(value, type) and (value.__module__, value.__name__) in declared \\
                and value is not declared[(value.__module__, value.__name__)]:
            stale.append(f"{modname}.{attr}")
print(json.dumps({"sealed": sorted(n for (_, n), c in declared.items() if type(c) is DeclaredClass), "stale": stale}))
"""
    out = _run(code, **{accel.ENV_OFF: "1"})
    assert out["stale"] == []
    assert out["sealed"] == sorted(["JobState", "ClusterState", "CostModel", "Member", "Component", "ComponentSet",
                                    "LASQueues", "GpuLedger", "PeakEntry", "RunningJobs", "LiveComponents", "Simulator"])


def test_a_declaration_line_the_reader_does_not_know_is_named_with_its_file_and_line(tmp_path):
    from jigsaw_env.declared import read_declarations

    pxd = tmp_path / "m.pxd"
    pxd.write_text("cimport cython\n\ncdef class A:\n    cdef dict __dict__\n    cdef public object a, b  # note\n"
                   "    @cython.locals(g=cython.Py_ssize_t)\n    cpdef f(self, x)\n\ncdef class B:\n    cdef public list c\n")
    d = read_declarations(pxd)
    assert (d["A"].attributes, d["A"].has_dict, d["A"].weakref) == (("a", "b"), True, False)
    assert (d["B"].attributes, d["B"].has_dict) == (("c",), False)
    pxd.write_text("cdef class A:\n    cdef public double[:] a\n")
    with pytest.raises(ValueError, match=r"m\.pxd:2: expected 'cdef \[public\]"):
        read_declarations(pxd)
