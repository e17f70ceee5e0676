"""One online batch on the wire: what a producer puts in the store, and what the trainer makes of
it.

A producer sends each sample's states in their *stored form* (``eagle3.capture.encoding``: raw in
``capture.dtype``, fp8 values + scales, or the top-k ids + probabilities), as flat byte arrays that
Ray's object store hands back without a copy. The trainer checks a batch the way the stored path
checks a shard before its rows train (``check_message``): the key is the one its plan expects
(epoch, step, rank, sample ids), the features fingerprint is this run's, every state holds whole
tokens of the right width for the sample's length, and every value is finite. It then decodes and
pads exactly as ``FeatureDataset._collate`` does, so a batch trains the same from either path.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from eagle3.capture.backends import TopK, check_shapes, stored_final
from eagle3.capture.encoding import TORCH_DTYPES, ColumnCodec, FinalCodec, TopKCodec, dequantize
from eagle3.capture.shard import Sample
from eagle3.errors import DataError

Wire = tuple[np.ndarray, str, tuple[int, ...]]  # (bytes as uint8, torch dtype name, shape)


class BatchRejected(DataError):
    """An online batch failed its integrity check: it does not train (the message names the batch
    and samples)."""


def to_wire(t: torch.Tensor) -> Wire:
    t = t.detach().contiguous().cpu()
    return t.view(-1).view(torch.uint8).numpy(), str(t.dtype).removeprefix("torch."), tuple(t.shape)


def from_wire(w: Wire) -> torch.Tensor:
    data, dtype, shape = w
    # the store's buffers are read-only; decoding copies out of them
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        flat = (
            torch.frombuffer(memoryview(data), dtype=torch.uint8)
            if data.size
            else torch.empty(0, dtype=torch.uint8)
        )
    return flat.view(getattr(torch, dtype)).view(shape)


class Stored(NamedTuple):
    """A sample's states as a feature shard holds them (``ColumnCodec.views``: values then scales,
    or ids, probs)."""

    aux: tuple[torch.Tensor, torch.Tensor | None]
    last: tuple[torch.Tensor, torch.Tensor | None]


def _stored_order(
    codec: ColumnCodec | FinalCodec, view: tuple[torch.Tensor, torch.Tensor | None]
) -> tuple:
    """A shard view's parts in ``stored()``'s order: (values,), (scales, values) for fp8, (ids,
    probs)."""
    first, second = view
    if isinstance(codec, TopKCodec):
        return first, second
    return (first,) if second is None else (second, first)


def make_message(
    key: Any,
    features_fp: str,
    samples: Sequence[Sample],
    states: Sequence[tuple[Any, Any]],
    *,
    codecs: tuple[ColumnCodec, FinalCodec],
    backend: Any,
    hidden_size: int,
) -> dict[str, Any]:
    """The store object of one batch: per sample its token columns and its states' stored form."""
    aux_codec, last_codec = codecs
    rows = []
    for sample, state in zip(samples, states, strict=True):
        if isinstance(state, Stored):  # already in the stored form, read from a feature shard
            aux_parts, last_parts = (
                _stored_order(aux_codec, state.aux),
                _stored_order(last_codec, state.last),
            )
        else:
            aux, final = state
            check_shapes(
                len(sample.input_ids), aux, final, hidden_size=hidden_size, codec=last_codec
            )
            aux_parts, last_parts = aux_codec.stored(aux), stored_final(last_codec, final, backend)
        rows.append(
            {
                "sample_id": sample.sample_id,
                "input_ids": np.asarray(sample.input_ids, dtype=np.int32),
                "loss_mask": np.asarray(sample.loss_mask, dtype=np.uint8),
                "aux": [to_wire(p) for p in aux_parts],
                "last": [to_wire(p) for p in last_parts],
            }
        )
    return {"key": key, "features_fingerprint": features_fp, "rows": rows}


def _decode(
    codec: ColumnCodec | FinalCodec, parts: list[torch.Tensor], dtype: torch.dtype
) -> list[torch.Tensor]:
    if isinstance(codec, TopKCodec):
        ids, probs = parts
        return [ids.long(), probs.float()]
    if codec.fp8:
        scales, values = parts
        return [dequantize(values, scales, dtype)]
    return [parts[0].to(dtype)]


def _widths(codec: ColumnCodec | FinalCodec) -> list[tuple[int, str]]:
    if isinstance(codec, TopKCodec):
        return [(codec.k, "int32"), (codec.k, "float16")]
    if codec.fp8:
        return [(codec.segments, "float32"), (codec.width, "float8_e4m3fn")]
    return [(codec.width, codec.dtype)]


def check_message(
    message: dict[str, Any], *, key: Any, features_fp: str, codecs: tuple[ColumnCodec, FinalCodec]
) -> list[tuple[list[torch.Tensor], list[torch.Tensor]]]:
    """The batch's states as tensors, after the checks of the module docstring; ``BatchRejected``
    otherwise."""
    got = message.get("key")
    where = f"online batch {key[:3]} (samples {list(key[3])[:8]})"
    if got is None or tuple(got[:3]) != tuple(key[:3]) or tuple(got[3]) != tuple(key[3]):
        raise BatchRejected(
            f"{where}: the store handed over batch {got and tuple(got[:3])} with other samples; "
            "the producers planned another epoch order (same config and regen shards on both?)"
        )
    if message.get("features_fingerprint") != features_fp:
        raise BatchRejected(
            f"{where}: captured for features {message.get('features_fingerprint')}, this run trains "
            f"on {features_fp}: producers and trainer resolved different configs"
        )
    states = []
    for row in message["rows"]:
        n = len(row["input_ids"])
        parts = []
        for name, codec in zip(("aux", "last"), codecs, strict=True):
            tensors = [from_wire(w) for w in row[name]]
            shapes = [(tuple(t.shape), str(t.dtype).removeprefix("torch.")) for t in tensors]
            if shapes != [((n, width), dtype) for width, dtype in _widths(codec)]:
                raise BatchRejected(
                    f"{where}: sample {row['sample_id']} {name} states {shapes} do not fit its {n} "
                    f"tokens ({codec.describe()})"
                )
            if not all(torch.isfinite(t.float()).all() for t in tensors if t.dtype != torch.int32):
                raise BatchRejected(
                    f"{where}: sample {row['sample_id']} has non-finite {name} states; the stored "
                    "path quarantines such a sample at capture: check the target on it"
                )
            parts.append(tensors)
        states.append((parts[0], parts[1]))
    return states


def collate(
    message: dict[str, Any],
    states: list[tuple[list[torch.Tensor], list[torch.Tensor]]],
    *,
    codecs: tuple[ColumnCodec, FinalCodec],
    hidden_dtype: torch.dtype | None,
    max_seq_len: int | None,
) -> dict[str, torch.Tensor]:
    """The batch dict ``FeatureDataset`` yields for these rows (right padding, rows cut to
    ``max_seq_len``)."""
    aux_codec, last_codec = codecs
    dtype = hidden_dtype or TORCH_DTYPES[aux_codec.dtype]
    rows = message["rows"]
    lengths = [min(len(r["input_ids"]), max_seq_len or len(r["input_ids"])) for r in rows]
    b, width = len(rows), max(lengths)
    out = {
        "input_ids": torch.zeros(b, width, dtype=torch.int64),
        "loss_mask": torch.zeros(b, width, dtype=torch.bool),
        "attention_mask": torch.zeros(b, width, dtype=torch.bool),
    }
    aux = torch.zeros(b, width, aux_codec.width, dtype=dtype)
    topk = isinstance(last_codec, TopKCodec)
    if topk:
        ids = torch.zeros(b, width, last_codec.k, dtype=torch.int64)
        probs = torch.zeros(b, width, last_codec.k, dtype=torch.float32)
    else:
        last = torch.zeros(b, width, last_codec.width, dtype=dtype)
    for i, (row, n, (aux_parts, last_parts)) in enumerate(zip(rows, lengths, states, strict=True)):
        out["input_ids"][i, :n] = torch.from_numpy(np.array(row["input_ids"][:n], dtype=np.int64))
        out["loss_mask"][i, :n] = torch.from_numpy(np.array(row["loss_mask"][:n], dtype=bool))
        out["attention_mask"][i, :n] = True
        aux[i, :n] = _decode(aux_codec, [p[:n] for p in aux_parts], dtype)[0]
        decoded = _decode(last_codec, [p[:n] for p in last_parts], dtype)
        if topk:
            ids[i, :n], probs[i, :n] = decoded
        else:
            last[i, :n] = decoded[0]
    out["aux_hidden"] = aux
    if topk:
        out["target_ids"], out["target_probs"] = ids, probs
    else:
        out["last_hidden"] = last
    return out


def states_of(
    backend: Any, samples: Sequence[Sample]
) -> list[tuple[torch.Tensor, torch.Tensor | TopK]]:
    """One forward of ``samples`` through a capture backend: per sample ``(aux [T, 3H], final)``."""
    return list(backend.forward([s.input_ids for s in samples]))
