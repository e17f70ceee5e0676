"""The SGLang contract for EAGLE-3 aux layer ids: two conventions and the per-family rule
(docs/DESIGN.md, "Aux layers").

Two conventions exist and the config always names the one it uses:

* ``input_of_layer`` (SGLang's capture convention): id ``i`` is the residual stream *entering*
  decoder layer ``i``, i.e. HF ``output_hidden_states[i]``. SGLang's default is ``[2, L//2, L-3]``.
* ``output_of_layer`` (what ``eagle_config.eagle_aux_hidden_state_layer_ids`` in a draft's
  config.json means): id ``j`` is the output of decoder layer ``j``, so ``j = i - 1``. The safe form
  to export is ``[1, L//2-1, L-4]``.

Target families. A draft's ``eagle_aux_hidden_state_layer_ids`` (``output_of_layer``, what the
export writes) reaches the target's ``set_eagle3_layers_to_capture`` in SGLang 0.5.23, which turns
it into ``layers_to_capture`` (``input_of_layer``, what capture records). That turn depends on the
target family (``target.family``):

* ``llama`` (``python/sglang/srt/models/llama.py``,
  ``LlamaForCausalLM.set_eagle3_layers_to_capture``; Qwen and most dense models copy it): every id
  gets ``+1`` (the output of layer ``j`` is the input of layer ``j+1``).
* ``deepseek`` (``python/sglang/srt/models/deepseek_v2.py``,
  ``DeepseekV2ForCausalLM.set_eagle3_layers_to_capture``, inherited by ``DeepseekV3ForCausalLM``;
  ``models/kimi_k25.py`` ``KimiK25ForConditionalGeneration`` serves its text through that
  ``DeepseekV3ForCausalLM``): ``+1`` only when ``ids[0] == 1``, otherwise the ids are used verbatim
  as ``input_of_layer``. So a DeepSeek/Kimi draft is read as trained only when its first exported id
  is 1, i.e. its first captured layer is 2 (SGLang's default ``[2, L//2, L-3]`` is such a set).

``served_layer_ids`` is that one rule; validation refuses a layer set SGLang would serve shifted
(rather than export ids whose meaning depends on their value), and export and preflight rely on the
same rule.
"""

from __future__ import annotations

from typing import Literal

LayerConvention = Literal["input_of_layer", "output_of_layer"]
LAYER_CONVENTIONS: tuple[str, ...] = ("input_of_layer", "output_of_layer")
TargetFamily = Literal["llama", "deepseek"]
TARGET_FAMILIES: tuple[str, ...] = ("llama", "deepseek")


def default_aux_layers(num_layers: int) -> list[int]:
    """SGLang's default aux layers in the ``input_of_layer`` convention: ``[2, L//2, L-3]``."""
    return [2, num_layers // 2, num_layers - 3]


def to_export_ids(layer_ids: list[int], convention: LayerConvention) -> list[int]:
    """Layer ids in the ``output_of_layer`` convention written to a draft's ``eagle_config``."""
    return list(layer_ids) if convention == "output_of_layer" else [i - 1 for i in layer_ids]


def to_sglang_ids(layer_ids: list[int], convention: LayerConvention) -> list[int]:
    """Layer ids in the ``input_of_layer`` convention (HF ``output_hidden_states`` indices)."""
    return list(layer_ids) if convention == "input_of_layer" else [j + 1 for j in layer_ids]


def family_error(value: object) -> str:
    """The message for a family this module has no SGLang rule for."""
    return (
        f"unknown target family {value!r}: set target.family to one of {list(TARGET_FAMILIES)} "
        "('llama' for Llama/Qwen-like dense targets, 'deepseek' for DeepSeek-V2/V3 and Kimi-K2/K2.5 targets)"
    )


def served_layer_ids(export_ids: list[int], family: str) -> list[int]:
    """The ``input_of_layer`` ids SGLang 0.5.23 captures for a draft exporting ``export_ids`` on a
    ``family`` target."""
    if family == "llama":
        return [j + 1 for j in export_ids]
    if family == "deepseek":
        return (
            [j + 1 for j in export_ids] if export_ids and export_ids[0] == 1 else list(export_ids)
        )
    raise ValueError(family_error(family))


def serving_problem(capture_ids: list[int], family: str) -> str | None:
    """Why a draft trained on ``capture_ids`` (``input_of_layer``) would be served other layers,
    with the fix; or None.

    The export always writes ``capture_ids - 1`` (``output_of_layer``, the form every engine reads);
    the question is only whether ``family``'s SGLang rule maps that back onto ``capture_ids``."""
    exported = [i - 1 for i in capture_ids]
    served = served_layer_ids(exported, family)
    if served == list(capture_ids):
        return None
    return (
        f"a {family} target in SGLang serves draft ids {exported} (output_of_layer) as input_of_layer {served}, "
        f"not the captured {list(capture_ids)}: SGLang adds 1 only when the first draft id is 1, so the first "
        f"aux layer must be 2 in input_of_layer (1 in output_of_layer), e.g. capture.aux_layers="
        f"[2, {capture_ids[1]}, {capture_ids[2]}] with capture.layer_convention=input_of_layer"
    )
