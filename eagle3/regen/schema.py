"""Columns of the regen stage's shards (docs/DESIGN.md, "Regenerated conversations"). Capture reads
only ``sample_id, input_ids, loss_mask``; the rest is provenance. ``meta`` (JSON) records per-row
facts that are not columns: the API used, the number of regenerated turns, whether the output
round-trips through decode/encode, and what the OpenAI path could not guarantee (``retokenized``).
"""

from __future__ import annotations

import pyarrow as pa

from eagle3.data.schema import MESSAGE_TYPE, PROMPT_SCHEMA

REGEN_SCHEMA = pa.schema(
    [
        pa.field("sample_id", pa.string(), nullable=False),
        pa.field("source", pa.string()),
        pa.field("messages", pa.list_(MESSAGE_TYPE)),
        pa.field("input_ids", pa.list_(pa.int32())),
        pa.field("loss_mask", pa.list_(pa.uint8())),
        pa.field("finish_reason", pa.string()),
        pa.field("prompt_tokens", pa.int32()),
        pa.field("completion_tokens", pa.int32()),
        pa.field("server", pa.string()),
        pa.field("latency_s", pa.float64()),
        pa.field("attempts", pa.int32()),
        pa.field("status", pa.string()),
        pa.field("error", pa.string()),
        pa.field("meta", pa.string()),
    ]
)

REGEN_COLUMNS: tuple[str, ...] = tuple(REGEN_SCHEMA.names)

# Columns of a prompts shard that regeneration reads.
PROMPT_COLUMNS: tuple[str, ...] = (
    "sample_id",
    "source",
    "messages",
    "input_ids",
    "loss_mask",
    "tools",
    "meta",
)
assert all(PROMPT_SCHEMA.get_field_index(c) >= 0 for c in PROMPT_COLUMNS), (
    "PROMPT_SCHEMA lost a column regen reads"
)

STATUS_OK, STATUS_TRUNCATED, STATUS_FAILED = "ok", "truncated", "failed"
