"""The core install: the simulator, the environment, the traces, the heuristics and evaluate work
without torch, Ray, ONNX or stable-baselines3 (pyproject's extras add them), and a command that
needs one of them says which extra to install in one line.

Each check runs in a fresh interpreter whose import system refuses those packages, so a module
that imports one of them at import time, or on the core's code paths, fails the test."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OPTIONAL = ("torch", "ray", "onnx", "onnxruntime", "stable_baselines3", "sb3_contrib", "tensorboard", "sklearn")

BLOCK = textwrap.dedent(f"""
    import importlib.abc, sys
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in {OPTIONAL!r}:
                raise ModuleNotFoundError(f"No module named {{name!r}} (blocked)", name=name)
            return None
    sys.meta_path.insert(0, Block())
""")


def run_blocked(body: str) -> subprocess.CompletedProcess:
    code = BLOCK + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})


def test_core_dependencies_hold_no_optional_package():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {d.split(">")[0].split("=")[0].split("[")[0].strip().lower() for d in project["dependencies"]}
    assert core.isdisjoint({"torch", "ray", "onnx", "onnxruntime", "stable-baselines3", "sb3-contrib", "tensorboard",
                            "scikit-learn"}), core
    extras = project["optional-dependencies"]
    assert any(d.startswith("torch") for d in extras["calibrate"])
    assert any(d.startswith("torch") for d in extras["rl"]) and any(d.startswith("torch") for d in extras["executor"])


def test_importing_the_core_loads_no_optional_package():
    r = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import json, sys
        import jigsaw_env.env, jigsaw_env.simulator, jigsaw_env.evaluate, agents, traces
        from agents import make_scheduler
        make_scheduler("jigsaw")
        print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
    """)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    loaded = set(json.loads(r.stdout.splitlines()[-1]))
    assert loaded.isdisjoint(OPTIONAL), loaded & set(OPTIONAL)


def test_the_core_runs_without_the_optional_packages():
    r = run_blocked("""
        import gymnasium as gym
        from gymnasium.utils.env_checker import check_env
        from agents import make_scheduler
        from jigsaw_env.cli import main
        from jigsaw_env.cluster import ClusterSpec
        from jigsaw_env.env import JigsawClusterEnv
        from jigsaw_env.simulator import SimConfig, Simulator
        from traces import load_trace

        jobs = load_trace("synthetic:jobs=20,load=1.5,seed=1", cluster_gpus=8).jobs
        for agent in ("fifo", "srtf", "tiresias", "gandiva", "gandiva+spb", "jigsaw"):
            m = Simulator(ClusterSpec.from_gpus(8), jobs, SimConfig()).run(make_scheduler(agent))
            assert m["jobs_completed"] == 20, (agent, m["jobs_completed"])
        env = JigsawClusterEnv(gpus=8, max_jobs=10)
        check_env(env, skip_render_check=True)
        rc = main(["simulate", "--trace", "synthetic", "--gpus", "8", "--max-jobs", "20", "--agent", "jigsaw",
                   "--json"])
        assert rc == 0
        print("CORE OK")
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "CORE OK" in r.stdout


def test_a_command_that_needs_an_extra_names_it():
    for argv, extra in ((["train", "--timesteps", "10"], "rl"),
                        (["deploy", "--demo", "--slots", "1", "--policy", "fifo", "--no-replay"], "executor")):
        r = run_blocked(f"""
            import sys
            from jigsaw_env.cli import main
            sys.exit(main({argv!r}))
        """)
        assert r.returncode == 2, (argv, r.stderr[-2000:])
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert lines[0].startswith(f"jigsaw {argv[0]}: error: needs the Python package ")
        assert f"pip install 'jigsaw[{extra}]'" in lines[0]


def test_import_layers_hold():
    # .importlinter's contracts: the core and the heuristics import nothing of the app layer,
    # the executor, training, torch, Ray or ONNX (directly or through another module)
    import shutil

    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    r = subprocess.run([exe, "--config", str(ROOT / ".importlinter"), "--no-cache"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "Contracts: 3 kept, 0 broken." in r.stdout, r.stdout[-3000:]
