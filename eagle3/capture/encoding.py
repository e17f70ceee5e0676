"""How hidden states are stored in a feature shard's binary columns (``capture.encoding``, footer
``encoding``).

* ``raw``: the capture dtype's little-endian bytes (``seq_len x width``), 2 bytes per value in bf16:
  8*H bytes per token for the aux (3H) and final (H) states, today's layout and the field's
  per-sample ``.ckpt`` size.
* ``fp8_aux``: the aux states as float8 e4m3 with one float32 scale per token and per captured layer
  (the residual stream grows with depth, so each layer's H slice gets its own ``amax / 448``); the
  final state stays raw. The draft consumes aux states only through its ``fc`` projection, so 3
  significant bits plus a per-token scale cost little, and the final state, which becomes the target
  distribution through ``lm_head``, keeps its precision.
* ``fp8_all``: the final state in fp8 too (one scale per token).
* ``fp8_topk``: the aux states as in ``fp8_aux``; instead of the final state, the target's ``k``
  most likely next tokens (``capture.topk``, footer ``topk``), computed at capture from the final
  state with the target's ``lm_head`` (``eagle3.capture.head``, the path training uses on a stored
  final state). The draft never reads the final state except to build that distribution, and H
  values per token (7168 for Kimi) are what kept ``fp8_all`` above 0.40 of 8*H; ``6 k`` bytes are
  not. The top-k is over the *full* target vocab: the draft vocab is chosen after capture, from the
  captured shards (``eagle3.train.vocab``), and is rebuilt as nights add shards, so the stored
  distribution must not depend on it; training maps the ids into the draft vocab
  (``eagle3.train.loss``). Ids are int32 (real vocabularies exceed 65K). Probabilities are float16,
  not bf16: they lie in [0, 1], where float16's 10 mantissa bits give a relative error of 2**-11
  down to 6e-5 (bf16: 2**-8), and the mass below float16's range (< 6e-8 per token) is negligible in
  a cross-entropy.

An fp8 value is ``scales (seq_len x segments float32) | values (seq_len x width float8)``, a top-k
value is ``ids (seq_len x k int32) | probs (seq_len x k float16)`` (descending probability), so one
row stays one binary value (the feature schema does not change) and a reader views both parts in
place. Decoding (``dequantize``) is a multiply per element, done where the batch is consumed: on the
GPU when training there.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa
import torch

Encoding = Literal["raw", "fp8_aux", "fp8_all", "fp8_topk"]
ENCODINGS: tuple[str, ...] = ("raw", "fp8_aux", "fp8_all", "fp8_topk")
# the encoding whose final-state column holds the target's top-k (``TopKCodec``)
TOPK_ENCODING = "fp8_topk"
FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
TORCH_DTYPES: dict[str, torch.dtype] = {"bfloat16": torch.bfloat16, "float32": torch.float32}
# The integer dtype of the same width, used to move bf16 through numpy/arrow (numpy has no
# bfloat16).
STORAGE_VIEW: dict[str, torch.dtype] = {"bfloat16": torch.int16, "float32": torch.float32}
SCALE_BYTES = 4  # float32 scale per token and segment
# top-k ids and probabilities (module docstring)
TOPK_ID_DTYPE, TOPK_PROB_DTYPE = torch.int32, torch.float16
TOPK_BYTES = 4 + 2  # per stored (id, probability)
# Bytes per token outside the hidden states: input_ids int32 + loss_mask uint8.
TOKEN_OVERHEAD_BYTES = 5

# One stored value viewed in place: (values [T, width] in the stored dtype, scales [T, segments]
# float32 or None), or for the top-k (ids [T, k] int32, probs [T, k] float16).
Encoded = tuple[torch.Tensor, torch.Tensor | None]


@dataclass(frozen=True)
class ColumnCodec:
    """The stored form of one hidden-state column: ``width`` values per token, raw in ``dtype`` or
    fp8 with ``segments`` scales per token (each scale covers ``width // segments`` consecutive
    values)."""

    dtype: str
    width: int
    segments: int
    fp8: bool

    @property
    def bytes_per_token(self) -> int:
        if self.fp8:
            return self.width + SCALE_BYTES * self.segments
        return self.width * torch.empty((), dtype=TORCH_DTYPES[self.dtype]).element_size()

    def encode(self, x: torch.Tensor) -> bytes:
        """The stored bytes of ``x [T, width]``: its ``stored`` form, joined (``host_buffer``)."""
        return host_buffer(*(part.cpu() for part in self.stored(x))).to_pybytes()

    def stored(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``x [T, width]`` in its stored form on ``x``'s device (the GPU when capturing there,
        where fp8 quantizes): ``(values,)`` in ``dtype``, or ``(scales, values)`` for fp8."""
        if not self.fp8:
            return (x.detach().to(TORCH_DTYPES[self.dtype]).contiguous(),)
        values, scales = quantize(x.detach(), self.segments)
        return scales, values

    def views(self, column: pa.ChunkedArray | pa.Array) -> list[Encoded]:
        """Each value of ``column`` viewed in place (``torch.frombuffer`` over the Arrow buffer,
        kept alive by the tensors): read-only views, copy before writing into them."""
        return _views(column, self.bytes_per_token, self._value_view, self.describe)

    def _value_view(self, data: pa.Buffer, start: int, tokens: int) -> Encoded:
        if not self.fp8:
            flat = torch.frombuffer(
                data, dtype=STORAGE_VIEW[self.dtype], count=tokens * self.width, offset=start
            )
            return flat.view(TORCH_DTYPES[self.dtype]).view(tokens, self.width), None
        n_scales = tokens * self.segments
        scales = torch.frombuffer(data, dtype=torch.float32, count=n_scales, offset=start)
        values = torch.frombuffer(
            data,
            dtype=torch.uint8,
            count=tokens * self.width,
            offset=start + SCALE_BYTES * n_scales,
        )
        return values.view(FP8).view(tokens, self.width), scales.view(tokens, self.segments)

    def describe(self) -> str:
        return f"fp8 x{self.segments} scales" if self.fp8 else self.dtype


@dataclass(frozen=True)
class TopKCodec:
    """The stored form of the target's top-``k`` next-token distribution: per token ``k`` int32 ids
    then ``k`` float16 probabilities (module docstring); a value views as ``(ids [T, k] int32, probs
    [T, k] float16)``."""

    k: int

    @property
    def bytes_per_token(self) -> int:
        return TOPK_BYTES * self.k

    def encode(self, ids: torch.Tensor, probs: torch.Tensor) -> bytes:
        """The stored bytes of ``ids [T, k]`` and ``probs [T, k]``
        (``eagle3.capture.head.target_topk``)."""
        return host_buffer(*(part.cpu() for part in self.stored(ids, probs))).to_pybytes()

    def stored(self, ids: torch.Tensor, probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ids int32, probs float16)`` on their device."""
        if ids.shape != probs.shape or ids.shape[-1] != self.k:
            raise ValueError(
                f"top-k ids {tuple(ids.shape)} / probs {tuple(probs.shape)} do not have k={self.k}"
            )
        return ids.detach().to(TOPK_ID_DTYPE).contiguous(), probs.detach().to(
            TOPK_PROB_DTYPE
        ).contiguous()

    def views(self, column: pa.ChunkedArray | pa.Array) -> list[Encoded]:
        """Each value of ``column`` as ``(ids, probs)`` views of the Arrow buffer (read-only, like
        ``ColumnCodec``)."""
        return _views(column, self.bytes_per_token, self._value_view, self.describe)

    def _value_view(self, data: pa.Buffer, start: int, tokens: int) -> Encoded:
        n = tokens * self.k
        ids = torch.frombuffer(data, dtype=TOPK_ID_DTYPE, count=n, offset=start)
        probs = torch.frombuffer(data, dtype=torch.int16, count=n, offset=start + 4 * n).view(
            TOPK_PROB_DTYPE
        )
        return ids.view(tokens, self.k), probs.view(tokens, self.k)

    def describe(self) -> str:
        return f"top-{self.k} int32 ids + float16 probs"


# the final-state column: the state itself, or the target's top-k
FinalCodec = ColumnCodec | TopKCodec


def host_buffer(*parts: torch.Tensor) -> pa.Buffer:
    """A stored value's bytes (``stored``'s parts, once on the CPU), one part after the other, as an
    Arrow buffer: over the tensor itself for one part (no copy; the buffer keeps it alive), one
    concatenation for several. The capture writer builds its columns from these: ``tobytes()`` per
    part, the join and Arrow's copy into the column made three copies of every state byte on the one
    writer thread (BENCHMARKS.md, "Capture writer")."""
    flat = [part.contiguous().view(-1).view(torch.uint8) for part in parts]
    joined = flat[0] if len(flat) == 1 else torch.cat(flat)
    return pa.py_buffer(joined.numpy())


def _views(
    column: pa.ChunkedArray | pa.Array,
    per_token: int,
    view: Callable[[pa.Buffer, int, int], Encoded],
    describe: Callable[[], str],
) -> list[Encoded]:
    """``view(data buffer, byte offset, tokens)`` of each binary value of ``column``, checked to
    hold whole tokens."""
    out: list[Encoded] = []
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    with warnings.catch_warnings():  # Arrow buffers are read-only; the views are never written to
        warnings.simplefilter("ignore", UserWarning)
        for chunk in chunks:
            if len(chunk) == 0:
                continue
            _validity, offsets_buf, data = chunk.buffers()
            offsets = memoryview(offsets_buf).cast("i")[
                chunk.offset : chunk.offset + len(chunk) + 1
            ]
            for start, end in itertools.pairwise(offsets):
                if end == start or (end - start) % per_token:
                    raise ValueError(
                        f"feature value of {end - start} bytes is not a whole number of "
                        f"{per_token}-byte tokens ({describe()})"
                    )
                out.append(view(data, start, (end - start) // per_token))
    return out


def column_codecs(
    encoding: str, dtype: str, hidden_size: int, *, topk: int | None = None
) -> tuple[ColumnCodec, FinalCodec]:
    """(aux codec ``[T, 3H]``, final-state codec: ``[T, H]``, or the top-``topk`` for ``fp8_topk``);
    an unknown name lists the known."""
    if encoding not in ENCODINGS:
        raise ValueError(
            f"unknown feature encoding {encoding!r}: set capture.encoding to one of {list(ENCODINGS)}"
        )
    if dtype not in TORCH_DTYPES:
        raise ValueError(f"feature dtype {dtype!r} is not one of {sorted(TORCH_DTYPES)}")
    aux = ColumnCodec(dtype, 3 * hidden_size, 3, fp8=encoding != "raw")
    if encoding == TOPK_ENCODING:
        if topk is None or topk < 1:
            raise ValueError(
                f"encoding {encoding!r} needs k >= 1 (got {topk}): set capture.topk, e.g. 256"
            )
        return aux, TopKCodec(topk)
    return aux, ColumnCodec(dtype, hidden_size, 1, fp8=encoding == "fp8_all")


def encoding_topk(encoding: str, topk: int) -> int | None:
    """The k an encoding stores (``capture.topk`` for ``fp8_topk``), None for encodings that store
    no top-k."""
    return topk if encoding == TOPK_ENCODING else None


def bytes_per_token(encoding: str, dtype: str, hidden_size: int, *, topk: int | None = None) -> int:
    """Uncompressed feature bytes per token: both state columns plus input_ids and loss_mask."""
    aux, last = column_codecs(encoding, dtype, hidden_size, topk=topk)
    return aux.bytes_per_token + last.bytes_per_token + TOKEN_OVERHEAD_BYTES


def quantize(x: torch.Tensor, segments: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., W]`` -> (fp8 values ``[..., W]``, float32 scales ``[..., segments]``), ``scale =
    amax / 448`` per segment so the largest magnitude maps to fp8's largest finite value (an
    all-zero segment keeps scale 1)."""
    parts = x.float().unflatten(-1, (segments, -1))  # [..., W] -> [..., S, W/S]
    amax = parts.abs().amax(dim=-1)  # [..., S]
    scales = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    values = (parts / scales.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8).flatten(-2)
    return values, scales


def dequantize(values: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp8 ``values [..., W]`` times ``scales [..., S]`` (each over ``W/S`` values) -> ``[..., W]``
    in ``dtype``."""
    # [..., W] -> [..., S, W/S]
    parts = fp8_as_half(values).float().unflatten(-1, (scales.shape[-1], -1))
    return (parts * (scales * 2.0**8).unsqueeze(-1)).flatten(-2).to(dtype)


def fp8_as_half(values: torch.Tensor) -> torch.Tensor:
    """e4m3 values as float16, each exactly ``value * 2**-8``, by moving the bits: sign to bit 15,
    exponent and mantissa (7 bits) to bits 7-13. The exponent biases differ by 8 (7 vs 15) and e4m3
    subnormals land on fp16 subnormals, so every finite e4m3 value maps exactly. Why: torch's own
    fp8 -> float conversion is a scalar loop on CPU (~2x slower than these three vector integer
    ops); fp16 -> float32 is a vector instruction."""
    bits = values.view(torch.uint8).to(torch.int16)
    return (((bits & 0x80) << 8) | ((bits & 0x7F) << 7)).view(torch.float16)
