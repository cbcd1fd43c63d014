"""Checkpoint files of an SPB job (docs/executor.md, "Fault tolerance"): the format, ``meta.json``
(the newest checkpoint and the one before it), the choice of the newest one that loads
(:func:`select_checkpoint`), and the collective save and load of a trainer's model, optimizer and
RNG states (``SPBTrainer.save_checkpoint`` and ``load_checkpoint`` call
:func:`save_trainer_checkpoint` and :func:`load_trainer_checkpoint`). Files load with
``weights_only=True``: tensors and plain data, no code.
"""
from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

__all__ = ["CHECKPOINT_FORMAT", "CHECKPOINT_ENTRY_FIELDS", "CheckpointUnreadable", "read_checkpoint_meta",
           "checkpoint_entries", "check_checkpoint_entry", "select_checkpoint", "rng_state", "set_rng_state",
           "save_trainer_checkpoint", "load_trainer_checkpoint"]

CHECKPOINT_FORMAT = 1


def read_checkpoint_meta(path: str | Path) -> dict[str, Any] | None:
    """The checkpoint's ``meta.json`` (iteration, world size, state hash), or None if absent. Its
    top-level fields describe the newest checkpoint; ``"previous"`` the one before (or None)."""
    p = Path(path) / "meta.json"
    if not p.exists():
        return None
    return json.loads(p.read_text())


class CheckpointUnreadable(RuntimeError):
    """No checkpoint of a job's folder loads (every one kept is truncated or corrupt)."""


#: the fields of one checkpoint's entry in ``meta.json`` (the newest at the top level, the one
#: before it under ``"previous"``)
CHECKPOINT_ENTRY_FIELDS = ("format", "iteration", "world_size", "model_sha256", "level", "pattern", "state_file",
                           "rng_pattern", "saved", "extra")


def checkpoint_entries(meta: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The checkpoints ``meta.json`` names, newest first (at most two)."""
    if meta is None:
        return []
    newest = {k: meta[k] for k in CHECKPOINT_ENTRY_FIELDS if k in meta}
    prev = meta.get("previous")
    return [newest] + ([prev] if isinstance(prev, dict) else [])


def _meta_of(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """``meta.json``'s content for ``entries`` (newest first, at least one)."""
    return {**entries[0], "previous": entries[1] if len(entries) > 1 else None}


def _write_meta(path: Path, meta: dict[str, Any]) -> None:
    tmp = path / f"meta.json.tmp{os.getpid()}"
    tmp.write_text(json.dumps(meta, indent=1) + "\n")
    os.replace(tmp, path / "meta.json")


def check_checkpoint_entry(path: str | Path, entry: dict[str, Any]) -> None:
    """Load ``entry``'s state file (``weights_only``: tensors and plain data only, no code runs)
    and check its format and iteration; ValueError (one line) if it is missing, truncated or
    corrupt. The model hash is checked when a trainer loads it."""
    f = Path(path) / str(entry.get("state_file", "state.pt"))
    try:
        state = torch.load(f, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - truncated, corrupt, missing, or holding more than data
        first = (str(e).strip().splitlines() or [""])[0][:160]
        raise ValueError(f"{f.name} does not load ({type(e).__name__}: {first})") from None
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{f.name}: unknown checkpoint format")
    if int(state.get("iteration", -1)) != int(entry.get("iteration", -2)):
        raise ValueError(f"{f.name}: iteration {state.get('iteration')} differs from meta.json's {entry.get('iteration')}")


def select_checkpoint(path: str | Path, log: Callable[[str], None] | None = None) -> int:
    """The iteration of the newest checkpoint in ``path`` that loads (0: none was saved). One that
    does not load (a truncated newest) is dropped from ``meta.json``, so that every reader (the
    executor's rollback, the workers' load) takes the one before it, and ``log`` gets one line.
    When the only checkpoint kept does not load and none came before it, the job starts again at
    iteration 0 (its initial weights come from its seed): ``meta.json`` is set aside as
    ``meta.json.unreadable``. When two were kept and neither loads, raises
    :class:`CheckpointUnreadable` (one line): the job cannot go on."""
    path = Path(path)
    try:
        meta = read_checkpoint_meta(path)
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointUnreadable(f"{path}/meta.json: not valid JSON ({e}); no checkpoint to load") from None
    entries = checkpoint_entries(meta)
    bad = []
    for i, entry in enumerate(entries):
        try:
            check_checkpoint_entry(path, entry)
        except ValueError as e:
            bad.append(f"iteration {entry.get('iteration')}: {e}")
            continue
        if i > 0:
            _write_meta(path, _meta_of(entries[i:]))
            if log is not None:
                log(f"checkpoint {path}: the newest ({bad[0]}) is unreadable; loading the one at "
                    f"iteration {entry['iteration']}")
        return int(entry["iteration"])
    if len(entries) == 1:
        os.replace(path / "meta.json", path / "meta.json.unreadable")
        if log is not None:
            log(f"checkpoint {path}: the only one ({bad[0]}) is unreadable; starting again at iteration 0")
        return 0
    if not entries:
        return 0
    raise CheckpointUnreadable(f"no checkpoint in {path} loads ({'; '.join(bad)})")


def _atomic_torch_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def rng_state(device: torch.device) -> dict[str, Any]:
    """The RNG states as tensors and plain data (a ``weights_only`` load reads them back)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    st = {"torch": torch.get_rng_state(),
          "numpy": {"kind": str(kind), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
                    "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
          "python": {"version": int(version), "state": [int(x) for x in internal], "gauss_next": gauss_next}}
    if device.type == "cuda":
        st["cuda"] = torch.cuda.get_rng_state(device)
    return st


def set_rng_state(st: dict[str, Any], device: torch.device) -> None:
    """Put back the RNG states :func:`rng_state` read."""
    torch.set_rng_state(st["torch"])
    n = st["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    p = st["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss_next"]))
    if "cuda" in st and device.type == "cuda":
        torch.cuda.set_rng_state(st["cuda"], device)


def save_trainer_checkpoint(trainer, path: str | Path, iteration: int, extra: dict[str, Any] | None = None) -> None:
    """``SPBTrainer.save_checkpoint`` (its docstring): collective over the trainer's job."""
    path = Path(path)
    it = int(iteration)
    state_name, rng_pattern = f"state-{it:09d}.pt", "rng-rank{rank}-" + f"{it:09d}.pt"
    path.mkdir(parents=True, exist_ok=True)
    trainer.barrier()
    if trainer.rank == 0:
        _atomic_torch_save({"format": CHECKPOINT_FORMAT, "model": trainer.model.state_dict(),
                            "optimizer": trainer.optimizer.state_dict(), "iteration": it,
                            "world_size": trainer.world, "extra": extra or {}}, path / state_name)
    _atomic_torch_save(rng_state(trainer.device), path / rng_pattern.format(rank=trainer.rank))
    trainer.barrier()
    if trainer.rank == 0:
        entry = {"format": CHECKPOINT_FORMAT, "iteration": it, "world_size": trainer.world,
                 "model_sha256": trainer.state_hash(), "level": trainer.level, "pattern": trainer.pattern.value,
                 "state_file": state_name, "rng_pattern": rng_pattern, "saved": time.time(),
                 "extra": extra or {}}
        try:
            older = [e for e in checkpoint_entries(read_checkpoint_meta(path)) if int(e["iteration"]) != it]
        except (ValueError, KeyError, TypeError):  # an unreadable meta.json names nothing to keep
            older = []
        entries = [entry] + older[:1]
        _write_meta(path, _meta_of(entries))
        keep = {"meta.json"}
        for e in entries:
            keep |= {e["state_file"]} | {e["rng_pattern"].format(rank=r) for r in range(int(e["world_size"]))}
        for f in path.iterdir():  # older checkpoints, and temporaries of killed writers
            if f.name not in keep and (f.name.startswith(("state", "rng-rank")) or ".tmp" in f.name):
                try:
                    f.unlink()
                except OSError:
                    pass
    trainer.barrier()


def load_trainer_checkpoint(trainer, path: str | Path) -> int:
    """``SPBTrainer.load_checkpoint`` (its docstring): collective over the trainer's job."""
    path = Path(path)
    meta = read_checkpoint_meta(path)
    if meta is None:
        raise FileNotFoundError(f"no complete checkpoint in {path} (meta.json missing)")
    state = torch.load(path / meta.get("state_file", "state.pt"), map_location=trainer.device, weights_only=True)
    if state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path}: unknown checkpoint format {state.get('format')!r}")
    trainer.model.load_state_dict(state["model"])
    trainer.optimizer.load_state_dict(state["optimizer"])
    got = trainer.state_hash()
    if got != meta["model_sha256"]:
        raise ValueError(f"{path}: model hash {got[:12]} after loading differs from meta.json's "
                         f"{meta['model_sha256'][:12]}")
    rng = path / meta.get("rng_pattern", "rng-rank{rank}.pt").format(rank=trainer.rank)
    if int(meta["world_size"]) == trainer.world and rng.exists():
        try:
            saved_rng = torch.load(rng, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - e.g. a numpy RNG state pickled by an earlier version
            raise ValueError(f"{rng}: not an RNG state of tensors and plain data ({type(e).__name__}); "
                             f"a checkpoint written by an earlier version of jigsaw does not load") from None
        set_rng_state(saved_rng, trainer.device)
    trainer.barrier()
    return int(state["iteration"])
