"""The gate stage through the generic stage tasks (``task.fn``): a draft launched with the wrong
algorithm is refused before any server starts; the plan knows the gate's directory before measuring;
a finished gate is read back, and ``force`` measures again; the report is the finalize Markdown."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from prefect.logging import disable_run_logger
from safetensors.torch import save_file

from eagle3.config.pipeline import PipelineConfig, with_overrides
from eagle3.config.target import TargetConfig
from eagle3.gate.stage import GateStage
from eagle3.rundir.runroot import Manifest
from tasks.stage import finalize_task, plan_task, unit_cache_key, unit_task


def refused_gate_setup(tmp_path: Path) -> tuple[PipelineConfig, str]:
    """A config that serves with ``EAGLE`` and a (stub) draft export: static preflight refuses
    it."""
    export = tmp_path / "export"
    export.mkdir()
    (export / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    save_file({"fc.weight": torch.zeros(2, 2)}, str(export / "model.safetensors"))
    base = PipelineConfig(
        name="gate-task",
        root=str(tmp_path / "root"),
        target=TargetConfig(
            model_path=str(tmp_path / "target"), num_layers=8, hidden_size=64, vocab_size=2048
        ),
    )
    config = with_overrides(
        base, ["speculative.algorithm=EAGLE", "gate.prompt_sets={chat: /nonexistent.jsonl}"]
    )
    return config, str(export)


def _gate(config, inputs):
    stage = GateStage()
    plan = plan_task.fn(stage, config, inputs)
    reports = [unit_task.fn(stage, config, plan, unit) for unit in plan.units]
    return plan, finalize_task.fn(stage, config, plan, reports, [])


def test_gate_refuses_statically_and_returns_report_paths(tmp_path, prefect_harness):
    config, export = refused_gate_setup(tmp_path)
    with disable_run_logger():
        plan = plan_task.fn(GateStage(), config, {"drafts": [export]})
        assert Manifest.read(plan.out_dir) is None  # planned, not measured
        _plan, result = _gate(config, {"drafts": [export]})
    out = result.summary
    assert result.out_dir == plan.out_dir and out["out_dir"] == str(plan.out_dir)
    assert (
        out["passed"] is False
        and out["verdict"] == "fail"
        and out["promotion"] is None
        and out["reused"] is False
    )
    report = json.loads(Path(out["report"]).read_text())
    assert report["arms"] == []  # nothing was launched or measured
    (decision,) = report["decisions"]
    assert any("--speculative-algorithm is 'EAGLE'" in r for r in decision["reasons"])
    assert "# EAGLE-3 gate: FAIL" in Path(
        out["markdown"]
    ).read_text() and result.description.endswith("FAIL")
    assert result.markdown == Path(out["markdown"]).read_text()


def test_a_finished_gate_is_read_back_unless_forced_and_never_served_from_the_prefect_cache(
    tmp_path, prefect_harness
):
    config, export = refused_gate_setup(tmp_path)
    with disable_run_logger():
        first_plan, first = _gate(config, {"drafts": [export]})
        again_plan, again = _gate(config, {"drafts": [export]})
        _forced_plan, forced = _gate(config, {"drafts": [export], "force": True})
    assert again_plan.fingerprint == first_plan.fingerprint and again.summary["reused"] is True
    assert forced.summary["reused"] is False and forced.out_dir == first.out_dir
    assert unit_cache_key(None, {"stage": GateStage(), "plan": first_plan, "unit": 0}) is None
