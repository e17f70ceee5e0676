"""The gate flow runs its task and publishes the Markdown report as the ``gate-report`` artifact."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from prefect.artifacts import Artifact
from safetensors.torch import save_file

from eagle3.config import PipelineConfig, TargetConfig, with_overrides
from flows.gate import gate_flow


def test_gate_flow_publishes_the_refusal_as_a_markdown_artifact(tmp_path, prefect_harness):
    export = tmp_path / "export"
    export.mkdir()
    (export / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    save_file({"fc.weight": torch.zeros(2, 2)}, str(export / "model.safetensors"))
    base = PipelineConfig(
        name="gate-flow",
        root=str(tmp_path / "root"),
        target=TargetConfig(model_path=str(tmp_path / "target"), num_layers=8, hidden_size=64, vocab_size=2048),
    )
    config = with_overrides(base, ["speculative.algorithm=EAGLE"])
    out = gate_flow(config, [str(export)])
    assert out["passed"] is False
    assert Path(out["out_dir"], "manifest.json").exists()
    artifact = Artifact.get("gate-report")
    assert artifact is not None and "# EAGLE-3 gate: FAIL" in str(artifact.data)
    assert "--speculative-algorithm is 'EAGLE'" in str(artifact.data)
