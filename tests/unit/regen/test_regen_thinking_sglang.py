"""Regen of thinking, tool-calling conversations on real SGLang 0.5.23 (the thinking world's target,
served with SGLang's own ``--reasoning-parser kimi_k2``): through /v1/chat/completions the thinking
comes back split off into ``reasoning_content``, and regen keeps it in the training sequence, under
the loss mask.

Not compared token for token with /generate on the same server: SGLang's greedy decoding is not
batch-invariant (a request's numerics depend on what else is in its batch), and the tiny target has
near-ties, so two runs of the same conversation may part ways; the reference server's test
(``test_regen_thinking.py``) makes that comparison."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from eagle3.recipes import load_recipe
from eagle3.regen.stage import RegenStage
from eagle3.serve.launch_commands import build_launch
from eagle3.stage import run_stage

pytestmark = [pytest.mark.sglang, pytest.mark.slow]


@pytest.fixture(scope="module")
def sglang_server(think_world, sglang_python, tmp_path_factory):
    logs = tmp_path_factory.mktemp("think-sglang")
    config = load_recipe(
        "tiny_think",
        [
            f"root={logs / 'run'}",
            "server.engine=sglang",
            "server.extra_args=[--reasoning-parser, kimi_k2]",
        ],
    )
    with build_launch(config, "baseline", port=0).server(log_path=logs / "sglang.log") as server:
        yield server


def _regen(regen_helpers, root: Path, model: Path, url: str, api: str) -> dict[str, dict[str, Any]]:
    prompts = regen_helpers.write_prompts(root, [regen_helpers.agentic_rows()])
    config = regen_helpers.config(
        root,
        model,
        [url],
        context_length=1024,
        reasoning_parser="kimi_k2",
        tool_call_parser="kimi_k2",
        thinking=True,
        max_new_tokens=96,
        api=api,
    )
    summary = run_stage(RegenStage(), config, prompts_dir=prompts).summary
    assert summary["done"] and summary["failed_shards"] == [] and summary["failed"] == 0
    rows = pq.read_table(Path(summary["regen_dir"]) / "shard-00000.parquet").to_pylist()
    return {r["sample_id"]: r for r in rows}


def _masked_text(tokenizer: Any, row: dict[str, Any]) -> str:
    """The decoded runs of the row's sequence that carry loss, joined."""
    runs, run = [], []
    for token, bit in zip(row["input_ids"], row["loss_mask"], strict=True):
        if bit:
            run.append(token)
        elif run:
            runs.append(tokenizer.decode(run))
            run = []
    return "\n".join([*runs, tokenizer.decode(run)] if run else runs)


def test_real_sglangs_reasoning_parser_does_not_strip_the_thinking_regen_trains_on(
    think_world, sglang_server, regen_helpers, tmp_path
):
    model = Path(think_world.model_dir)
    rows = _regen(regen_helpers, tmp_path, model, sglang_server.url, "openai")
    assert len(rows) == len(regen_helpers.agentic_rows())
    answers = [m for row in rows.values() for m in row["messages"] if m["role"] == "assistant"]
    # the target thinks
    assert answers and sum(bool(m["reasoning_content"]) for m in answers) > len(answers) // 2
    tokenizer = AutoTokenizer.from_pretrained(model)
    for row in rows.values():
        trained = _masked_text(tokenizer, row)
        # kept whole by the template's rule
        last = [m for m in row["messages"] if m["role"] == "assistant"][-1]
        assert (last["reasoning_content"] or "") in trained and last["content"] in trained
        assert json.loads(row["meta"])["api"] == "openai"
