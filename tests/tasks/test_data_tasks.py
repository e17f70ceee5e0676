"""The discover and normalize stages through the generic stage tasks (``task.fn``): plan, units,
finalize, the published tables and summary, resume/skip, the failure policy and the per-source unit
cache key."""

from __future__ import annotations

import json

import pytest
from prefect.logging import disable_run_logger

from eagle3.config.data import SourceConfig
from eagle3.config.pipeline import PipelineConfig
from eagle3.config.target import TargetConfig
from eagle3.data.stage import DiscoverStage, NormalizeStage
from eagle3.rundir.layout import FAILED_SHARDS_FILE, StageInputError
from eagle3.rundir.runroot import Manifest
from eagle3.stage import UnitsFailed
from tasks.stage import finalize_task, plan_task, unit_cache_key, unit_task


@pytest.fixture(scope="module")
def data_config(tmp_path_factory) -> PipelineConfig:
    """Two sample sources (ShareGPT JSON, local Q/A JSONL) and a tiny tokenizer, no tiny world
    needed."""
    from eagle3.worlds.conversations import generate_conversations
    from eagle3.worlds.samples import FILE_NAMES, write_samples
    from eagle3.worlds.tiny_target import build_tokenizer

    root = tmp_path_factory.mktemp("data-tasks")
    write_samples(root / "data", rows_per_source=40)
    corpus = [m["content"] for conv in generate_conversations(100, seed=1) for m in conv]
    build_tokenizer(corpus, vocab_size=1024).save_pretrained(root / "model")
    return PipelineConfig(
        name="data-tasks",
        root=str(root / "run"),
        target=TargetConfig(
            model_path=str(root / "model"), num_layers=8, hidden_size=64, vocab_size=1024
        ),
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


@pytest.fixture
def artifacts(monkeypatch) -> dict[str, list]:
    """Record the artifacts finalize publishes instead of sending them to a Prefect API."""
    import tasks.stage as mod

    calls: dict[str, list] = {"tables": [], "markdown": []}
    monkeypatch.setattr(
        mod, "publish_table", lambda key, rows, **kw: calls["tables"].append((key, rows))
    )
    monkeypatch.setattr(
        mod, "publish_markdown", lambda key, md, **kw: calls["markdown"].append((key, md))
    )
    return calls


def _run(stage, config, inputs, *, failed=()):
    plan = plan_task.fn(stage, config, inputs)
    reports = [unit_task.fn(stage, config, plan, unit) for unit in plan.units if unit not in failed]
    return plan, reports, finalize_task.fn(stage, config, plan, reports, list(failed))


def test_discover_then_normalize_through_the_generic_tasks(data_config, artifacts):
    with disable_run_logger():
        _plan, _reports, catalog = _run(DiscoverStage(), data_config, {})
        assert (
            json.loads((catalog.out_dir / "catalog.json").read_text())["datasets"][0]["rows"] == 40
        )
        key, datasets = artifacts["tables"][-1]
        assert key.startswith("discover-") and [d["name"] for d in datasets] == [
            "sharegpt",
            "local_qa",
        ]
        plan, reports, result = _run(
            NormalizeStage(), data_config, {"catalog_dir": str(catalog.out_dir)}
        )
        assert plan.units == ("sharegpt", "local_qa") and plan.planned == {
            "sharegpt": 40,
            "local_qa": 40,
        }
        assert all(
            r.detail["in"] == 40 == r.rows + sum(r.detail["quarantined"].values()) for r in reports
        )
        assert not any(r.skipped for r in reports)
        assert (
            result.done
            and Manifest.read(result.out_dir) is not None
            and not (result.out_dir / "spill").exists()
        )
        key, rows = artifacts["tables"][-1]
        assert key.startswith("normalize-sources-") and {r["source"] for r in rows} == {
            "sharegpt",
            "local_qa",
        }
        key, markdown = artifacts["markdown"][-1]
        assert key.startswith("normalize-summary-") and "prompts" in markdown
        before = (result.out_dir / "manifest.json").read_text()
        # the catalog this config names
        _plan, again, rerun = _run(NormalizeStage(), data_config, {})
    assert rerun.out_dir == result.out_dir and all(r.skipped for r in again)
    assert (result.out_dir / "manifest.json").read_text() == before  # a manifest hit writes nothing


def test_a_finished_source_is_skipped_and_a_failed_one_fails_the_stage(
    data_config, tmp_path, artifacts
):
    config = data_config.model_copy(update={"root": str(tmp_path / "run")})
    stage = NormalizeStage()
    with disable_run_logger():
        _run(DiscoverStage(), config, {})
        with pytest.raises(UnitsFailed, match=r"normalize failed .*local_qa.*eagle3 normalize"):
            _run(stage, config, {}, failed=("local_qa",))
        plan = plan_task.fn(stage, config, {})
        assert json.loads((plan.out_dir / FAILED_SHARDS_FILE).read_text()) == ["local_qa"]
        assert Manifest.read(plan.out_dir) is None and stage.progress(plan).done == 40
        # its spill is on disk: resumed, not redone
        assert unit_task.fn(stage, config, plan, "sharegpt").skipped
        assert stage.progress(plan).total == 80


def test_normalize_without_a_finished_catalog_names_discover(data_config, tmp_path):
    config = data_config.model_copy(update={"root": str(tmp_path / "empty")})
    with pytest.raises(StageInputError, match="eagle3 discover"):
        NormalizeStage().plan(config)


def test_unit_cache_key_exists_only_once_the_sources_rows_are_on_disk(
    data_config, tmp_path, artifacts
):
    config = data_config.model_copy(update={"root": str(tmp_path / "run")})
    with disable_run_logger():
        _run(DiscoverStage(), config, {})
    stage = NormalizeStage()
    plan = stage.plan(config)
    params = {"stage": stage, "plan": plan, "unit": "sharegpt"}
    assert unit_cache_key(None, params) is None  # nothing on disk: never answered from the cache
    counts = plan.out_dir / "spill" / "sharegpt" / "counts.json"
    counts.parent.mkdir(parents=True)
    counts.write_text("{}")
    done = unit_cache_key(None, params)
    assert done is not None and done.startswith(f"normalize-{plan.fingerprint}-sharegpt-")
    (plan.out_dir / "manifest.json").write_text("{}")
    # the finished stage's manifest now marks the rows on disk
    assert unit_cache_key(None, params) != done
