"""Dedup + shard: the per-source spills -> ``<root>/prompts/<fp>/shard-NNNNN.parquet`` +
``quarantine.parquet``.

One pass over the spills, interleaved in proportion to their sizes (rows in file order within a
source), so "first occurrence wins" is deterministic, the shards are byte-identical for a config,
and every prefix of the shards mixes all sources. Exact and near duplicates (``eagle3.data.dedup``)
join the per-source quarantine rows in ``quarantine.parquet``. The books are checked per source
before the manifest is written: rows in = rows kept in shards + rows quarantined (by reason); a
mismatch raises instead of losing rows. The spills are deleted once the manifest is written (the
manifest is the stage's only "done" signal).
"""

from __future__ import annotations

import heapq
import logging
import os
import shutil
from collections import Counter
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

from eagle3.config.pipeline import PipelineConfig
from eagle3.data.dedup import Deduper
from eagle3.data.normalize import ROW_GROUP_BYTES
from eagle3.data.parquet import ShardWriter, iter_batches, open_shard, write_table
from eagle3.data.readers import truncate_raw
from eagle3.data.schema import PROMPT_SCHEMA, QUARANTINE_SCHEMA
from eagle3.data.served import served_labels
from eagle3.rundir.runroot import FileEntry, Manifest

logger = logging.getLogger(__name__)

QUARANTINE_FILE = "quarantine.parquet"


class BooksError(RuntimeError):
    """Rows in != rows kept + rows quarantined for a source: a bug, never silently accepted."""


def _spill_rows(path: Path) -> Iterator[dict[str, Any]]:
    for batch in iter_batches(path):
        yield from batch.to_pylist()


def _interleaved(spills: list[dict[str, Any]]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Rows of every spill, interleaved in proportion to the spills' sizes, streaming and
    deterministic.

    Any prefix of the shards is then a representative mix of the sources, so a nightly run that
    takes only the first shards (``--scale``) trains on every source, and shard k keeps its content
    as later nights add shards.
    """
    paths = [Path(s["spill"]) if s["spill"] else None for s in spills]
    totals = [open_shard(p).metadata.num_rows if p else 0 for p in paths]
    rows = [_spill_rows(p) if p else iter(()) for p in paths]
    emitted = [0] * len(spills)
    heap = [(1 / total, i) for i, total in enumerate(totals) if total]
    heapq.heapify(heap)
    while heap:
        _, i = heapq.heappop(heap)
        emitted[i] += 1
        yield i, next(rows[i])
        if emitted[i] < totals[i]:
            heapq.heappush(heap, ((emitted[i] + 1) / totals[i], i))


def _dedup_turns(row: dict[str, Any]) -> list[str]:
    return [m["content"] for m in row["messages"] if m["role"] not in ("assistant", "system")]


def _claim_first(
    spills: list[dict[str, Any]], first: Collection[int], deduper: Deduper
) -> dict[tuple[int, str], str | None]:
    """Dedup decisions for the rows of the ``first`` spills (served sources), taken before any
    other row is seen: a served row holds the target's answer already, so it wins a tie with a
    row that would be regenerated."""
    decided: dict[tuple[int, str], str | None] = {}
    for i in sorted(first):
        for row in _spill_rows(Path(spills[i]["spill"])) if spills[i]["spill"] else ():
            decided[(i, row["source_row"])] = deduper.check(row["sample_id"], _dedup_turns(row))
    return decided


def _dedup_spills(
    spills: list[dict[str, Any]],
    deduper: Deduper,
    writer: ShardWriter,
    qwriter: ShardWriter,
    *,
    chunk: int = 256,
    first: Collection[int] = (),
) -> list[tuple[int, Counter[str]]]:
    counts: list[tuple[int, Counter[str]]] = [(0, Counter()) for _ in spills]
    rows: list[dict[str, Any]] = []
    rejects: list[dict[str, Any]] = []
    decided = _claim_first(spills, first, deduper)
    for i, row in _interleaved(spills):
        key, turns = (i, row["source_row"]), _dedup_turns(row)
        reason = decided[key] if i in first else deduper.check(row["sample_id"], turns)
        kept, dropped = counts[i]
        if reason is None:
            rows.append(row)
            counts[i] = (kept + 1, dropped)
        else:
            dropped[reason] += 1
            raw = truncate_raw({"sample_id": row["sample_id"], "messages": row["messages"]})
            rejects.append(
                {
                    "source": row["source"],
                    "source_row": row["source_row"],
                    "reason": reason,
                    "raw": raw,
                }
            )
        if len(rows) >= chunk or len(rejects) >= chunk:
            writer.write_rows(rows)
            qwriter.write_rows(rejects)
            rows, rejects = [], []
    writer.write_rows(rows)
    qwriter.write_rows(rejects)
    for spill in spills:
        for qbatch in iter_batches(Path(spill["quarantine"])) if spill["quarantine"] else ():
            qwriter.write_table(_as_table(qbatch))
    return counts


def _as_table(batch: Any) -> Any:
    import pyarrow as pa

    return pa.Table.from_batches([batch])


def _balance(spill: dict[str, Any], kept: int, dropped: Counter[str]) -> dict[str, Any]:
    quarantined = Counter(spill["quarantined"]) + dropped
    record = {
        "source": spill["source"],
        "available": spill.get("available"),
        "planned": spill.get("planned"),
        "in": spill["in"],
        "kept": kept,
        "quarantined": dict(sorted(quarantined.items())),
        "duplicates": dropped.get("duplicate", 0) + dropped.get("near_duplicate", 0),
    } | ({"filters": spill["filters"]} if "filters" in spill else {})
    if spill["in"] != kept + sum(quarantined.values()):
        raise BooksError(
            f"{spill['source']}: {spill['in']} rows in but {kept} kept + {dict(quarantined)} quarantined"
        )
    return record


def build_prompt_shards(
    config: PipelineConfig, spills: list[dict[str, Any]], out_dir: Path
) -> dict[str, Any]:
    """Dedup the spills across sources, write prompt shards + quarantine + manifest; returns the
    manifest's stats.

    A finished stage (manifest present) is left untouched.
    """
    out_dir = Path(out_dir)
    done = Manifest.read(out_dir)
    if done is not None:
        logger.info("prompts %s are up to date (manifest hit): nothing to do", out_dir)
        # left by a kill between the manifest and the rmtree
        shutil.rmtree(out_dir / "spill", ignore_errors=True)
        return done.stats
    n = config.normalize
    deduper = Deduper(threshold=n.near_dup_threshold, num_perm=n.minhash_num_perm)
    meta = {
        "stage": "prompts",
        "fingerprint": out_dir.name,
        "system_prompt_policy": n.system_prompt_policy,
    }
    per_source: dict[str, Any] = {}
    rg = ROW_GROUP_BYTES
    with ShardWriter(
        out_dir, PROMPT_SCHEMA, rows_per_shard=n.shard_size, row_group_bytes=rg, metadata=meta
    ) as writer:
        with ShardWriter(
            out_dir, QUARANTINE_SCHEMA, prefix="quarantine", row_group_bytes=rg, metadata=meta
        ) as qwriter:
            served = served_labels(config)
            first = {i for i, spill in enumerate(spills) if spill["source"] in served}
            counted = _dedup_spills(spills, deduper, writer, qwriter, first=first)
            for spill, (kept, dropped) in zip(spills, counted, strict=True):
                per_source[spill["source"]] = _balance(spill, kept, dropped)
            qinfos = qwriter.close()
        shards = writer.close()
    quarantine = out_dir / QUARANTINE_FILE
    if qinfos:
        os.replace(qinfos[0].path, quarantine)
    else:
        write_table(quarantine, QUARANTINE_SCHEMA.empty_table())
    q_rows = qinfos[0].rows if qinfos else 0
    files = [FileEntry.of(s.path, rows=s.rows, base=out_dir, sha256=s.sha256) for s in shards]
    files.append(FileEntry.of(quarantine, rows=q_rows, base=out_dir))
    stats = {
        "sources": per_source,
        "kept": sum(s["kept"] for s in per_source.values()),
        "quarantined": q_rows,
        "shards": len(shards),
    }
    config_doc = {k: config.model_dump(mode="json")[k] for k in ("sources", "mix", "normalize")}
    Manifest("prompts", out_dir.name, files=files, config=config_doc, stats=stats).write(out_dir)
    shutil.rmtree(out_dir / "spill", ignore_errors=True)
    logger.info(
        "prompts %s: %d kept in %d shards, %d quarantined",
        out_dir,
        stats["kept"],
        len(shards),
        q_rows,
    )
    return stats


def summary_markdown(stats: dict[str, Any]) -> str:
    """A short markdown report of a finished prompts stage (for the Prefect summary artifact)."""
    lines = ["| source | in | kept | duplicates | quarantined |", "|---|---|---|---|---|"]
    for s in stats["sources"].values():
        q = ", ".join(f"{k}: {v}" for k, v in s["quarantined"].items()) or "-"
        lines.append(f"| {s['source']} | {s['in']} | {s['kept']} | {s['duplicates']} | {q} |")
    head = f"**{stats['kept']:,} prompts** in {stats['shards']} shards, {stats['quarantined']:,} rows quarantined.\n\n"
    return head + "\n".join(lines) + "\n"
