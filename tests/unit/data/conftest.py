"""Fixtures of the data-stage tests: sample files in every format (``eagle3.worlds.samples``), a
tiny target tokenizer and a pretokenized file, plus a config builder pointing the tiny recipe's
sources at them."""

from __future__ import annotations

from pathlib import Path

import pytest
from data_stage_helpers import VOCAB, make_config, normalize, write_pretokenized

from eagle3.config.pipeline import PipelineConfig
from eagle3.worlds.conversations import generate_conversations
from eagle3.worlds.samples import write_samples


@pytest.fixture(scope="session")
def data_world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Sample files, bench sets and ``bad_rows.json`` (200 rows per source) + a tiny tokenizer
    directory."""
    from eagle3.worlds.tiny_target import build_tokenizer

    root = tmp_path_factory.mktemp("data-world")
    paths = write_samples(root / "data", seed=0, rows_per_source=200)
    corpus = [m["content"] for conv in generate_conversations(300, seed=1) for m in conv]
    tok = build_tokenizer(corpus, vocab_size=VOCAB)
    tok.save_pretrained(root / "model")
    write_pretokenized(root / "data" / "pretokenized.parquet", tok)
    return {**paths, "root": root, "data": root / "data", "model": root / "model"}


@pytest.fixture
def config_factory(data_world: dict[str, Path], tmp_path: Path):
    def build(overrides: list[str] | None = None, root: Path | None = None) -> PipelineConfig:
        return make_config(data_world, root or tmp_path / "run", overrides)

    return build


@pytest.fixture(scope="session")
def normalized_run(data_world: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    """The prompts stage run once over every sample format: (config, prompts stage dir)."""
    config = make_config(data_world, tmp_path_factory.mktemp("normalized-run"))
    return config, normalize(config)


@pytest.fixture(scope="session")
def think_tokenizer():
    """The thinking world's tokenizer and chat template (``eagle3.worlds.think_target``), trained on
    a few hundred of its conversations: no model, so it builds in a second."""
    from eagle3.worlds.agentic import AgenticFactory
    from eagle3.worlds.think_target import build_think_tokenizer
    from eagle3.worlds.think_world import tokenizer_corpus

    factory = AgenticFactory(1)
    return build_think_tokenizer(tokenizer_corpus([factory.make() for _ in range(300)]))
