"""The MLA draft's export (``train.architecture.attention=mla``): what SGLang 0.5.23's
``Eagle3DeepseekV2ForCausalLM`` (``srt/models/kimi_k25_eagle3.py``) and vLLM's
``deepseek_eagle3.py`` read. ``eagle3.model.export_format`` is the format; this module holds the
parts where the MLA draft differs.

* ``config.json``: ``architectures ["Eagle3DeepseekV2ForCausalLM"]``, ``model_type "kimi_k2"``
  (SGLang registers it as DeepSeek-V3's config class), the MLA sizes (``q_lora_rank`` is required:
  SGLang refuses the layer without it), ``rope_interleave: true`` (the RoPE layout
  ``eagle3.model.mla`` trains, the DeepSeek default both engines use), a ``rope_scaling`` that is
  always YaRN (both engines read any scaling as DeepSeek-YaRN; plain RoPE is written as YaRN with
  factor 1, the same rotation, ``plain_rope_as_yarn``), and the aux layer ids twice:
  ``eagle_config.eagle_aux_hidden_state_layer_ids`` in ``output_of_layer`` (SGLang maps them by the
  target family's rule, ``eagle3.config.aux_layers``) and a top-level
  ``eagle_aux_hidden_state_layer_ids`` in ``input_of_layer``, vLLM's convention: vLLM reads only the
  top-level field and captures the residual stream entering those layers verbatim (without it, it
  falls back to ``[2, L//2, L-3]``). SGLang never reads the top-level field (it takes
  ``eagle_config``), so both engines serve the captured layers.
* ``model.safetensors``: the decoder layer under ``layers.0.`` (the published MLA drafts' name; both
  engines also map ``midlayer.``), its attention ``self_attn.{q_a_proj, q_a_layernorm, q_b_proj,
  kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj}``; ``fc``, ``norm``, ``lm_head``, the EAGLE
  3.1 norms and the vocab maps as for the Llama head. SGLang fuses ``q_a_proj`` and
  ``kv_a_proj_with_mqa`` at load and splits ``kv_b_proj`` into its absorbed ``w_kc``/``w_vc``; it
  *warns* about (and drops) any other name.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from eagle3.model.draft import DraftConfig

MLA_ARCHITECTURE = "Eagle3DeepseekV2ForCausalLM"
MLA_MODEL_TYPE = "kimi_k2"
MLA_SIZES = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
MODEL_LAYER, EXPORT_LAYER = (
    "midlayer.",
    "layers.0.",
)  # the decoder layer's prefix in DraftModel / in the export
MLA_ONLY_WEIGHTS = (
    "q_a_proj",
    "kv_a_proj_with_mqa",
    "kv_b_proj",
)  # tensor names only an MLA layer has
VLLM_AUX_IDS = "eagle_aux_hidden_state_layer_ids"  # vLLM's top-level field, input_of_layer


def is_mla(cfg: dict[str, Any]) -> bool:
    """Whether an export ``config.json`` describes the MLA draft."""
    return cfg.get("architectures") == [MLA_ARCHITECTURE]


def has_mla_weights(keys: Iterable[str]) -> bool:
    """Whether tensor names include an MLA layer's (whatever the config says)."""
    return any(f".self_attn.{name}." in key for key in keys for name in MLA_ONLY_WEIGHTS)


def mla_config_fields(draft: DraftConfig, layer_ids: list[int]) -> dict[str, Any]:
    """The fields an MLA export's ``config.json`` adds to or overrides in the Llama head's (module
    docstring); ``layer_ids`` are ``output_of_layer``."""
    return {
        "architectures": [MLA_ARCHITECTURE],
        "model_type": MLA_MODEL_TYPE,
        **{k: getattr(draft, k) for k in MLA_SIZES},
        "num_key_value_heads": draft.num_attention_heads,
        "rope_scaling": draft.rope_scaling or plain_rope_as_yarn(draft.max_position_embeddings),
        "rope_interleave": True,
        VLLM_AUX_IDS: [j + 1 for j in layer_ids],
    }


def plain_rope_as_yarn(max_position_embeddings: int) -> dict[str, Any]:
    """Plain RoPE written as DeepSeek-YaRN with factor 1: the same rotation (no interpolation,
    mscale 1), and the one form SGLang 0.5.23 builds an MLA layer's RoPE from on CPU
    (``get_rope_cpu`` asserts a ``rope_scaling``)."""
    return {
        "rope_type": "yarn",
        "factor": 1.0,
        "original_max_position_embeddings": max_position_embeddings,
    }


def mla_attention_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The MLA attention's tensors (names inside the layer) and shapes a ``config.json`` implies.

    Raises ``KeyError`` naming a size the config lacks."""
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    q_rank, kv_rank, rope = cfg["q_lora_rank"], cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    nope, v = cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    return {
        "self_attn.q_a_proj.weight": (q_rank, 2 * h),  # reads cat([embed, hidden]): 2H
        "self_attn.q_a_layernorm.weight": (q_rank,),
        "self_attn.q_b_proj.weight": (heads * (nope + rope), q_rank),
        "self_attn.kv_a_proj_with_mqa.weight": (kv_rank + rope, 2 * h),
        "self_attn.kv_a_layernorm.weight": (kv_rank,),
        "self_attn.kv_b_proj.weight": (heads * (nope + v), kv_rank),
        "self_attn.o_proj.weight": (h, heads * v),
    }


def mla_draft_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """The ``DraftConfig`` fields an MLA export's ``config.json`` sets (the inverse of
    ``mla_config_fields``)."""
    sizes = {k: cfg[k] for k in MLA_SIZES}
    return {
        "attention": "mla",
        **sizes,
        "num_key_value_heads": cfg["num_attention_heads"],
        "head_dim": sizes["qk_nope_head_dim"] + sizes["qk_rope_head_dim"],
    }


def rename_layer(tensors: dict[str, torch.Tensor], *, to_export: bool) -> dict[str, torch.Tensor]:
    """The decoder layer's tensors renamed between ``DraftModel``'s ``midlayer.`` and the export's
    ``layers.0.``."""
    old, new = (MODEL_LAYER, EXPORT_LAYER) if to_export else (EXPORT_LAYER, MODEL_LAYER)
    return {new + k.removeprefix(old) if k.startswith(old) else k: v for k, v in tensors.items()}
