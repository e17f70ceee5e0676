"""The data stages on the stage contract (``eagle3.stage``): discover (sources -> catalog) and
normalize (catalog -> prompt shards).

``DiscoverStage`` is one unit: resolve the configured sources into
``<root>/catalog/<fp>/catalog.json``; its table is the resolved datasets. ``NormalizeStage`` has one
unit per source (its label): normalize the source into its spill (``spill/<source>/``,
``counts.json`` written last, so a finished source is skipped and an unfinished one redone);
``finalize`` dedups across all sources (first occurrence wins in config order, so it needs every
spill) and writes the prompt shards and the manifest. The catalog is not a lineage stage: its
fingerprint is a function of the config alone (``catalog_fingerprint``), so the normalize plan finds
the config's catalog itself when not given one.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eagle3.config.pipeline import PipelineConfig
from eagle3.data.discover import catalog_fingerprint, check_sources, load_catalog, write_catalog
from eagle3.data.normalize import (
    mix_lines,
    normalize_source,
    prompts_fingerprint,
    source_counts,
    spill_counts_path,
)
from eagle3.data.prompt_shards import build_prompt_shards, summary_markdown
from eagle3.rundir.layout import find_input, stage_dir, write_failed_shards
from eagle3.rundir.runroot import MANIFEST, Manifest
from eagle3.stage import OnProgress, Plan, Progress, Stage, StageResult, Unit, UnitReport
from eagle3.target_io import tokenizer_imports

logger = logging.getLogger(__name__)

_CATALOG_COLUMNS = ("name", "adapter", "kind", "id", "revision", "format", "license", "rows")


class DiscoverStage(Stage[Plan]):
    """Resolve the sources into the catalog stage; a manifest hit when nothing they point at
    changed."""

    name = "discover"
    unit_name = "catalog"
    retries = 2  # Hub look-ups fail transiently

    def plan(self, config: PipelineConfig) -> Plan:
        check_sources(config)
        fp = catalog_fingerprint(config)
        return Plan(
            stage=self.name, fingerprint=fp, out_dir=stage_dir(config.root_path, self.name, fp)
        )

    def run_unit(
        self,
        config: PipelineConfig,
        plan: Plan,
        unit: Unit,
        *,
        env: Any = None,
        on_progress: OnProgress | None = None,
    ) -> UnitReport:
        manifest = Manifest.read(plan.out_dir)
        if manifest is not None:
            logger.info("catalog %s is up to date (manifest hit): nothing to do", plan.out_dir)
            return UnitReport(
                unit=unit, skipped=True, rows=manifest.stats["rows"], detail=manifest.stats
            )
        stats = write_catalog(config, plan.out_dir)
        return UnitReport(unit=unit, rows=stats["rows"], detail=stats)

    def unit_output(self, plan: Plan, unit: Unit) -> Path:
        return plan.out_dir / MANIFEST

    def retrigger(self, plan: Plan, failed: Sequence[Unit]) -> str:
        return "eagle3 discover"  # one unit: the whole catalog

    def finalize(
        self,
        config: PipelineConfig,
        plan: Plan,
        reports: Sequence[UnitReport],
        failed: Sequence[Unit],
    ) -> StageResult:
        if failed:
            return self.failed_result(plan, failed)
        datasets = load_catalog(plan.out_dir)["datasets"]
        return StageResult(
            stage=self.name,
            fingerprint=plan.fingerprint,
            out_dir=plan.out_dir,
            done=True,
            summary={"datasets": len(datasets), "rows": sum(d["rows"] for d in datasets)},
            table=[{k: d[k] for k in _CATALOG_COLUMNS} for d in datasets],
        )


class NormalizePlan(Plan):
    catalog_dir: Path
    planned: dict[str, int]  # source label -> rows the mix plan takes from it


class NormalizeStage(Stage[NormalizePlan]):
    """Normalize each source into its spill (one unit per source), then dedup + shard them all in
    ``finalize``."""

    name = "normalize"
    unit_name = "source"
    retries = 1

    def plan(
        self, config: PipelineConfig, *, catalog_dir: Path | str | None = None
    ) -> NormalizePlan:
        """The prompts stage of the finished catalog ``catalog_dir`` (default: the catalog this
        config names; a ``StageInputError`` when that one is not finished)."""
        wanted = None if catalog_dir else catalog_fingerprint(config)
        catalog = find_input(
            config.root_path,
            "discover",
            wanted,
            explicit=catalog_dir,
            option="catalog_dir",
            produce="eagle3 discover",
        )
        fp = prompts_fingerprint(config, catalog.name)
        out = stage_dir(config.root_path, self.name, fp)
        lines = mix_lines(config, load_catalog(catalog))
        done = " (done: manifest hit)" if Manifest.read(out) is not None else ""
        logger.info("prompts %s%s; mix plan %s", out, done, [(m.source, m.planned) for m in lines])
        return NormalizePlan(
            stage=self.name,
            fingerprint=fp,
            out_dir=out,
            units=tuple(m.source for m in lines),
            catalog_dir=catalog,
            planned={m.source: m.planned for m in lines},
        )

    def run_unit(
        self,
        config: PipelineConfig,
        plan: NormalizePlan,
        unit: Unit,
        *,
        env: Any = None,
        on_progress: OnProgress | None = None,
    ) -> UnitReport:
        source = next(s for s in config.sources if s.label == unit)
        skipped = source_counts(plan.out_dir, str(unit)) is not None
        report = None if on_progress is None else (lambda taken: on_progress(taken, 0))
        counts = normalize_source(
            config, source, plan.catalog_dir, plan.out_dir, on_progress=report
        )
        return UnitReport(unit=unit, skipped=skipped, rows=counts["kept"], detail=counts)

    def unit_imports(self, config: PipelineConfig) -> tuple[str, ...]:
        """Each source's too_long check tokenizes with the target's tokenizer."""
        return tokenizer_imports(config.target)

    def unit_output(self, plan: NormalizePlan, unit: Unit) -> Path:
        """The source's rows are on disk: its spill's ``counts.json``, or the finished stage's
        manifest (finalize removes the spills)."""
        manifest = plan.out_dir / MANIFEST
        return manifest if manifest.exists() else spill_counts_path(plan.out_dir, str(unit))

    def progress(self, plan: NormalizePlan) -> Progress:
        """Rows taken / planned, from files: a source counts once its spill (or the finished stage)
        records it."""
        done = 0
        for unit in plan.units:
            counts = source_counts(plan.out_dir, str(unit))
            done += counts["in"] if counts is not None else 0
        return Progress(done=done, total=sum(plan.planned.values()), unit="rows")

    def retrigger(self, plan: NormalizePlan, failed: Sequence[Unit]) -> str:
        # finished sources are skipped, so a re-run redoes only the failed ones
        return "eagle3 normalize"

    def finalize(
        self,
        config: PipelineConfig,
        plan: NormalizePlan,
        reports: Sequence[UnitReport],
        failed: Sequence[Unit],
    ) -> StageResult:
        if failed:
            table = [
                {"source": r.unit, "in": r.detail["in"], "kept": r.rows, "state": "normalized"}
                for r in reports
            ]
            table += [{"source": u, "in": 0, "kept": 0, "state": "failed"} for u in failed]
            return self.failed_result(plan, failed, table=table)
        by_unit = {r.unit: r.detail for r in reports}
        # Config order, whatever order the units finished in: dedup keeps the first occurrence in
        # this order.
        stats = build_prompt_shards(config, [by_unit[u] for u in plan.units], plan.out_dir)
        write_failed_shards(plan.out_dir, [])
        table = [
            {
                "source": s["source"],
                "in": s["in"],
                "kept": s["kept"],
                "duplicates": s["duplicates"],
                **{f"q_{k}": v for k, v in s["quarantined"].items()},
            }
            for s in stats["sources"].values()
        ]
        markdown = f"# prompts {plan.fingerprint}\n\n`{plan.out_dir}`\n\n" + summary_markdown(stats)
        return StageResult(
            stage=self.name,
            fingerprint=plan.fingerprint,
            out_dir=plan.out_dir,
            done=True,
            summary=stats,
            table=table,
            markdown=markdown,
        )
