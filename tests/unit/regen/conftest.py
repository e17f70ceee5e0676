"""Fixtures of the regen tests: a tiny target model directory, prompts rows, configs, a
kill-and-resume run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def regen_model_dir(tiny_world) -> Path:
    """The tiny world's target model directory."""
    return Path(tiny_world.model_dir)


def chat(sample_id: str, *turns: str, system: str | None = None) -> dict:
    """A prompts row: user turns with (to-be-discarded) assistant replies between them."""
    messages = [{"role": "system", "content": system}] if system else []
    for i, text in enumerate(turns):
        messages.append({"role": "user", "content": text})
        messages.append({"role": "assistant", "content": f"ORIGINAL ANSWER {i}"})
    return {"sample_id": sample_id, "messages": messages}


def regen_config(
    root: Path, model_dir: Path, servers: list[str], *, context_length: int = 256, **regen: object
):
    """A pipeline config for these tests: the tiny target (or another of its size), small
    generations, fast backoff."""
    from eagle3.config.pipeline import PipelineConfig
    from eagle3.config.regen import RegenConfig
    from eagle3.config.target import TargetConfig

    defaults = {
        "max_new_tokens": 6,
        "temperature": 0.0,
        "concurrency_per_server": 4,
        "max_retries": 3,
        "backoff_base_s": 0.02,
        "backoff_max_s": 0.2,
        "readmit_after_s": 0.5,
        "journal_fsync_every": 4,
    }
    return PipelineConfig(
        name="regen-test",
        root=str(root),
        target=TargetConfig(
            model_path=str(model_dir),
            num_layers=8,
            hidden_size=128,
            vocab_size=2048,
            context_length=context_length,
            dtype="float32",
        ),
        regen=RegenConfig(servers=servers, **(defaults | regen)),
    )


def agentic_rows(n_weather: int = 3, *, seed: int = 4242) -> list[dict]:
    """Prompts rows of the thinking world's kinds, as normalize writes them: two-city weather
    conversations (two user turns, a tool call and its result each), a coding agent (three calls in
    a row), a plain thinking answer."""
    import json

    from eagle3.worlds.agentic import AgenticFactory

    factory = AgenticFactory(seed)
    convs = []
    while len(convs) < n_weather:
        conv = factory.make("weather")
        if sum(m["role"] == "user" for m in conv.messages) == 2:
            convs.append(conv)
    convs += [factory.make("coding"), factory.make("math")]
    return [
        {
            "sample_id": f"{c.kind}-{i}",
            "messages": c.messages,
            "tools": json.dumps(c.tools) if c.tools else None,
        }
        for i, c in enumerate(convs)
    ]


@dataclass
class KilledRun:
    out: Path  # the regen stage directory
    journal: Path  # shard 0's journal, gone once the resumed run finished the shard
    at_kill: object  # scan_journal(journal) right after the kill


def kill_and_resume(
    tmp_path: Path, config, prompts: Path, ready: Callable[[Path], bool], waiting: str
) -> KilledRun:
    """``python -m eagle3.regen`` on one shard, kill -9 once ``ready(journal)`` holds, then the same
    command again to the end (exit 0). ``waiting`` says what never happened when the first client
    makes no progress."""
    from eagle3.regen.journal import scan_journal
    from eagle3.regen.plan import regen_fingerprint
    from eagle3.rundir.layout import stage_dir
    from eagle3.rundir.runroot import Manifest

    config_path = tmp_path / "config.yaml"
    config_path.write_text(config.to_yaml())
    out = stage_dir(
        tmp_path, "regen", regen_fingerprint(Manifest.read(prompts).fingerprint, config)
    )
    journal = out / "shard-00000.journal.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "eagle3.regen",
        "--config",
        str(config_path),
        "--prompts",
        str(prompts),
    ]
    with open(tmp_path / "client1.log", "wb") as log:
        first = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    while not ready(journal):
        assert first.poll() is None, (tmp_path / "client1.log").read_text()[-3000:]
        assert time.monotonic() < deadline, waiting
        time.sleep(0.05)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    at_kill = scan_journal(journal)
    second = subprocess.run(cmd, capture_output=True, timeout=600)
    assert second.returncode == 0, second.stderr.decode()[-3000:]
    return KilledRun(out, journal, at_kill)


@pytest.fixture(scope="session")
def regen_helpers(write_prompts_stage):
    """The helpers above and the suite's prompts-stage writer, as a fixture (test files cannot
    import a conftest module by name)."""
    from types import SimpleNamespace

    return SimpleNamespace(
        write_prompts=write_prompts_stage,
        chat=chat,
        config=regen_config,
        agentic_rows=agentic_rows,
        kill_and_resume=kill_and_resume,
    )
