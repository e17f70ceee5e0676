"""Prefect tasks of the data stages: discover, plan the prompts stage, normalize one source, dedup + shard.

Each task calls one library function. The library skips finished work itself (catalog and prompts manifests, a
source's ``counts.json``), so only the per-source task carries a Prefect cache key: the prompts stage directory
(its fingerprint) and the source name, plus whether that source's output is on disk, so a deleted run root is never
skipped on a stale cache entry.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.context import TaskRunContext

from eagle3.config import PipelineConfig
from eagle3.data.discover import discover
from eagle3.data.normalize import normalize_source
from eagle3.data.pipeline import mix_plan, prompts_dir
from eagle3.data.shard import build_prompt_shards, summary_markdown
from eagle3.data.stage import load_catalog, read_stage_stats
from tasks.common import Progress, artifact_key, cache_key_from, publish_markdown, publish_table


def _source_cache_key(context: TaskRunContext, parameters: dict[str, Any]) -> str | None:
    """Cached only once the source's rows are on disk (its spill counts, or the finished stage); never while missing,
    so a deleted run root is normalized again instead of answered from the cache."""
    base = cache_key_from("prompts_dir", "source_name")(context, parameters)
    out = Path(parameters["prompts_dir"])
    done = (out / "manifest.json").exists() or (out / "spill" / parameters["source_name"] / "counts.json").exists()
    return f"{base}-done" if done else None


@task(name="discover", retries=2, retry_delay_seconds=10, cache_policy=NO_CACHE)
def discover_task(config: PipelineConfig) -> str:
    """Resolve the sources into a catalog stage directory (manifest hit when nothing changed)."""
    out = discover(config)
    datasets = load_catalog(out)["datasets"]
    rows = [{k: d[k] for k in ("name", "adapter", "kind", "id", "revision", "format", "license", "rows")} for d in
            datasets]  # fmt: skip
    publish_table(f"catalog-{out.name}", rows, description=f"resolved datasets ({out})")
    get_run_logger().info("catalog %s: %d datasets", out, len(datasets))
    return str(out)


@task(name="prompts-plan", cache_policy=NO_CACHE)
def prompts_plan_task(config: PipelineConfig, catalog_dir: str) -> dict[str, Any]:
    """The prompts stage directory, whether it is already done, and the mix plan per source."""
    out = prompts_dir(config, Path(catalog_dir))
    plan = [asdict(line) for line in mix_plan(config, Path(catalog_dir))]
    done = read_stage_stats(out) is not None
    get_run_logger().info("prompts %s%s; mix plan %s", out, " (done: manifest hit)" if done else "", plan)
    return {"prompts_dir": str(out), "done": done, "plan": plan, "sources": [s.label for s in config.sources]}


@task(name="normalize-source", retries=1, retry_delay_seconds=10, cache_key_fn=_source_cache_key, persist_result=True)
def normalize_source_task(config: PipelineConfig, source_name: str, catalog_dir: str, prompts_dir: str,
                          planned: int) -> dict[str, Any]:  # fmt: skip
    """Normalize one source into its spill (prompt rows + quarantine); returns its counts."""
    source = next(s for s in config.sources if s.label == source_name)
    progress = Progress(artifact_key("normalize", Path(prompts_dir).name, source_name), total=planned, unit="rows",
                        every_s=config.orchestration.progress_every_s)  # fmt: skip
    counts = normalize_source(config, source, Path(catalog_dir), Path(prompts_dir), on_progress=progress.update)
    progress.update(planned, force=True)
    get_run_logger().info("%s: %d in, %d kept, quarantined %s", source_name, counts["in"], counts["kept"],
                          counts["quarantined"])  # fmt: skip
    return counts


@task(name="prompt-shards", cache_policy=NO_CACHE)
def build_prompt_shards_task(config: PipelineConfig, spills: list[dict[str, Any]], prompts_dir: str) -> str:
    """Dedup across sources and write the prompt shards; publishes per-source counts and a summary."""
    out = build_prompt_shards(config, spills, Path(prompts_dir))
    stats = read_stage_stats(out) or {}
    rows = [{"source": s["source"], "in": s["in"], "kept": s["kept"], "duplicates": s["duplicates"],
             **{f"q_{k}": v for k, v in s["quarantined"].items()}} for s in stats["sources"].values()]  # fmt: skip
    publish_table(f"prompts-sources-{out.name}", rows, description="per-source counts (in, kept, quarantined)")
    publish_markdown(f"prompts-summary-{out.name}", f"# prompts {out.name}\n\n`{out}`\n\n" + summary_markdown(stats))
    return str(out)
