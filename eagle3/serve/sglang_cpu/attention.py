"""``torch.ops.sgl_kernel.{decode,extend}_attention_cpu`` for SGLang 0.5.23's ``intel_amx`` backend,
in torch.

Kernels ported to CPU so that SGLang's real serving stack runs here (see the package docstring),
pinned to the release in ``SGLANG_VERSION``: the positional signatures are the ones
``IntelAMXAttnBackend.forward_decode`` / ``forward_extend``
(srt/layers/attention/intel_amx_backend.py) call. The computation is the one of SGLang's Triton
kernels for the same jobs (kernels/ops/attention/decode_attention.py and extend_attention.py): per
request, the keys are the cached tokens ``req_to_token[req_pool_indices[i], :len]``, scores are
scaled by ``sm_scale``, soft-capped by ``logit_cap`` when it is positive, masked, softmaxed in
float32 and applied to the values; grouped-query heads share their key-value head. The output is
written in place in the query's dtype.

Decode: one query token per request; when ``key``/``value`` are given they are first written into
the KV cache at ``loc`` (the backend leaves that write to the kernel). ``attn_logits`` is the C++
kernel's split-KV scratch: this port computes each request in one pass and leaves it untouched.

Extend: request i's queries are ``extend_seq_lens[i]`` tokens from ``extend_start_loc[i]``; its keys
are the cached prefix (``seq_lens[i] - extend_seq_lens[i]`` tokens) then its own new
``k_extend``/``v_extend`` rows. The prefix is always visible; among the new tokens the mask is
causal (or none when ``is_causal`` is false), or, for a speculative tree, ``tree_mask``: a boolean
``[extend, extend]`` block per request, packed in batch order (the ``QLEN_ONLY`` layout that
``build_tree_kernel_efficient`` writes on CPU; the buffer may be longer than the batch needs).

What a Llama target and its EAGLE-3 draft need is ported; the rest is refused with an error naming
it: sliding windows, attention sinks, cross-attention and encoder lengths, fp8 KV caches, KV-shared
layers (no new k/v).
"""

from __future__ import annotations

import torch

from eagle3.serve.sglang_cpu.kernels import NotPortedError

DECODE_SCHEMA = (
    "decode_attention_cpu(Tensor query, Tensor(a!) k_buffer, Tensor(b!) v_buffer, float k_scale, float v_scale, "
    "Tensor(c!) output, Tensor? key, Tensor? value, Tensor loc, Tensor(d!) attn_logits, Tensor req_to_token, "
    "Tensor req_pool_indices, Tensor seq_lens, float sm_scale, float logit_cap, bool is_cross_attn, "
    "int sliding_window_size, Tensor? encoder_lens, Tensor? sinks) -> ()"
)
EXTEND_SCHEMA = (
    "extend_attention_cpu(Tensor q_extend, Tensor? k_extend, Tensor? v_extend, Tensor(a!) o_extend, Tensor k_buffer, "
    "Tensor v_buffer, float k_scale, float v_scale, Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, "
    "Tensor extend_seq_lens, Tensor extend_start_loc, int max_len_extend, float sm_scale, float logit_cap, "
    "bool is_cross_attn, int sliding_window_size, Tensor? encoder_lens, Tensor? sinks, Tensor? tree_mask, "
    "bool is_causal) -> ()"
)
_LIBRARY: list[torch.library.Library] = []


def _refuse_unported(
    *,
    op: str,
    k_buffer: torch.Tensor,
    scales: tuple[float, float],
    is_cross_attn: bool,
    window: int,
    encoder_lens,
    sinks,
) -> None:
    unported = {
        "cross-attention": is_cross_attn,
        "encoder lengths": encoder_lens is not None,
        "attention sinks": sinks is not None,
        f"a sliding window ({window - 1} tokens)": window > 0,
        f"a {k_buffer.dtype} KV cache": not k_buffer.dtype.is_floating_point
        or k_buffer.element_size() < 2,
        f"KV scales {scales}": scales != (1.0, 1.0),
    }
    found = [name for name, present in unported.items() if present]
    if found:
        raise NotPortedError(
            f"sgl_kernel.{op} (torch port for SGLang on CPU) does not cover {', '.join(found)}: "
            "serve a plain Llama-style model, or run SGLang with its compiled CPU kernels"
        )


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    visible: torch.Tensor | None,
    sm_scale: float,
    logit_cap: float,
) -> torch.Tensor:
    """softmax(q k^T * scale) v per head. q [M, H, D], k [N, Hkv, D], v [N, Hkv, Dv], visible [M, N]
    -> [M, H, Dv]."""
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)  # [N, Hkv, D] -> [N, H, D]
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("mhd,nhd->hmn", q.float(), k) * sm_scale  # [H, M, N]
    if logit_cap > 0:
        scores = logit_cap * torch.tanh(scores / logit_cap)
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    return torch.einsum("hmn,nhd->mhd", scores.softmax(dim=-1), v)  # [M, H, Dv]


def decode_attention_cpu(
    query: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    k_scale: float,
    v_scale: float,
    output: torch.Tensor,
    key: torch.Tensor | None,
    value: torch.Tensor | None,
    loc: torch.Tensor,
    attn_logits: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    logit_cap: float,
    is_cross_attn: bool,
    sliding_window_size: int,
    encoder_lens: torch.Tensor | None,
    sinks: torch.Tensor | None,
) -> None:
    """One decode step: write the new k/v at ``loc`` (when given), then attend over each request's
    cached tokens."""
    _refuse_unported(
        op="decode_attention_cpu",
        k_buffer=k_buffer,
        scales=(k_scale, v_scale),
        is_cross_attn=is_cross_attn,
        window=sliding_window_size,
        encoder_lens=encoder_lens,
        sinks=sinks,
    )
    if key is not None:
        slots = loc.reshape(-1).long()
        k_buffer[slots] = key.to(k_buffer.dtype)
        v_buffer[slots] = value.to(v_buffer.dtype)
    # The whole batch at once (a handful of ops per layer, not per request): each request's cached
    # tokens padded to the longest, the padding masked out.
    lens = seq_lens.long()
    width = int(lens.max())
    visible = torch.arange(width, device=lens.device)[None, :] < lens[:, None]  # [B, W]
    # [B, W] KV slots
    table = req_to_token[req_pool_indices.long(), :width].long().masked_fill(~visible, 0)
    # [B, W, Hkv, D], [B, W, Hkv, Dv]
    keys, values = k_buffer[table].float(), v_buffer[table].float()
    batch, heads, dim = query.shape
    groups = heads // keys.shape[2]  # query head h reads key-value head h // groups
    q = query.float().view(batch, keys.shape[2], groups, dim)  # [B, Hkv, G, D]
    scores = torch.einsum("bkgd,bwkd->bkgw", q, keys) * sm_scale  # [B, Hkv, G, W]
    if logit_cap > 0:
        scores = logit_cap * torch.tanh(scores / logit_cap)
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    out = torch.einsum("bkgw,bwkd->bkgd", scores.softmax(dim=-1), values)  # [B, Hkv, G, Dv]
    output.copy_(out.reshape(batch, heads, -1).to(output.dtype))


def extend_attention_cpu(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor | None,
    v_extend: torch.Tensor | None,
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    k_scale: float,
    v_scale: float,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    max_len_extend: int,
    sm_scale: float,
    logit_cap: float,
    is_cross_attn: bool,
    sliding_window_size: int,
    encoder_lens: torch.Tensor | None,
    sinks: torch.Tensor | None,
    tree_mask: torch.Tensor | None,
    is_causal: bool,
) -> None:
    """Prefill, chunked prefill and speculative verify: each request's new tokens over its prefix
    and themselves."""
    _refuse_unported(
        op="extend_attention_cpu",
        k_buffer=k_buffer,
        scales=(k_scale, v_scale),
        is_cross_attn=is_cross_attn,
        window=sliding_window_size,
        encoder_lens=encoder_lens,
        sinks=sinks,
    )
    if k_extend is None or v_extend is None:
        raise NotPortedError(
            "sgl_kernel.extend_attention_cpu (torch port) needs the new tokens' k and v"
        )
    mask_start = 0
    batch = zip(
        req_pool_indices.tolist(),
        seq_lens.tolist(),
        extend_seq_lens.tolist(),
        extend_start_loc.tolist(),
        strict=True,
    )
    for row, length, extend, start in batch:
        prefix = length - extend
        slots = req_to_token[row, :prefix].long()
        new = slice(start, start + extend)
        # [prefix + extend, Hkv, D]
        k = torch.cat([k_buffer[slots].to(k_extend.dtype), k_extend[new]])
        v = torch.cat([v_buffer[slots].to(v_extend.dtype), v_extend[new]])
        if tree_mask is not None:  # the draft tree's [extend, extend] block, after the prefix
            block = (
                tree_mask.reshape(-1)[mask_start : mask_start + extend * extend]
                .view(extend, extend)
                .bool()
            )
            visible = torch.cat([torch.ones(extend, prefix, dtype=torch.bool), block], dim=1)
            mask_start += extend * extend
        elif is_causal:  # query j sits at position prefix + j and sees keys 0..prefix + j
            visible = torch.arange(length)[None, :] <= prefix + torch.arange(extend)[:, None]
        else:
            visible = None
        out = _attend(q_extend[new], k, v, visible, sm_scale, logit_cap)
        o_extend[new] = out.to(o_extend.dtype)


def register() -> torch.library.Library:
    """Define the two ops under ``torch.ops.sgl_kernel`` (once per process) and return the library
    that holds them."""
    if not _LIBRARY:
        library = torch.library.Library("sgl_kernel", "DEF")
        library.define(DECODE_SCHEMA)
        library.define(EXTEND_SCHEMA)
        library.impl("decode_attention_cpu", decode_attention_cpu, "CPU")
        library.impl("extend_attention_cpu", extend_attention_cpu, "CPU")
        _LIBRARY.append(library)
    return _LIBRARY[0]
