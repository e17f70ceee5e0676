"""Fixtures of the reference-server tests: a tiny target model directory (the tiny world's when available)."""

from __future__ import annotations

from pathlib import Path

import pytest


def _fallback_model_dir(out: Path) -> Path:
    """An untrained tiny Llama + ChatML BPE tokenizer, for sessions where ``eagle3.dev.world`` is missing."""
    from eagle3.dev.tiny_target import build_model, build_tokenizer

    corpus = [f"user asks question {i} about topic {i % 7} and the assistant answers at length." for i in range(400)]
    tokenizer = build_tokenizer(corpus, vocab_size=512)
    model = build_model(tokenizer, num_layers=4, max_position_embeddings=512)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def serve_model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        import eagle3.dev.world  # noqa: F401
    except ImportError:
        return _fallback_model_dir(tmp_path_factory.mktemp("tiny-target"))
    return Path(request.getfixturevalue("tiny_world").model_dir)
