"""The scaling step as a stage (``eagle3.stage``), one unit: tonight's point on the curve.

The unit adds tonight's point, read from the gate report, to the run root's curve (``eagle3.scaling.curve``);
an aimed night's point also measures tonight's draft on each domain's held-out eval prompts (offline, CPU:
``eagle3.scaling.night.night_domains``); finalize renders the curve. No Prefect cache: the curve is one
ledger for every night, so no file marks one night done, and recording a point is quick and idempotent (a
night's point replaces its earlier one; the per-domain measurement is cached per draft).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eagle3.config.pipeline import PipelineConfig
from eagle3.gate.report import REPORT_JSON, read_report
from eagle3.rundir.layout import stage_root
from eagle3.rundir.runroot import fingerprint
from eagle3.scaling.curve import (
    ScalingPoint,
    curve_markdown,
    curve_path,
    curve_table,
    data_limited_verdict,
    plot_curve,
    read_curve,
    record_point,
)
from eagle3.scaling.night import night_domains
from eagle3.stage import OnProgress, Plan, Stage, StageResult, Unit, UnitReport

CURVE_PNG = "curve.png"


class ScalingPlan(Plan):
    gate_dir: Path
    total_prompts: int
    train_samples: int
    draft_fingerprint: str
    label: str = ""
    policy: str = "uniform"
    select_dir: Path | None = None  # aimed: the selection whose eval set measures the draft per domain
    draft_dir: Path | None = None  # aimed: tonight's export


class ScalingStage(Stage[ScalingPlan]):
    """Tonight's point on the scaling curve, from the gate report, as one unit."""

    name = "scaling"
    table_key = "scaling-curve"  # one curve per run root: the latest is the whole ledger
    summary_key = "scaling-curve-summary"
    retries = 0  # reading a report and rewriting a small file: a failure is not transient

    def plan(
        self, config: PipelineConfig, *, gate_dir: Path | str, total_prompts: int, train_samples: int,
        draft_fingerprint: str, label: str = "", policy: str = "uniform", select_dir: Path | str | None = None,
        draft_dir: Path | str | None = None,
    ) -> ScalingPlan:  # fmt: skip
        aimed = [policy, str(select_dir), str(draft_dir)] if policy != "uniform" else []  # uniform: as before
        fp = fingerprint("scaling", draft_fingerprint, str(gate_dir), total_prompts, train_samples, label, *aimed)
        return ScalingPlan(stage=self.name, fingerprint=fp, out_dir=stage_root(config.root_path, "scaling"),
                           gate_dir=Path(gate_dir), total_prompts=total_prompts, train_samples=train_samples,
                           draft_fingerprint=draft_fingerprint, label=label, policy=policy,
                           select_dir=Path(select_dir) if select_dir else None,
                           draft_dir=Path(draft_dir) if draft_dir else None)  # fmt: skip

    def run_unit(
        self, config: PipelineConfig, plan: ScalingPlan, unit: Unit, *, env: Any = None,
        on_progress: OnProgress | None = None,
    ) -> UnitReport:  # fmt: skip
        report = read_report(plan.gate_dir)
        domains = night_domains(config, plan.select_dir, plan.draft_dir) if plan.select_dir and plan.draft_dir else {}
        decision = report.decisions[0] if report.decisions else None
        point = ScalingPoint(
            total_prompts=plan.total_prompts,
            train_samples=plan.train_samples,
            accept_length=float(decision.accept_length or 0.0) if decision else 0.0,
            speedup=float(decision.speedup or 0.0) if decision else 0.0,
            passed=report.passed,
            draft_fingerprint=plan.draft_fingerprint,
            report=str(plan.gate_dir / REPORT_JSON),
            label=plan.label,
            policy=plan.policy,
            domains=domains,
        )
        points = record_point(config.root_path, point)
        png = plot_curve(points, plan.out_dir / CURVE_PNG)
        return UnitReport(unit=unit, rows=len(points), detail={"png": str(png)})

    def retrigger(self, plan: ScalingPlan, failed: Sequence[Unit]) -> str:
        return f"eagle3 run (the night resumes and records its point from {plan.gate_dir})"

    def finalize(
        self, config: PipelineConfig, plan: ScalingPlan, reports: Sequence[UnitReport], failed: Sequence[Unit]
    ) -> StageResult:
        if failed:
            return self.failed_result(plan, failed)
        points = read_curve(config.root_path)
        png, curve = plan.out_dir / CURVE_PNG, curve_path(config.root_path)
        summary = {"points": len(points), "verdict": data_limited_verdict(points), "png": str(png), "curve": str(curve)}
        return StageResult(stage=self.name, fingerprint=plan.fingerprint, out_dir=plan.out_dir, done=True,
                           summary=summary, table=curve_table(points), markdown=curve_markdown(points, png=png),
                           description=summary["verdict"])  # fmt: skip
