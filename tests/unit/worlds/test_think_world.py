"""The thinking world: built and cached like the tiny world, sample rows whose planted defects
normalize finds, and a target that really thinks and calls tools in its template's format."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from eagle3.data.dialect import reasoning_format, tool_call_format
from eagle3.data.stage import DiscoverStage, NormalizeStage
from eagle3.data.template import ChatOptions, render_prompt
from eagle3.recipes import eagle3_home, load_recipe
from eagle3.rundir.runroot import Manifest
from eagle3.stage import run_stage
from eagle3.worlds.think_world import ThinkWorldSpec, build_think_world
from eagle3.worlds.world import TinyWorldSpec, world_dir_for

CALLS = tool_call_format("kimi_k2")
THINK_END = reasoning_format("kimi_k2").think_end


def test_the_thinking_world_is_cached_apart_from_the_tiny_world(think_world):
    again, hit = build_think_world(eagle3_home() / "cache")
    assert hit and again == think_world
    assert think_world.root == world_dir_for(eagle3_home() / "cache", ThinkWorldSpec())
    assert (
        think_world.root.name.startswith("think-world-")
        and ThinkWorldSpec().fingerprint() != TinyWorldSpec().fingerprint()
    )
    assert think_world.pretokenized is None and set(think_world.samples) == {
        "openai_tools",
        "sharegpt_tools",
        "coderforge",
        "swe_agent",
    }
    assert think_world.report["train_loss_last"] < 1.0 < think_world.report["train_loss_first"]


def test_normalize_quarantines_exactly_the_planted_rows_with_their_reasons(think_world, tmp_path):
    config = load_recipe("tiny_think", [f"root={tmp_path}", "mix.total=null"])
    catalog = run_stage(DiscoverStage(), config).out_dir
    out = run_stage(NormalizeStage(), config, catalog_dir=catalog).out_dir
    got: dict[str, dict[int, str]] = {}
    for row in pq.read_table(out / "quarantine.parquet").to_pylist():
        got.setdefault(row["source"], {})[int(row["source_row"])] = row["reason"]
    planted = json.loads(think_world.bad_rows.read_text())
    assert got == {
        source: {r["row"]: r["reason"] for r in rows} for source, rows in planted.items()
    }
    stats = Manifest.read(out).stats["sources"]
    assert all(stats[s]["kept"] >= 100 for s in planted)


@pytest.fixture(scope="module")
def target(think_world):
    tok = AutoTokenizer.from_pretrained(think_world.model_dir)
    return tok, AutoModelForCausalLM.from_pretrained(think_world.model_dir).eval()


def _greedy(target, messages, tools, *, thinking: bool) -> str:
    import torch

    tok, model = target
    ids = render_prompt(tok, messages, ChatOptions(tools=tools, kwargs={"thinking": thinking}))
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=96, do_sample=False)
    return tok.decode(out[0, len(ids) :], skip_special_tokens=True)


def _bench(think_world, name: str) -> list[dict]:
    return [
        json.loads(line)
        for line in (Path(think_world.bench_dir) / f"{name}.jsonl").read_text().splitlines()
    ]


def test_the_target_thinks_then_calls_one_of_its_tools(think_world, target):
    for row in _bench(think_world, "tools")[:8:2]:  # first turns: the question and the tools
        text = _greedy(
            target, [{"role": "user", "content": row["prompt"]}], row["tools"], thinking=True
        )
        reasoning, _, content = text.partition(THINK_END)
        _before, calls = CALLS.parse(content)
        assert reasoning and calls, f"no thinking or no call for {row['prompt']!r}: {text!r}"
        assert {c["name"] for c in calls} <= {t["function"]["name"] for t in row["tools"]}
        assert all(isinstance(json.loads(c["arguments"]), dict) for c in calls)


def test_the_target_thinks_before_a_plain_answer_unless_the_switch_is_off(think_world, target):
    """With the switch off the template closes the block itself; the 2M-parameter target then writes
    no thinking for most prompts (it may still for the odd one: one in six with the default world on
    our CI machine)."""
    prompts = [
        [{"role": "user", "content": row["prompt"]}] for row in _bench(think_world, "think")[:6]
    ]
    for messages in prompts:
        thought = _greedy(target, messages, None, thinking=True)
        assert THINK_END in thought and CALLS.section_start not in thought
    off = [_greedy(target, messages, None, thinking=False) for messages in prompts]
    assert sum(THINK_END in text for text in off) < len(prompts) / 2, off
