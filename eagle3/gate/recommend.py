"""The serving configuration a gate recommends for its best draft (the promoted one, else the fastest
on the profile): SGLang's adaptive speculation tiers from the per-level speedups of the draft's
chain arms (one arm per ``gate.sweep`` setting; ``eagle3.gate.serving`` computes the tiers),
written as ``adaptive_config.json`` beside the report, and the SGLang command that serves the draft
with it. The gate measured the static configs, not the adaptive server.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from eagle3.config.gate import SpeculativeConfig
from eagle3.config.pipeline import PipelineConfig
from eagle3.gate import profiles
from eagle3.gate.report import ArmResult, Decision
from eagle3.gate.serving import StepResult, Tier, adaptive_tiers, initial_steps, sglang_config
from eagle3.gate.verdict import level_verdicts
from eagle3.rundir.runroot import atomic_write_json
from eagle3.serve.launch_commands import build_launch

ADAPTIVE_JSON = "adaptive_config.json"


def _step_results(
    config: PipelineConfig, arms: list[ArmResult], draft: str
) -> dict[int, list[StepResult]]:
    """Each level's speedups of the draft's chain arms (SGLang adapts topk 1 only), from their level
    verdicts at the primary sampling profile."""
    first = profiles.primary(config.gate)
    arms, gate = profiles.of_profile(arms, first), config.gate.for_sampling(first)
    base = next((a for a in arms if a.role == "baseline" and a.error is None and a.rounds), None)
    mine = [
        a
        for a in arms
        if a.role == "candidate"
        and a.draft == draft
        and a.error is None
        and a.speculative
        and a.speculative.get("eagle_topk") == 1
    ]
    levels: dict[int, list[StepResult]] = {c: [] for c in gate.levels}
    for arm in mine if base is not None else []:
        for lv in level_verdicts(arm, base, None, gate):  # type: ignore[arg-type]
            if lv.speedup is not None:
                levels[lv.concurrency].append(
                    StepResult(arm.speculative["num_steps"], lv.speedup, lv.speedup_interval)
                )
    return levels


def serving_config(
    config: PipelineConfig, draft: str, tiers: list[Tier], out_dir: Path, *, note: str = ""
) -> dict:
    """The serving configuration from adaptive ``tiers`` (``GateReport.adaptive``): their SGLang
    JSON written to ``out_dir``, the SGLang command serving ``draft`` with it, starting at the first
    drafting tier's steps; the baseline's command when no tier drafts."""
    port, steps = config.server.port or 30000, initial_steps(tiers)
    out: dict[str, Any] = {
        "draft": draft,
        "tiers": [asdict(t) for t in tiers],
        "config": None,
        "config_path": None,
    }
    if steps is None:
        launch = build_launch(config, "baseline", engine="sglang", port=port)
        return out | {
            "launch_sglang": launch.shell(),
            "summary": "No measured level has a speedup estimate of 1 or "
            "more: serve the baseline (no adaptive tier would draft).",
        }
    path = out_dir / ADAPTIVE_JSON
    atomic_write_json(path, sglang_config(tiers))
    algorithm = config.speculative.algorithm
    spec = SpeculativeConfig(
        algorithm=algorithm, num_steps=steps, eagle_topk=1, num_draft_tokens=steps + 1
    )
    launch = build_launch(
        config,
        "eagle3",
        engine="sglang",
        draft=draft,
        speculative=spec,
        port=port,
        adaptive_config=path,
    )
    summary = (
        f"SGLang drafts per running batch size from these tiers (0 steps: no drafting), each from the static "
        f"configs measured at its level for `{Path(draft).name}`; the adaptive server itself was not "
        f"measured. {note}"
    ).strip()
    return out | {
        "config": sglang_config(tiers),
        "config_path": str(path),
        "launch_sglang": launch.shell(),
        "summary": summary,
    }


def recommend(
    config: PipelineConfig, arms: list[ArmResult], best: Decision | None, out_dir: Path
) -> dict | None:
    """The serving configuration of the gate's ``best`` decision's draft (the module docstring);
    None without one, or when none of its arms could give a tier."""
    tiers = adaptive_tiers(_step_results(config, arms, best.draft)) if best is not None else []
    if best is None or not tiers:
        return None
    return serving_config(
        config, best.draft, tiers, out_dir, note=best.crossover["summary"] if best.crossover else ""
    )
