"""Checkpoints: the last two complete ones are kept, they load with ``torch.load(weights_only=True)``
(RNG states as tensors and plain data), and a truncated newest one falls back to the one before it
with one logged line. Known answers on tiny_mlp, 1 rank, local processes (no Ray)."""
from __future__ import annotations

import json
import logging

import pytest
import torch

from jigsaw_executor.launcher import run_job_local
from jigsaw_executor.spb_checkpoint import (CheckpointUnreadable, checkpoint_entries, read_checkpoint_meta,
                                        select_checkpoint)

KW = dict(batch_size=8, device="cpu", seed=3, timeout_s=30, job_timeout_s=120, return_state=True)
DECISIONS = [(0, "rotating")] * 12


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Iterations 0-3, checkpoint at 2 and 4 (checkpoint_every=2), and the uninterrupted run to 6."""
    ck = tmp_path_factory.mktemp("ckpt")
    run_job_local("tiny_mlp", 1, 4, DECISIONS, checkpoint_dir=ck, resume=True, checkpoint_every=2, **KW)
    straight = run_job_local("tiny_mlp", 1, 6, DECISIONS, **KW)
    return ck, straight


def _copy(src, dst):
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


@pytest.mark.slow
def test_the_last_two_checkpoints_are_kept_and_load_as_plain_data(saved):
    ck, _ = saved
    meta = read_checkpoint_meta(ck)
    assert [e["iteration"] for e in checkpoint_entries(meta)] == [4, 2]
    for e in checkpoint_entries(meta):
        state = torch.load(ck / e["state_file"], weights_only=True)
        assert state["iteration"] == e["iteration"]
        rng = torch.load(ck / e["rng_pattern"].format(rank=0), weights_only=True)
        assert isinstance(rng["torch"], torch.Tensor) and isinstance(rng["python"]["state"], list)
    assert len(list(ck.glob("state-*.pt"))) == 2


@pytest.mark.slow
def test_a_truncated_newest_checkpoint_falls_back_to_the_previous(saved, tmp_path, caplog):
    ck = _copy(saved[0], tmp_path / "ck")
    newest = ck / read_checkpoint_meta(ck)["state_file"]
    newest.write_bytes(newest.read_bytes()[:100])  # truncated
    with caplog.at_level(logging.WARNING, logger="jigsaw_executor.checkpoint"):
        res = run_job_local("tiny_mlp", 1, 4, DECISIONS, checkpoint_dir=ck, resume=True, save_checkpoint=False, **KW)
    lines = [r.getMessage() for r in caplog.records if r.name == "jigsaw_executor.checkpoint"]
    assert len(lines) == 1 and "unreadable" in lines[0] and "iteration 2" in lines[0], lines
    assert res.start_iteration == 2 and res.end_iteration == 6
    # from the previous checkpoint the run ends where the uninterrupted one does
    straight = saved[1]
    assert res.state_hashes == straight.state_hashes
    assert [r.loss for r in res.reports[0]] == [r.loss for r in straight.reports[0][2:]]


@pytest.mark.slow
def test_the_only_checkpoint_unreadable_starts_again_at_iteration_0(tmp_path):
    ck = tmp_path / "ck"
    run_job_local("tiny_mlp", 1, 2, DECISIONS, checkpoint_dir=ck, resume=True, **KW)
    (ck / read_checkpoint_meta(ck)["state_file"]).write_bytes(b"")
    lines = []
    assert select_checkpoint(ck, log=lines.append) == 0
    assert len(lines) == 1 and "iteration 0" in lines[0]
    assert read_checkpoint_meta(ck) is None and (ck / "meta.json.unreadable").is_file()


def test_all_checkpoints_corrupt_is_one_line(saved, tmp_path):
    ck = _copy(saved[0], tmp_path / "ck")
    for f in ck.glob("state-*.pt"):
        f.write_bytes(b"PK\x03\x04 not a checkpoint")
    with pytest.raises(CheckpointUnreadable) as e:
        select_checkpoint(ck)
    assert "\n" not in str(e.value) and "iteration 4" in str(e.value) and "iteration 2" in str(e.value)
    assert json.loads((ck / "meta.json").read_text())["iteration"] == 4  # left as found, for inspection


def test_a_checkpoint_holding_code_is_not_run(saved, tmp_path):
    """A state file whose pickle would call a function: weights_only refuses it, nothing runs."""
    ck = _copy(saved[0], tmp_path / "ck")
    marker = tmp_path / "marker"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    meta = read_checkpoint_meta(ck)
    torch.save({"format": 1, "iteration": meta["iteration"], "x": Evil()}, ck / meta["state_file"])
    lines = []
    assert select_checkpoint(ck, log=lines.append) == 2
    assert not marker.exists() and len(lines) == 1
