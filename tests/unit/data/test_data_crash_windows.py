"""The prompts stage's rename-then-delete window: a kill after the manifest is written but before
the spill directory is removed leaves a finished stage whose rerun cleans the spill and changes
nothing else."""

from __future__ import annotations

import json

import pytest
from data_stage_helpers import normalize

from eagle3.rundir.runroot import Manifest

GOOD = {
    "conversations": [{"from": "human", "value": "Name a cat."}, {"from": "gpt", "value": "Tom."}]
}


class _Killed(BaseException):
    """Stands for a kill -9 at one line: nothing after it runs, nothing catches it."""


def test_kill_between_prompts_manifest_and_spill_delete_recovers_on_rerun(
    config_factory, tmp_path, monkeypatch
):
    from eagle3.data import prompt_shards

    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(GOOD) + "\n")
    config = config_factory(
        ["gate.prompt_sets={}", f"sources=[{{adapter: jsonl, path: '{path}'}}]"]
    )

    def killed(target, *args, **kwargs):
        raise _Killed

    monkeypatch.setattr(prompt_shards.shutil, "rmtree", killed)
    with pytest.raises(_Killed):
        normalize(config)
    out = next((tmp_path / "run" / "prompts").iterdir())
    before = Manifest.read(out)
    # the window: finished, with its spill left behind
    assert before is not None and (out / "spill").exists()
    monkeypatch.undo()
    assert normalize(config) == out
    assert not (out / "spill").exists() and not Manifest.read(out).verify(out)
    assert Manifest.read(out).created_at == before.created_at  # a manifest hit: nothing was redone
