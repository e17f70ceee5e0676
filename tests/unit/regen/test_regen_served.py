"""Served rows through the regen stage: passed through as answered, with their provenance, and no
server started when every row of the run is served (``RegenStage.resources``,
``eagle3.regen.conversation.pretokenized_row``)."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from eagle3.data.stage import DiscoverStage, NormalizeStage
from eagle3.recipes import load_recipe
from eagle3.regen import stage as regen_stage
from eagle3.regen.plan import plan_regen
from eagle3.regen.stage import RegenStage, needs_generation
from eagle3.stage import run_stage


def _prompts(config) -> Path:
    catalog = run_stage(DiscoverStage(), config).out_dir
    return run_stage(NormalizeStage(), config, catalog_dir=catalog).out_dir


@pytest.fixture(scope="module")
def served_prompts(served_traffic, tmp_path_factory):
    config = load_recipe("tiny_served", [f"root={tmp_path_factory.mktemp('served-regen')}"])
    assert config.sources[0].path == str(served_traffic.log_dir)
    return config, _prompts(config)


def test_a_served_night_regenerates_nothing_and_starts_no_server(served_prompts, monkeypatch):
    config, prompts = served_prompts

    @contextmanager
    def no_server(*_args, **_kwargs):
        raise AssertionError("a regen server was started for served rows")
        yield []

    monkeypatch.setattr(regen_stage, "regen_servers", no_server)
    result = run_stage(RegenStage(), config, prompts_dir=prompts)
    rows = [
        r
        for p in sorted(result.out_dir.glob("shard-*.parquet"))
        for r in pq.read_table(p).to_pylist()
    ]
    source = [
        r for p in sorted(prompts.glob("shard-*.parquet")) for r in pq.read_table(p).to_pylist()
    ]
    assert (
        result.summary["served"] == len(rows) == len(source) and result.summary["pretokenized"] == 0
    )
    for row, prompt in zip(rows, source, strict=True):
        served = json.loads(prompt["meta"])["served"]
        assert row["input_ids"] == prompt["input_ids"] and row["loss_mask"] == prompt["loss_mask"]
        assert (
            row["server"] == f"served:{served['server']}"
            and row["finish_reason"] == served["finish_reason"]
        )
        assert row["completion_tokens"] == sum(row["loss_mask"]) and row["status"] == "ok"
        assert json.loads(row["meta"])["served"]["rid"] == served["rid"]


def test_a_night_mixing_served_and_public_rows_needs_a_server(served_prompts, tmp_path):
    config, prompts = served_prompts
    assert not needs_generation(config, plan_regen(config, prompts))
    public = tmp_path / "public.jsonl"
    public.write_text(
        json.dumps({"messages": [{"role": "user", "content": "Plan a picnic for four."}]}) + "\n"
    )
    mixed = config.replace(
        sources=[
            *config.sources,
            config.sources[0].replace(adapter="jsonl", name="public", path=str(public)),
        ]
    )
    assert needs_generation(mixed, plan_regen(mixed, _prompts(mixed)))
