"""The gate flow (drafts benchmarked against the baseline and the champion) and the scaling flow
(tonight's gate result added to the scaling curve): the one stage wiring (``flows.stage.run_stage``)
over ``eagle3.gate.stage``.

Their artifacts have fixed keys (``gate-report``, ``scaling-curve``, ``scaling-curve-summary``; the
stages' ``summary_key``/``table_key``): the UI and the README point at "the latest" of each.
"""

from __future__ import annotations

from prefect import flow

from eagle3.config.pipeline import PipelineConfig
from eagle3.gate.stage import GateOutcome, GateStage
from eagle3.recipes import ConfigRef
from eagle3.scaling.stage import Curve, ScalingStage
from flows.stage import run_stage
from tasks.common import resolve_config_task


@flow(name="gate", log_prints=False)
def gate_flow(
    config: PipelineConfig | ConfigRef,
    drafts: list[str],
    baseline_url: str | None = None,
    spec_url: str | None = None,
    champion_url: str | None = None,
    features_dir: str | None = None,
    promote: bool = True,
    force: bool = False,
) -> GateOutcome:
    """Run the benchmark gate; the Markdown report is a Prefect artifact (key ``gate-report``).
    ``config`` is a resolved config, or a ``ConfigRef`` (a deployment's) resolved on the worker.
    Returns the ``GateOutcome``: the report paths, the ``verdict`` (pass, fail or inconclusive) with
    its ``reasons``, ``passed`` (promotable), the promotion and whether a finished gate was read
    back (``reused``)."""
    result = run_stage(
        GateStage(),
        resolve_config_task(config),
        drafts=drafts,
        baseline_url=baseline_url,
        spec_url=spec_url,
        champion_url=champion_url,
        features_dir=features_dir,
        promote=promote,
        force=force,
    )
    return GateOutcome.of(result)


@flow(name="scaling", log_prints=False)
def scaling_flow(
    config: PipelineConfig,
    gate_dir: str,
    total_prompts: int,
    train_samples: int,
    draft_fingerprint: str,
    label: str = "",
    policy: str = "uniform",
    select_dir: str | None = None,
    draft_dir: str | None = None,
) -> Curve:
    """Add tonight's point (from the gate report in ``gate_dir``) to ``<root>/scaling/curve.jsonl``
    and publish the curve (``scaling-curve`` table, ``scaling-curve-summary`` Markdown with the
    verdict, ``curve.png``). An aimed night (``select_dir``) also measures ``draft_dir`` per domain
    on the selection's eval set. Returns the number of nights, the verdict and the curve and plot
    paths (``Curve``)."""
    result = run_stage(
        ScalingStage(),
        config,
        gate_dir=gate_dir,
        total_prompts=total_prompts,
        train_samples=train_samples,
        draft_fingerprint=draft_fingerprint,
        label=label,
        policy=policy,
        select_dir=select_dir,
        draft_dir=draft_dir,
    )
    return Curve.of(result)
