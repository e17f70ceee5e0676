"""The regen stage (the stage contract of ``eagle3.stage``): prompts shards -> the target's own
answers, one unit per shard.

* ``resources``: the configured ``regen.servers``, or a server on the target model started for the
  length of the stage run on ``server.engine`` (the tiny recipe: the project's reference server, or
  SGLang itself on this CPU); SIGTERM and Ctrl-C stop the running shards first (``regen.stop``).
* ``max_in_flight``: ``regen.shards_in_flight`` shards at once, so ``regen.concurrency_per_server``
  is what a server sees; ``concurrency_limits``: one orchestrator-wide slot per persistent server (a
  nightly run and a re-trigger never double a server's load; a reference server started by this run
  has a fresh port and none).
* ``progress``: samples done / planned over this run's shards, from the journals and shard footers;
  ``health``: each server's state in the shards' shared pool.
* ``finalize``: ``failed_shards.json`` every time (empty when none), ``manifest.json`` only when
  every shard of the prompts stage is compacted (a run over a subset of shards leaves the stage
  unfinished, not failed).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

from eagle3.config.pipeline import PipelineConfig
from eagle3.data.parquet import iter_batches, shard_is_valid
from eagle3.regen.client import sampling_params
from eagle3.regen.plan import RegenPlan, plan_regen, sampling_fields, target_fields
from eagle3.regen.pool import shared_pool
from eagle3.regen.schema import REGEN_SCHEMA
from eagle3.regen.shard import DROPPED, FAILED, ShardReport, regen_shard, report_from_shard
from eagle3.regen.status import regen_status
from eagle3.regen.stop import shards_stop_with_the_run
from eagle3.rundir.layout import REGEN_INPUT, shard_name, write_failed_shards
from eagle3.rundir.runroot import FileEntry, Manifest
from eagle3.stage import OnProgress, Progress, Stage, StageResult, Unit, UnitReport
from eagle3.target_io import tokenizer_imports

logger = logging.getLogger(__name__)

REPORT_FIELDS = (
    "ok",
    "truncated",
    "dropped",
    "failed",
    "pretokenized",
    "served",
    "completion_tokens",
    "round_trip_failures",
    "mask_fallbacks",
    "history_rewritten",
    "tool_replay_stops",
)


# What the lineage records about earlier turns (the rows' meta.history says which rows it rewrote).
HISTORY_RULE = (
    "each prompt shows earlier turns as the target's chat template renders them (chat_template_hash, "
    "sampling.chat_template_kwargs); a thinking template drops their reasoning"
)


@contextmanager
def regen_servers(config: PipelineConfig, *, log_dir: Path | None = None) -> Iterator[list[str]]:
    """The servers to regenerate with: ``regen.servers``, or a local server on ``server.engine``
    started for the block (at most ``regen.concurrency_per_server`` requests running on it), from
    the launch line every server the pipeline starts comes from: both engines serve the same dtype
    with the same torch threads."""
    if config.regen.servers or config.regen.answers == "source":  # source answers need no server
        yield list(config.regen.servers)
        return
    from eagle3.serve.launch_commands import build_launch

    running = config.regen.concurrency_per_server
    served = config.replace(server=config.server.replace(max_running_requests=running))
    command = build_launch(served, "baseline", port=0)
    log_path = (log_dir / f"{config.server.engine}-server.log") if log_dir else None
    with command.server(log_path=log_path) as server:
        yield [server.url]


def needs_generation(config: PipelineConfig, plan: RegenPlan) -> bool:
    """Whether a shard of this run still to compact holds a row of a source that is neither
    served nor pre-tokenized (read from its ``source`` column alone)."""
    from eagle3.data import catalog

    formats = ("pretokenized", "served")
    passing = {s.label for s in config.sources if catalog.get(s.adapter).row_format in formats}
    for index in plan.units:
        if shard_is_valid(plan.out_dir / shard_name(int(index)), schema=REGEN_SCHEMA):
            continue
        for batch in iter_batches(plan.prompt_shard(int(index)), columns=["source"]):
            if set(batch.column("source").to_pylist()) - passing:
                return True
    return False


def server_limit_names(servers: Sequence[str]) -> list[str]:
    """Orchestrator-wide concurrency limit names, one per server (``deployments/deploy.py`` creates
    them)."""
    return [
        "regen-server-" + re.sub(r"[^a-z0-9]+", "-", url.split("://", 1)[-1].lower()).strip("-")
        for url in servers
    ]


class RegenStage(Stage[RegenPlan]):
    name = "regen"
    unit_name = "shard"
    scale_out = True
    retries = 2
    # prompts, or the aimed nights' selection
    inputs: ClassVar[dict[str, str]] = {"prompts_dir": REGEN_INPUT}

    def plan(
        self, config: PipelineConfig, *, prompts_dir: Path, shard_ids: Sequence[int] | None = None
    ) -> RegenPlan:
        return plan_regen(config, prompts_dir, shard_ids)

    @contextmanager
    def resources(self, config: PipelineConfig, plan: RegenPlan) -> Iterator[list[str]]:
        """The servers; none when every row still to do passes through (a served night starts
        no server)."""
        if not config.regen.servers and not needs_generation(config, plan):
            logger.info("regen %s: all rows served or pre-tokenized: no server", plan.fingerprint)
            with shards_stop_with_the_run():
                yield []
            return
        with regen_servers(config, log_dir=plan.out_dir) as servers, shards_stop_with_the_run():
            yield servers

    def max_in_flight(self, config: PipelineConfig) -> int:
        return config.regen.shards_in_flight

    def unit_imports(self, config: PipelineConfig) -> tuple[str, ...]:
        return tokenizer_imports(config.target)  # each shard renders with the target's tokenizer

    def concurrency_limits(self, config: PipelineConfig) -> list[str]:
        return server_limit_names(config.regen.servers)

    def run_unit(
        self,
        config: PipelineConfig,
        plan: RegenPlan,
        unit: Unit,
        *,
        env: Any = None,
        on_progress: OnProgress | None = None,
    ) -> UnitReport:
        on_result = (
            None
            if on_progress is None
            else (lambda row: on_progress(1, int(row.get("completion_tokens") or 0)))
        )
        report = regen_shard(config, plan, int(unit), list(env), on_result=on_result)
        return _unit_report(report)

    def unit_output(self, plan: RegenPlan, unit: Unit) -> Path:
        return plan.out_dir / shard_name(int(unit))

    def progress(self, plan: RegenPlan) -> Progress:
        """Samples done / planned over this run's shards (``plan.units``: tonight's, a
        re-trigger's), never the whole prompt pool."""
        return regen_status(plan.out_dir, shard_ids=[int(u) for u in plan.units]).progress

    def health(self, config: PipelineConfig, env: Any) -> list[dict[str, Any]]:
        """Each server's state in this process's pool (the one the shards share on the thread
        runner)."""
        return shared_pool(list(env), config.regen).stats() if env else []

    def retrigger(self, plan: RegenPlan, failed: Sequence[Unit]) -> str:
        """The exact command for these shards (it works mid-run too, before ``failed_shards.json``
        is written)."""
        return f"eagle3 retry-shards --run {plan.out_dir} " + " ".join(
            f"--shard {int(u)}" for u in sorted(failed)
        )

    def finalize(
        self,
        config: PipelineConfig,
        plan: RegenPlan,
        reports: Sequence[UnitReport],
        failed: Sequence[Unit],
    ) -> StageResult:
        table, done = shard_table(plan, failed), _compacted(plan)
        pending = sorted(set(plan.shards) - set(done))
        summary: dict[str, Any] = {
            k: sum(r.detail.get(k, 0) for r in done.values()) for k in REPORT_FIELDS
        }
        summary |= {
            "regen_dir": str(plan.out_dir),
            "fingerprint": plan.fingerprint,
            "done": not pending,
            "shards_done": len(done),
            "shards_pending": pending,
            "failed_shards": sorted(map(int, failed)),
        }
        markdown = _summary_markdown(plan, summary, self.retrigger(plan, failed) if failed else "")
        if failed:
            return self.failed_result(plan, failed, summary=summary, table=table, markdown=markdown)
        write_failed_shards(plan.out_dir, [])
        if not pending:
            _write_manifest(config, plan, done, summary)
        return StageResult(
            stage=self.name,
            fingerprint=plan.fingerprint,
            out_dir=plan.out_dir,
            done=not pending,
            summary=summary,
            table=table,
            markdown=markdown,
        )


def _unit_report(report: ShardReport) -> UnitReport:
    return UnitReport(
        unit=report.index,
        skipped=report.state == "skipped",
        rows=report.rows,
        tokens=report.completion_tokens,
        detail=report.to_dict(),
    )


def _compacted(plan: RegenPlan) -> dict[int, UnitReport]:
    """The report of every compacted shard of the stage (this run's and earlier runs')."""
    paths = {i: plan.out_dir / shard_name(i) for i in sorted(plan.shards)}
    valid = {i: p for i, p in paths.items() if shard_is_valid(p, schema=REGEN_SCHEMA)}
    return {i: _unit_report(report_from_shard(p, i)) for i, p in valid.items()}


def shard_table(plan: RegenPlan, failed: Sequence[Unit]) -> list[dict[str, Any]]:
    """One row per shard (the Prefect table artifact): state, prompts, outcome counts, generated
    tokens."""
    done = _compacted(plan)
    table = []
    for index in sorted(plan.shards):
        row: dict[str, Any] = {"shard": index, "prompts": plan.shards[index]}
        if index in done:
            row |= {"state": "done"} | {k: done[index].detail.get(k, 0) for k in REPORT_FIELDS}
        else:
            row["state"] = "failed" if index in failed else "pending"
        table.append(row)
    return table


def _write_manifest(
    config: PipelineConfig, plan: RegenPlan, done: dict[int, UnitReport], stats: dict[str, Any]
) -> None:
    files = []
    for index, report in done.items():
        files.append(
            FileEntry.of(plan.out_dir / shard_name(index), rows=report.rows, base=plan.out_dir)
        )
        for kind in (FAILED, DROPPED):
            side = plan.out_dir / shard_name(index, kind)
            if side.exists():
                files.append(FileEntry.of(side, rows=report.detail.get(kind, 0), base=plan.out_dir))
    Manifest(
        stage="regen",
        fingerprint=plan.fingerprint,
        files=files,
        stats=stats,
        config={
            "sampling": sampling_fields(config.regen),
            "sampling_params": sampling_params(config.regen),
            "target": target_fields(config),
            "prompts_dir": str(plan.prompts_dir),
            "prompts_fingerprint": plan.prompts_fingerprint,
            "servers": list(config.regen.servers) or ["<local reference server>"],
            "history": HISTORY_RULE,
        },
    ).write(plan.out_dir)


def _summary_markdown(plan: RegenPlan, summary: dict[str, Any], retrigger: str) -> str:
    failed = summary["failed_shards"]
    return "\n".join(
        [
            f"# regen {plan.fingerprint}",
            f"- stage dir: `{plan.out_dir}`",
            f"- done: {summary['done']} ({summary['shards_done']}/{len(plan.shards)} shards)",
            f"- served {summary['served']}, pre-tokenized {summary['pretokenized']} (passed through)",
            f"- ok {summary['ok']}, truncated {summary['truncated']}, dropped {summary['dropped']}, "
            f"failed samples {summary['failed']}",
            f"- outputs whose text re-encodes to other ids: {summary['round_trip_failures']} "
            "(kept: rows hold the ids the engine generated, never a re-encoding)",
            f"- failed shards: {failed or 'none'}"
            + (f" (re-run: `{retrigger}`)" if failed else ""),
        ]
    )
