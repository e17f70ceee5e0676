"""The MLA draft layer (``train.architecture.attention=mla``): one step checked against a direct
computation written from SGLang 0.5.23's ``kimi_k25_eagle3.py`` / ``deepseek_v2.py`` (fused
down-projection, latent KV, interleaved RoPE on the rope part only, DeepSeek-YaRN frequencies and
softmax scale), the TTT unroll equal to decoding with the per-head K/V cache, and the sizes it takes
from each kind of target."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from test_draft_head import _ttt_unroll
from transformers import DeepseekV3Config, LlamaConfig

from eagle3.config.train import DraftArchitectureConfig
from eagle3.model.draft import DraftConfig, DraftKVCache, DraftModel
from eagle3.model.mla import mla_shape

H, V, VD, HEADS = 32, 50, 20, 4
Q_RANK, KV_RANK, NOPE, ROPE, VDIM = (
    24,
    16,
    8,
    4,
    12,
)  # distinct widths: a mixed-up split cannot pass
YARN = {
    "rope_type": "yarn",
    "factor": 4.0,
    "original_max_position_embeddings": 16,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 1.0,
    "mscale_all_dim": 0.5,
}


def _target(rope: dict | None = None) -> DeepseekV3Config:
    params = {"rope_theta": 10000.0, **(rope or {"rope_type": "default"})}
    return DeepseekV3Config(
        hidden_size=H,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        q_lora_rank=Q_RANK,
        kv_lora_rank=KV_RANK,
        qk_nope_head_dim=NOPE,
        qk_rope_head_dim=ROPE,
        v_head_dim=VDIM,
        intermediate_size=48,
        vocab_size=V,
        num_hidden_layers=4,
        rms_norm_eps=1e-5,
        max_position_embeddings=64,
        rope_parameters=params,
    )


def _model(rope: dict | None = None, seed: int = 0) -> DraftModel:
    torch.manual_seed(seed)
    model = DraftModel(
        DraftConfig.from_target_config(_target(rope), draft_vocab_size=VD, attention="mla")
    ).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(torch.rand_like(p) + 0.5)  # a forgotten or misplaced norm shows
    return model


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return weight * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _mscale(scale: float, m: float) -> float:  # deepseek_v2 / yarn.py: yarn_get_mscale
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def _cos_sin(positions: torch.Tensor, rope: dict | None) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepseekScalingRotaryEmbedding's cos/sin cache rows (plain RotaryEmbedding's unscaled)."""
    base, dim = 10000.0, ROPE
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    inv, amplitude = 1.0 / pos_freqs, 1.0
    if rope:
        factor, old = rope["factor"], rope["original_max_position_embeddings"]
        lo = math.floor(
            dim * math.log(old / (rope["beta_fast"] * 2 * math.pi)) / (2 * math.log(base))
        )
        hi = math.ceil(
            dim * math.log(old / (rope["beta_slow"] * 2 * math.pi)) / (2 * math.log(base))
        )
        lo, hi = max(lo, 0), min(hi, dim - 1)
        hi = hi + 0.001 if lo == hi else hi
        mask = 1 - torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - lo) / (hi - lo), 0, 1)
        inv = (1.0 / (factor * pos_freqs)) * (1 - mask) + inv * mask
        amplitude = _mscale(factor, rope["mscale"]) / _mscale(factor, rope["mscale_all_dim"])
    freqs = positions.float()[:, None] * inv
    return freqs.cos() * amplitude, freqs.sin() * amplitude


def _rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Non-neox RoPE (``rope_interleave`` true): each pair ``(x_2i, x_2i+1)`` as one complex number,
    turned."""
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2).contiguous())
    turned = pairs * torch.complex(cos, sin).view(cos.shape[0], *([1] * (x.dim() - 2)), -1)
    return torch.view_as_real(turned).flatten(-2)


def _sglang_step(model: DraftModel, embeds, aux, positions, rope: dict | None):
    """One draft step over one sequence ``[T, *]`` as SGLang's ``Eagle3MLAModel.forward`` computes
    it, the paged attention kernel replaced by a causal softmax."""
    layer, attn, t = model.midlayer, model.midlayer.self_attn, embeds.shape[0]
    hidden = aux @ model.fc.weight.T  # widths differ: fc
    x = torch.cat(
        [_rms(embeds, layer.input_layernorm.weight), _rms(hidden, layer.hidden_norm.weight)], -1
    )
    fused = torch.cat(
        [attn.q_a_proj.weight, attn.kv_a_proj_with_mqa.weight]
    ).T  # fused_qkv_a_proj_with_mqa
    q_lora, latent = (x @ fused).split([Q_RANK, KV_RANK + ROPE], -1)
    q = (_rms(q_lora, attn.q_a_layernorm.weight) @ attn.q_b_proj.weight.T).view(
        t, HEADS, NOPE + ROPE
    )
    kv_a, k_pe = latent.split([KV_RANK, ROPE], -1)
    kv = (_rms(kv_a, attn.kv_a_layernorm.weight) @ attn.kv_b_proj.weight.T).view(
        t, HEADS, NOPE + VDIM
    )
    cos, sin = _cos_sin(positions, rope)
    q = torch.cat([q[..., :NOPE], _rotate_pairs(q[..., NOPE:], cos, sin)], -1)
    k = torch.cat(
        [kv[..., :NOPE], _rotate_pairs(k_pe, cos, sin)[:, None].expand(t, HEADS, ROPE)], -1
    )
    scale = (NOPE + ROPE) ** -0.5 * (
        _mscale(rope["factor"], rope["mscale_all_dim"]) ** 2 if rope else 1.0
    )
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
    out = torch.einsum("hqk,khd->qhd", scores.softmax(-1), kv[..., NOPE:]).reshape(t, HEADS * VDIM)
    residual = hidden + out @ attn.o_proj.weight.T  # post_attention_layernorm(attn_out, residual)
    mlp_in = _rms(residual, layer.post_attention_layernorm.weight)
    mlp = layer.mlp
    act = F.silu(mlp_in @ mlp.gate_proj.weight.T) * (mlp_in @ mlp.up_proj.weight.T)
    out = residual + act @ mlp.down_proj.weight.T
    return _rms(out, model.norm.weight) @ model.lm_head.weight.T, out


@pytest.mark.parametrize("rope", [None, YARN], ids=["plain-rope", "yarn"])
def test_mla_step_equals_the_direct_computation_from_sglangs_file(rope):
    model = _model(rope)
    torch.manual_seed(1)
    t = 11
    embeds, aux, positions = torch.randn(t, H), 3 * torch.randn(t, 3 * H), torch.arange(5, 5 + t)
    with torch.no_grad():
        logits, hidden = model(embeds[None], aux[None], positions[None])
        want_logits, want_hidden = _sglang_step(model, embeds, aux, positions, rope)
    torch.testing.assert_close(logits[0], want_logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(hidden[0], want_hidden, rtol=1e-4, atol=1e-5)


def test_yarn_changes_the_step_so_the_scaling_is_really_applied():
    torch.manual_seed(2)
    embeds, aux, positions = (
        torch.randn(1, 9, H),
        torch.randn(1, 9, 3 * H),
        torch.arange(40, 49)[None],
    )
    with torch.no_grad():
        plain, yarn = (
            _model(None)(embeds, aux, positions)[0],
            _model(YARN)(embeds, aux, positions)[0],
        )
    assert not torch.allclose(plain, yarn, atol=1e-4)


@pytest.mark.parametrize("t", [0, 4, 7])
def test_mla_ttt_step_k_equals_a_chain_decoded_with_the_kv_cache(t):
    """The unroll's step k at position t == the k-th draft token of a chain decoded after prefix t,
    with keys (nope + rope wide) and values (v wide) of unequal widths in both caches."""
    model = _model(YARN, seed=3)
    T, steps = 12, 4
    ids, aux, embed = torch.randint(0, V, (1, T)), torch.randn(1, T, 3 * H), torch.randn(V, H)
    with torch.no_grad():
        ttt = _ttt_unroll(model, ids, aux, embed, steps)
        cache = DraftKVCache()
        logits, hidden = model(
            F.embedding(ids[:, 1 : t + 2], embed), aux[:, : t + 1], torch.arange(t + 1)[None], cache
        )
        assert (cache.k.shape[-1], cache.v.shape[-1]) == (NOPE + ROPE, VDIM)
        torch.testing.assert_close(logits[:, -1], ttt[0][:, t], rtol=1e-4, atol=1e-5)
        hidden = hidden[:, -1:]
        for k in range(1, steps):
            token = ids[:, t + 1 + k : t + 2 + k]
            logits, hidden = model(
                F.embedding(token, embed), hidden, torch.tensor([[t + k]]), cache
            )
            torch.testing.assert_close(logits[:, 0], ttt[k][:, t], rtol=1e-4, atol=1e-5)


def test_mla_ttt_gradients_reach_every_attention_weight():
    model = _model(seed=4).train()
    ids, aux, embed = torch.randint(0, V, (2, 8)), torch.randn(2, 8, 3 * H), torch.randn(V, H)
    sum(out.logsumexp(-1).mean() for out in _ttt_unroll(model, ids, aux, embed, 3)).backward()
    attn = model.midlayer.self_attn
    for name, p in attn.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_sizes_come_from_an_mla_target_or_derive_from_a_llama_one():
    kimi = DeepseekV3Config(
        hidden_size=7168,
        num_attention_heads=64,
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        vocab_size=163_840,
    )
    assert mla_shape(kimi) == {
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
    }  # TorchSpec's Kimi-K2.5 MLA draft
    lite = DeepseekV3Config(
        hidden_size=2048, num_attention_heads=16, q_lora_rank=None, kv_lora_rank=512
    )
    assert mla_shape(lite)["q_lora_rank"] == 1536  # SGLang's MLA draft needs one: 3 x kv_lora_rank
    llama = LlamaConfig(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32)
    assert mla_shape(llama) == {
        "q_lora_rank": 64,
        "kv_lora_rank": 32,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 16,
        "v_head_dim": 32,
    }
    assert mla_shape(llama, kv_lora_rank=48, q_lora_rank=None)["kv_lora_rank"] == 48


def test_mla_sizes_without_mla_attention_are_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"set train\.architecture\.attention=mla"):
        DraftArchitectureConfig(kv_lora_rank=32)
    with pytest.raises(ValueError, match="must be even"):
        DraftArchitectureConfig(attention="mla", qk_rope_head_dim=5)
    assert DraftArchitectureConfig(attention="mla", q_lora_rank=96).q_lora_rank == 96
