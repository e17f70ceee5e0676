"""The night's two stages (``eagle3.stage``), one unit each: plan-night (tonight's prompts, before
regen) and scaling (tonight's point on the curve, after the gate); and the typed results the nightly
flow passes on.

Plan-night: the unit is ``plan_tonight`` (by ``scaling.policy``; an aimed night writes its selection
under ``selection/<fp>/``); its result is the ``Night`` (``Night.of``), its Markdown the
``night-plan`` artifact. It reads the run root (the curve's last total, the selection's ledger), so
no recorded result stands in for it (a night recorded since would not be seen) and it records none.
Its directory is the run root's ``scaling/``, the ledger it plans from.

Scaling: the unit adds tonight's point, read from the gate report, to the run root's curve
(``eagle3.scaling.curve``); an aimed night's point also measures tonight's draft on each domain's
held-out eval prompts (offline, CPU: ``eagle3.scaling.night.night_domains``); finalize renders the
curve. No Prefect cache: the curve is one ledger for every night, so no file marks one night done,
and recording a point is quick and idempotent (a night's point replaces its earlier one; the
per-domain measurement is cached per draft).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eagle3.config.pipeline import PipelineConfig
from eagle3.gate.report import REPORT_JSON, read_report
from eagle3.gate.stage import GateOutcome
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
from eagle3.scaling.night import Night, night_domains, plan_tonight
from eagle3.stage import Frozen, OnProgress, Plan, Stage, StageResult, Unit, UnitReport
from eagle3.train.stage import TrainedDraft

CURVE_PNG = "curve.png"

logger = logging.getLogger(__name__)


class PlanNightPlan(Plan):
    prompts_dir: Path
    scale: int | None = None
    shard_ids: list[int] | None = None


class PlanNightStage(Stage[PlanNightPlan]):
    """Tonight's prompts by ``scaling.policy`` as one unit; the result's summary is the
    ``Night``."""

    name = "plan-night"
    summary_key = "night-plan"  # the latest plan, whatever the fingerprint
    # a plan that fails (unknown shard ids, no finished prompts stage) fails the same way again
    retries = 0
    # never read back (``reuse_recorded``): a night run again writes nothing here
    records_result = False

    def plan(
        self,
        config: PipelineConfig,
        *,
        prompts_dir: Path | str,
        scale: int | None = None,
        shard_ids: list[int] | None = None,
    ) -> PlanNightPlan:
        fp = fingerprint("plan-night", str(prompts_dir), scale, shard_ids, config.scaling.policy)
        return PlanNightPlan(
            stage=self.name,
            fingerprint=fp,
            out_dir=stage_root(config.root_path, "scaling"),
            prompts_dir=Path(prompts_dir),
            scale=scale,
            shard_ids=shard_ids,
        )

    def run_unit(
        self,
        config: PipelineConfig,
        plan: PlanNightPlan,
        unit: Unit,
        *,
        env: Any = None,
        on_progress: OnProgress | None = None,
    ) -> UnitReport:
        night = plan_tonight(config, plan.prompts_dir, plan.scale, plan.shard_ids)
        logger.info(
            "tonight (%s): %d prompts in shards %s (%d new), pool %d%s",
            night.policy,
            night.total_prompts,
            night.shard_ids,
            len(night.new_shard_ids),
            night.pool_prompts,
            ", pool exhausted" if night.exhausted else "",
        )
        return UnitReport(unit=unit, rows=night.total_prompts, detail=night.model_dump(mode="json"))

    def reuse_recorded(self, plan: PlanNightPlan) -> bool:
        return False  # the plan reads the run root's ledgers, which change between nights

    def retrigger(self, plan: PlanNightPlan, failed: Sequence[Unit]) -> str:
        return "eagle3 plan (shows tonight's plan, or why there is none), then eagle3 run"

    def finalize(
        self,
        config: PipelineConfig,
        plan: PlanNightPlan,
        reports: Sequence[UnitReport],
        failed: Sequence[Unit],
    ) -> StageResult:
        if failed:
            return self.failed_result(plan, failed)
        night = Night.model_validate(reports[0].detail)
        return StageResult(
            stage=self.name,
            fingerprint=plan.fingerprint,
            out_dir=plan.out_dir,
            done=True,
            summary=night.model_dump(mode="json"),
            markdown=night.plan_markdown,
            description=f"tonight: {night.policy}",
        )


class ScalingPlan(Plan):
    gate_dir: Path
    total_prompts: int
    train_samples: int
    draft_fingerprint: str
    label: str = ""
    policy: str = "uniform"
    # aimed: the selection whose eval set measures the draft per domain
    select_dir: Path | None = None
    draft_dir: Path | None = None  # aimed: tonight's export


class ScalingStage(Stage[ScalingPlan]):
    """Tonight's point on the scaling curve, from the gate report, as one unit."""

    name = "scaling"
    table_key = "scaling-curve"  # one curve per run root: the latest is the whole ledger
    summary_key = "scaling-curve-summary"
    retries = 0  # reading a report and rewriting a small file: a failure is not transient

    def plan(
        self,
        config: PipelineConfig,
        *,
        gate_dir: Path | str,
        total_prompts: int,
        train_samples: int,
        draft_fingerprint: str,
        label: str = "",
        policy: str = "uniform",
        select_dir: Path | str | None = None,
        draft_dir: Path | str | None = None,
    ) -> ScalingPlan:
        # uniform: as before
        aimed = [policy, str(select_dir), str(draft_dir)] if policy != "uniform" else []
        fp = fingerprint(
            "scaling", draft_fingerprint, str(gate_dir), total_prompts, train_samples, label, *aimed
        )
        return ScalingPlan(
            stage=self.name,
            fingerprint=fp,
            out_dir=stage_root(config.root_path, "scaling"),
            gate_dir=Path(gate_dir),
            total_prompts=total_prompts,
            train_samples=train_samples,
            draft_fingerprint=draft_fingerprint,
            label=label,
            policy=policy,
            select_dir=Path(select_dir) if select_dir else None,
            draft_dir=Path(draft_dir) if draft_dir else None,
        )

    def run_unit(
        self,
        config: PipelineConfig,
        plan: ScalingPlan,
        unit: Unit,
        *,
        env: Any = None,
        on_progress: OnProgress | None = None,
    ) -> UnitReport:
        report = read_report(plan.gate_dir)
        domains = (
            night_domains(config, plan.select_dir, plan.draft_dir)
            if plan.select_dir and plan.draft_dir
            else {}
        )
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
        self,
        config: PipelineConfig,
        plan: ScalingPlan,
        reports: Sequence[UnitReport],
        failed: Sequence[Unit],
    ) -> StageResult:
        if failed:
            return self.failed_result(plan, failed)
        points = read_curve(config.root_path)
        png, curve = plan.out_dir / CURVE_PNG, curve_path(config.root_path)
        summary = {
            "points": len(points),
            "verdict": data_limited_verdict(points),
            "png": str(png),
            "curve": str(curve),
        }
        return StageResult(
            stage=self.name,
            fingerprint=plan.fingerprint,
            out_dir=plan.out_dir,
            done=True,
            summary=summary,
            table=curve_table(points),
            markdown=curve_markdown(points, png=png),
            description=summary["verdict"],
        )


class Curve(Frozen):
    """The scaling stage's result: how many nights the curve holds, its verdict, the ledger and its
    plot."""

    points: int
    verdict: str
    png: str
    curve: str

    @classmethod
    def of(cls, result: StageResult) -> Curve:
        return cls.model_validate(result.summary)


class NightSummary(Frozen):
    """A whole night, what ``data-scaling`` returns and its summary artifact shows."""

    night: Night
    regen: StageResult
    draft: TrainedDraft
    gate: GateOutcome
    curve: Curve
    # how train.features was decided (``eagle3.capture.costs.choose_features``)
    features_mode: str | None = None
    target: str = ""  # target.model_path: the summary names the model the night served
    sources: tuple[str, ...] = ()  # the sources' labels: the data it regenerated

    def row_sources(self) -> dict[str, int]:
        """Tonight's training rows by where their answers came from: served traffic (as
        answered), regenerated by the target (tonight or earlier), or pre-tokenized rows of a
        dataset (the regen stage's counts)."""
        s = self.regen.summary
        served, pretokenized = int(s.get("served", 0)), int(s.get("pretokenized", 0))
        rows = int(s.get("ok", 0)) + int(s.get("truncated", 0))
        regenerated = rows - served - pretokenized
        return {"served": served, "regenerated": regenerated, "pretokenized": pretokenized}

    def rows_line(self) -> str:
        return ", ".join(f"{n:,} {kind}" for kind, n in self.row_sources().items())
