"""The gate and the scaling step as stages (``eagle3.stage``), each one unit.

Gate: the plan is the gate's identity (``gate_identity``: drafts, champion, config, URLs -> fingerprint and
directory), computed without measuring; the unit is ``run_gate``; finalize reads the report back, so a gate read
back from its manifest and one measured now end the same way. Its summary carries the verdict (pass, fail or
inconclusive) and the reasons, so the nightly flow can end in a state named after it, and what the gate says about
serving (``GateReport.serving_summary``: levels, crossover, adaptive config and command). No Prefect cache
(``unit_output`` is None): reading a finished gate's report is as cheap as a cache hit, a cached unit could not say
whether this run measured (``reused``), and ``force`` must measure again.

Scaling: the unit adds tonight's point, read from the gate report, to the run root's curve (``eagle3.scaling``);
an aimed night's point also measures tonight's draft on each domain's held-out eval prompts (offline, CPU:
``eagle3.bench.night.night_domains``); finalize renders the curve. It lives here, not in ``eagle3.scaling``,
because it reads the gate report and the scaling package sits below bench. No cache either: the curve is one
ledger for every night, so no file marks one night done, and recording a point is quick and idempotent (a
night's point replaces its earlier one; the per-domain measurement is cached per draft).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eagle3.bench.gate import gate_identity, run_gate
from eagle3.bench.night import night_domains
from eagle3.bench.report import REPORT_JSON, REPORT_MD, read_report, to_markdown
from eagle3.config import PipelineConfig
from eagle3.layout import stage_root
from eagle3.runroot import fingerprint
from eagle3.scaling import (
    ScalingPoint,
    curve_markdown,
    curve_path,
    curve_table,
    data_limited_verdict,
    plot_curve,
    read_curve,
    record_point,
)
from eagle3.stage import OnProgress, Plan, Stage, StageResult, Unit, UnitReport

CURVE_PNG = "curve.png"


class GatePlan(Plan):
    drafts: tuple[Path, ...]
    baseline_url: str | None = None
    spec_url: str | None = None
    champion_url: str | None = None
    features_dir: Path | None = None
    promote: bool = True
    force: bool = False


class GateStage(Stage[GatePlan]):
    """The benchmark gate as one unit: measure (or read back), decide, report, promote."""

    name = "gate"
    summary_key = "gate-report"  # the latest verdict, whatever the fingerprint
    retries = 0  # a failed arm is recorded in the report, not raised; what does raise would fail again the same way

    def plan(
        self, config: PipelineConfig, *, drafts: Sequence[Path | str], baseline_url: str | None = None,
        spec_url: str | None = None, champion_url: str | None = None,
        features_dir: Path | str | None = None, promote: bool = True, force: bool = False,
    ) -> GatePlan:  # fmt: skip
        gate = gate_identity(config, list(drafts), baseline_url=baseline_url, spec_url=spec_url,
                             champion_url=champion_url)  # fmt: skip
        return GatePlan(stage=self.name, fingerprint=gate.fingerprint, out_dir=gate.out_dir, drafts=tuple(gate.drafts),
                        baseline_url=baseline_url, spec_url=spec_url, champion_url=champion_url,
                        features_dir=Path(features_dir) if features_dir else None, promote=promote,
                        force=force)  # fmt: skip

    def run_unit(
        self, config: PipelineConfig, plan: GatePlan, unit: Unit, *, env: Any = None,
        on_progress: OnProgress | None = None,
    ) -> UnitReport:  # fmt: skip
        result = run_gate(config, list(plan.drafts), baseline_url=plan.baseline_url, spec_url=plan.spec_url,
                          champion_url=plan.champion_url, features_dir=plan.features_dir,
                          promote=plan.promote, force=plan.force)  # fmt: skip
        if result.out_dir != plan.out_dir:  # the champion changed between plan and run: another gate
            raise RuntimeError(f"the champion changed since the gate was planned ({plan.out_dir} is now "
                               f"{result.out_dir}); run the gate again")  # fmt: skip
        return UnitReport(unit=unit, skipped=result.reused, detail={"passed": result.passed, "verdict": result.verdict})

    def reuse_recorded(self, plan: GatePlan) -> bool:
        return not plan.force  # ``force`` measures again

    def retrigger(self, plan: GatePlan, failed: Sequence[Unit]) -> str:
        urls = {"baseline": plan.baseline_url, "spec": plan.spec_url, "champion": plan.champion_url}
        options = [f"--draft {d}" for d in plan.drafts] + [f"--{k}-url {url}" for k, url in urls.items() if url]
        return " ".join(["eagle3 gate", *options])

    def finalize(
        self, config: PipelineConfig, plan: GatePlan, reports: Sequence[UnitReport], failed: Sequence[Unit]
    ) -> StageResult:
        if failed:
            return self.failed_result(plan, failed)
        report = read_report(plan.out_dir)
        summary = {
            "out_dir": str(plan.out_dir),
            "report": str(plan.out_dir / REPORT_JSON),
            "markdown": str(plan.out_dir / REPORT_MD),
            "passed": report.passed,
            "verdict": report.verdict,
            "reasons": [r for d in report.decisions for r in d.reasons],
            "promotion": report.promotion,
            "reused": all(r.skipped for r in reports),
            **report.serving_summary(),
        }
        return StageResult(stage=self.name, fingerprint=plan.fingerprint, out_dir=plan.out_dir, done=True,
                           summary=summary, markdown=to_markdown(report),
                           description=f"gate {plan.fingerprint}: {str(report.verdict).upper()}")  # fmt: skip


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
