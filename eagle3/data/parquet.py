"""The one Parquet shard writer and reader every stage uses.

* explicit schema, footer key-value metadata (strings),
* row groups sized by bytes, not rows (hidden-state rows are MBs, prompt rows are KBs),
* shard rotation by row count, file names ``<prefix>-NNNNN.parquet``,
* each shard written as ``*.tmp`` and renamed when complete; ``close()`` returns what was written,
  its sha256 hashed as it is written and each row group synced as it is written (``_ShardFile``),
* a CRC32 in every page header (``write_page_checksum``), so a reader can check each page as it
  reads it (``page_checksum_verification``) and the footer, which no page checksum covers, by
  ``footer_sha256``,
* no dictionary and no statistics on binary columns (``value_columns``).

Readers validate the footer and the schema: a truncated or foreign file raises ``ShardError`` so the
caller rebuilds it instead of trusting it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from eagle3.rundir.layout import shard_name
from eagle3.rundir.runroot import atomic_path, footer_sha256, fsync_dir, sha256_file


def value_columns(schema: pa.Schema) -> list[str]:
    """The Parquet leaf columns that hold values, not opaque blobs: all but top-level binary columns
    (hidden states, one distinct multi-KB value per row). Only these get a dictionary and
    statistics; by default Arrow tries both on every column (BENCHMARKS.md, "Capture writer"):

    * a dictionary on a state column is hashed until its page overflows, then falls back to plain,
      which leaves the chunk in two encodings: 13-30% more CPU to write than plain alone, a few
      percent more to read;
    * statistics on it compare every multi-MB value with the running min and max, for a min and max
      that are then too long to store: 3.5x the CPU of writing the column without them (347 vs 982
      MiB/s uncompressed)."""

    def leaves(name: str, kind: pa.DataType) -> list[str]:
        if pa.types.is_list(kind) or pa.types.is_large_list(kind):  # Arrow's compliant nested names
            return leaves(f"{name}.list.element", kind.value_type)
        if pa.types.is_struct(kind):
            return [leaf for child in kind for leaf in leaves(f"{name}.{child.name}", child.type)]
        return [name]

    blob = (pa.types.is_binary, pa.types.is_large_binary)
    return [
        leaf
        for f in schema
        if not any(is_(f.type) for is_ in blob)
        for leaf in leaves(f.name, f.type)
    ]


def parquet_writer(
    where: Path | _ShardFile, schema: pa.Schema, compression: str | Mapping[str, str]
) -> pq.ParquetWriter:
    """The project's Parquet writer settings (``value_columns``) for one file (a path, or a file
    Arrow writes to but does not close)."""
    values = value_columns(schema)
    return pq.ParquetWriter(
        where,
        schema,
        compression=compression,
        use_dictionary=values,
        write_statistics=values,
        write_page_checksum=True,
    )


class _ShardFile:
    """The ``*.tmp`` file a shard is written to, handed to Arrow as a Python file. It hashes the
    bytes on their way to the disk and ``sync`` is called after each row group, so finishing a shard
    neither reads it back for its sha256 nor waits for all of it to reach the disk: on a GPU node a
    capture shard is tens of GB, and the forward would wait for both (BENCHMARKS.md, "Capture
    writer"). Syncing as it goes also bounds the dirty pages one writer holds to a row group,
    instead of leaving the kernel to throttle it at its dirty limit."""

    def __init__(self, path: Path) -> None:
        self._fh = open(path, "wb")  # noqa: SIM115 -- closed by ShardWriter._finish_shard or abort
        self._digest = hashlib.sha256()

    @property
    def closed(self) -> bool:
        return self._fh.closed

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:
        self._digest.update(data)
        return self._fh.write(data)

    def flush(self) -> None:
        self._fh.flush()

    def sync(self) -> None:
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()

    def hexdigest(self) -> str:
        return self._digest.hexdigest()


class ShardError(RuntimeError):
    """A shard that cannot be trusted (truncated, unreadable, or of another schema)."""


@dataclass(frozen=True)
class ShardInfo:
    path: Path
    rows: int
    bytes: int
    sha256: str
    footer_sha256: str


class ShardWriter:
    """Write rows to one or more Parquet shards with byte-sized row groups.

    ``rows_per_shard=None`` writes a single file named ``shard_name(start_index, prefix)``.
    """

    def __init__(
        self,
        out_dir: Path,
        schema: pa.Schema,
        *,
        prefix: str = "shard",
        start_index: int = 0,
        rows_per_shard: int | None = None,
        row_group_bytes: int = 64 * 2**20,
        metadata: Mapping[str, str] | None = None,
        compression: str | Mapping[str, str] = "zstd",  # one codec, or one per column name
    ) -> None:
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        meta = {
            **(schema.metadata or {}),
            **{k.encode(): v.encode() for k, v in (metadata or {}).items()},
        }
        self.schema = schema.with_metadata(meta)
        self.prefix = prefix
        self.rows_per_shard = rows_per_shard
        self.row_group_bytes = row_group_bytes
        self.compression = compression
        self._index = start_index
        self._writer: pq.ParquetWriter | None = None
        self._file: _ShardFile | None = None
        self._tmp: Path | None = None
        self._rows_in_shard = 0
        self._buffer: list[pa.RecordBatch] = []
        self._buffer_bytes = 0
        self._written: list[ShardInfo] = []

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def write_rows(self, rows: Iterable[Mapping[str, Any]]) -> None:
        rows = list(rows)
        if rows:
            self.write_table(pa.Table.from_pylist(rows, schema=self.schema))

    def write_table(self, table: pa.Table) -> None:
        table = table.cast(self.schema) if table.schema != self.schema else table
        offset = 0
        while offset < table.num_rows:
            room = table.num_rows - offset
            if self.rows_per_shard is not None:
                room = min(room, self.rows_per_shard - self._rows_in_shard - self._buffered_rows())
            piece = table.slice(offset, room)
            for batch in piece.to_batches():
                self._buffer.append(batch)
                self._buffer_bytes += batch.nbytes
            offset += room
            if self._buffer_bytes >= self.row_group_bytes:
                self._flush_row_group()
            if (
                self.rows_per_shard is not None
                and self._rows_in_shard + self._buffered_rows() >= self.rows_per_shard
            ):
                self._finish_shard()

    def close(self) -> list[ShardInfo]:
        """Flush and finish the open shard; returns every shard written by this writer."""
        if self._buffer or self._writer is not None:
            self._finish_shard()
        return list(self._written)

    def abort(self) -> None:
        """Drop the unfinished shard (its ``*.tmp``), keeping shards already finished."""
        if self._writer is not None:
            self._writer.close()
        if self._file is not None:
            self._file.close()
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)
        self._writer, self._file, self._tmp, self._buffer, self._buffer_bytes = (
            None,
            None,
            None,
            [],
            0,
        )

    def _buffered_rows(self) -> int:
        return sum(b.num_rows for b in self._buffer)

    def _open(self) -> tuple[pq.ParquetWriter, _ShardFile]:
        if self._writer is None:
            self._tmp = self.out_dir / (shard_name(self._index, self.prefix) + ".tmp")
            self._file = _ShardFile(self._tmp)
            self._writer = parquet_writer(self._file, self.schema, self.compression)
        assert self._file is not None
        return self._writer, self._file

    def _flush_row_group(self) -> None:
        if not self._buffer:
            return
        writer, file = self._open()
        table = pa.Table.from_batches(self._buffer, schema=self.schema)
        writer.write_table(table, row_group_size=table.num_rows)
        file.sync()
        self._rows_in_shard += table.num_rows
        self._buffer, self._buffer_bytes = [], 0

    def _finish_shard(self) -> None:
        self._flush_row_group()
        # an empty single-file writer still produces a valid, empty file
        writer, file = self._open()
        writer.close()  # the footer
        file.sync()
        file.close()
        assert self._tmp is not None
        final = self._tmp.with_suffix("")  # strip ".tmp"
        os.replace(self._tmp, final)
        fsync_dir(self.out_dir)
        self._written.append(
            ShardInfo(
                final,
                self._rows_in_shard,
                final.stat().st_size,
                file.hexdigest(),
                footer_sha256(final),
            )
        )
        self._writer, self._file, self._tmp, self._rows_in_shard = None, None, None, 0
        self._index += 1


def write_table(
    path: Path, table: pa.Table, *, metadata: Mapping[str, str] | None = None
) -> ShardInfo:
    """Write one small table to exactly ``path`` (atomically), e.g. ``quarantine.parquet``."""
    path = Path(path)
    meta = {
        **(table.schema.metadata or {}),
        **{k.encode(): v.encode() for k, v in (metadata or {}).items()},
    }
    table = table.replace_schema_metadata(meta)
    with atomic_path(path) as tmp, parquet_writer(tmp, table.schema, "zstd") as writer:
        writer.write_table(table)
    return ShardInfo(
        path, table.num_rows, path.stat().st_size, sha256_file(path), footer_sha256(path)
    )


def open_shard(path: Path, *, schema: pa.Schema | None = None) -> pq.ParquetFile:
    """Open a shard after checking its footer and (optionally) that it has every field of
    ``schema``. Its reads check each page's checksum (an ``OSError`` on a damaged page, where an
    unchecked read decodes wrong values)."""
    try:
        pf = pq.ParquetFile(path, page_checksum_verification=True)
    except (pa.ArrowInvalid, OSError) as exc:
        raise ShardError(
            f"{path}: unreadable Parquet footer ({exc}); delete it so the stage rebuilds it"
        ) from exc
    if schema is not None:
        have = pf.schema_arrow
        missing = [f.name for f in schema if have.get_field_index(f.name) < 0]
        wrong = [
            f.name
            for f in schema
            if f.name not in missing and not have.field(f.name).type.equals(f.type)
        ]
        if missing or wrong:
            raise ShardError(f"{path}: schema mismatch (missing {missing}, wrong type {wrong})")
    return pf


def shard_metadata(path: Path) -> dict[str, str]:
    meta = open_shard(path).schema_arrow.metadata or {}
    return {k.decode(): v.decode() for k, v in meta.items() if not k.startswith(b"ARROW:")}


def iter_batches(
    path: Path, *, columns: list[str] | None = None, batch_size: int = 1024
) -> Iterator[pa.RecordBatch]:
    yield from open_shard(path).iter_batches(batch_size=batch_size, columns=columns)


def shard_is_valid(path: Path, *, schema: pa.Schema | None = None, rows: int | None = None) -> bool:
    """True when ``path`` opens, matches ``schema`` and (if given) holds ``rows`` rows."""
    try:
        pf = open_shard(path, schema=schema)
    except ShardError:
        return False
    return rows is None or pf.metadata.num_rows == rows
