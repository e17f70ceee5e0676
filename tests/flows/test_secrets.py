"""Secrets: read from the environment or a Prefect Secret block, and never written anywhere a run
leaves records (run root, Prefect home and database, persisted results, captured output)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest

from eagle3.data.parquet import ShardWriter
from eagle3.data.schema import PROMPT_SCHEMA
from eagle3.recipes import ConfigRef
from eagle3.rundir.runroot import FileEntry, Manifest, fingerprint
from eagle3.serve.launch import reference_server

HF_SECRET = "hf_LeakCanary0123456789abcdefXYZ"
KEY_SECRET = "sk-regen-LeakCanary9876543210"


def _prompts(root: Path, rows: int = 6) -> Path:
    out = root / "prompts" / fingerprint("secret-prompts", rows)
    data = [
        {
            "sample_id": f"s-{i}",
            "source": "t",
            "source_row": str(i),
            "n_user_turns": 1,
            "meta": "{}",
            "messages": [{"role": "user", "content": f"question {i}"}],
            "input_ids": None,
            "loss_mask": None,
        }
        for i in range(rows)
    ]
    with ShardWriter(out, PROMPT_SCHEMA, start_index=0) as writer:
        writer.write_rows(data)
    [info] = writer.close()
    Manifest(
        stage="prompts", fingerprint=out.name, files=[FileEntry.of(info.path, rows=rows, base=out)]
    ).write(out)
    return out


def _files_containing(directory: Path, needles: list[bytes]) -> list[str]:
    found = []
    for path in directory.rglob("*"):
        if path.is_file() and not path.is_symlink():
            blob = path.read_bytes()
            found += [f"{path}: {needle.decode()}" for needle in needles if needle in blob]
    return found


@pytest.mark.slow
def test_regen_run_with_tokens_set_leaves_them_nowhere(
    tiny_world: Any,
    prefect_harness: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
):
    from prefect.settings import get_current_settings

    from flows.regen import regen_flow

    caplog.set_level(logging.INFO)
    monkeypatch.setenv("HF_TOKEN", HF_SECRET)
    monkeypatch.setenv("EAGLE3_REGEN_KEY", KEY_SECRET)
    root = tmp_path / "root"
    prompts = _prompts(root)
    with reference_server(None, extra_args=["--synthetic-tokens", "3"]) as server:
        overrides = [
            f"root={root}",
            f"regen.servers=[{server.url}]",
            "regen.api_key_env=EAGLE3_REGEN_KEY",
            "regen.max_new_tokens=3",
        ]
        state = regen_flow(
            ConfigRef(recipe="tiny", overrides=overrides),
            prompts_dir=str(prompts),
            return_state=True,
        )
    assert state.is_completed(), state.message
    assert state.result().summary["ok"] + state.result().summary["truncated"] == 6
    settings = get_current_settings()
    database = Path(settings.server.database.connection_url.get_secret_value().split("///", 1)[1])
    places = [root, database.parent, Path(settings.home), Path(settings.results.local_storage_path)]
    needles = [HF_SECRET.encode(), KEY_SECRET.encode()]
    leaks = [
        leak for place in places if place.exists() for leak in _files_containing(place, needles)
    ]
    assert not leaks, leaks
    out, err = capfd.readouterr()
    # the run's logs, wherever the session's Prefect handlers send them
    output = out + err + caplog.text
    assert not [s for s in (HF_SECRET, KEY_SECRET) if s in output], (
        "a secret reached stdout/stderr or the logs"
    )
    assert "EAGLE3_REGEN_KEY from environment" in output, (
        "the run should say where its secrets came from"
    )


def test_secret_missing_from_the_environment_comes_from_its_prefect_secret_block(
    tiny_world: Any, prefect_harness: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from prefect import flow
    from prefect.blocks.system import Secret

    from eagle3.runtime.secrets import block_name
    from tasks.common import resolve_config_task

    monkeypatch.delenv("EAGLE3_BLOCK_KEY", raising=False)
    Secret(value="from-the-block").save(block_name("EAGLE3_BLOCK_KEY"), overwrite=True)
    assert block_name("EAGLE3_BLOCK_KEY") == "eagle3-eagle3-block-key"

    @flow
    def resolve_and_read() -> str | None:
        overrides = [f"root={tmp_path}", "regen.api_key_env=EAGLE3_BLOCK_KEY"]
        resolve_config_task(ConfigRef(recipe="tiny", overrides=overrides))
        return os.environ.get("EAGLE3_BLOCK_KEY")

    assert resolve_and_read() == "from-the-block"
    # the environment wins over the block
    monkeypatch.setenv("EAGLE3_BLOCK_KEY", "from-the-environment")
    assert resolve_and_read() == "from-the-environment"
