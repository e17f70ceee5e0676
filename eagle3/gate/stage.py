"""The gate as a stage (``eagle3.stage``), one unit.

The plan is the gate's identity (``gate_identity``: drafts, champion, config, URLs -> fingerprint
and directory), computed without measuring; the unit is ``run_gate``; finalize reads the report
back, so a gate read back from its manifest and one measured now end the same way. Its summary
carries the verdict (pass, fail or inconclusive) and the reasons, so the nightly flow can end in a
state named after it, and what the gate says about serving (``GateReport.serving_summary``: levels,
crossover, adaptive config and command). No Prefect cache (``unit_output`` is None): reading a
finished gate's report is as cheap as a cache hit, a cached unit could not say whether this run
measured (``reused``), and ``force`` must measure again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import Field

from eagle3.config.pipeline import PipelineConfig
from eagle3.gate.release import GateRequest, gate_identity, run_gate
from eagle3.gate.report import REPORT_JSON, REPORT_MD, read_report, to_markdown
from eagle3.gate.served_profile import with_served_profile
from eagle3.stage import Frozen, OnProgress, Plan, Stage, StageResult, Unit, UnitReport


class GatePlan(Plan, GateRequest):
    """The gate's identity (``Plan``) and what it was asked (``GateRequest``, drafts resolved)."""


class GateStage(Stage[GatePlan]):
    """The benchmark gate as one unit: measure (or read back), decide, report, promote."""

    name = "gate"
    summary_key = "gate-report"  # the latest verdict, whatever the fingerprint
    # a failed arm is recorded in the report, not raised; what does raise would fail again the same
    # way
    retries = 0

    def plan(self, config: PipelineConfig, **request: Any) -> GatePlan:
        """``request``: the fields of a ``GateRequest`` (the gate flow's parameters)."""
        config = with_served_profile(config)  # gate.profile=served: the load the logs record
        asked = GateRequest.model_validate(request)
        gate = gate_identity(config, asked)
        return GatePlan(
            **{**asked.model_dump(), "drafts": tuple(gate.drafts)},
            stage=self.name,
            fingerprint=gate.fingerprint,
            out_dir=gate.out_dir,
        )

    def run_unit(
        self,
        config: PipelineConfig,
        plan: GatePlan,
        unit: Unit,
        *,
        env: Any = None,
        on_progress: OnProgress | None = None,
    ) -> UnitReport:
        result = run_gate(with_served_profile(config), plan)
        # the champion changed between plan and run: another gate
        if result.out_dir != plan.out_dir:
            raise RuntimeError(
                f"the champion changed since the gate was planned ({plan.out_dir} is now "
                f"{result.out_dir}); run the gate again"
            )
        return UnitReport(
            unit=unit,
            skipped=result.reused,
            detail={"passed": result.passed, "verdict": result.verdict},
        )

    def reuse_recorded(self, plan: GatePlan) -> bool:
        return not plan.force  # ``force`` measures again

    def retrigger(self, plan: GatePlan, failed: Sequence[Unit]) -> str:
        urls = {"baseline": plan.baseline_url, "spec": plan.spec_url, "champion": plan.champion_url}
        options = [f"--draft {d}" for d in plan.drafts] + [
            f"--{k}-url {url}" for k, url in urls.items() if url
        ]
        return " ".join(["eagle3 gate", *options])

    def finalize(
        self,
        config: PipelineConfig,
        plan: GatePlan,
        reports: Sequence[UnitReport],
        failed: Sequence[Unit],
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
        return StageResult(
            stage=self.name,
            fingerprint=plan.fingerprint,
            out_dir=plan.out_dir,
            done=True,
            summary=summary,
            markdown=to_markdown(report),
            description=f"gate {plan.fingerprint}: {str(report.verdict).upper()}",
        )


class GateOutcome(Frozen):
    """The gate stage's result as the flows pass it on: where the report is, the verdict with its
    reasons, the promotion, and what the gate says about serving
    (``GateReport.serving_summary``)."""

    out_dir: str
    report: str
    markdown: str
    passed: bool
    verdict: str
    reasons: list[str]
    promotion: dict[str, Any] | None = None
    reused: bool = False
    levels: list[dict[str, Any]] = Field(default_factory=list)
    crossover: dict[str, Any] | None = None
    warnings: list[str] = Field(default_factory=list)
    adaptive_config: str | None = None
    adaptive_launch: str | None = None
    sampling: list[dict[str, Any]] = Field(default_factory=list)  # each verdict's sampling profile

    @classmethod
    def of(cls, result: StageResult) -> GateOutcome:
        return cls.model_validate(result.summary)

    def serving(self) -> dict[str, Any]:
        """The serving part, in the shape ``GateReport.serving_summary`` gives
        (``report_md.serving_lines``)."""
        keys = {"levels", "crossover", "warnings", "adaptive_config", "adaptive_launch", "sampling"}
        return self.model_dump(include=keys)
