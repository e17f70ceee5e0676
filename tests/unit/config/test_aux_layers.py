"""The SGLang layer-id contract (``eagle3.config.aux_layers``): conventions and the per-family
rule."""

from __future__ import annotations

from eagle3.config.aux_layers import (
    default_aux_layers,
    served_layer_ids,
    to_export_ids,
    to_sglang_ids,
)


def test_conventions_convert_both_ways():
    assert to_export_ids([2, 4, 5], "input_of_layer") == [1, 3, 4]
    assert to_sglang_ids(to_export_ids([2, 4, 5], "input_of_layer"), "output_of_layer") == [2, 4, 5]
    assert to_sglang_ids([2, 4, 5], "input_of_layer") == [2, 4, 5]


def test_default_aux_layers_are_sglangs_for_61_layers():
    assert default_aux_layers(61) == [2, 30, 58]


def test_llama_family_serves_every_draft_id_plus_one():
    """SGLang 0.5.23 python/sglang/srt/models/llama.py,
    LlamaForCausalLM.set_eagle3_layers_to_capture: ``layers_to_capture = [val + 1 for val in
    layer_ids]`` whatever the ids are."""
    assert served_layer_ids([1, 15, 28], "llama") == [2, 16, 29]
    assert served_layer_ids([2, 30, 58], "llama") == [3, 31, 59]


def test_deepseek_family_adds_one_only_when_the_first_id_is_one():
    """SGLang 0.5.23 python/sglang/srt/models/deepseek_v2.py,
    DeepseekV2ForCausalLM.set_eagle3_layers_to_capture (DeepseekV3ForCausalLM inherits it;
    models/kimi_k25.py serves Kimi-K2.5's text through DeepseekV3ForCausalLM): ``+1`` when
    ``layer_ids[0] == 1``, else ``layers_to_capture = list(layer_ids)`` verbatim."""
    assert served_layer_ids([1, 29, 57], "deepseek") == [2, 30, 58]
    assert served_layer_ids([2, 29, 57], "deepseek") == [2, 29, 57]
