"""The features/ contract (docs/DESIGN.md, "Features"): columns, footer metadata and the per-shard
quarantine.

One row per sample. Hidden states are stored as bytes in ``binary`` columns (``seq_len x 3H`` and
``seq_len x H``), so a reader can view them as tensors without decoding; how (raw in the footer's
``dtype``, or fp8 with per-token scales) is the footer's ``encoding`` (``eagle3.capture.encoding``).
In the ``fp8_topk`` encoding the ``last_hidden`` column holds the target's top-``topk`` next-token
ids and probabilities instead of the final state (footer ``topk``). Each value is one row's states,
so a Kimi-sized row (hundreds of MB) never crosses Arrow's 2 GiB per-array limit as long as arrays
are built per row (``hidden_column``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from eagle3.capture.encoding import (
    ENCODINGS,
    TOPK_ENCODING,
    TORCH_DTYPES,
    ColumnCodec,
    FinalCodec,
    column_codecs,
)
from eagle3.rundir.runroot import versions

FEATURE_SCHEMA = pa.schema(
    [
        pa.field("sample_id", pa.string(), nullable=False),
        pa.field("input_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("loss_mask", pa.list_(pa.uint8()), nullable=False),
        pa.field("seq_len", pa.int32(), nullable=False),
        pa.field("aux_hidden", pa.binary(), nullable=False),
        pa.field("last_hidden", pa.binary(), nullable=False),
    ]
)

CAPTURE_QUARANTINE_SCHEMA = pa.schema(
    [
        pa.field("sample_id", pa.string()),
        pa.field("reason", pa.string()),
        pa.field("seq_len", pa.int32()),
    ]
)

# Reasons a row is quarantined instead of written.
REASON_TOO_LONG = "too_long"
REASON_NON_FINITE = "non_finite"
REASON_BAD_INPUT = "bad_input"

LAYER_CONVENTION = "input_of_layer"

REQUIRED_FOOTER_KEYS: tuple[str, ...] = (
    "target_model",
    "target_revision",
    "hidden_size",
    "num_layers",
    "layer_ids",
    "layer_convention",
    "dtype",
    "encoding",
    "chat_template_hash",
    "system_prompt_policy",
    "eagle3_version",
)


def footer_metadata(
    *,
    target_model: str,
    target_revision: str | None,
    hidden_size: int,
    num_layers: int,
    layer_ids: Sequence[int],
    dtype: str,
    encoding: str,
    chat_template_hash: str,
    system_prompt_policy: str,
    truncation: str,
    max_seq_len: int,
    features_fingerprint: str,
    topk: int | None = None,
    capture_backend: str = "hf",
) -> dict[str, str]:
    """Footer key-values of a feature shard (strings; lists as JSON). Also copied into the manifest.
    ``topk``: the k of an encoding that stores the target's top-k (``fp8_topk``), recorded as footer
    ``topk``; ``capture_backend``: the engine whose forward produced the states (``hf``,
    ``sglang``)."""
    return {
        "target_model": target_model,
        "target_revision": target_revision or "",
        "hidden_size": str(hidden_size),
        "num_layers": str(num_layers),
        "layer_ids": json.dumps(list(layer_ids)),
        "layer_convention": LAYER_CONVENTION,
        "dtype": dtype,
        "encoding": encoding,
        "chat_template_hash": chat_template_hash,
        "system_prompt_policy": system_prompt_policy,
        "truncation": truncation,
        "max_seq_len": str(max_seq_len),
        "features_fingerprint": features_fingerprint,
        "capture_backend": capture_backend,
        "eagle3_version": versions().get("eagle3-pipeline", "unknown"),
        **({"topk": str(topk)} if topk is not None else {}),
    }


def check_footer(meta: dict[str, str], *, path: Any) -> None:
    """Raise ``ValueError`` naming the missing keys or an unsupported dtype/convention."""
    missing = [k for k in REQUIRED_FOOTER_KEYS if k not in meta]
    if missing:
        raise ValueError(
            f"{path}: feature shard footer lacks {missing}; re-run `eagle3 capture` to rebuild it"
        )
    if meta["dtype"] not in TORCH_DTYPES:
        raise ValueError(
            f"{path}: footer dtype {meta['dtype']!r} is not one of {sorted(TORCH_DTYPES)}"
        )
    if meta["encoding"] not in ENCODINGS:
        raise ValueError(
            f"{path}: footer encoding {meta['encoding']!r} is not one of {list(ENCODINGS)}"
        )
    if meta["encoding"] == TOPK_ENCODING and not meta.get("topk", "").isdigit():
        raise ValueError(
            f"{path}: footer encoding {TOPK_ENCODING!r} needs a positive integer 'topk', got "
            f"{meta.get('topk')!r}; re-run `eagle3 capture` to rebuild the shard"
        )
    if meta["layer_convention"] != LAYER_CONVENTION:
        raise ValueError(
            f"{path}: layer convention {meta['layer_convention']!r}, expected {LAYER_CONVENTION!r}"
        )


def hidden_column(values: Sequence[bytes | pa.Buffer]) -> pa.ChunkedArray:
    """A binary column with one chunk per row, so no chunk exceeds Arrow's 2 GiB offset limit; each
    chunk is built over its value's buffer, without copying it."""
    if not values:
        return pa.chunked_array([], type=pa.binary())
    return pa.chunked_array([_one_value(pa.py_buffer(v)) for v in values], type=pa.binary())


def _one_value(data: pa.Buffer) -> pa.Array:
    offsets = pa.array([0, data.size], pa.int32()).buffers()[1]
    return pa.Array.from_buffers(pa.binary(), 1, [None, offsets, data])


def feature_table(rows: Sequence[dict[str, Any]]) -> pa.Table:
    """Build a ``FEATURE_SCHEMA`` table from rows holding ``aux_hidden``/``last_hidden`` as
    bytes."""
    columns = {
        "sample_id": pa.array([r["sample_id"] for r in rows], pa.string()),
        "input_ids": pa.array([r["input_ids"] for r in rows], pa.list_(pa.int32())),
        "loss_mask": pa.array([r["loss_mask"] for r in rows], pa.list_(pa.uint8())),
        "seq_len": pa.array([r["seq_len"] for r in rows], pa.int32()),
    }
    table = pa.table(columns)
    table = table.append_column("aux_hidden", hidden_column([r["aux_hidden"] for r in rows]))
    table = table.append_column("last_hidden", hidden_column([r["last_hidden"] for r in rows]))
    return table.cast(FEATURE_SCHEMA)


def footer_codecs(meta: dict[str, str]) -> tuple[ColumnCodec, FinalCodec]:
    """The (aux, final-state) column codecs a checked footer describes."""
    topk = int(meta["topk"]) if meta["encoding"] == TOPK_ENCODING else None
    return column_codecs(meta["encoding"], meta["dtype"], int(meta["hidden_size"]), topk=topk)
