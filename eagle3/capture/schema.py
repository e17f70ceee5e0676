"""The features/ contract (DESIGN §3): columns, footer metadata and the per-shard quarantine.

One row per sample. Hidden states are stored as raw little-endian bytes in ``binary`` columns (``seq_len x 3H`` and
``seq_len x H``), so a reader can view them as tensors without decoding; the element type is the footer's ``dtype``
(``bfloat16`` or ``float32``). Each value is one row's states, so a Kimi-sized row (hundreds of MB) never crosses
Arrow's 2 GiB per-array limit as long as arrays are built per row (``hidden_column``).
"""

from __future__ import annotations

import itertools
import json
import warnings
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import torch

from eagle3.runroot import versions

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
TORCH_DTYPES: dict[str, torch.dtype] = {"bfloat16": torch.bfloat16, "float32": torch.float32}
# The integer dtype of the same width, used to move bf16 through numpy/arrow (numpy has no bfloat16).
STORAGE_VIEW: dict[str, torch.dtype] = {"bfloat16": torch.int16, "float32": torch.float32}

REQUIRED_FOOTER_KEYS: tuple[str, ...] = (
    "target_model",
    "target_revision",
    "hidden_size",
    "num_layers",
    "layer_ids",
    "layer_convention",
    "dtype",
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
    chat_template_hash: str,
    system_prompt_policy: str,
    truncation: str,
    max_seq_len: int,
    features_fingerprint: str,
) -> dict[str, str]:
    """Footer key-values of a feature shard (strings; lists as JSON). Also copied into the manifest."""
    return {
        "target_model": target_model,
        "target_revision": target_revision or "",
        "hidden_size": str(hidden_size),
        "num_layers": str(num_layers),
        "layer_ids": json.dumps(list(layer_ids)),
        "layer_convention": LAYER_CONVENTION,
        "dtype": dtype,
        "chat_template_hash": chat_template_hash,
        "system_prompt_policy": system_prompt_policy,
        "truncation": truncation,
        "max_seq_len": str(max_seq_len),
        "features_fingerprint": features_fingerprint,
        "eagle3_version": versions().get("eagle3-pipeline", "unknown"),
    }


def check_footer(meta: dict[str, str], *, path: Any) -> None:
    """Raise ``ValueError`` naming the missing keys or an unsupported dtype/convention."""
    missing = [k for k in REQUIRED_FOOTER_KEYS if k not in meta]
    if missing:
        raise ValueError(f"{path}: feature shard footer lacks {missing}; re-run `eagle3 capture` to rebuild it")
    if meta["dtype"] not in TORCH_DTYPES:
        raise ValueError(f"{path}: footer dtype {meta['dtype']!r} is not one of {sorted(TORCH_DTYPES)}")
    if meta["layer_convention"] != LAYER_CONVENTION:
        raise ValueError(f"{path}: layer convention {meta['layer_convention']!r}, expected {LAYER_CONVENTION!r}")


def tensor_bytes(x: torch.Tensor, dtype: str) -> bytes:
    """Little-endian bytes of ``x`` in the storage ``dtype`` (bf16 moves through an int16 view)."""
    x = x.detach().to(device="cpu", dtype=TORCH_DTYPES[dtype]).contiguous()
    return x.view(STORAGE_VIEW[dtype]).numpy().tobytes()


def hidden_column(values: Sequence[bytes]) -> pa.ChunkedArray:
    """A binary column with one chunk per row, so no chunk exceeds Arrow's 2 GiB offset limit."""
    if not values:
        return pa.chunked_array([], type=pa.binary())
    return pa.chunked_array([pa.array([v], type=pa.binary()) for v in values], type=pa.binary())


def feature_table(rows: Sequence[dict[str, Any]]) -> pa.Table:
    """Build a ``FEATURE_SCHEMA`` table from rows holding ``aux_hidden``/``last_hidden`` as bytes."""
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


def binary_tensors(column: pa.ChunkedArray | pa.Array, dtype: str, width: int) -> list[torch.Tensor]:
    """View each value of a hidden-state binary column as a ``[seq_len, width]`` tensor, without copying.

    ``torch.frombuffer`` wraps the Arrow data buffer in place (keeping it alive); bf16 is read as int16 and
    reinterpreted. The tensors are read-only views: copy before writing into them."""
    view, out = STORAGE_VIEW[dtype], []
    itemsize = torch.empty((), dtype=view).element_size()
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    with warnings.catch_warnings():  # Arrow buffers are read-only; the views are never written to
        warnings.simplefilter("ignore", UserWarning)
        for chunk in chunks:
            out += _views(chunk, view, itemsize, dtype, width)
    return out


def _views(chunk: pa.Array, view: torch.dtype, itemsize: int, dtype: str, width: int) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    if len(chunk) == 0:
        return out
    _validity, offsets_buf, data = chunk.buffers()
    offsets = memoryview(offsets_buf).cast("i")[chunk.offset : chunk.offset + len(chunk) + 1]
    for start, end in itertools.pairwise(offsets):
        count = (end - start) // itemsize
        if count == 0 or count % width:
            raise ValueError(f"hidden-state value of {end - start} bytes is not a multiple of width {width}")
        flat = torch.frombuffer(data, dtype=view, count=count, offset=start)
        out.append(flat.view(TORCH_DTYPES[dtype]).view(count // width, width))
    return out
