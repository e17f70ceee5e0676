"""Static preflight on EAGLE 3.1 drafts: a sound one passes naming its flags, and each way the flags
and the norm weights in the file can disagree (which SGLang loads without a word) fails
``draft_variant`` with the fix."""

from __future__ import annotations

from pathlib import Path

import torch

from eagle3.config.pipeline import PipelineConfig
from eagle3.gate.preflight import Check, failed, run_static
from eagle3.serve.launch_commands import build_launch

EAGLE31 = {"fc_norm": True, "norm_output": True}


def _fails(config: PipelineConfig, export: Path) -> dict[str, str]:
    baseline = build_launch(config, "baseline", engine="sglang", port=30000)
    spec = build_launch(config, "eagle3", engine="sglang", draft=export, port=30000)
    checks: list[Check] = run_static(config, export, baseline=baseline, spec=spec)
    assert "draft_variant" in {c.name for c in checks}
    return {c.name: c.message for c in failed(checks)}


def test_sound_eagle31_draft_passes_every_static_check(bench_config, make_export):
    assert _fails(bench_config, make_export(**EAGLE31)) == {}
    before = make_export(
        "before",
        eagle_config={
            "eagle_aux_hidden_state_layer_ids": [1, 3, 4],
            "use_aux_hidden_state": True,
            "norm_before_fc": True,
        },
    )
    assert _fails(bench_config, before) == {}


def test_fc_norm_weights_without_the_flag_are_refused(bench_config, make_export):
    # written with the weights
    export = make_export(mutate=lambda cfg, t: cfg.pop("fc_norm"), **EAGLE31)
    fails = _fails(bench_config, export)
    assert "draft_variant" in fails and "fc_norm.0.weight" in fails["draft_variant"]
    assert (
        "without fc_norm: true" in fails["draft_variant"]
        and "drops them silently" in fails["draft_variant"]
    )


def test_fc_norm_flag_without_the_weights_is_refused(bench_config, make_export):
    def strip(cfg, tensors):
        for i in range(3):
            tensors.pop(f"fc_norm.{i}.weight")

    fails = _fails(bench_config, make_export(mutate=strip, **EAGLE31))
    assert "draft_variant" in fails and "config.json sets fc_norm" in fails["draft_variant"]
    assert "train.architecture.fc_norm=true" in fails["draft_variant"]


def test_legacy_aux_norm_weights_without_a_flag_are_refused(bench_config, make_export):
    def legacy(cfg, tensors):
        for name in ("low", "mid", "high"):
            tensors[f"aux_norm_{name}.weight"] = torch.ones(cfg["hidden_size"])

    fails = _fails(bench_config, make_export(mutate=legacy))
    assert "aux_norm_high.weight" in fails["draft_variant"]


def test_input_norm_without_norm_before_fc_is_refused(bench_config, make_export):
    def add(cfg, tensors):
        tensors["input_norm.weight"] = torch.ones(3 * cfg["hidden_size"])

    fails = _fails(bench_config, make_export(mutate=add))
    assert "input_norm.weight" in fails["draft_variant"]
    assert "eagle_config.norm_before_fc: true" in fails["draft_variant"]
