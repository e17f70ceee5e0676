"""The MLA draft's export: the DeepSeek config SGLang 0.5.23 builds ``Eagle3DeepseekV2ForCausalLM``
from, the tensor names it loads (golden key set), the full-vocab form without vocab maps, a lossless
reload, and the fields vLLM's ``deepseek_eagle3.py`` reads (golden list read from that file) with
every tensor reaching a vLLM parameter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_export_eagle31 import GOLDEN, LAYERS, VD, H, V, _export
from transformers import DeepseekV3Config, LlamaConfig

from eagle3.model.draft import DraftModel
from eagle3.model.export_format import WEIGHTS_FILE, expected_shapes, load_draft, validate_export
from eagle3.model.export_mla import MLA_ARCHITECTURE, VLLM_AUX_IDS

YARN = {
    "rope_type": "yarn",
    "factor": 4.0,
    "original_max_position_embeddings": 32,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}


def mla_target(rope: dict | None = None) -> DeepseekV3Config:
    return DeepseekV3Config(
        hidden_size=H,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=24,
        kv_lora_rank=16,
        qk_nope_head_dim=8,
        qk_rope_head_dim=4,
        v_head_dim=12,
        intermediate_size=48,
        vocab_size=V,
        num_hidden_layers=LAYERS,
        max_position_embeddings=128,
        rope_parameters={"rope_theta": 10000.0, **(rope or {"rope_type": "default"})},
    )


def mla_export(
    tmp_path: Path, *, target=None, full: bool = False, family: str = "deepseek", **flags
) -> tuple[Path, DraftModel]:
    """An MLA draft with random weights (norms off 1), checkpointed and exported through
    ``export_draft``; ``full``: the full vocab."""
    return _export(
        tmp_path,
        target=target or mla_target(YARN),
        draft_vocab=V if full else VD,
        family=family,
        overrides=["train.architecture.attention=mla"],
        attention="mla",
        **flags,
    )


def test_mla_export_is_the_deepseek_config_and_the_layer_names_sglang_loads(tmp_path):
    export, _ = mla_export(tmp_path)
    cfg = json.loads((export / "config.json").read_text())
    assert cfg["architectures"] == [MLA_ARCHITECTURE] and cfg["model_type"] == "kimi_k2"
    assert {
        k: cfg[k]
        for k in (
            "q_lora_rank",
            "kv_lora_rank",
            "qk_nope_head_dim",
            "qk_rope_head_dim",
            "v_head_dim",
        )
    } == {
        "q_lora_rank": 24,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4,
        "v_head_dim": 12,
    }
    assert (
        cfg["num_hidden_layers"] == 1 and cfg["rope_interleave"] is True and "head_dim" not in cfg
    )
    assert cfg["rope_scaling"] == YARN  # the target's YaRN, as SGLang's deepseek_yarn reads it
    # deepseek family: SGLang adds 1 to [1, 3, 4] (first id 1); vLLM reads the top level verbatim
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    assert cfg[VLLM_AUX_IDS] == [2, 4, 5]
    golden = json.loads((GOLDEN / "export_keys_mla.json").read_text())
    assert sorted(load_file(str(export / WEIGHTS_FILE))) == golden == sorted(expected_shapes(cfg))
    assert validate_export(export) == []
    card = (export / "README.md").read_text()
    assert f"attention: MLA (`{MLA_ARCHITECTURE}`, 4 heads, q_lora_rank 24, kv_lora_rank 16" in card


def test_reloaded_mla_export_gives_identical_logits_and_hidden(tmp_path):
    export, draft = mla_export(tmp_path, fc_norm=True, norm_output=True)
    model, d2t, _, _ = load_draft(export)
    assert model.config.attention == "mla" and model.config.rope_scaling == YARN
    embeds, aux, positions = (
        torch.randn(2, 7, H),
        torch.randn(2, 7, 3 * H),
        torch.arange(7).expand(2, 7),
    )
    with torch.no_grad():
        got, want = model(embeds, aux, positions), draft.eval()(embeds, aux, positions)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(d2t + torch.arange(VD), torch.arange(0, 2 * VD, 2))


def test_full_vocab_export_has_no_vocab_maps_and_loads_as_the_identity(tmp_path):
    export, _ = mla_export(tmp_path, full=True)
    cfg = json.loads((export / "config.json").read_text())
    assert cfg["draft_vocab_size"] == cfg["vocab_size"] == V
    keys = set(load_file(str(export / WEIGHTS_FILE)))
    assert not {"d2t", "t2d"} & keys and validate_export(export) == []
    _, d2t, t2d, _ = load_draft(export)
    assert not d2t.any() and t2d.all() and d2t.numel() == V
    assert "full target vocab (no d2t)" in (export / "README.md").read_text()


def test_mla_on_a_llama_target_derives_its_sizes_and_plain_rope(tmp_path):
    target = LlamaConfig(
        hidden_size=H,
        intermediate_size=48,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=V,
        num_hidden_layers=LAYERS,
        max_position_embeddings=128,
    )
    export, _ = mla_export(tmp_path, target=target, family="llama")
    cfg = json.loads((export / "config.json").read_text())
    assert (
        cfg["q_lora_rank"],
        cfg["kv_lora_rank"],
        cfg["qk_rope_head_dim"],
        cfg["v_head_dim"],
    ) == (16, 8, 4, 8)
    plain = {"rope_type": "yarn", "factor": 1.0, "original_max_position_embeddings": 256}
    assert cfg["rope_scaling"] == plain  # plain RoPE, in the form SGLang's CPU path builds
    assert validate_export(export) == []
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4] and cfg[
        VLLM_AUX_IDS
    ] == [2, 4, 5]


def test_an_mla_export_without_q_lora_rank_is_refused(tmp_path):
    export, _ = mla_export(tmp_path)
    cfg = json.loads((export / "config.json").read_text())
    del cfg["q_lora_rank"]
    (export / "config.json").write_text(json.dumps(cfg))
    assert any("lacks q_lora_rank" in p for p in validate_export(export))


# ------------------------------------------------------------------------------------------------
# vLLM: the fields deepseek_eagle3.py reads and the weight names it maps (golden read from it)
# ------------------------------------------------------------------------------------------------


def _vllm_name(name: str, reads: dict) -> str | None:
    """A checkpoint tensor name as vLLM's ``Eagle3DeepseekV2ForCausalLM.load_weights`` maps it, or
    None (skipped)."""
    if any(s in name for s in reads["skipped_substrings"]):
        return None
    for old, new in reads["renamed"].items():
        name = name.replace(old, new)
    if not name.startswith(tuple(reads["unprefixed"])):
        name = "model." + name
    for old, new in (reads["substr_mapping"] | reads["stacked_mapping"]).items():
        name = name.replace(old, new)
    return name


@pytest.mark.parametrize("full", [False, True], ids=["draft-vocab", "full-vocab"])
def test_vllm_reads_every_field_it_needs_and_maps_every_tensor_to_a_parameter(tmp_path, full):
    reads = json.loads((GOLDEN / "vllm_deepseek_eagle3_reads.json").read_text())
    export, _ = mla_export(tmp_path, full=full, fc_norm=True, norm_output=True)
    cfg = json.loads((export / "config.json").read_text())
    assert set(reads["config_required"]) <= set(cfg)
    assert not cfg.get(
        "norm_before_residual", False
    )  # our layer's residual is the un-normed hidden
    assert cfg[reads["aux_layer_ids_field"]] == [
        i + 1 for i in cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    ]
    mapped = {_vllm_name(k, reads) for k in load_file(str(export / WEIGHTS_FILE))} - {None}
    params = set(reads["parameters"]) - set(reads["parameters_skipped_when_absent"])
    if full:
        params.discard("draft_id_to_target_id")
    assert mapped == params
