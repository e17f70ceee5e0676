"""The disk budget of a capture: estimate the bytes before the first forward, refuse when they do
not fit.

At Kimi-K2.5's scale (H 7168, 8*H = 57 KB per token in bf16) a night of features is terabytes; a
capture that fills the disk half-way fails every shard task at once and leaves the run root
unusable. So the capture stage checks before it starts (``CaptureStage.resources``):

    estimate = tokens of the regen shards still to capture x uncompressed bytes per token of
    capture.encoding
               + the largest such shards once more, as many as run at once (``shards_at_once``): a
                 running shard's uncompressed part files live until it finishes

and refuses when the free space at the features root is below ``estimate +
capture.disk_reserve_bytes``. Token counts come from the regen shards' Parquet footers (the
leaf-value count of ``input_ids``), so nothing is read. The estimate is an upper bound: the Parquet
codecs only shrink it (BENCHMARKS.md has the measured ratios).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from eagle3.capture.encoding import ENCODINGS, bytes_per_token
from eagle3.config.pipeline import PipelineConfig

logger = logging.getLogger(__name__)

# The per-night estimate's assumption on the regenerated conversations' length (prompt + target
# answer, in target tokens): about 1.5K tokens per sample (docs/DESIGN.md, "Features"). Used only
# where no regen shards exist yet (``eagle3 config show``); a real capture counts its shards'
# tokens.
MEAN_TOKENS_PER_SAMPLE = 1_500


class DiskBudgetError(RuntimeError):
    """The features root has less free space than the capture needs (the message says how much and
    what to do)."""


@dataclass(frozen=True)
class DiskEstimate:
    tokens: int
    bytes_per_token: int
    shards_at_once: int
    # the largest ``shards_at_once`` shards' tokens: the most held in part files at one time
    parts_tokens: int

    @property
    def total_bytes(self) -> int:
        return (self.tokens + self.parts_tokens) * self.bytes_per_token


def shards_at_once(config: PipelineConfig, shards: int) -> int:
    """The most of ``shards`` capture shards that run at the same time:
    ``capture.shards_in_flight``, else the task runner's bound (``orchestration.max_workers`` on
    threads, and on a local Ray, which it sizes), else all of them (a remote Ray cluster runs as
    many as its GPUs fit: unknown before the tasks run)."""
    orchestration = config.orchestration
    bound = config.capture.shards_in_flight
    if bound is None and (
        orchestration.task_runner == "thread" or orchestration.ray_address is None
    ):
        bound = orchestration.max_workers
    return shards if bound is None else min(bound, shards)


def regen_tokens(path: Path) -> int:
    """Tokens in a regen shard, from its footer: the leaf-value count of the ``input_ids`` list
    column."""
    meta = pq.ParquetFile(path).metadata
    column = next(
        j for j in range(meta.num_columns) if meta.schema.column(j).path.startswith("input_ids.")
    )
    return sum(meta.row_group(i).column(column).num_values for i in range(meta.num_row_groups))


def capture_estimate(config: PipelineConfig, regen_shards: Iterable[Path]) -> DiskEstimate:
    """The disk a capture of ``regen_shards`` needs in ``config.capture.encoding`` (see the module
    docstring)."""
    counts = sorted((regen_tokens(Path(p)) for p in regen_shards), reverse=True)
    capture = config.capture
    per_token = bytes_per_token(
        capture.encoding, capture.dtype, config.target.hidden_size, topk=capture.topk
    )
    at_once = shards_at_once(config, len(counts))
    return DiskEstimate(
        tokens=sum(counts),
        bytes_per_token=per_token,
        shards_at_once=at_once,
        parts_tokens=sum(counts[:at_once]),
    )


def check_disk_budget(
    estimate: DiskEstimate, out_dir: Path, *, reserve_bytes: int, encoding: str
) -> None:
    """Log the estimate; raise ``DiskBudgetError`` when the free space at ``out_dir`` (or its
    nearest existing parent) is below the estimate plus the reserve."""
    probe = Path(out_dir)
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    need = estimate.total_bytes + reserve_bytes
    logger.info(
        "capture needs at most %s for %s tokens (%s, %d B/token, uncompressed); %s free at %s",
        human_bytes(estimate.total_bytes),
        f"{estimate.tokens:,}",
        encoding,
        estimate.bytes_per_token,
        human_bytes(free),
        probe,
    )
    if free < need:
        raise DiskBudgetError(
            f"capture refused before writing: it needs up to {human_bytes(estimate.total_bytes)} "
            f"({estimate.tokens:,} tokens x {estimate.bytes_per_token} B/token in encoding {encoding!r}, plus the "
            f"part files of the {estimate.shards_at_once} largest shards, which may run at once) and "
            f"capture.disk_reserve_bytes={human_bytes(reserve_bytes)} must stay free, but only {human_bytes(free)} "
            f"is free at {probe}. Free space there, point `root` at a larger disk, capture fewer shards (--shard) "
            "or fewer at once (capture.shards_in_flight), or store less per token (capture.encoding=fp8_aux, "
            "fp8_all or fp8_topk)"
        )


def night_estimate(
    config: PipelineConfig, *, mean_tokens: int = MEAN_TOKENS_PER_SAMPLE
) -> dict[str, object]:
    """Per-encoding feature bytes of one night's mix (``mix.total`` prompts x ``mean_tokens``),
    uncompressed, and what the part files of the shards capturing at once add on top in
    ``capture.encoding`` (the peak the disk budget reserves): what ``eagle3 config show`` prints
    before any regen shard exists."""
    prompts = config.mix.total
    if prompts is None:
        return {"prompts": None, "note": "mix.total is unset: no per-night estimate"}
    tokens = prompts * mean_tokens
    h, capture = config.target.hidden_size, config.capture
    per_token = {e: bytes_per_token(e, capture.dtype, h, topk=capture.topk) for e in ENCODINGS}
    shards = -(-prompts // config.normalize.shard_size)
    at_once = shards_at_once(config, shards)
    return {
        "prompts": prompts,
        "mean_tokens_assumed": mean_tokens,
        "encoding": capture.encoding,
        "topk": capture.topk,
        "bytes_per_token_over_8H": {e: round(n / (8 * h), 3) for e, n in per_token.items()},
        "bytes": {e: human_bytes(tokens * n) for e, n in per_token.items()},
        "part_files_at_peak": f"{at_once} of {shards} shards capturing at once: "
        + human_bytes(
            at_once * config.normalize.shard_size * mean_tokens * per_token[capture.encoding]
        ),
    }


def human_bytes(n: float) -> str:
    """Decimal units (disks are sold and ``df -H`` reports in them): ``6.06 TB``."""
    units, i = ("B", "KB", "MB", "GB", "TB"), 0
    while abs(n) >= 1000 and i < len(units) - 1:
        n, i = n / 1000, i + 1
    return f"{n:,.0f} B" if i == 0 else f"{n:,.2f} {units[i]}"
