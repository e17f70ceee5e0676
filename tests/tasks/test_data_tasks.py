"""Data tasks called as plain functions (``task.fn``): discover, plan, per-source normalize, shards, cache key."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from eagle3.config import PipelineConfig, SourceConfig, TargetConfig
from eagle3.runroot import Manifest


@pytest.fixture(scope="module")
def data_config(tmp_path_factory) -> dict:
    """Two sample sources (ShareGPT JSON, local Q/A JSONL) and a tiny tokenizer, no tiny world needed."""
    from eagle3.dev.samples import FILE_NAMES, generate_conversations, write_samples
    from eagle3.dev.tiny_target import build_tokenizer

    root = tmp_path_factory.mktemp("data-tasks")
    write_samples(root / "data", rows_per_source=40)
    corpus = [m["content"] for conv in generate_conversations(100, seed=1) for m in conv]
    build_tokenizer(corpus, vocab_size=1024).save_pretrained(root / "model")
    config = PipelineConfig(
        name="data-tasks",
        root=str(root / "run"),
        target=TargetConfig(model_path=str(root / "model"), num_layers=8, hidden_size=64, vocab_size=1024),
        sources=[
            SourceConfig(adapter="sharegpt", path=str(root / "data" / FILE_NAMES["sharegpt"])),
            SourceConfig(
                adapter="jsonl",
                name="local_qa",
                path=str(root / "data" / FILE_NAMES["local_jsonl"]),
                columns={"user": "question", "assistant": "answer", "id": "uid"},
            ),
        ],
    )
    return config


@pytest.fixture
def no_artifacts(monkeypatch):
    """Record artifacts instead of sending them to a Prefect API (task.fn runs outside a flow)."""
    import tasks.data as mod

    calls: dict[str, list] = {"tables": [], "markdown": []}
    monkeypatch.setattr(mod, "publish_table", lambda key, rows, **kw: calls["tables"].append((key, rows)))
    monkeypatch.setattr(mod, "publish_markdown", lambda key, md, **kw: calls["markdown"].append((key, md)))

    class _Progress:
        def __init__(self, *a, **kw) -> None:
            self.done = 0

        def update(self, done, **kw) -> None:
            self.done = done

    monkeypatch.setattr(mod, "Progress", _Progress)
    monkeypatch.setattr(mod, "get_run_logger", lambda: SimpleNamespace(info=lambda *a, **k: None))
    return calls


def test_tasks_run_the_stage_and_publish_per_source_counts(data_config, no_artifacts):
    from tasks.data import build_prompt_shards_task, discover_task, normalize_source_task, prompts_plan_task

    catalog_dir = discover_task.fn(data_config)
    assert json.loads((Path(catalog_dir) / "catalog.json").read_text())["datasets"][0]["rows"] == 40
    plan = prompts_plan_task.fn(data_config, catalog_dir)
    assert plan["sources"] == ["sharegpt", "local_qa"] and not plan["done"]
    assert [line["planned"] for line in plan["plan"]] == [40, 40]
    spills = [normalize_source_task.fn(data_config, s, catalog_dir, plan["prompts_dir"], 40) for s in plan["sources"]]
    assert all(s["in"] == 40 == s["kept"] + sum(s["quarantined"].values()) for s in spills)
    out = build_prompt_shards_task.fn(data_config, spills, plan["prompts_dir"])
    assert Manifest.read(Path(out)) is not None and not (Path(out) / "spill").exists()
    ((key, rows),) = no_artifacts["tables"][-1:]
    assert key.startswith("prompts-sources-") and {r["source"] for r in rows} == {"sharegpt", "local_qa"}
    assert "prompts" in no_artifacts["markdown"][-1][1]
    assert prompts_plan_task.fn(data_config, catalog_dir)["done"]


def test_source_cache_key_exists_only_while_the_output_does(tmp_path):
    from tasks.data import _source_cache_key

    ctx = SimpleNamespace(task=SimpleNamespace(name="normalize-source"))
    params = {"prompts_dir": str(tmp_path / "fp"), "source_name": "sharegpt"}
    assert _source_cache_key(ctx, params) is None  # nothing on disk: never answered from the cache
    (tmp_path / "fp" / "spill" / "sharegpt").mkdir(parents=True)
    (tmp_path / "fp" / "spill" / "sharegpt" / "counts.json").write_text("{}")
    done = _source_cache_key(ctx, params)
    assert done is not None and "sharegpt" in done and str(tmp_path / "fp") in done
