"""The gate task: a draft launched with the wrong algorithm is refused before any server starts; report published."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from prefect.logging import disable_run_logger
from safetensors.torch import save_file

from eagle3.config import PipelineConfig, TargetConfig, with_overrides
from tasks.gate import gate_task


def refused_gate_setup(tmp_path: Path) -> tuple[dict, str]:
    """A config that serves with ``EAGLE`` and a (stub) draft export: static preflight refuses it."""
    export = tmp_path / "export"
    export.mkdir()
    (export / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    save_file({"fc.weight": torch.zeros(2, 2)}, str(export / "model.safetensors"))
    base = PipelineConfig(
        name="gate-task",
        root=str(tmp_path / "root"),
        target=TargetConfig(model_path=str(tmp_path / "target"), num_layers=8, hidden_size=64, vocab_size=2048),
    )
    config = with_overrides(base, ["speculative.algorithm=EAGLE", "gate.prompt_sets={chat: /nonexistent.jsonl}"])
    return config, str(export)


def test_gate_task_refuses_statically_and_returns_report_paths(tmp_path, prefect_harness):
    config, export = refused_gate_setup(tmp_path)
    with disable_run_logger():
        out = gate_task.fn(config, [export])
    assert out["passed"] is False and out["promotion"] is None
    report = json.loads(Path(out["report"]).read_text())
    assert report["arms"] == []  # nothing was launched or measured
    (decision,) = report["decisions"]
    assert any("--speculative-algorithm is 'EAGLE'" in r for r in decision["reasons"])
    assert "# EAGLE-3 gate: FAIL" in Path(out["markdown"]).read_text()
