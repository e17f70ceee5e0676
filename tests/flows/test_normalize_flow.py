"""The discover + normalize flows produce the prompts stage; a second run is a manifest hit."""

from __future__ import annotations

from pathlib import Path

from eagle3.config.data import SourceConfig
from eagle3.config.pipeline import PipelineConfig
from eagle3.config.target import TargetConfig
from eagle3.rundir.runroot import Manifest


def _config(root: Path) -> dict:
    from eagle3.worlds.conversations import generate_conversations
    from eagle3.worlds.samples import FILE_NAMES, write_samples
    from eagle3.worlds.tiny_target import build_tokenizer

    write_samples(root / "data", rows_per_source=40)
    corpus = [m["content"] for conv in generate_conversations(100, seed=1) for m in conv]
    build_tokenizer(corpus, vocab_size=1024).save_pretrained(root / "model")
    sources = [
        SourceConfig(adapter=name, path=str(root / "data" / FILE_NAMES[name]))
        for name in ("ultrachat", "magpie")
    ]
    config = PipelineConfig(
        name="normalize-flow",
        root=str(root / "run"),
        target=TargetConfig(
            model_path=str(root / "model"), num_layers=8, hidden_size=64, vocab_size=1024
        ),
        sources=sources,
    )
    return config


def test_prompts_flow_writes_shards_and_a_rerun_is_a_manifest_hit(tmp_path, prefect_harness):
    from flows.normalize import prompts_flow

    config = _config(tmp_path)
    out = Path(prompts_flow(config))
    manifest = Manifest.read(out)
    assert manifest is not None and manifest.verify(out) == []
    stats = manifest.stats["sources"]
    assert set(stats) == {"ultrachat", "magpie"}
    assert all(s["in"] == 40 == s["kept"] + sum(s["quarantined"].values()) for s in stats.values())
    before = (out / "manifest.json").read_text()
    assert Path(prompts_flow(config)) == out
    assert (out / "manifest.json").read_text() == before
