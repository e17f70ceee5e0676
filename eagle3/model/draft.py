"""The EAGLE-3 draft head: architecture only (loss, parallelism, export and loading live elsewhere).

Design choices (docs/DESIGN.md, "The draft head", matching SGLang's ``LlamaForCausalLMEagle3``):

* ``fc: Linear(3*H_target -> H, bias=False)`` fuses the target's three aux hidden states
  (low|mid|high). As in SGLang, ``fc`` is applied only when the incoming hidden is not already ``H``
  wide: inside a speculation chain the hidden input is the draft's own previous output (``H`` wide).
  A target hidden of width ``H`` (SGLang's plain ``EAGLE`` algorithm with an EAGLE-3 draft)
  therefore skips ``fc`` silently, which is exactly the misconfiguration the reference decoder's
  ``last_hidden_only`` mode reproduces.
* One decoder layer ``midlayer``: attention input is ``cat([input_layernorm(embed),
  hidden_norm(hidden)])`` (2H); q/k/v project from 2H, ``o_proj`` and the SwiGLU MLP work at H. The
  residual stream is the *hidden* stream, not the embedding: ``r1 = hidden + attn``, ``r2 = r1 +
  mlp(post_attention_layernorm(r1))``. ``r2`` is the pre-norm output: ``lm_head(norm(r2))`` gives
  the draft logits and ``r2`` itself is the hidden input of the next step (TTT/chain).
* Attention shape per target family (``attention_shape``). A Llama-like target gives heads, kv heads
  and ``head_dim`` (or ``H // heads``) directly. A DeepSeek-V2/V3 or Kimi-K2/K2.5 target (multi-head
  latent attention, recognised by ``kv_lora_rank`` in its config) has no plain attention to copy:
  transformers' ``DeepseekV3Config`` sets ``head_dim`` to the RoPE sub-dimension
  ``qk_rope_head_dim`` (64), half the width the draft needs. The draft uses ``num_attention_heads``
  query *and* kv heads of ``v_head_dim`` (128), SpecForge's shape for these targets
  (sgl-project/SpecForge ``configs/kimi-k2-eagle3.json`` and ``configs/kimi-k25-eagle3.json``: 64
  heads, 64 kv heads, ``head_dim`` 128 on ``hidden_size`` 7168).
* EAGLE 3.1 (``fc_norm``, ``norm_output``, ``norm_before_fc``; all off by default = EAGLE-3), as
  SGLang 0.5.23's ``LlamaForCausalLMEagle3`` reads them (``srt/models/llama_eagle3.py``):
  ``norm_before_fc`` one RMSNorm ``input_norm`` over the concatenated ``[3H_t]`` aux states, then
  ``fc_norm`` one RMSNorm ``fc_norm.{0,1,2}`` per ``H_t`` aux chunk (low|mid|high), then ``fc``, in
  that order when both are on (both act only where ``fc`` does). ``norm_output``: the hidden handed
  to the next step (TTT unroll, chain) is the post-norm ``norm(r2)``, the "attention drift" fix of
  EAGLE 3.1, instead of the pre-norm ``r2``; the logits are the same either way.
* ``attention=mla`` (``DraftConfig.attention``) puts DeepSeek's multi-head latent attention in the
  layer instead (``eagle3.model.mla``, SGLang's ``Eagle3DeepseekV2ForCausalLM``); both attentions
  hand ``attend`` per-head keys and values, whose widths may differ (MLA), so every cache below
  serves both.
* Token embeddings come from the frozen target ``embed_tokens`` and are passed in by the caller
  (``input_embeds``), so the (possibly huge) embedding table is never part of the trained, sharded
  or exported module.
* RoPE follows the target's rope settings (``default``, ``linear`` and ``llama3`` scaling are
  implemented; other scalings such as yarn fall back to plain RoPE at the same theta, and the export
  writes ``rope_scaling: null`` so serving computes what training computed).
* Attention uses ``torch.nn.functional.scaled_dot_product_attention`` (GQA through ``enable_gqa``);
  flash-attn is used when the ``gpu`` extra is installed, on CUDA, in half precision (guarded
  import).

Training-time test (TTT) attention. Step 0 runs over the whole sequence with real target features:
position ``t`` holds ``(hidden_t, token_{t+1})`` at RoPE position ``t`` and attends causally to
positions ``<= t``. At unrolled step ``k >= 1`` position ``t`` continues the chain that started at
``t``: it attends to the cached step-0 keys/values at positions ``<= t`` (its real context) plus its
*own* diagonal entries from steps ``1..k`` (its earlier speculative tokens), with RoPE position ``t
+ k``. This is exactly what a chain of ``k`` draft tokens sees at inference after a prefix ending at
  ``t`` (SGLang and ``eagle3.serve.reference.spec_decoder``). The softmax over the union is computed
exactly by merging the step-0 attention (output + log-sum-exp) with the ``k`` diagonal scores, so
memory stays ``O(T^2)`` per step instead of ``O(k T^2)``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger(__name__)

try:  # optional `gpu` extra
    from flash_attn import flash_attn_func as _flash_attn_func
except ImportError:  # pragma: no cover - flash-attn is never installed in CI
    _flash_attn_func = None

SUPPORTED_ROPE = ("default", "linear", "llama3")


@dataclass
class DraftConfig:
    """Shapes and settings of the draft head, derived from the target's HF config."""

    hidden_size: int
    target_hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    vocab_size: int
    draft_vocab_size: int
    rope_scaling: dict[str, Any] | None = None
    hidden_act: str = "silu"
    extra: dict[str, Any] = field(default_factory=dict)
    fc_norm: bool = False  # EAGLE 3.1: RMSNorm per aux chunk before fc (module docstring)
    norm_output: bool = False  # EAGLE 3.1: the next step reads the post-norm hidden
    norm_before_fc: bool = False  # one RMSNorm over the concatenated aux states before fc
    attention: str = "mha"  # "mla": latent attention (eagle3.model.mla), with the sizes below
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None

    @classmethod
    def from_target_config(
        cls,
        target: Any,
        *,
        draft_vocab_size: int,
        max_position_embeddings: int | None = None,
        intermediate_size: int | None = None,
        fc_norm: bool = False,
        norm_output: bool = False,
        norm_before_fc: bool = False,
        attention: str = "mha",
        **mla_sizes: int | None,
    ) -> DraftConfig:
        """Build from a transformers config (or its ``text_config``): H, heads, kv heads, head_dim,
        MLP, eps, rope.

        ``max_position_embeddings`` is raised to at least the target's context; the EAGLE 3.1
        flags and the attention (``mla_sizes``: ``q_lora_rank``... ``v_head_dim``, None for the
        default) are the draft's own choice, not the target's.
        """
        target = getattr(target, "text_config", None) or target
        hidden = int(target.hidden_size)
        heads, kv_heads, head_dim = attention_shape(target)
        mla: dict[str, Any] = {}
        if attention == "mla":
            from eagle3.model.mla import mla_rope_settings, mla_shape

            mla = mla_shape(target, **mla_sizes)
            kv_heads, head_dim = heads, mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"]
            theta, scaling = mla_rope_settings(target)
        elif attention == "mha" and all(v is None for v in mla_sizes.values()):
            theta, scaling = _rope_settings(target)
        else:
            raise ValueError(
                f"attention={attention!r} with sizes {mla_sizes}: use 'mha', or 'mla' with sizes"
            )
        target_ctx = int(getattr(target, "max_position_embeddings", 0) or 0)
        return cls(
            hidden_size=hidden,
            target_hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=int(intermediate_size or target.intermediate_size),
            rms_norm_eps=float(getattr(target, "rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=max(target_ctx, int(max_position_embeddings or 0)) or 4096,
            vocab_size=int(target.vocab_size),
            draft_vocab_size=int(draft_vocab_size),
            fc_norm=fc_norm,
            norm_output=norm_output,
            norm_before_fc=norm_before_fc,
            attention=attention,
            **mla,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def attention_shape(target: Any) -> tuple[int, int, int]:
    """(heads, kv heads, head_dim) of the draft's attention for a transformers target config (module
    docstring)."""
    heads = int(target.num_attention_heads)
    # DeepSeek-V2/V3, Kimi-K2/K2.5: latent attention, SpecForge's shape
    if getattr(target, "kv_lora_rank", None):
        return heads, heads, int(target.v_head_dim)
    kv_heads = int(getattr(target, "num_key_value_heads", None) or heads)
    return (
        heads,
        kv_heads,
        int(getattr(target, "head_dim", None) or int(target.hidden_size) // heads),
    )


def _rope_settings(target: Any) -> tuple[float, dict[str, Any] | None]:
    """(theta, scaling) from either transformers-5 ``rope_parameters`` or legacy
    ``rope_theta``/``rope_scaling``."""
    params = dict(getattr(target, "rope_parameters", None) or {})
    legacy = dict(getattr(target, "rope_scaling", None) or {})
    theta = float(params.get("rope_theta") or getattr(target, "rope_theta", None) or 10000.0)
    scaling = legacy or {k: v for k, v in params.items() if k != "rope_theta"}
    kind = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
    if kind == "default":
        return theta, None
    if kind not in SUPPORTED_ROPE:
        logger.warning(
            "rope_type %r is not implemented for the draft; it uses plain RoPE (theta=%s)",
            kind,
            theta,
        )
        return theta, None
    return theta, {
        "rope_type": kind,
        **{k: v for k, v in scaling.items() if k not in ("rope_type", "type")},
    }


def rope_inv_freq(config: DraftConfig) -> torch.Tensor:
    """Inverse frequencies ``[head_dim/2]`` with linear or Llama-3 scaling applied."""
    dim = config.head_dim
    inv = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", "default")
    if kind == "linear":
        inv = inv / float(scaling["factor"])
    elif kind == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_ctx = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        smooth = ((old_ctx / wavelen) - low) / (high - low)
        scaled = torch.where(wavelen > old_ctx / low, inv / factor, inv)
        mid = (1 - smooth) * inv / factor + smooth * inv
        is_mid = (wavelen <= old_ctx / low) & (wavelen >= old_ctx / high)
        inv = torch.where(is_mid, mid, scaled)
    return inv.float()


def apply_rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [B, heads, S, D]`` by ``positions [B, S]`` (half-split layout, as HF/SGLang
    Llama)."""
    angles = positions.to(inv_freq.dtype)[..., None] * inv_freq  # [B, S] -> [B, S, D/2]
    cos = torch.cat([angles.cos(), angles.cos()], -1)[:, None].to(x.dtype)  # [B, 1, S, D]
    sin = torch.cat([angles.sin(), angles.sin()], -1)[:, None].to(x.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


class DraftKVCache:
    """Keys/values of the draft's single layer for incremental decoding, ``[B, kv_heads, S, D_k]``
    and ``[B, kv_heads, S, D_v]`` (equal widths but for MLA).

    ``key_mask`` (``[B, S]`` bool over every key, including those the next forward appends) lets a
    batch hold rows of different lengths: a batched caller sets it before each forward and False
    keys (left padding) are never attended. None means every key is real (one sequence, or rows of
    equal length).
    """

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.key_mask: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v

    def crop(self, length: int) -> None:
        """Drop everything after the first ``length`` positions (rejected speculative tokens)."""
        if self.k is not None:
            self.k, self.v = self.k[:, :, :length], self.v[:, :, :length]


@dataclass
class TTTCache:
    """Step-0 keys/values (full sequence) plus each later step's keys/values (one per position, the
    diagonal)."""

    k0: torch.Tensor | None = None
    v0: torch.Tensor | None = None
    diag_k: list[torch.Tensor] = field(default_factory=list)
    diag_v: list[torch.Tensor] = field(default_factory=list)


def _expand_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    # [B, kv, S, D] -> [B, kv*g, S, D]
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def _causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    offset: int,
    key_mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Queries at positions ``offset..offset+S-1`` over keys ``0..offset+S-1``; ``[B, h, S, D_v]``.

    ``key_mask [B, total]`` hides padding keys; a query always sees its own key, so a padding
    query's row is never all masked (its output is unused, but an all -inf row would be NaN).
    ``scale`` None is ``1/sqrt(D_k)``; values may be narrower or wider than keys (MLA)."""
    s, total = q.shape[2], k.shape[2]
    half = q.dtype in (torch.float16, torch.bfloat16)
    flash = _flash_attn_func is not None and q.is_cuda and half
    if key_mask is None and flash and k.shape[-1] == v.shape[-1]:
        out = _flash_attn_func(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            causal=True,
            softmax_scale=scale,
        )
        return out.transpose(1, 2)  # flash-attn aligns the causal mask bottom-right, as we need
    groups = q.shape[1] // k.shape[1]
    if key_mask is None and offset == 0 and s == total:
        return F.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=groups > 1, scale=scale
        )
    # [S, total]
    mask = torch.ones(s, total, dtype=torch.bool, device=q.device).tril(diagonal=total - s)
    if key_mask is not None:
        own = torch.zeros(s, total, dtype=torch.bool, device=q.device)
        own[:, total - s :] = torch.eye(s, dtype=torch.bool, device=q.device)
        mask = mask & (key_mask[:, None, None, :].to(q.device) | own)  # [B, 1, S, total]
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, enable_gqa=groups > 1, scale=scale
    )


def _ttt_attention(q: torch.Tensor, cache: TTTCache, scale: float | None = None) -> torch.Tensor:
    """Exact softmax over step-0 keys ``<= t`` and the diagonal keys of steps ``1..k`` for each
    query ``t``."""
    groups = q.shape[1] // cache.k0.shape[1]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    qf = q.float()
    k0, v0 = _expand_kv(cache.k0, groups).float(), _expand_kv(cache.v0, groups).float()
    t = q.shape[2]
    scores = (qf @ k0.transpose(-1, -2)) * scale  # [B, h, T, D] x [B, h, D, T] -> [B, h, T, T]
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    diag = [
        ((qf * _expand_kv(k, groups).float()).sum(-1, keepdim=True) * scale) for k in cache.diag_k
    ]  # k x [B, h, T, 1]
    all_scores = torch.cat([scores, *diag], dim=-1)  # [B, h, T, T + k]
    probs = torch.softmax(all_scores, dim=-1)
    out = probs[..., :t] @ v0  # [B, h, T, T] x [B, h, T, D_v] -> [B, h, T, D_v]
    for j, v in enumerate(cache.diag_v):
        out = out + probs[..., t + j : t + j + 1] * _expand_kv(v, groups).float()
    return out.to(q.dtype)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache: DraftKVCache | TTTCache | None,
    scale: float | None = None,
) -> torch.Tensor:
    """The draft layer's attention of new queries ``[B, h, S, D_k]`` with their keys/values
    (``[B, kv, S, D_k]``, ``[B, kv, S, D_v]``) through ``cache``: the TTT unroll, a decoding cache,
    or none; ``[B, h, S, D_v]`` out."""
    if isinstance(cache, TTTCache) and cache.k0 is not None:
        cache.diag_k.append(k)
        cache.diag_v.append(v)
        return _ttt_attention(q, cache, scale)
    offset = 0
    if isinstance(cache, TTTCache):
        cache.k0, cache.v0 = k, v
    elif isinstance(cache, DraftKVCache):
        offset = cache.length
        k, v = cache.append(k, v)
    key_mask = cache.key_mask if isinstance(cache, DraftKVCache) else None
    return _causal_attention(q, k, v, offset, key_mask, scale)


class DraftAttention(nn.Module):
    def __init__(self, config: DraftConfig) -> None:
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.heads, self.kv_heads, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            d,
        )
        self.q_proj = nn.Linear(2 * h, self.heads * d, bias=False)
        self.k_proj = nn.Linear(2 * h, self.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(2 * h, self.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.heads * d, h, bias=False)
        self.register_buffer("inv_freq", rope_inv_freq(config), persistent=False)

    def _project(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b, s, _ = x.shape
        # [B, S, 2H] -> [B, h, S, D]
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        # -> [B, kv, S, D]
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        return apply_rope(q, positions, self.inv_freq), apply_rope(k, positions, self.inv_freq), v

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, cache: DraftKVCache | TTTCache | None
    ) -> torch.Tensor:
        b, s, _ = x.shape
        out = attend(*self._project(x, positions), cache)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))  # [B, h, S, D] -> [B, S, H]


class DraftMLP(nn.Module):
    def __init__(self, config: DraftConfig) -> None:
        super().__init__()
        h, i = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # [B, S, H] -> [B, S, I] -> [B, S, H]
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftDecoderLayer(nn.Module):
    """SGLang's Eagle3 ``LlamaDecoderLayer``: 2H attention input, residual on the hidden stream."""

    def __init__(self, config: DraftConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        if config.attention == "mla":
            from eagle3.model.mla import MLAAttention

            self.self_attn: nn.Module = MLAAttention(config)
        else:
            self.self_attn = DraftAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = DraftMLP(config)

    def forward(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        cache: DraftKVCache | TTTCache | None,
    ) -> torch.Tensor:
        # 2 x [B, S, H] -> [B, S, 2H]
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        residual = hidden + self.self_attn(x, positions, cache)  # [B, S, H]
        # pre-norm output [B, S, H]
        return residual + self.mlp(self.post_attention_layernorm(residual))


class DraftModel(nn.Module):
    """``fc`` + ``midlayer`` + ``norm`` + ``lm_head`` (parameter names are the export's key names),
    plus the EAGLE 3.1 ``input_norm`` (``norm_before_fc``) and ``fc_norm.{0,1,2}`` (``fc_norm``)
    when the config turns them on."""

    def __init__(self, config: DraftConfig) -> None:
        super().__init__()
        self.config = config
        th = config.target_hidden_size
        if config.norm_before_fc:
            self.input_norm = RMSNorm(3 * th, config.rms_norm_eps)
        if config.fc_norm:
            self.fc_norm = nn.ModuleList([RMSNorm(th, config.rms_norm_eps) for _ in range(3)])
        self.fc = nn.Linear(3 * th, config.hidden_size, bias=False)
        self.midlayer = DraftDecoderLayer(config)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)

    def fuse(self, hidden: torch.Tensor) -> torch.Tensor:
        """Target aux hidden ``[B, S, 3H_t] -> [B, S, H]``; an ``H``-wide hidden passes through
        (SGLang's rule), the EAGLE 3.1 norms included: they normalise the target's states only."""
        if hidden.shape[-1] == self.config.hidden_size:
            return hidden
        if self.config.norm_before_fc:
            hidden = self.input_norm(hidden)  # [B, S, 3H_t], one norm over the concatenation
        if self.config.fc_norm:
            chunks = hidden.chunk(3, dim=-1)  # 3 x [B, S, H_t]: low | mid | high
            hidden = torch.cat(
                [norm(c) for norm, c in zip(self.fc_norm, chunks, strict=True)], dim=-1
            )
        return self.fc(hidden)  # [B, S, 3H_t] -> [B, S, H]

    def forward(
        self,
        input_embeds: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        cache: DraftKVCache | TTTCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft step: ``(logits [B, S, V_draft], next hidden [B, S, H])``.

        ``hidden`` is the target's aux hidden (3H_t, fused by ``fc``) or the previous step's
        returned hidden (H). The returned hidden is what the next step reads, as SGLang hands it on:
        the pre-norm output, or the post-norm one with ``norm_output`` (EAGLE 3.1).
        ``cache`` is a ``DraftKVCache`` for decoding, a ``TTTCache`` for the training unroll, or
        None (no cache).
        """
        out = self.midlayer(input_embeds, self.fuse(hidden), positions, cache)  # pre-norm [B, S, H]
        normed = self.norm(out)  # [B, S, H]
        # [B, S, H] -> [B, S, V_draft]
        return self.lm_head(normed), normed if self.config.norm_output else out
