"""How hidden states are stored in a feature shard's binary columns (``capture.encoding``, footer ``encoding``).

* ``raw``: the capture dtype's little-endian bytes (``seq_len x width``), 2 bytes per value in bf16: 8*H bytes per
  token for the aux (3H) and final (H) states, today's layout and the field's per-sample ``.ckpt`` size.
* ``fp8_aux``: the aux states as float8 e4m3 with one float32 scale per token and per captured layer (the residual
  stream grows with depth, so each layer's H slice gets its own ``amax / 448``); the final state stays raw. The
  draft consumes aux states only through its ``fc`` projection, so 3 significant bits plus a per-token scale cost
  little, and the final state, which becomes the target distribution through ``lm_head``, keeps its precision.
* ``fp8_all``: the final state in fp8 too (one scale per token).

An fp8 value is ``scales (seq_len x segments float32) | values (seq_len x width float8)``, so one row stays one
binary value (the feature schema does not change) and a reader views both parts in place. Decoding
(``dequantize``) is a multiply per element, done where the batch is consumed: on the GPU when training there.
"""

from __future__ import annotations

import itertools
import warnings
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa
import torch

Encoding = Literal["raw", "fp8_aux", "fp8_all"]
ENCODINGS: tuple[str, ...] = ("raw", "fp8_aux", "fp8_all")
FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
TORCH_DTYPES: dict[str, torch.dtype] = {"bfloat16": torch.bfloat16, "float32": torch.float32}
# The integer dtype of the same width, used to move bf16 through numpy/arrow (numpy has no bfloat16).
STORAGE_VIEW: dict[str, torch.dtype] = {"bfloat16": torch.int16, "float32": torch.float32}
SCALE_BYTES = 4  # float32 scale per token and segment
# Bytes per token outside the hidden states: input_ids int32 + loss_mask uint8.
TOKEN_OVERHEAD_BYTES = 5

# One stored value viewed in place: (values [T, width] in the stored dtype, scales [T, segments] float32 or None).
Encoded = tuple[torch.Tensor, torch.Tensor | None]


@dataclass(frozen=True)
class ColumnCodec:
    """The stored form of one hidden-state column: ``width`` values per token, raw in ``dtype`` or fp8 with
    ``segments`` scales per token (each scale covers ``width // segments`` consecutive values)."""

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
        """The stored bytes of ``x [T, width]``; fp8 quantizes on ``x``'s device (the GPU when capturing there)."""
        if not self.fp8:
            x = x.detach().to(device="cpu", dtype=TORCH_DTYPES[self.dtype]).contiguous()
            return x.view(STORAGE_VIEW[self.dtype]).numpy().tobytes()
        values, scales = quantize(x.detach(), self.segments)
        return scales.cpu().numpy().tobytes() + values.view(torch.uint8).cpu().numpy().tobytes()

    def views(self, column: pa.ChunkedArray | pa.Array) -> list[Encoded]:
        """Each value of ``column`` viewed in place (``torch.frombuffer`` over the Arrow buffer, kept alive by the
        tensors): read-only views, copy before writing into them."""
        out: list[Encoded] = []
        chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        with warnings.catch_warnings():  # Arrow buffers are read-only; the views are never written to
            warnings.simplefilter("ignore", UserWarning)
            for chunk in chunks:
                out += self._chunk_views(chunk)
        return out

    def _chunk_views(self, chunk: pa.Array) -> list[Encoded]:
        if len(chunk) == 0:
            return []
        _validity, offsets_buf, data = chunk.buffers()
        offsets = memoryview(offsets_buf).cast("i")[chunk.offset : chunk.offset + len(chunk) + 1]
        per_token, out = self.bytes_per_token, []
        for start, end in itertools.pairwise(offsets):
            if end == start or (end - start) % per_token:
                raise ValueError(f"hidden-state value of {end - start} bytes is not a whole number of "
                                 f"{per_token}-byte tokens (width {self.width}, encoding {self.describe()})")
            tokens = (end - start) // per_token
            if not self.fp8:
                flat = torch.frombuffer(data, dtype=STORAGE_VIEW[self.dtype], count=tokens * self.width, offset=start)
                out.append((flat.view(TORCH_DTYPES[self.dtype]).view(tokens, self.width), None))
                continue
            n_scales = tokens * self.segments
            scales = torch.frombuffer(data, dtype=torch.float32, count=n_scales, offset=start)
            values = torch.frombuffer(data, dtype=torch.uint8, count=tokens * self.width,
                                      offset=start + SCALE_BYTES * n_scales)
            out.append((values.view(FP8).view(tokens, self.width), scales.view(tokens, self.segments)))
        return out

    def describe(self) -> str:
        return f"fp8 x{self.segments} scales" if self.fp8 else self.dtype


def column_codecs(encoding: str, dtype: str, hidden_size: int) -> tuple[ColumnCodec, ColumnCodec]:
    """(aux codec ``[T, 3H]``, final-state codec ``[T, H]``) of an encoding; an unknown name lists the known."""
    if encoding not in ENCODINGS:
        raise ValueError(f"unknown feature encoding {encoding!r}: set capture.encoding to one of {list(ENCODINGS)}")
    if dtype not in TORCH_DTYPES:
        raise ValueError(f"feature dtype {dtype!r} is not one of {sorted(TORCH_DTYPES)}")
    aux = ColumnCodec(dtype, 3 * hidden_size, 3, fp8=encoding != "raw")
    last = ColumnCodec(dtype, hidden_size, 1, fp8=encoding == "fp8_all")
    return aux, last


def bytes_per_token(encoding: str, dtype: str, hidden_size: int) -> int:
    """Uncompressed feature bytes per token: both state columns plus input_ids and loss_mask."""
    aux, last = column_codecs(encoding, dtype, hidden_size)
    return aux.bytes_per_token + last.bytes_per_token + TOKEN_OVERHEAD_BYTES


def quantize(x: torch.Tensor, segments: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., W]`` -> (fp8 values ``[..., W]``, float32 scales ``[..., segments]``), ``scale = amax / 448`` per
    segment so the largest magnitude maps to fp8's largest finite value (an all-zero segment keeps scale 1)."""
    parts = x.float().unflatten(-1, (segments, -1))  # [..., W] -> [..., S, W/S]
    amax = parts.abs().amax(dim=-1)  # [..., S]
    scales = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    values = (parts / scales.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8).flatten(-2)
    return values, scales


def dequantize(values: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp8 ``values [..., W]`` times ``scales [..., S]`` (each over ``W/S`` values) -> ``[..., W]`` in ``dtype``."""
    parts = fp8_as_half(values).float().unflatten(-1, (scales.shape[-1], -1))  # [..., W] -> [..., S, W/S]
    return (parts * (scales * 2.0**8).unsqueeze(-1)).flatten(-2).to(dtype)


def fp8_as_half(values: torch.Tensor) -> torch.Tensor:
    """e4m3 values as float16, each exactly ``value * 2**-8``, by moving the bits: sign to bit 15, exponent and
    mantissa (7 bits) to bits 7-13. The exponent biases differ by 8 (7 vs 15) and e4m3 subnormals land on fp16
    subnormals, so every finite e4m3 value maps exactly. Why: torch's own fp8 -> float conversion is a scalar loop
    on CPU (~2x slower than these three vector integer ops); fp16 -> float32 is a vector instruction."""
    bits = values.view(torch.uint8).to(torch.int16)
    return (((bits & 0x80) << 8) | ((bits & 0x7F) << 7)).view(torch.float16)
