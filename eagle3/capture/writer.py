"""The capture's writer threads: part files and the streamed final shard.

The forward (``eagle3.capture.shard``) hands each batch's states in their stored form to
``PartWriter`` and goes on with the next batch. Two background threads do the rest, so a batch's
compression overlaps the next one's part file:
* the parts thread waits for a GPU's copies to the host (``eagle3.runtime.transfer.HostCopy``),
  quarantines non-finite samples, builds the Arrow table over the states' own buffers (no copy) and
  writes and syncs the part file (what a resume keeps);
* the shard thread compresses the tables, in part order, into the final shard.
On a CPU target they share the cores with the forward, so both run at the lowest CPU priority
(``eagle3.runtime.procs.yield_cpu``): they use what the forward's threads leave idle instead of
slowing all of them, and when they fall ``WRITE_AHEAD`` batches behind, the forward waits and frees
the cores. On a GPU target they use the CPU the forward leaves idle at normal priority. What one
writer sustains alone bounds a GPU capture: BENCHMARKS.md.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from eagle3.capture.encoding import host_buffer
from eagle3.capture.schema import (
    CAPTURE_QUARANTINE_SCHEMA,
    FEATURE_SCHEMA,
    REASON_NON_FINITE,
    feature_table,
)
from eagle3.config.pipeline import PipelineConfig
from eagle3.data.parquet import ShardInfo, ShardWriter, parquet_writer, write_table
from eagle3.rundir.layout import hashes_file_name, parts_dir_name, shard_name
from eagle3.rundir.runroot import atomic_path, atomic_write_json, remove_in_background
from eagle3.runtime.procs import yield_cpu
from eagle3.runtime.transfer import HostCopy


def feature_compression(hidden: str) -> dict[str, str]:
    """Parquet codec per feature column: ``hidden`` (``capture.hidden_compression``) for the two
    state columns, zstd for the small rest (ids and masks compress well and cost little to decode).
    Arrow's zstd level is 1, the cheapest that keeps the ratio (BENCHMARKS.md, "Storage": levels 3
    and 6 store the same bytes, 3x and 10x slower)."""
    return {
        name: hidden if name in ("aux_hidden", "last_hidden") else "zstd"
        for name in FEATURE_SCHEMA.names
    }


@dataclass
class Batch:
    """One forward batch for the writer: its part number, each sample's token columns (``sample_id,
    input_ids, loss_mask, seq_len``), its states' stored parts (aux, final) and whether they are
    finite (aux, final: one bool per sample each), as host tensors whose copies from a GPU are done
    once ``copies.wait()`` returns."""

    part: int
    samples: list[dict]
    states: list[tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]]
    finite: tuple[torch.Tensor, torch.Tensor]
    copies: HostCopy
    tokens: int

    def rows(self) -> tuple[list[dict], list[dict]]:
        """(feature rows, quarantined rows: the samples with a non-finite state), in sample
        order."""
        self.copies.wait()
        finite = (self.finite[0] & self.finite[1]).tolist()
        rows, quarantined = [], []
        for sample, ok, (aux, last) in zip(self.samples, finite, self.states, strict=True):
            if not ok:
                quarantined.append(
                    {
                        "sample_id": sample["sample_id"],
                        "reason": REASON_NON_FINITE,
                        "seq_len": sample["seq_len"],
                    }
                )
                continue
            rows.append(
                sample | {"aux_hidden": host_buffer(*aux), "last_hidden": host_buffer(*last)}
            )
        return rows, quarantined


# Batches waiting for the writer: bounds the memory held (one batch's states each) and what a kill
# -9 can lose (those plus the batch forwarding). 2 lets the forward run on while the writer
# compresses a batch.
WRITE_AHEAD = 2


class PartWriter:
    """Writes the forward's batches on background threads (module docstring), so encoding,
    compression and disk stay off the compute thread: per batch an atomic part file (+ quarantine
    part), then its rows streamed into the final shard (``ShardWriter``, byte-sized row groups),
    which is compressed while the forward runs on.

    The final shard is first fed the parts already on disk (a resumed run), in part order, so
    resumed and uninterrupted runs write the same rows in the same order. ``finish`` writes the
    quarantine file, then renames the shard, then writes both files' sizes and hashes
    (``hashes-NNNNN.json``, what ``finalize_features`` lists without reading the shard back), then
    removes the parts (the order ``eagle3.capture.shard._finished`` relies on). A build first
    records that nothing is known of its files (``{}``), so a shard is never listed with another
    build's hashes, even from the previous manifest. ``submit`` blocks while ``WRITE_AHEAD`` batches
    wait (backpressure) and raises the writer's error, if any."""

    def __init__(
        self,
        config: PipelineConfig,
        index: int,
        out_dir: Path,
        footer: dict[str, str],
        done_parts: list[Path],
        progress: Callable[[int, int], None] | None,
    ) -> None:
        self.index, self.out_dir, self.footer, self.progress = index, out_dir, footer, progress
        self._parts_dir = out_dir / parts_dir_name(index)
        shard = out_dir / shard_name(index)
        shard.with_name(shard.name + ".tmp").unlink(missing_ok=True)
        self._hashes = out_dir / hashes_file_name(index)
        # what an earlier build or manifest knew is of other bytes
        atomic_write_json(self._hashes, {})
        self._shard = ShardWriter(
            out_dir,
            FEATURE_SCHEMA,
            start_index=index,
            row_group_bytes=config.capture.row_group_bytes,
            metadata=footer,
            compression=feature_compression(config.capture.hidden_compression),
        )
        self._queue: queue.Queue[Batch | None] = queue.Queue(maxsize=WRITE_AHEAD)
        # parts -> shard thread
        self._tables: queue.Queue[pa.Table | None] = queue.Queue(maxsize=WRITE_AHEAD)
        self._error: BaseException | None = None
        # the forward computes on this CPU: yield to it
        self._background = config.capture.device == "cpu"
        self._threads = [
            threading.Thread(
                target=self._loop, args=(done_parts,), name=f"capture-parts-{index}", daemon=True
            ),
            threading.Thread(target=self._shard_loop, name=f"capture-shard-{index}", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, batch: Batch) -> None:
        self._raise_error()
        self._queue.put(batch)

    def _raise_error(self) -> None:
        if self._error is not None:
            raise RuntimeError(
                f"capture writer of shard {self.index} failed: {self._error}"
            ) from self._error

    def _loop(self, done_parts: list[Path]) -> None:
        """The parts thread: each batch's rows, its part files (what a resume keeps), then its table
        to the shard thread."""
        if self._background:
            yield_cpu()
        try:
            for part in done_parts:
                self._tables.put(pq.read_table(part).cast(FEATURE_SCHEMA))
            while (batch := self._queue.get()) is not None:
                self._write(batch)
        except BaseException as exc:  # handed to the compute thread by submit/finish
            self._error = exc
            # keep taking batches so submit never blocks on a dead writer
            while self._queue.get() is not None:
                pass
        finally:
            self._tables.put(None)

    def _shard_loop(self) -> None:
        """The shard thread: the tables, in part order, compressed into the final shard. Its own
        thread, so a batch's compression runs while the next batch's part file is written and
        synced."""
        if self._background:
            yield_cpu()
        try:
            while (table := self._tables.get()) is not None:
                self._shard.write_table(table)
        except BaseException as exc:
            self._error = self._error or exc
            # so the parts thread never blocks on a dead shard thread
            while self._tables.get() is not None:
                pass

    def _write(self, batch: Batch) -> None:
        name = f"{self.index:05d}.part-{batch.part:05d}.parquet"
        rows, quarantined = batch.rows()
        # written first: a kill between the two files only redoes this batch's good rows
        if quarantined:
            q_table = pa.Table.from_pylist(quarantined, schema=CAPTURE_QUARANTINE_SCHEMA)
            write_table(self._parts_dir / f"quarantine-{name}", q_table, metadata=self.footer)
        if rows:
            table = feature_table(rows)
            _write_part(self._parts_dir / f"shard-{name}", table, self.footer)
            self._tables.put(table)
        # reported once the batch is on disk: a resume keeps what was reported
        if self.progress is not None:
            self.progress(len(batch.samples), batch.tokens)

    def _stop(self) -> None:
        self._queue.put(None)
        for thread in self._threads:
            thread.join()

    def abort(self) -> None:
        """Stop after the batches already handed over (their parts stay, for the resume); drop the
        unfinished shard."""
        self._stop()
        self._shard.abort()

    def finish(self, pre_quarantined: list[dict]) -> dict[str, Any]:
        """Quarantine file first (the rows quarantined before the forward, then every quarantine
        part), shard second, their writers' hashes third, parts last (renamed aside and deleted in
        the background: ``remove_in_background``). A kill between the shard and its hashes leaves a
        finished shard whose hashes are not known (``{}``): the next capture of the shard checks its
        pages and records them (``eagle3.capture.shard``)."""
        self._stop()
        if self._error is not None:
            self._shard.abort()
            self._raise_error()
        quarantine = self.out_dir / shard_name(self.index, "quarantine")
        quarantine_parts = sorted(
            self._parts_dir.glob(f"quarantine-{self.index:05d}.part-*.parquet")
        )
        q_tables = [pa.Table.from_pylist(pre_quarantined, schema=CAPTURE_QUARANTINE_SCHEMA)]
        q_tables += [pq.read_table(p).cast(CAPTURE_QUARANTINE_SCHEMA) for p in quarantine_parts]
        q_info = write_table(quarantine, pa.concat_tables(q_tables), metadata=self.footer)
        (info,) = self._shard.close()
        record_hashes(self._hashes, [info, q_info])
        remove_in_background(self._parts_dir)
        return {
            "shard_index": self.index,
            "path": str(info.path),
            "rows": info.rows,
            "quarantined": q_info.rows,
            "bytes": info.bytes,
        }


def record_hashes(path: Path, files: Sequence[ShardInfo]) -> None:
    """``hashes-NNNNN.json``: each of a shard's files' size, sha256 and footer sha256, by file
    name."""
    atomic_write_json(
        path,
        {
            i.path.name: {"bytes": i.bytes, "sha256": i.sha256, "footer_sha256": i.footer_sha256}
            for i in files
        },
    )


def _write_part(path: Path, table: pa.Table, footer: dict[str, str]) -> None:
    """A part file, atomically and uncompressed: it lives until the shard is finished, which
    compresses once."""
    meta = {**(table.schema.metadata or {}), **{k.encode(): v.encode() for k, v in footer.items()}}
    table = table.replace_schema_metadata(meta)
    with atomic_path(path) as tmp, parquet_writer(tmp, table.schema, "none") as writer:
        writer.write_table(table)
