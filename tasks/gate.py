"""Prefect task of the gate stage: run the benchmark gate and publish its Markdown report as an artifact.

No Prefect result cache: the gate library already resumes from its own stage manifest (``<root>/gate/<fp>/``,
fingerprint of drafts, champion, config and URLs), and a gate whose champion changed must measure again, which the
library's fingerprint sees and a task-level key computed before the run could not.
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from eagle3.bench.gate import run_gate
from eagle3.bench.report import to_markdown
from eagle3.config import PipelineConfig
from tasks.common import artifact_key, publish_markdown


@task(name="gate", retries=0, cache_policy=NO_CACHE)
def gate_task(
    config: PipelineConfig,
    drafts: list[str],
    baseline_url: str | None = None,
    spec_url: str | None = None,
    champion_url: str | None = None,
    flavour: str = "reference",
    features_dir: str | None = None,
    promote: bool = True,
    force: bool = False,
) -> dict[str, Any]:
    """Run the gate; returns the report paths, the verdict and the promotion (small dict)."""
    from pathlib import Path

    log = get_run_logger()
    result = run_gate(
        config,
        [Path(d) for d in drafts],
        baseline_url=baseline_url,
        spec_url=spec_url,
        champion_url=champion_url,
        flavour=flavour,
        features_dir=Path(features_dir) if features_dir else None,
        promote=promote,
        force=force,
    )
    report = result.report
    verdict = "PASS" if report.passed else "FAIL"
    publish_markdown(
        artifact_key("gate-report"), to_markdown(report), description=f"gate {report.fingerprint}: {verdict}"
    )
    log.info("gate %s: %s, report in %s", report.fingerprint, verdict, result.out_dir)
    return {
        "out_dir": str(result.out_dir),
        "report": str(result.out_dir / "report.json"),
        "markdown": str(result.out_dir / "report.md"),
        "passed": report.passed,
        "promotion": report.promotion,
        "reused": result.reused,
    }
