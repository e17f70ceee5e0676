"""A KV cache that appends in place: the reference server's decode without a copy of the whole cache
per token.

transformers' ``DynamicLayer`` appends a decode step's keys and values with ``torch.cat``, which
copies every cached token of every layer at every step: on SmolLM2-135M (30 layers, float32, 46 KB
of keys and values a token) a batch of 16 sequences 1,000 tokens long copies ~740 MB per generated
token, and a decode step measured 1.3x slower than appending in place (B 16, L 1,024, one thread).
``GrowingLayer`` keeps each layer's keys and values in a buffer with room to spare (a quarter more
when full: amortised O(1) per token) and hands attention views of the filled part; SGLang's paged
pool copies nothing either.

``GrowingCache`` is a transformers ``Cache`` of such layers, built empty or from per-layer ``(keys,
values)`` as ``DynamicCache(ddp_cache_data=...)`` is, and iterated the same way, so ``HFEngine``
uses it in its place.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

MIN_CAPACITY = 64  # tokens of room a buffer gets at least when it grows


class GrowingLayer(DynamicLayer):
    """One layer's keys and values ``[B, kv_heads, capacity, D]``, filled up to ``length``."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None
        self._length = 0

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self._length + key_states.shape[-2]
        if self._keys is None or end > self._keys.shape[-2]:
            self._grow(key_states, value_states, end + max(end // 4, MIN_CAPACITY))
        assert self._keys is not None and self._values is not None
        self._keys[:, :, self._length : end] = key_states  # [B, kv, new, D] written in place
        self._values[:, :, self._length : end] = value_states
        self._length = end
        self.keys, self.values = self._keys[:, :, :end], self._values[:, :, :end]  # views, no copy
        return self.keys, self.values

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, capacity: int) -> None:
        batch, heads, _, dim = key_states.shape
        keys = key_states.new_empty(batch, heads, capacity, dim)
        values = value_states.new_empty(
            batch, value_states.shape[1], capacity, value_states.shape[3]
        )
        if self._keys is not None and self._values is not None and self._length:
            keys[:, :, : self._length] = self._keys[:, :, : self._length]
            values[:, :, : self._length] = self._values[:, :, : self._length]
        self._keys, self._values = keys, values

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError(
            "GrowingLayer is rebuilt, never cropped: build a new GrowingCache instead"
        )

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError(
            "GrowingLayer is rebuilt, never re-indexed: build a new GrowingCache instead"
        )


class GrowingCache(Cache):
    """A ``Cache`` of ``GrowingLayer`` (module docstring); ``ddp_cache_data``: per-layer
    ``(keys, values)``."""

    def __init__(
        self, ddp_cache_data: Iterable[tuple[torch.Tensor, torch.Tensor]] | None = None
    ) -> None:
        layers: list[GrowingLayer] = []
        for keys, values in ddp_cache_data or ():
            layer = GrowingLayer()
            layer.update(keys, values)
            layers.append(layer)
        if layers:
            super().__init__(layers=layers)
        else:
            super().__init__(layer_class_to_replicate=GrowingLayer)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, None]]:
        for layer in self.layers:
            yield layer.keys, layer.values, None
