"""Preflight's rules for MLA drafts (``Eagle3DeepseekV2ForCausalLM``, ``eagle3.model.export_mla``):
what makes SGLang 0.5.23 or vLLM refuse, or silently mis-serve, an MLA export. ``run_static`` calls
``checks`` once; for a Llama-head export with Llama-head weights there is nothing to check here.

- ``mla_head``: the config and the weights describe the same head. A Llama head's ``config.json`` on
  MLA weights loads in SGLang as a Llama head that has none of the tensors (``q_a_proj``...): the
  draft serves untrained attention; an MLA config on Llama weights leaves the MLA layer empty.
- ``mla_config``: ``q_lora_rank`` present (SGLang raises without it), every MLA size present and
  positive, an even RoPE part, one layer, a DeepSeek ``model_type`` (SGLang builds the layer from a
  DeepSeek config class), and a ``rope_scaling`` when SGLang serves it on CPU (its CPU RoPE asserts
  one; the export writes plain RoPE as YaRN with factor 1).
- ``mla_vllm_layer_ids``: the top-level ``eagle_aux_hidden_state_layer_ids`` vLLM reads (verbatim,
  ``input_of_layer``) are the captured layers; without it vLLM captures ``[2, L//2, L-3]``. SGLang's
  side, the DeepSeek +1 rule on ``eagle_config``, is the general ``layer_ids`` check.

What the general checks already cover for an MLA draft: the algorithm (``EAGLE3``: the engine must
serve it as an EAGLE-3 draft), the key set and shapes (``expected_shapes`` knows the MLA layer), the
vocab (a mapping, or the full vocab without one), the layer ids by the target family's rule.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eagle3.config.aux_layers import default_aux_layers
from eagle3.config.pipeline import PipelineConfig
from eagle3.data.parquet import ShardError
from eagle3.gate.preflight import Check, capture_layer_ids
from eagle3.model.export_format import DraftExport
from eagle3.model.export_mla import (
    MLA_ARCHITECTURE,
    MLA_SIZES,
    VLLM_AUX_IDS,
    has_mla_weights,
    is_mla,
)

DEEPSEEK_MODEL_TYPES = ("kimi_k2", "deepseek_v3", "deepseek_v2")
REEXPORT_MLA = "re-export the draft trained with train.architecture.attention=mla (`eagle3 export`)"


def check_head(export: DraftExport) -> Check:
    mla_config, mla_weights = is_mla(export.config), has_mla_weights(export.shapes)
    arch = export.config.get("architectures")
    if mla_weights and not mla_config:
        return Check(
            "mla_head",
            False,
            f"model.safetensors holds an MLA layer (q_a_proj, "
            f"kv_a_proj_with_mqa, kv_b_proj) but config.json says architectures={arch}: "
            "SGLang builds that head, which has none of these tensors, and serves untrained "
            f"attention; write architectures [{MLA_ARCHITECTURE!r}]: {REEXPORT_MLA}",
        )
    if mla_config and not mla_weights:
        return Check(
            "mla_head",
            False,
            f"config.json says [{MLA_ARCHITECTURE!r}] but "
            "model.safetensors has no MLA layer (q_a_proj, kv_a_proj_with_mqa, kv_b_proj): "
            "export the draft with the config it was trained with",
        )
    return Check("mla_head", True, f"{MLA_ARCHITECTURE} config on MLA weights")


def _config_problems(cfg: dict[str, Any], sglang_cpu: bool) -> list[str]:
    problems = []
    if not cfg.get("q_lora_rank"):
        problems.append(
            f"q_lora_rank is {cfg.get('q_lora_rank')!r}: SGLang's MLA draft layer "
            "requires it (it raises 'requires q_lora_rank')"
        )
    bad = [k for k in MLA_SIZES[1:] if not (isinstance(cfg.get(k), int) and cfg[k] > 0)]
    problems += [f"{k} is {cfg.get(k)!r}, a positive size is needed" for k in bad]
    if isinstance(cfg.get("qk_rope_head_dim"), int) and cfg["qk_rope_head_dim"] % 2:
        problems.append(f"qk_rope_head_dim {cfg['qk_rope_head_dim']} is odd (RoPE rotates pairs)")
    if cfg.get("num_hidden_layers") != 1:
        problems.append(f"num_hidden_layers is {cfg.get('num_hidden_layers')}: SGLang supports 1")
    if cfg.get("model_type") not in DEEPSEEK_MODEL_TYPES:
        problems.append(
            f"model_type is {cfg.get('model_type')!r}, not a DeepSeek config SGLang "
            f"builds the MLA layer from ({', '.join(DEEPSEEK_MODEL_TYPES)})"
        )
    if sglang_cpu and not cfg.get("rope_scaling"):
        problems.append(
            "rope_scaling is null: SGLang's CPU RoPE for MLA needs one (plain RoPE is "
            "YaRN with factor 1)"
        )
    return problems


def check_config(export: DraftExport, config: PipelineConfig) -> Check:
    server = config.server
    problems = _config_problems(export.config, server.engine == "sglang" and server.device == "cpu")
    if problems:
        return Check("mla_config", False, f"{'; '.join(problems)}: {REEXPORT_MLA}")
    sizes = ", ".join(f"{k} {export.config[k]}" for k in MLA_SIZES)
    return Check("mla_config", True, sizes)


def check_vllm_layer_ids(export: DraftExport, capture_ids: list[int], num_layers: int) -> Check:
    ids = export.config.get(VLLM_AUX_IDS)
    if ids is None and default_aux_layers(num_layers) == list(capture_ids):
        return Check(
            "mla_vllm_layer_ids", True, f"absent; vLLM's default is the capture {capture_ids}"
        )
    if ids == list(capture_ids):
        return Check("mla_vllm_layer_ids", True, f"top-level {ids} = capture (input_of_layer)")
    served = default_aux_layers(num_layers) if ids is None else ids
    return Check(
        "mla_vllm_layer_ids",
        False,
        f"vLLM serves the MLA draft the layers {served} (the "
        f"top-level {VLLM_AUX_IDS}, verbatim, or its default), not the captured "
        f"{list(capture_ids)}: write {VLLM_AUX_IDS}={list(capture_ids)} (`eagle3 export`)",
    )


def checks(config: PipelineConfig, export: DraftExport, features_dir: Path | None) -> list[Check]:
    """The MLA rules for ``export`` (none for a Llama head on Llama weights); never raises."""
    if not (is_mla(export.config) or has_mla_weights(export.shapes)):
        return []
    head = check_head(export)
    if not head.ok or not is_mla(export.config):
        return [head]
    try:
        capture = capture_layer_ids(features_dir) if features_dir else config.sglang_layer_ids
    except (OSError, ValueError, KeyError, ShardError) as exc:
        return [
            head,
            check_config(export, config),
            Check("mla_vllm_layer_ids", False, f"{type(exc).__name__}: {exc}"),
        ]
    return [
        head,
        check_config(export, config),
        check_vllm_layer_ids(export, capture, config.target.num_layers),
    ]
