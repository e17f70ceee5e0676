"""Fixtures of the regen tests: a tiny target model directory."""

from __future__ import annotations

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


def regen_config(root: Path, model_dir: Path, servers: list[str], *, context_length: int = 256, **regen: object):
    """A pipeline config for these tests: the tiny target (or another of its size), small generations, fast
    backoff."""
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
    """Prompts rows of the thinking world's kinds, as normalize writes them: two-city weather conversations (two
    user turns, a tool call and its result each), a coding agent (three calls in a row), a plain thinking answer."""
    import json

    from eagle3.worlds.agentic import AgenticFactory

    factory = AgenticFactory(seed)
    convs = []
    while len(convs) < n_weather:
        conv = factory.make("weather")
        if sum(m["role"] == "user" for m in conv.messages) == 2:
            convs.append(conv)
    convs += [factory.make("coding"), factory.make("math")]
    return [{"sample_id": f"{c.kind}-{i}", "messages": c.messages, "tools": json.dumps(c.tools) if c.tools else None}
            for i, c in enumerate(convs)]  # fmt: skip


@pytest.fixture(scope="session")
def regen_helpers(write_prompts_stage):
    """The helpers above and the suite's prompts-stage writer, as a fixture (test files cannot import a conftest
    module by name)."""
    from types import SimpleNamespace

    return SimpleNamespace(write_prompts=write_prompts_stage, chat=chat, config=regen_config, agentic_rows=agentic_rows)
