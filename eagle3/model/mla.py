"""The draft layer's multi-head latent attention (``train.architecture.attention=mla``), the
attention of SGLang 0.5.23's ``Eagle3DeepseekV2ForCausalLM`` (``srt/models/kimi_k25_eagle3.py`` on
``deepseek_v2.py``'s ``DeepseekV2AttentionMLA``), which the published Kimi-K2.x drafts use.

The computation, for the layer's ``2H``-wide input ``x = cat[input_layernorm(embed),
hidden_norm(hidden)]``:

* queries through a low-rank bottleneck: ``q = q_b_proj(q_a_layernorm(q_a_proj(x)))``, per head
  ``qk_nope_head_dim + qk_rope_head_dim`` wide (SGLang fuses ``q_a_proj`` and ``kv_a_proj_with_mqa``
  into one ``fused_qkv_a_proj_with_mqa`` whose output is ``[q_lora_rank | kv_lora_rank |
  qk_rope_head_dim]``);
* keys and values from one shared latent: ``kv_a_proj_with_mqa(x) = [c | k_pe]``, ``c``
  (``kv_lora_rank``) is normalised (``kv_a_layernorm``) and expanded per head by ``kv_b_proj`` into
  ``[k_nope | v]``; ``k_pe`` (``qk_rope_head_dim``) is one RoPE key shared by every head (not
  normalised);
* RoPE rotates only the ``qk_rope_head_dim`` part of queries and keys, interleaved (pairs ``(x_2i,
  x_2i+1)``; the DeepSeek default, ``rope_interleave`` true). With YaRN scaling (Kimi-K2.5: factor
  64) the frequencies are DeepSeek-YaRN's, cos/sin carry ``mscale(factor, mscale) / mscale(factor,
  mscale_all_dim)`` and the softmax scale ``qk_head_dim^-0.5`` is multiplied by ``mscale(factor,
  mscale_all_dim)^2``, as SGLang's ``deepseek_yarn`` RoPE and ``compute_mla_mscale_scaling`` do.
  SGLang reads any ``rope_scaling`` as DeepSeek-YaRN, so another scaling of the target (linear,
  llama3) is not carried over: the draft uses plain RoPE (which the export writes as YaRN with
  factor 1, ``eagle3.model.export_mla``).
* ``o_proj`` from ``heads x v_head_dim`` back to ``H``.

Caching. Serving engines cache the latent (``c`` and ``k_pe``) and absorb ``kv_b_proj`` into the
query and output (SGLang's ``w_kc``/``w_vc``); that is the same function. Training and the reference
server cache per-head keys ``[k_nope | k_pe]`` (``qk_nope + qk_rope`` wide) and values
(``v_head_dim`` wide) instead, so the draft's TTT unroll and decoding caches
(``eagle3.model.draft.attend``) serve both attentions unchanged.

Sizes (``mla_shape``). On an MLA target (DeepSeek-V2/V3, Kimi-K2.x: ``kv_lora_rank`` in its config)
the draft takes the target's own sizes, TorchSpec's choice for Kimi-K2.5 (q_lora_rank 1536,
kv_lora_rank 512, 128/64/128 head dims); a target without ``q_lora_rank`` gets ``3 x kv_lora_rank``
(DeepSeek-V3's ratio), as SGLang's MLA draft requires one. On another target they derive from its
attention: ``v_head_dim`` = its head width, half of it each for the nope and RoPE parts,
``q_lora_rank`` ``H/2``, ``kv_lora_rank`` ``H/4``. Each can be set in ``train.architecture``
(matching a parameter budget, ``benchmarks/mla_vs_mha.py``).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
from torch import nn

from eagle3.model.draft import DraftConfig, DraftKVCache, RMSNorm, TTTCache, attend, attention_shape

logger = logging.getLogger(__name__)

YARN_KEYS = (
    "factor",
    "original_max_position_embeddings",
    "beta_fast",
    "beta_slow",
    "mscale",
    "mscale_all_dim",
    "extrapolation_factor",
    "attn_factor",
)


def mla_shape(target: Any, **sizes: int | None) -> dict[str, int]:
    """The draft's MLA sizes for a transformers target config; ``sizes`` (None = default) override
    them."""
    hidden = int(target.hidden_size)
    if getattr(target, "kv_lora_rank", None):
        kv_rank = int(target.kv_lora_rank)
        shape = {
            "q_lora_rank": int(getattr(target, "q_lora_rank", None) or 3 * kv_rank),
            "kv_lora_rank": kv_rank,
            "qk_nope_head_dim": int(target.qk_nope_head_dim),
            "qk_rope_head_dim": int(target.qk_rope_head_dim),
            "v_head_dim": int(target.v_head_dim),
        }
    else:
        _, _, head_dim = attention_shape(target)
        rope = max(2, head_dim // 4 * 2)  # half the head, even
        shape = {
            "q_lora_rank": hidden // 2,
            "kv_lora_rank": hidden // 4,
            "qk_nope_head_dim": head_dim - rope,
            "qk_rope_head_dim": rope,
            "v_head_dim": head_dim,
        }
    unknown = set(sizes) - set(shape)
    if unknown:
        raise ValueError(f"unknown MLA sizes {sorted(unknown)}: use {sorted(shape)}")
    return shape | {k: int(v) for k, v in sizes.items() if v is not None}


def mla_rope_settings(target: Any) -> tuple[float, dict[str, Any] | None]:
    """(theta, scaling) of the MLA draft's RoPE: the target's YaRN settings kept (``rope_type``
    yarn), plain RoPE otherwise (module docstring)."""
    params = dict(getattr(target, "rope_parameters", None) or {})
    scaling = dict(getattr(target, "rope_scaling", None) or {}) or params
    theta = float(params.get("rope_theta") or getattr(target, "rope_theta", None) or 10000.0)
    kind = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
    if kind in ("yarn", "deepseek_yarn"):
        return theta, {
            "rope_type": "yarn",
            **{k: scaling[k] for k in YARN_KEYS if scaling.get(k) is not None},
        }
    if kind != "default":
        logger.warning(
            "rope_type %r has no DeepSeek-MLA form (SGLang reads every rope_scaling as YaRN); "
            "the MLA draft uses plain RoPE (theta=%s)",
            kind,
            theta,
        )
    return theta, None


def yarn_mscale(scale: float, mscale: float) -> float:
    """DeepSeek-YaRN's magnitude correction ``0.1 * mscale * ln(scale) + 1`` (1 for scale <= 1)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_tables(config: DraftConfig) -> tuple[torch.Tensor, float, float]:
    """``(inv_freq [qk_rope/2], cos/sin amplitude, softmax scale)`` of an MLA draft config (module
    docstring)."""
    dim, base = int(config.qk_rope_head_dim), float(config.rope_theta)
    qk_head = int(config.qk_nope_head_dim) + dim
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    scaling = config.rope_scaling
    if not scaling:
        return (1.0 / pos_freqs).float(), 1.0, qk_head**-0.5
    factor = float(scaling.get("factor", 1.0))
    old_ctx = float(scaling.get("original_max_position_embeddings", config.max_position_embeddings))

    def correction_dim(rotations: float) -> float:
        return dim * math.log(old_ctx / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(float(scaling.get("beta_fast", 32)))), 0)
    high = min(math.ceil(correction_dim(float(scaling.get("beta_slow", 1)))), dim - 1)
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / ((high - low) or 0.001)).clamp(
        0, 1
    )
    extrapolate = (1 - ramp) * float(scaling.get("extrapolation_factor", 1))
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolate) + (1.0 / pos_freqs) * extrapolate
    all_dim = float(scaling.get("mscale_all_dim") or 0)
    amplitude = (
        yarn_mscale(factor, float(scaling.get("mscale", 1)))
        / yarn_mscale(factor, all_dim)
        * float(scaling.get("attn_factor", 1))
    )
    return inv_freq.float(), amplitude, qk_head**-0.5 * yarn_mscale(factor, all_dim) ** 2


def apply_rope_interleaved(
    x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, amplitude: float
) -> torch.Tensor:
    """Rotate the pairs ``(x_2i, x_2i+1)`` of ``x [B, heads, S, D]`` by ``positions [B, S]``."""
    angles = positions.to(inv_freq.dtype)[..., None] * inv_freq  # [B, S] -> [B, S, D/2]
    cos, sin = (
        (angles.cos() * amplitude)[:, None].to(x.dtype),
        (angles.sin() * amplitude)[:, None].to(x.dtype),
    )
    even, odd = x[..., 0::2], x[..., 1::2]  # [B, heads, S, D/2] each
    return torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2)


class MLAAttention(nn.Module):
    """Multi-head latent attention over the ``2H`` draft input; parameter names are SGLang's (module
    docstring)."""

    def __init__(self, config: DraftConfig) -> None:
        super().__init__()
        h, heads, eps = config.hidden_size, config.num_attention_heads, config.rms_norm_eps
        self.heads, self.kv_rank, self.v_dim = (
            heads,
            int(config.kv_lora_rank),
            int(config.v_head_dim),
        )
        self.nope, self.rope = int(config.qk_nope_head_dim), int(config.qk_rope_head_dim)
        self.q_a_proj = nn.Linear(2 * h, int(config.q_lora_rank), bias=False)
        self.q_a_layernorm = RMSNorm(int(config.q_lora_rank), eps)
        self.q_b_proj = nn.Linear(
            int(config.q_lora_rank), heads * (self.nope + self.rope), bias=False
        )
        self.kv_a_proj_with_mqa = nn.Linear(2 * h, self.kv_rank + self.rope, bias=False)
        self.kv_a_layernorm = RMSNorm(self.kv_rank, eps)
        self.kv_b_proj = nn.Linear(self.kv_rank, heads * (self.nope + self.v_dim), bias=False)
        self.o_proj = nn.Linear(heads * self.v_dim, h, bias=False)
        inv_freq, self.amplitude, self.scale = rope_tables(config)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def _project(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Per-head queries and keys ``[B, h, S, nope + rope]`` and values ``[B, h, S, v]``."""
        b, s, _ = x.shape
        q = self.q_b_proj(
            self.q_a_layernorm(self.q_a_proj(x))
        )  # [B, S, 2H] -> [B, S, q_lora] -> [B, S, h*(n+r)]
        q_nope, q_pe = (
            q.view(b, s, self.heads, -1).transpose(1, 2).split([self.nope, self.rope], dim=-1)
        )
        latent, k_pe = self.kv_a_proj_with_mqa(x).split(
            [self.kv_rank, self.rope], dim=-1
        )  # [B, S, kv_lora], rope
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).view(b, s, self.heads, -1).transpose(1, 2)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)  # [B, h, S, nope], [B, h, S, v]
        q_pe = apply_rope_interleaved(q_pe, positions, self.inv_freq, self.amplitude)
        k_pe = apply_rope_interleaved(
            k_pe[:, None], positions, self.inv_freq, self.amplitude
        )  # [B, 1, S, rope]
        k = torch.cat([k_nope, k_pe.expand(-1, self.heads, -1, -1)], dim=-1)
        return torch.cat([q_nope, q_pe], dim=-1), k, v

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, cache: DraftKVCache | TTTCache | None
    ) -> torch.Tensor:
        b, s, _ = x.shape
        out = attend(*self._project(x, positions), cache, self.scale)  # [B, h, S, v]
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))  # [B, S, h*v] -> [B, S, H]
