"""Our MLA export read by SGLang 0.5.23 itself: ``Eagle3DeepseekV2ForCausalLM`` built from the
export's ``config.json`` and loaded by its own ``load_weights`` (``sglang_draft_probe.py``, in
SGLang's interpreter) takes every exported tensor with no warning, leaves no parameter unloaded but
the target's ``embed_tokens``, and computes our forward's logits and next-step hidden within fp32
tolerance (its MHA attention path with a causal softmax), while the absorbed form its decode path
uses (``w_kc``/``w_vc`` from its ``post_load_weights``) computes the same attention; plain RoPE and
YaRN, a reduced and the full vocab."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from test_export_mla import YARN, H, mla_export, mla_target
from test_export_sglang_eagle31 import _inputs, _ours, _sglang_step

from eagle3.model.export_format import WEIGHTS_FILE

pytestmark = [pytest.mark.sglang, pytest.mark.slow]


@pytest.mark.parametrize(
    ("rope", "full", "flags"),
    [(YARN, False, {}), (None, True, {}), (YARN, True, {"fc_norm": True, "norm_output": True})],
    ids=["yarn", "plain-rope+full-vocab", "yarn+full-vocab+eagle3.1"],
)
def test_sglang_loads_every_mla_tensor_and_computes_our_step(
    sglang_python, tmp_path, rope, full, flags
):
    export, _ = mla_export(tmp_path, target=mla_target(rope), full=full, **flags)
    inputs = _inputs()
    inputs["positions"] = inputs["positions"] + 20  # past YaRN's unscaled band
    got, stderr = _sglang_step(sglang_python, export, tmp_path, inputs, with_stderr=True)
    assert (
        "skipping unexpected weight" not in stderr
    )  # SGLang warns about (and drops) any name it lacks
    unloaded = [
        k.removeprefix("finite/") for k, v in got.items() if k.startswith("finite/") and not bool(v)
    ]
    assert unloaded == ["model.embed_tokens.weight"]  # the target's, never exported
    exported = load_file(str(export / WEIGHTS_FILE))
    exported_numel = sum(v.numel() for k, v in exported.items() if k not in ("d2t", "t2d"))
    loaded_numel = sum(
        int(v) for k, v in got.items() if k.startswith("numel/") and "embed_tokens" not in k
    )
    assert (
        exported_numel == loaded_numel
    )  # no exported tensor dropped, no SGLang parameter without one
    if full:
        assert "hot_token_id" not in got  # no d2t: SGLang sees the target's vocab
    else:
        assert torch.equal(
            got["hot_token_id"], exported["d2t"] + torch.arange(exported["d2t"].numel())
        )
    logits, hidden = _ours(export, inputs)
    torch.testing.assert_close(got["logits"], logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got["next_hidden"], hidden, rtol=1e-4, atol=1e-5)
    assert (
        float(got["latent_gap"]) < 1e-4
    )  # the absorbed (decode) form agrees with the expanded one
    assert logits.shape[-1] == (64 if full else 16) and inputs["embeds"].shape[-1] == H
