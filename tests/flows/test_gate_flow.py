"""The gate flow runs the gate stage and publishes the Markdown report as the ``gate-report``
artifact; the scaling flow records the gate's point and publishes the curve as ``scaling-curve`` and
``scaling-curve-summary``; ``eagle3 gate`` exits with the verdict's own code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from prefect.artifacts import Artifact
from safetensors.torch import save_file
from typer.testing import CliRunner

from eagle3.config.pipeline import PipelineConfig, with_overrides
from eagle3.config.target import TargetConfig
from eagle3.gate.report import Decision, GateReport, write_report
from eagle3.gate.stage import GateOutcome
from flows.cli import app
from flows.commands.common import EXIT_FAILED, EXIT_INCONCLUSIVE
from flows.gate import gate_flow, scaling_flow


def test_gate_flow_publishes_the_refusal_as_a_markdown_artifact(tmp_path, prefect_harness):
    export = tmp_path / "export"
    export.mkdir()
    (export / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    save_file({"fc.weight": torch.zeros(2, 2)}, str(export / "model.safetensors"))
    base = PipelineConfig(
        name="gate-flow",
        root=str(tmp_path / "root"),
        target=TargetConfig(
            model_path=str(tmp_path / "target"), num_layers=8, hidden_size=64, vocab_size=2048
        ),
    )
    config = with_overrides(base, ["speculative.algorithm=EAGLE"])
    out = gate_flow(config, [str(export)])
    assert out.passed is False and out.verdict == "fail"
    assert any("--speculative-algorithm is 'EAGLE'" in r for r in out.reasons)
    assert Path(out.out_dir, "manifest.json").exists()
    artifact = Artifact.get("gate-report")
    assert artifact is not None and "# EAGLE-3 gate: FAIL" in str(artifact.data)
    assert "--speculative-algorithm is 'EAGLE'" in str(artifact.data)
    assert artifact.description.endswith("FAIL")  # the verdict at a glance


def test_scaling_flow_publishes_the_curve_under_its_fixed_keys(tmp_path, prefect_harness):
    config = PipelineConfig(
        name="scaling-flow",
        root=str(tmp_path / "root"),
        target=TargetConfig(
            model_path=str(tmp_path / "target"), num_layers=8, hidden_size=64, vocab_size=2048
        ),
    )
    gate_dir = tmp_path / "gate"
    decision = Decision("d", True, "spec", 1.2, 1.7, None)
    thresholds = {
        "traffic": {"1": 1.0},
        "min_speedup": 1.05,
        "min_accept": 1.5,
        "min_gain_over_champion": 1.0,
    }
    write_report(GateReport("g", "tiny", thresholds, {}, [], [decision], passed=True), gate_dir)
    out = scaling_flow(
        config,
        gate_dir=str(gate_dir),
        total_prompts=10,
        train_samples=9,
        draft_fingerprint="d",
        label="night 1",
    )
    assert out.points == 1 and Path(out.png).is_file()
    table, summary = Artifact.get("scaling-curve"), Artifact.get("scaling-curve-summary")
    assert table is not None and table.description == out.verdict and "1.7" in str(table.data)
    assert summary is not None and out.verdict in str(summary.data)


@pytest.mark.parametrize(
    ("verdict", "passed", "code", "needle"),
    [
        ("pass", True, 0, None),
        ("fail", False, EXIT_FAILED, "passed no draft"),
        ("inconclusive", False, EXIT_INCONCLUSIVE, "inconclusive, nothing promoted"),
    ],
)
def test_the_gate_command_exits_with_its_verdicts_own_code(
    tmp_path, monkeypatch, verdict, passed, code, needle
):
    """The command maps the flow's verdict to the exit code; the flow itself is stubbed (measuring
    is tested apart)."""
    markdown = tmp_path / "report.md"
    markdown.write_text(f"# EAGLE-3 gate: {verdict.upper()}\n")
    summary = GateOutcome(
        verdict=verdict,
        passed=passed,
        markdown=str(markdown),
        out_dir=str(tmp_path),
        report=str(tmp_path / "report.json"),
        reasons=[],
    )
    monkeypatch.setattr("flows.gate.gate_flow", lambda *args, **kwargs: summary)
    result = CliRunner().invoke(
        app, ["gate", "--draft", str(tmp_path), "--set", f"root={tmp_path}"]
    )
    assert result.exit_code == code, result.output
    assert f"# EAGLE-3 gate: {verdict.upper()}" in result.stdout
    if needle is None:
        assert "error:" not in result.stderr
    else:
        assert (
            result.stderr.startswith("error: ")
            and needle in result.stderr
            and str(tmp_path) in result.stderr
        )
