"""Static preflight on MLA drafts (``Eagle3DeepseekV2ForCausalLM``): a sound one passes (a reduced
or the full vocab, a Llama or a DeepSeek target), and each way SGLang or vLLM would refuse or
mis-serve one fails with the check that names the fix: no ``q_lora_rank``, a Llama head's config on
MLA weights, layer ids off by one under the DeepSeek +1 rule, vLLM's top-level ids, and an engine
not serving it as EAGLE3."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eagle3.config.pipeline import PipelineConfig, with_overrides
from eagle3.gate.preflight import Check, failed, run_static
from eagle3.serve.launch_commands import build_launch

MLA = {
    "architectures": ["Eagle3DeepseekV2ForCausalLM"],
    "model_type": "kimi_k2",
    "num_key_value_heads": 4,
    "q_lora_rank": 64,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 16,
    "v_head_dim": 32,
    "rope_interleave": True,
    "eagle_aux_hidden_state_layer_ids": [2, 4, 5],
    "rope_scaling": {"rope_type": "yarn", "factor": 1.0, "original_max_position_embeddings": 2048},
}


def _checks(config: PipelineConfig, export: Path) -> list[Check]:
    baseline = build_launch(config, "baseline", engine="sglang", port=30000)
    spec = build_launch(config, "eagle3", engine="sglang", draft=export, port=30000)
    return run_static(config, export, baseline=baseline, spec=spec)


def _fails(config: PipelineConfig, export: Path) -> dict[str, str]:
    return {c.name: c.message for c in failed(_checks(config, export))}


def _full_vocab(cfg: dict, tensors: dict) -> None:
    del tensors["d2t"], tensors["t2d"]
    cfg["draft_vocab_size"] = cfg["vocab_size"]
    tensors["lm_head.weight"] = torch.zeros(cfg["vocab_size"], cfg["hidden_size"])


@pytest.mark.parametrize("family", ["llama", "deepseek"])
@pytest.mark.parametrize("vocab", ["reduced", "full"])
def test_sound_mla_draft_passes_every_static_check(bench_config, make_export, family, vocab):
    config = with_overrides(bench_config, [f"target.family={family}"])
    export = make_export(mutate=_full_vocab if vocab == "full" else None, **MLA)
    checks = _checks(config, export)
    assert [c.line() for c in failed(checks)] == []
    names = {c.name: c.message for c in checks}
    assert {"mla_head", "mla_config", "mla_vllm_layer_ids"} <= set(names)
    assert ("full vocab" in names["d2t_order"]) == (vocab == "full")


def test_a_llama_head_export_runs_no_mla_rule(bench_config, make_export):
    assert not {c.name for c in _checks(bench_config, make_export())} & {"mla_head", "mla_config"}


def test_missing_q_lora_rank_is_refused(bench_config, make_export):
    export = make_export(mutate=lambda cfg, tensors: cfg.pop("q_lora_rank"), **MLA)
    fails = _fails(bench_config, export)
    assert "q_lora_rank" in fails["mla_config"] and "requires it" in fails["mla_config"]
    assert "train.architecture.attention=mla" in fails["mla_config"]


def test_a_llama_heads_config_on_mla_weights_is_refused(bench_config, make_export):
    def llama_config(cfg, tensors):
        for key in (
            "q_lora_rank",
            "kv_lora_rank",
            "qk_nope_head_dim",
            "qk_rope_head_dim",
            "v_head_dim",
        ):
            cfg.pop(key)
        cfg.update(
            architectures=["LlamaForCausalLMEagle3"], model_type="llama", num_key_value_heads=2
        )

    fails = _fails(bench_config, make_export(mutate=llama_config, **MLA))
    assert "holds an MLA layer" in fails["mla_head"] and "untrained" in fails["mla_head"]
    assert "Eagle3DeepseekV2ForCausalLM" in fails["mla_head"] and "draft_keys" in fails


def test_layer_ids_off_by_one_under_the_deepseek_rule_are_refused(bench_config, make_export):
    """Capture [2, 4, 5]: the draft must say [1, 3, 4]; [1, 4, 5] starts with 1, so SGLang adds 1 to
    every id on a DeepSeek target and serves [2, 5, 6]."""
    config = with_overrides(bench_config, ["target.family=deepseek"])
    eagle = {"eagle_aux_hidden_state_layer_ids": [1, 4, 5], "use_aux_hidden_state": True}
    fails = _fails(config, make_export(eagle_config=eagle, **MLA))
    assert "served on a deepseek target as input_of_layer [2, 5, 6]" in fails["layer_ids"]
    assert "eagle_aux_hidden_state_layer_ids=[1, 3, 4]" in fails["layer_ids"]


def test_vllm_top_level_ids_in_the_wrong_convention_are_refused(bench_config, make_export):
    fails = _fails(
        bench_config, make_export(**{**MLA, "eagle_aux_hidden_state_layer_ids": [1, 3, 4]})
    )
    assert "vLLM serves the MLA draft the layers [1, 3, 4]" in fails["mla_vllm_layer_ids"]
    assert "eagle_aux_hidden_state_layer_ids=[2, 4, 5]" in fails["mla_vllm_layer_ids"]
    # absent, vLLM falls back to [2, L//2, L-3] = [2, 4, 5] here: the capture, so it passes
    export = make_export(
        "absent", mutate=lambda cfg, t: cfg.pop("eagle_aux_hidden_state_layer_ids"), **MLA
    )
    assert bench_config.target.num_layers == 8
    assert "mla_vllm_layer_ids" not in _fails(bench_config, export)


def test_an_mla_draft_served_as_plain_eagle_is_refused(bench_config, make_export):
    config = with_overrides(bench_config, ["speculative.algorithm=EAGLE"])
    fails = _fails(config, make_export(**MLA))
    assert "EAGLE3" in fails["algorithm"] and "fc is skipped" in fails["algorithm"]


def test_sglang_on_cpu_needs_the_mla_rope_scaling(bench_config, make_export):
    config = with_overrides(bench_config, ["server.engine=sglang", "server.device=cpu"])
    fails = _fails(config, make_export(**{**MLA, "rope_scaling": None}))
    assert "rope_scaling is null" in fails["mla_config"]
    assert "mla_config" not in _fails(
        bench_config, make_export("gpu", **{**MLA, "rope_scaling": None})
    )
