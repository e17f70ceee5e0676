"""Helpers of the data-stage tests (a uniquely named module: ``conftest`` is ambiguous on
sys.path)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from eagle3.config.data import SourceConfig
from eagle3.config.gate import GateConfig
from eagle3.config.pipeline import PipelineConfig, with_overrides
from eagle3.config.target import TargetConfig
from eagle3.data.stage import DiscoverStage, NormalizeStage
from eagle3.stage import run_stage
from eagle3.worlds.conversations import generate_conversations
from eagle3.worlds.samples import FILE_NAMES

VOCAB = 2048
# Pretokenized rows: index -> expected quarantine reason (None = kept).
PRETOKENIZED_BAD = {3: "bad_tokens", 5: "bad_tokens", 7: "empty", 9: "bad_tokens"}


def write_pretokenized(path: Path, tokenizer: Any, n: int = 20) -> None:
    from eagle3.data.template import render_conversation

    rows = []
    for i, conv in enumerate(generate_conversations(n, seed=99)):
        r = render_conversation(tokenizer, conv)
        ids, mask = list(r.input_ids), list(r.loss_mask)
        if i == 3:
            ids[0] = VOCAB + 5  # outside the target vocab
        elif i == 5:
            mask = mask[:-1]  # length mismatch
        elif i == 7:
            ids, mask = [], []
        elif i == 9:
            mask[0] = 7
        rows.append({"id": f"pt-{i}", "input_ids": ids, "loss_mask": mask})
    schema = pa.schema(
        [
            ("id", pa.string()),
            ("input_ids", pa.list_(pa.int32())),
            ("loss_mask", pa.list_(pa.uint8())),
        ]
    )
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)


def sources_for(data: Path) -> list[SourceConfig]:
    """The tiny recipe's sources over ``data``."""
    out = [
        SourceConfig(adapter=name, path=str(data / FILE_NAMES[name]))
        for name in ("sharegpt", "ultrachat", "perfect_blend", "openhermes", "magpie", "tulu3")
    ]
    out.append(
        SourceConfig(
            adapter="jsonl",
            name="local_qa",
            path=str(data / FILE_NAMES["local_jsonl"]),
            columns={"user": "question", "assistant": "answer", "id": "uid"},
        )
    )
    out.append(SourceConfig(adapter="pretokenized", path=str(data / "pretokenized.parquet")))
    return out


def make_config(
    world: dict[str, Path], root: Path, overrides: list[str] | None = None
) -> PipelineConfig:
    data = world["data"]
    config = PipelineConfig(
        name="data-test",
        root=str(root),
        target=TargetConfig(
            model_path=str(world["model"]),
            num_layers=8,
            hidden_size=128,
            vocab_size=VOCAB,
            context_length=1024,
        ),
        sources=sources_for(data),
        gate=GateConfig(
            prompt_sets={n: str(data / "bench" / f"{n}.jsonl") for n in ("chat", "math", "code")},
            traffic={1: 1.0},
        ),
    )
    return with_overrides(
        config, ["normalize.max_prompt_tokens=512", "normalize.shard_size=200", *(overrides or [])]
    )


def bad_rows(data: Path) -> dict[str, dict[int, str]]:
    """Ground truth: adapter -> {row: reason}; ``local_jsonl`` is the ``local_qa`` source."""
    doc = json.loads((data / "bad_rows.json").read_text())
    return {
        ("local_qa" if k == "local_jsonl" else k): {r["row"]: r["reason"] for r in v}
        for k, v in doc.items()
    } | {"pretokenized": dict(PRETOKENIZED_BAD)}


def discover(config: PipelineConfig) -> Path:
    """The catalog stage of ``config``, run in this process (``eagle3.stage.run_stage``)."""
    return run_stage(DiscoverStage(), config).out_dir


def normalize(config: PipelineConfig) -> Path:
    """Discover, then the prompts stage of ``config``, in this process; returns the prompts stage
    directory."""
    return run_stage(NormalizeStage(), config, catalog_dir=discover(config)).out_dir


def drop_code(request: Any) -> str | None:
    """A ``served.hook`` for the served-source tests: drops the requests routed as code."""
    return "code" if request.headers.get("x-smg-routing-key") == "code" else None
