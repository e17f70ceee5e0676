"""Prefect plumbing shared by every task: cache keys from stage fingerprints, table, Markdown and
image artifacts (a running stage's progress is ``tasks.monitor``).

Tasks are thin: they call one library function and add retries, a cache key and artifacts. Cache
keys are the stage fingerprint plus the shard id, never the task's source code, so editing a
docstring does not redo a 50-hour regeneration. Artifact keys are lowercase letters, digits and
dashes (Prefect's rule).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from eagle3.config.pipeline import PipelineConfig
from eagle3.recipes import ConfigRef
from eagle3.requirements import check_requirements
from eagle3.rundir.runroot import check_run_root
from tasks.secrets import load_secret_blocks


def artifact_key(*parts: str) -> str:
    """A valid Prefect artifact key from free text: lowercase, digits and dashes."""
    key = re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")
    return re.sub(r"-{2,}", "-", key)[:100]


def output_cache_key(base: str, output: Path) -> str | None:
    """``base`` plus the output file's size and mtime; None (never cached) while the output is
    missing.

    A shard deleted or rebuilt on disk is then never skipped as a stale Prefect cache hit.
    """
    if not output.exists():
        return None
    stat = output.stat()
    return f"{base}-{stat.st_size}-{stat.st_mtime_ns}"


def publish_table(key: str, rows: Sequence[Mapping[str, Any]], *, description: str = "") -> None:
    create_table_artifact(
        key=artifact_key(key), table=[dict(r) for r in rows], description=description
    )


def publish_markdown(key: str, markdown: str, *, description: str = "") -> None:
    create_markdown_artifact(key=artifact_key(key), markdown=markdown, description=description)


def markdown_image(png: Path | str, alt: str) -> str:
    """A PNG embedded in Markdown as a ``data:`` URI: the Prefect UI shows it as an image, offline,
    from any machine (the file itself sits on a worker's disk the browser cannot reach)."""
    encoded = base64.b64encode(Path(png).read_bytes()).decode("ascii")
    return f"![{alt}](data:image/png;base64,{encoded})"


def publish_plots(
    key: str, plots: Mapping[str, Path | str | None], *, description: str = ""
) -> str | None:
    """One Markdown artifact showing each existing PNG under its title (missing ones are skipped);
    returns the Markdown, None when there was no plot to show."""
    sections = [
        f"## {title}\n\n{markdown_image(path, title)}\n\n`{path}`"
        for title, path in plots.items()
        if path and Path(path).is_file()
    ]
    if not sections:
        return None
    markdown = "\n\n".join(sections) + "\n"
    publish_markdown(key, markdown, description=description)
    return markdown


@task(name="resolve-config", cache_policy=NO_CACHE)
def resolve_config_task(config: PipelineConfig | ConfigRef) -> PipelineConfig:
    """The validated config of a run: a ``ConfigRef`` (what deployments store: a recipe name or a
    YAML path plus ``a.b=value`` overrides) is resolved here, on the worker, at run time; a resolved
    config passes through. Resolved once per run: every task and subflow takes the result as is."""
    resolved = config.resolve() if isinstance(config, ConfigRef) else config
    # shared storage: fail fast on a wrong mount
    root_id = check_run_root(resolved.root_path, resolved.root_id)
    # secrets missing from the environment, from their Prefect Secret blocks
    load_secret_blocks(resolved)
    get_run_logger().info(
        "config %s, run root %s (id %s)", resolved.name, resolved.root_path, root_id
    )
    return resolved


@task(name="check-requirements", cache_policy=NO_CACHE)
def check_requirements_task(config: PipelineConfig) -> None:
    """Refuse, before any stage runs, a night whose modes need a package this worker lacks (one
    line naming the extra, ``eagle3.requirements``): a deployment's night fails in seconds, not at
    its train stage."""
    check_requirements(config)
