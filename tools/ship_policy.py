"""Pack a training run as a policy shipped in the package (``agents/policies/<name>/``).

    python -m tools.ship_policy RUN_DIR [--name learned] [--model best|last] [--max-mb 5]

Copies the kept model (``best``: ``best/best_model.zip``, the model with the best return on the
run's validation split, with the observation statistics saved beside it; ``last``: ``model.zip``)
as ``model.zip`` (its weights as trained; the optimizer's running moments left out, a cold Adam
state in their place: they are two thirds of the file and no evaluation, export or deployment
reads them) and ``vecnormalize.npz``, writes ``config.json`` (the run's, plus ``shipped``:
the name, the run folder, the model kept, the trace file's SHA-256 and the held-out split it leaves
alone), exports ``policy.onnx`` from it (``jigsaw export``'s graph, checked against the model), and
refuses a folder over ``--max-mb``. ``jigsaw evaluate --agents <name>``, ``jigsaw deploy --policy
<name>`` and ``jigsaw export <name>`` then use it (:mod:`agents.shipped`).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from agents.shipped import POLICIES_DIR, SHIPPED_NAMES

ROOT = Path(__file__).resolve().parents[1]


def _statistics(run_dir: Path, model: str) -> Path:
    from agents.vecnorm_file import stats_path

    found = stats_path(run_dir / "best") if model == "best" else stats_path(run_dir)
    if found is None:
        raise FileNotFoundError(f"{run_dir}: no observation statistics beside the {model} model")
    return found


def _portable(run_dir: Path) -> str:
    """``run_dir`` as the shipped config records it: relative to the project when inside it (no
    path of the packing machine), else as given."""
    try:
        return run_dir.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return str(run_dir)


def _copy_without_optimizer_moments(src: Path, dest: Path, algo: str) -> None:
    """Save the model of ``src`` at ``dest`` with its optimizer's per-parameter state cleared
    (``torch.optim.Optimizer.state``; the parameter groups, learning rate included, are kept)."""
    from agents.rl import algo_class

    model = algo_class(algo).load(str(src), device="cpu")
    model.policy.optimizer.state.clear()
    model.save(str(dest))


def ship(run_dir: Path, name: str, model: str = "best", max_mb: float = 5.0) -> Path:
    """Write ``agents/policies/<name>/`` from ``run_dir`` (module docstring); returns the folder."""
    from agents.rl import read_run_config
    from jigsaw_env.digest import file_sha256
    from jigsaw_executor.export import export_policy
    from traces.api import parse_spec

    if name not in SHIPPED_NAMES:
        raise ValueError(f"--name must be one of {list(SHIPPED_NAMES)} (agents.shipped.SHIPPED_NAMES), got {name!r}")
    cfg = read_run_config(run_dir)
    src = run_dir / ("best/best_model.zip" if model == "best" else "model.zip")
    if not src.is_file():
        raise FileNotFoundError(f"{run_dir}: no {src.relative_to(run_dir)} (model {model!r})")
    trace = cfg["env"]["trace"]
    trace_file = Path(parse_spec(trace)[1])
    cfg["shipped"] = {"name": name, "from_run": _portable(run_dir), "model": model,
                      "trace": trace, "trace_sha256": file_sha256(trace_file),
                      "heldout_split": cfg["sampling"]["eval_split"], "val_split": cfg["sampling"]["val_split"]}
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=POLICIES_DIR))
    try:
        _copy_without_optimizer_moments(src, tmp / "model.zip", str(cfg["algo"]))
        shutil.copy(_statistics(run_dir, model), tmp / "vecnormalize.npz")
        (tmp / "config.json").write_text(json.dumps(cfg, indent=1, default=str) + "\n")
        export_policy(tmp, tmp / "policy.onnx", check=256, run_label=_portable(POLICIES_DIR / name))
        size_mb = sum(f.stat().st_size for f in tmp.iterdir()) / 1e6
        if size_mb > max_mb:
            raise ValueError(f"the shipped policy would be {size_mb:.2f} MB, over --max-mb {max_mb:g}")
        dest = POLICIES_DIR / name
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
        dest.chmod(0o755)  # mkdtemp made it private
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--name", default="learned")
    p.add_argument("--model", choices=("best", "last"), default="best")
    p.add_argument("--max-mb", type=float, default=5.0)
    a = p.parse_args(argv)
    dest = ship(a.run_dir, a.name, a.model, a.max_mb)
    files = {f.name: f.stat().st_size for f in sorted(dest.iterdir())}
    print(json.dumps({"shipped": str(dest), "files": files, "total_mb": round(sum(files.values()) / 1e6, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
