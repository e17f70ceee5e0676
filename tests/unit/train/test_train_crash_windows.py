"""The rename-then-delete windows of training outputs: a kill at each leaves a state the rerun
recovers from.

Checkpoint: ``rmtree(step) -> replace(tmp, step) -> write latest -> prune``; export:
``rmtree(export) -> replace(tmp, export)``. Each test stops the sequence at one point (as a kill -9
would) and reruns."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from train_synthetic import synthetic

from eagle3.train import checkpoint, export
from eagle3.train.checkpoint import latest_checkpoint
from eagle3.train.distributed import DistInfo
from eagle3.train.trainer import train_on_source
from eagle3.worlds.distil import ListBatchSource

CPU = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


class _Killed(BaseException):
    """Stands for a kill -9 at one line: nothing after it runs, nothing catches it."""


def _kill_on_call(n: int, real):
    calls = [0]

    def wrapper(*args, **kwargs):
        calls[0] += 1
        if calls[0] == n:
            raise _Killed
        return real(*args, **kwargs)

    return wrapper


def test_kill_between_checkpoint_rename_and_latest_pointer_resumes_from_the_previous_one(
    tmp_path, monkeypatch
):
    config, inputs, batches = synthetic(**{"train.max_steps": 4, "train.save_every": 2})
    out = tmp_path / "draft"
    monkeypatch.setattr(
        checkpoint, "atomic_write_text", _kill_on_call(2, checkpoint.atomic_write_text)
    )
    # step-000004 is renamed into place, ``latest`` still names step-000002
    with pytest.raises(_Killed):
        train_on_source(config, ListBatchSource(batches), inputs, out, CPU)
    assert (out / "ckpt" / "step-000004").exists() and latest_checkpoint(
        out / "ckpt"
    ).name == "step-000002"
    monkeypatch.undo()
    summary = train_on_source(config, ListBatchSource(batches), inputs, out, CPU)
    assert summary["steps"] == 4 and latest_checkpoint(out / "ckpt").name == "step-000004"
    assert json.loads((out / "ckpt" / "step-000004" / "trainer.json").read_text())["step"] == 4


def test_kill_between_export_delete_and_rename_is_redone_by_the_next_export(tmp_path, monkeypatch):
    config, inputs, batches = synthetic(**{"train.max_steps": 1})
    train_on_source(config, ListBatchSource(batches), inputs, tmp_path / "draft", CPU)
    vocab = tmp_path / "vocab.safetensors"
    t2d = torch.zeros(inputs.head.embed.shape[0], dtype=torch.bool)
    t2d[inputs.draft_ids] = True
    save_file({"d2t": inputs.d2t, "t2d": t2d}, str(vocab))
    target = tmp_path / "export"
    export.export_draft(config, tmp_path / "draft", vocab, None, target)
    monkeypatch.setattr(export.os, "replace", _kill_on_call(1, export.os.replace))
    with pytest.raises(_Killed):  # the old export is deleted, the new one not yet renamed
        export.export_draft(config, tmp_path / "draft", vocab, None, target)
    assert not target.exists()
    monkeypatch.undo()
    assert export.export_draft(config, tmp_path / "draft", vocab, None, target) == target
    assert (target / "model.safetensors").exists() and not target.with_name("export.tmp").exists()
