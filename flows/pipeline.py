"""``data-scaling``: the whole pipeline as one flow of stage subflows.

discover -> normalize -> plan-night -> regen -> capture -> vocab -> train (+ export) -> gate ->
scaling curve.

Design choices:

* Every stage is its own subflow, so the UI shows one run per stage with its artifacts, and each
  stage skips itself when its manifest (or its per-shard outputs) already exist: a re-run, a resume
  after ``kill -9`` and a nightly run over a grown prompt set all redo only what is missing.
* The night's selection is a stage over the run root (``eagle3.scaling.stage.PlanNightStage``, run
  here on the nightly run so its ``night-plan`` artifact is this run's), by ``scaling.policy``:
  uniform takes the first whole prompt shards covering ``previous total + scale``; aimed spends
  ``scale`` across domains by expected gain and writes the rows it chose as the shards regen reads
  (the ``night-plan`` artifact shows why); explicit ``shard_ids`` override either (re-triggers,
  tests).
* Regen and capture run their shards on the task runner ``orchestration`` names (threads, or Ray
  with one GPU per capture task); each stage flow picks it from its config (``flows.runners``).
* Where the trainer's hidden states come from (``train.features``) is decided once, by the capture
  stage's plan, and handed on (``FeatureSource``): online, capture writes nothing and the train
  stage's producers capture during training; the flow is the same either way.
* A refused gate ends the run **Failed** with the report path in the message; an inconclusive one
  (noise or a failed sanity check, nothing promoted) in a Failed-type state named **Inconclusive**,
  with the reasons and the report path; the report is also the ``gate-report`` markdown artifact,
  and the night's point is on the scaling curve either way.
* Stages hand on typed results (``StageResult``, ``Night``, ``TrainedDraft``, ``GateOutcome``,
  ``Curve``); the run returns the ``NightSummary`` of them all.
* What a person watches on this run's page: ``data-scaling-status`` (the running stage's percent,
  rates, ETA, failed shards with their re-trigger commands, server health; ``tasks.monitor``) and
  ``night-plots`` (training curves, gate plots, scaling curve as images).
"""

from __future__ import annotations

from prefect import flow, get_run_logger
from prefect.states import Failed, State

from eagle3.recipes import ConfigRef
from eagle3.scaling.night import Night
from eagle3.scaling.stage import NightSummary, PlanNightStage
from flows.capture import capture_flow
from flows.discover import discover_flow
from flows.gate import gate_flow, scaling_flow
from flows.normalize import normalize_flow
from flows.regen import regen_flow
from flows.stage import run_stage
from flows.train import train_flow
from flows.vocab import vocab_flow
from tasks.common import check_requirements_task, resolve_config_task
from tasks.pipeline import (
    night_plots_task,
    publish_summary_task,
    tiny_world_task,
)


@flow(name="data-scaling", log_prints=False)
def data_scaling(
    recipe: str = "tiny",
    overrides: list[str] | None = None,
    scale: int | None = None,
    shard_ids: list[int] | None = None,
) -> NightSummary | State:
    """Grow the training set by ``scale`` prompts (all prompts when unset), train a draft on
    everything so far, gate it against the baseline and the champion, and add the night to the
    scaling curve.

    ``recipe`` is a recipe name or a YAML config path; ``overrides`` are ``a.b=value`` strings.
    """
    config = resolve_config_task(ConfigRef(recipe=recipe, overrides=overrides or []))
    check_requirements_task(config)  # a mode whose extra is missing here: refused before any stage
    tiny_world_task(config)
    catalog = discover_flow(config)
    prompts = normalize_flow(config, catalog)
    night = Night.of(
        run_stage(PlanNightStage(), config, prompts_dir=prompts, scale=scale, shard_ids=shard_ids)
    )
    regen = regen_flow(config, shard_ids=night.shard_ids, prompts_dir=night.prompts_dir)
    features = capture_flow(config, shard_ids=night.shard_ids, regen_dir=str(regen.out_dir))
    draft = train_flow(config, features, vocab_flow(config, features))
    gate = gate_flow(config, [draft.export], features_dir=features.shards_dir)
    curve = scaling_flow(
        config,
        gate_dir=gate.out_dir,
        total_prompts=night.total_prompts,
        train_samples=draft.train_samples,
        draft_fingerprint=draft.fingerprint,
        label=f"{len(night.shard_ids)} shards",
        policy=night.policy,
        select_dir=night.select_dir,
        draft_dir=draft.export,
    )
    summary = NightSummary(
        night=night,
        regen=regen,
        draft=draft,
        gate=gate,
        curve=curve,
        features_mode=features.why,
        target=config.target.model_path,
        sources=tuple(s.label for s in config.sources),
    )
    publish_summary_task(summary)
    night_plots_task(draft.out_dir, gate.markdown, curve.png)
    get_run_logger().info("tonight's rows: %s; gate report: %s", summary.rows_line(), gate.markdown)
    if gate.verdict == "inconclusive":
        return Failed(
            name="Inconclusive",
            data=summary,
            message=f"gate inconclusive for {draft.export}, nothing "
            f"promoted ({'; '.join(gate.reasons)}): report {gate.markdown}",
        )
    if not gate.passed:
        return Failed(
            message=f"gate refused the draft {draft.export}: report {gate.markdown}", data=summary
        )
    return summary
