"""Prefect plumbing shared by every task: cache keys from stage fingerprints, progress and table artifacts.

Tasks are thin: they call one library function and add retries, a cache key and artifacts. Cache keys are the
stage fingerprint plus the shard id, never the task's source code, so editing a docstring does not redo a 50-hour
regeneration. Artifact keys are lowercase letters, digits and dashes (Prefect's rule).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect import get_run_logger, task
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NO_CACHE

from eagle3.config import PipelineConfig
from eagle3.recipes import ConfigRef
from eagle3.runroot import check_run_root
from tasks.secrets import load_secret_blocks


def artifact_key(*parts: str) -> str:
    """A valid Prefect artifact key from free text: lowercase, digits and dashes."""
    key = re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")
    return re.sub(r"-{2,}", "-", key)[:100]


def output_cache_key(base: str, output: Path) -> str | None:
    """``base`` plus the output file's size and mtime; None (never cached) while the output is missing.

    A shard deleted or rebuilt on disk is then never skipped as a stale Prefect cache hit.
    """
    if not output.exists():
        return None
    stat = output.stat()
    return f"{base}-{stat.st_size}-{stat.st_mtime_ns}"


class Progress:
    """A Prefect progress artifact with throughput and ETA in its description, throttled to ``every_s``.

    Works in any flow or task run context; ``update`` is cheap to call per sample. ``already_done`` (a resumed
    stage) counts towards the bar but not towards the rate, so the ETA of a resumed run is not flattered.
    """

    def __init__(
        self, key: str, *, total: int, unit: str = "samples", every_s: float = 10.0, already_done: int = 0
    ) -> None:
        self.key, self.total, self.unit, self.every_s = artifact_key(key), max(total, 1), unit, every_s
        self.done = self.already_done = min(already_done, self.total)
        self.tokens = 0
        self._start = time.monotonic()
        self._last = 0.0
        self._id: UUID = create_progress_artifact(
            progress=100.0 * self.done / self.total, key=self.key, description=self._describe()
        )  # type: ignore[assignment]

    def _describe(self) -> str:
        elapsed = max(time.monotonic() - self._start, 1e-9)
        rate = (self.done - self.already_done) / elapsed
        eta = (self.total - self.done) / rate if rate > 0 else float("nan")
        tok = f", {self.tokens / elapsed:,.0f} tok/s" if self.tokens else ""
        eta_txt = f"{eta / 60:,.1f} min" if eta == eta else "unknown"
        return f"{self.done:,}/{self.total:,} {self.unit} ({rate:,.2f}/s{tok}), ETA {eta_txt}"

    def update(self, done: int, *, tokens: int | None = None, force: bool = False) -> None:
        self.done = min(done, self.total)
        if tokens is not None:
            self.tokens = tokens
        now = time.monotonic()
        if force or self.done >= self.total or now - self._last >= self.every_s:
            self._last = now
            update_progress_artifact(
                artifact_id=self._id, progress=100.0 * self.done / self.total, description=self._describe()
            )


def publish_table(key: str, rows: Sequence[Mapping[str, Any]], *, description: str = "") -> None:
    create_table_artifact(key=artifact_key(key), table=[dict(r) for r in rows], description=description)


def publish_markdown(key: str, markdown: str, *, description: str = "") -> None:
    create_markdown_artifact(key=artifact_key(key), markdown=markdown, description=description)


@task(name="resolve-config", cache_policy=NO_CACHE)
def resolve_config_task(config: PipelineConfig | ConfigRef) -> PipelineConfig:
    """The validated config of a run: a ``ConfigRef`` (what deployments store: a recipe name or a YAML path plus
    ``a.b=value`` overrides) is resolved here, on the worker, at run time; a resolved config passes through.
    Resolved once per run: every task and subflow takes the result as is."""
    resolved = config.resolve() if isinstance(config, ConfigRef) else config
    root_id = check_run_root(resolved.root_path, resolved.root_id)  # shared storage: fail fast on a wrong mount
    load_secret_blocks(resolved)  # secrets missing from the environment, from their Prefect Secret blocks
    get_run_logger().info("config %s, run root %s (id %s)", resolved.name, resolved.root_path, root_id)
    return resolved
