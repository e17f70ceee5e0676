"""The torch attention ops against what SGLang's Triton decode/extend attention kernels compute.

The ops are called through ``torch.ops.sgl_kernel`` with the positional arguments
``IntelAMXAttnBackend`` passes; the reference is a loop over requests, query tokens and heads, with
the softmax written out.
"""

from __future__ import annotations

import math

import pytest
import torch

from eagle3.serve.sglang_cpu import attention
from eagle3.serve.sglang_cpu.kernels import NotPortedError

HEADS, KV_HEADS, DIM, SLOTS, POOL = 4, 2, 8, 64, 16


@pytest.fixture(scope="module", autouse=True)
def ops() -> None:
    attention.register()


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def _cache(gen: torch.Generator, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    k_buffer = torch.randn(SLOTS, KV_HEADS, DIM, generator=gen).to(dtype)
    v_buffer = torch.randn(SLOTS, KV_HEADS, DIM, generator=gen).to(dtype)
    req_to_token = torch.randperm(SLOTS, generator=gen)[: 3 * POOL].to(torch.int32).view(3, POOL)
    return k_buffer, v_buffer, req_to_token


def _reference(q, keys, values, visible, sm_scale, logit_cap) -> torch.Tensor:
    """One query token [H, D] over keys/values [N, Hkv, D] where visible[n]; head h reads kv head h
    // group."""
    out = torch.zeros(q.shape[0], values.shape[-1])
    for h in range(q.shape[0]):
        kv = h // (q.shape[0] // keys.shape[1])
        scores = []
        for n in range(keys.shape[0]):
            s = float(q[h].double() @ keys[n, kv].double()) * sm_scale
            scores.append(logit_cap * math.tanh(s / logit_cap) if logit_cap > 0 else s)
        top = max(s for s, v in zip(scores, visible, strict=True) if v)
        weights = [math.exp(s - top) if v else 0.0 for s, v in zip(scores, visible, strict=True)]
        for n, w in enumerate(weights):
            out[h] += w / sum(weights) * values[n, kv].float()
    return out


@pytest.mark.parametrize("logit_cap", [0.0, 1.5])
def test_decode_attention_writes_the_new_kv_then_attends_over_each_requests_tokens(gen, logit_cap):
    k_buffer, v_buffer, req_to_token = _cache(gen)
    rows, lens = torch.tensor([2, 0]), torch.tensor([5, 11])
    query, key, value = (torch.randn(2, h, DIM, generator=gen) for h in (HEADS, KV_HEADS, KV_HEADS))
    # each request's newest token
    loc = torch.stack([req_to_token[2, 4], req_to_token[0, 10]]).long()
    output = torch.empty_like(query)
    expected_k, expected_v = k_buffer.clone(), v_buffer.clone()
    expected_k[loc], expected_v[loc] = key, value

    torch.ops.sgl_kernel.decode_attention_cpu(
        query,
        k_buffer,
        v_buffer,
        1.0,
        1.0,
        output,
        key,
        value,
        loc,
        torch.zeros(2, HEADS, 8, DIM + 1),
        req_to_token,
        rows,
        lens,
        0.3,
        logit_cap,
        False,
        0,
        None,
        None,
    )

    assert torch.equal(k_buffer, expected_k) and torch.equal(v_buffer, expected_v)
    for i in range(2):
        slots = req_to_token[rows[i], : lens[i]].long()
        want = _reference(
            query[i], expected_k[slots], expected_v[slots], [True] * int(lens[i]), 0.3, logit_cap
        )
        torch.testing.assert_close(output[i], want, rtol=1e-5, atol=1e-5)


def _extend(gen, *, tree_mask=None, is_causal=True, dtype=torch.float32, logit_cap=0.0):
    k_buffer, v_buffer, req_to_token = _cache(gen, dtype)
    rows, seq_lens = torch.tensor([1, 2]), torch.tensor([7, 4])
    extend_lens, starts = (
        torch.tensor([3, 4], dtype=torch.int32),
        torch.tensor([0, 3], dtype=torch.int32),
    )
    q, k, v = (torch.randn(7, h, DIM, generator=gen).to(dtype) for h in (HEADS, KV_HEADS, KV_HEADS))
    out = torch.empty_like(q)
    torch.ops.sgl_kernel.extend_attention_cpu(
        q,
        k,
        v,
        out,
        k_buffer,
        v_buffer,
        1.0,
        1.0,
        req_to_token,
        rows,
        seq_lens,
        extend_lens,
        starts,
        4,
        0.25,
        logit_cap,
        False,
        0,
        None,
        None,
        tree_mask,
        is_causal,
    )
    return out, (q, k, v, k_buffer, v_buffer, req_to_token, rows, seq_lens, extend_lens, starts)


def _extend_reference(inputs, visible_of, logit_cap=0.0) -> torch.Tensor:
    q, k, v, k_buffer, v_buffer, req_to_token, rows, seq_lens, extend_lens, starts = inputs
    out = torch.empty(q.shape[0], HEADS, DIM)
    for b in range(2):
        extend, start = int(extend_lens[b]), int(starts[b])
        prefix = int(seq_lens[b]) - extend
        slots = req_to_token[rows[b], :prefix].long()
        keys, values = (
            torch.cat([k_buffer[slots], k[start : start + extend]]),
            torch.cat([v_buffer[slots], v[start : start + extend]]),
        )
        for j in range(extend):
            visible = [visible_of(b, prefix, j, n) for n in range(prefix + extend)]
            out[start + j] = _reference(q[start + j], keys, values, visible, 0.25, logit_cap)
    return out


@pytest.mark.parametrize("logit_cap", [0.0, 2.0])
def test_extend_attention_sees_the_cached_prefix_and_the_new_tokens_causally(gen, logit_cap):
    out, inputs = _extend(gen, logit_cap=logit_cap)

    want = _extend_reference(inputs, lambda b, prefix, j, n: n <= prefix + j, logit_cap)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_extend_attention_without_causality_sees_every_token(gen):
    out, inputs = _extend(gen, is_causal=False)

    torch.testing.assert_close(
        out, _extend_reference(inputs, lambda *_: True), rtol=1e-5, atol=1e-5
    )


def test_extend_attention_sees_the_prefix_and_follows_the_tree_mask_packed_per_request(gen):
    # QLEN_ONLY blocks; the buffer may be longer
    tree_mask = torch.rand(3 * 3 + 4 * 4 + 5, generator=gen) < 0.5
    offsets = [0, 3 * 3]
    tree_mask[[0, 4, 8, 9, 14, 19, 24]] = True  # as in a real tree, every node sees itself

    out, inputs = _extend(gen, tree_mask=tree_mask)

    lens = inputs[8]
    want = _extend_reference(
        inputs, lambda b, p, j, n: n < p or bool(tree_mask[offsets[b] + j * int(lens[b]) + n - p])
    )
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_extend_attention_in_bfloat16_stays_close_to_float32(gen):
    out, inputs = _extend(gen, dtype=torch.bfloat16)

    assert out.dtype == torch.bfloat16
    want = _extend_reference(inputs, lambda b, prefix, j, n: n <= prefix + j)
    torch.testing.assert_close(out.float(), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"sliding_window_size": 9}, "sliding window"),
        ({"sinks": torch.zeros(HEADS)}, "attention sinks"),
        ({"is_cross_attn": True}, "cross-attention"),
        ({"k_scale": 0.5}, "KV scales"),
    ],
)
def test_decode_attention_refuses_what_a_llama_model_does_not_need(gen, change, named):
    k_buffer, v_buffer, req_to_token = _cache(gen)
    args = {
        "query": torch.randn(1, HEADS, DIM),
        "k_buffer": k_buffer,
        "v_buffer": v_buffer,
        "k_scale": 1.0,
        "v_scale": 1.0,
        "output": torch.empty(1, HEADS, DIM),
        "key": None,
        "value": None,
        "loc": torch.tensor([0]),
        "attn_logits": torch.empty(0),
        "req_to_token": req_to_token,
        "req_pool_indices": torch.tensor([0]),
        "seq_lens": torch.tensor([3]),
        "sm_scale": 0.3,
        "logit_cap": 0.0,
        "is_cross_attn": False,
        "sliding_window_size": 0,
        "encoder_lens": None,
        "sinks": None,
    }

    with pytest.raises(NotPortedError, match=named):
        torch.ops.sgl_kernel.decode_attention_cpu(*{**args, **change}.values())


def test_register_defines_the_ops_once_per_process():
    assert attention.register() is attention.register()
    assert hasattr(torch.ops.sgl_kernel, "decode_attention_cpu")
    assert hasattr(torch.ops.sgl_kernel, "extend_attention_cpu")
