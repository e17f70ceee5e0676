"""The reference server's KV cache appends in place and holds what transformers' concatenating
cache holds."""

from __future__ import annotations

import torch

from eagle3.serve.reference.kv_cache import MIN_CAPACITY, GrowingCache


def test_appending_in_place_holds_what_concatenation_holds_and_grows_rarely():
    gen = torch.Generator().manual_seed(0)
    first = [
        (torch.randn(2, 3, 5, 4, generator=gen), torch.randn(2, 3, 5, 4, generator=gen))
        for _ in range(2)
    ]
    cache = GrowingCache(ddp_cache_data=first)
    expected = [list(kv) for kv in first]
    buffers = {id(cache.layers[0]._keys)}
    for _ in range(3 * MIN_CAPACITY):  # decode steps: one token per layer each
        for layer, kv in enumerate(expected):
            k, v = torch.randn(2, 3, 1, 4, generator=gen), torch.randn(2, 3, 1, 4, generator=gen)
            got_k, got_v = cache.update(k, v, layer)
            kv[0], kv[1] = torch.cat([kv[0], k], dim=2), torch.cat([kv[1], v], dim=2)
            assert torch.equal(got_k, kv[0]) and torch.equal(got_v, kv[1])
        buffers.add(id(cache.layers[0]._keys))
    assert cache.get_seq_length() == 5 + 3 * MIN_CAPACITY
    assert (
        len(buffers) <= 4
    )  # a quarter more room at each growth: a handful of copies, not one per token
    assert [torch.equal(k, e[0]) for (k, _, _), e in zip(cache, expected, strict=True)] == [
        True,
        True,
    ]


def test_an_empty_cache_fills_its_layers_on_the_first_forward():
    cache = GrowingCache()
    keys, values = cache.update(torch.ones(1, 2, 7, 4), torch.zeros(1, 2, 7, 4), 0)
    assert keys.shape == (1, 2, 7, 4) and cache.get_seq_length() == 7 and float(values.sum()) == 0.0
