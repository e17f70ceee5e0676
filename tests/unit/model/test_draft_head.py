"""The draft head's shapes, SGLang-style residual stream and the TTT attention pattern (== chained
decoding)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import DeepseekV3Config, LlamaConfig

from eagle3.model.draft import DraftConfig, DraftKVCache, DraftModel, TTTCache, rope_inv_freq

H, V, VD = 32, 50, 20


def _config(**rope) -> DraftConfig:
    target = LlamaConfig(
        hidden_size=H,
        intermediate_size=48,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=V,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        **rope,
    )
    return DraftConfig.from_target_config(target, draft_vocab_size=VD, max_position_embeddings=512)


def test_config_from_target_takes_shapes_and_raises_context():
    cfg = _config()
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (
        H,
        4,
        2,
        8,
    )
    assert (cfg.intermediate_size, cfg.vocab_size, cfg.draft_vocab_size) == (48, V, VD)
    assert cfg.max_position_embeddings == 512 and cfg.rms_norm_eps == 1e-5
    assert _config().rope_scaling is None


def test_deepseek_target_gives_specforges_attention_width_not_the_rope_dim():
    """Kimi-K2-like MLA target: transformers' DeepseekV3Config.head_dim is qk_rope_head_dim (64);
    SpecForge's configs/kimi-k2-eagle3.json and kimi-k25-eagle3.json draft uses 64 heads, 64 kv
    heads of head_dim 128."""
    target = DeepseekV3Config(
        hidden_size=7168,
        num_attention_heads=64,
        num_key_value_heads=64,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
        kv_lora_rank=512,
        intermediate_size=18432,
        vocab_size=163_840,
        num_hidden_layers=61,
    )
    assert target.head_dim == 64
    cfg = DraftConfig.from_target_config(target, draft_vocab_size=32_000)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (64, 64, 128)


def test_llama3_rope_scaling_is_kept_and_changes_low_frequencies():
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    cfg = _config(rope_parameters={"rope_theta": 500000.0, **scaling})
    assert cfg.rope_theta == 500000.0 and cfg.rope_scaling["rope_type"] == "llama3"
    plain = rope_inv_freq(_config(rope_parameters={"rope_theta": 500000.0, "rope_type": "default"}))
    scaled = rope_inv_freq(cfg)
    assert torch.equal(scaled[0], plain[0]) and scaled[-1] < plain[-1]


def test_shapes_and_residual_stream_is_the_fused_hidden():
    torch.manual_seed(0)
    model = DraftModel(_config())
    assert model.fc.weight.shape == (H, 3 * H)
    assert model.midlayer.self_attn.q_proj.weight.shape == (H, 2 * H)
    assert model.midlayer.self_attn.k_proj.weight.shape == (16, 2 * H)
    assert model.lm_head.weight.shape == (VD, H)
    embeds, aux = torch.randn(2, 5, H), torch.randn(2, 5, 3 * H)
    positions = torch.arange(5).expand(2, 5)
    for p in (model.midlayer.self_attn.o_proj.weight, model.midlayer.mlp.down_proj.weight):
        # attention and MLP contribute nothing: output == residual == fc(aux)
        torch.nn.init.zeros_(p)
    logits, hidden = model(embeds, aux, positions)
    assert logits.shape == (2, 5, VD) and hidden.shape == (2, 5, H)
    torch.testing.assert_close(hidden, model.fc(aux))


def _ttt_unroll(model, ids, aux, embed, steps):
    b, t = ids.shape
    positions = torch.arange(t).expand(b, t)
    cache, hidden, outs = TTTCache(), aux, []
    for k in range(steps):
        shifted = torch.zeros_like(ids)
        shifted[:, : t - 1 - k] = ids[:, 1 + k :]
        logits, hidden = model(F.embedding(shifted, embed), hidden, positions + k, cache)
        outs.append(logits)
    return outs


@pytest.mark.parametrize("t", [0, 3, 7])
def test_ttt_step_k_equals_a_decoded_chain_after_prefix_t(t):
    """Unrolled step k at position t == the k-th draft token of a chain decoded with a KV cache
    after prefix t."""
    torch.manual_seed(1)
    model = DraftModel(_config()).eval()
    T, steps = 12, 4
    ids, aux, embed = torch.randint(0, V, (1, T)), torch.randn(1, T, 3 * H), torch.randn(V, H)
    with torch.no_grad():
        ttt = _ttt_unroll(model, ids, aux, embed, steps)
        cache = DraftKVCache()
        logits, hidden = model(
            F.embedding(ids[:, 1 : t + 2], embed), aux[:, : t + 1], torch.arange(t + 1)[None], cache
        )
        torch.testing.assert_close(logits[:, -1], ttt[0][:, t], rtol=1e-4, atol=1e-5)
        hidden = hidden[:, -1:]
        for k in range(1, steps):
            token = ids[:, t + 1 + k : t + 2 + k]
            logits, hidden = model(
                F.embedding(token, embed), hidden, torch.tensor([[t + k]]), cache
            )
            torch.testing.assert_close(logits[:, 0], ttt[k][:, t], rtol=1e-4, atol=1e-5)


def test_kv_cache_crop_drops_rejected_positions():
    torch.manual_seed(2)
    model = DraftModel(_config()).eval()
    embeds, aux = torch.randn(1, 6, H), torch.randn(1, 6, 3 * H)
    with torch.no_grad():
        full, _ = model(embeds, aux, torch.arange(6)[None], DraftKVCache())
        cache = DraftKVCache()
        model(embeds[:, :4], aux[:, :4], torch.arange(4)[None], cache)
        # rejected drafts
        model(torch.randn(1, 2, H), torch.randn(1, 2, H), torch.tensor([[4, 5]]), cache)
        cache.crop(4)
        tail, _ = model(embeds[:, 4:], aux[:, 4:], torch.tensor([[4, 5]]), cache)
    torch.testing.assert_close(tail, full[:, 4:], rtol=1e-4, atol=1e-5)
