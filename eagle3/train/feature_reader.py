"""Reading feature shards: one row group at a time, every page checked, as tensors in the stored
form.

``open_features`` parses and validates a shard's footer once; each read then opens its own
memory-mapped handle on it (``FeatureFile.read``), and ``iter_row_groups`` keeps the next row groups
reading on threads of their own while the consumer works on one. The rows come out as tensors
viewing the decompressed Arrow buffers (``Decoded``): the loader (``eagle3.train.data``) makes the
one copy into its padded batches.
"""

from __future__ import annotations

import itertools
import warnings
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from eagle3.capture.encoding import ColumnCodec, Encoded, FinalCodec
from eagle3.capture.schema import FEATURE_SCHEMA
from eagle3.data.parquet import open_shard
from eagle3.rundir.integrity import checked_read
from eagle3.runtime.procs import yield_cpu

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class Decoded:
    """One row group's rows as tensors viewing the decompressed Arrow buffers (no copy, no per-token
    Python)."""

    input_ids: list[torch.Tensor]
    loss_mask: list[torch.Tensor]
    aux: list[Encoded]
    last: list[Encoded]


# What training reads: every column but sample_id (read only to name a failing batch's samples,
# ``origin``).
READ_COLUMNS = ["input_ids", "loss_mask", "aux_hidden", "last_hidden"]


@dataclass(frozen=True)
class FeatureFile:
    """A validated feature shard: its path and parsed footer. Every read opens its own handle on
    them (``read``): a ``pq.ParquetFile`` read with ``pre_buffer`` swaps a read cache that a read on
    another thread may still be using (apache/arrow PARQUET-2316), which fails as "ReadRangeCache
    did not find matching cache entry" or crashes the process; a handle on the already-parsed footer
    costs one ``mmap``."""

    path: Path
    metadata: pq.FileMetaData

    @property
    def num_row_groups(self) -> int:
        return self.metadata.num_row_groups

    def read(
        self, columns: list[str], row_group: int | None = None, *, use_threads: bool = True
    ) -> pa.Table:
        """``columns`` of one row group (None: of the whole file), on a handle of its own (class
        docstring).

        The handle is opened for fast reads: memory-mapped (pages are not copied into a read buffer
        first) and each row group's column chunks fetched in one go (``pre_buffer``): 2-3x the
        throughput of a plain open on uncompressed state columns (BENCHMARKS.md, "Storage"). Shards
        are replaced by rename, never rewritten in place, so a mapping stays valid while training.
        Every page is checked against its CRC32 as it is read (the loader's ``verify_files`` checked
        sizes and footers only: ``eagle3.rundir.integrity``); one that fails, or does not decode,
        raises ``DataError`` naming the file, the row group and the command that rebuilds it."""
        handle = pq.ParquetFile(
            self.path,
            metadata=self.metadata,
            memory_map=True,
            pre_buffer=True,
            page_checksum_verification=True,
        )
        with checked_read(self.path, rebuild="eagle3 capture", row_group=row_group):
            if row_group is None:
                return handle.read(columns=columns, use_threads=use_threads)
            return handle.read_row_group(row_group, columns=columns, use_threads=use_threads)

    def read_column(self, row_group: int, column: str) -> list[Any]:
        return self.read([column], row_group).column(0).to_pylist()


def iter_row_groups(
    reads: Iterable[tuple[FeatureFile, int]],
    codecs: tuple[ColumnCodec, FinalCodec],
    *,
    ahead: int = 1,
    background: bool = False,
) -> Iterator[Decoded]:
    """``read_row_group`` over ``(file, row group)`` pairs in order, with ``ahead`` row groups
    beyond the one asked for already reading on their own threads: the decompression of one row
    group uses ~1.3 cores at most (the aux column is 3/4 of the bytes), so reading two at once is
    what keeps two cores decompressing. ``background``: the reading threads yield to the compute of
    this process (``yield_cpu``; Arrow decodes on them)."""

    def read(pair: tuple[FeatureFile, int]) -> Decoded:
        return read_row_group(*pair, codecs, arrow_threads=not background)

    return run_ahead(
        read, reads, ahead=ahead, threads=ahead + 1, name="row-group-reader", background=background
    )


def run_ahead(
    fn: Callable[[T], R],
    items: Iterable[T],
    *,
    ahead: int,
    threads: int,
    name: str,
    background: bool = False,
) -> Generator[R, None, None]:
    """``fn`` over ``items``, results in order, on ``threads`` threads named ``name``, with
    ``ahead`` items beyond the one asked for already submitted (a bounded prefetch); ``background``:
    the threads yield to the compute of this process (``yield_cpu``). Closing the generator cancels
    what was submitted and not started."""
    pending: deque[Future[R]] = deque()
    todo = iter(items)
    init = yield_cpu if background else None
    with ThreadPoolExecutor(threads, thread_name_prefix=name, initializer=init) as pool:
        try:
            while True:
                pending.extend(
                    pool.submit(fn, item)
                    for item in itertools.islice(todo, ahead + 1 - len(pending))
                )
                if not pending:
                    return
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()


def open_features(path: Path) -> FeatureFile:
    """A feature shard's footer, checked to hold every feature column (``ShardError`` names the file
    if not)."""
    return FeatureFile(path, open_shard(path, schema=FEATURE_SCHEMA).metadata)


def read_row_group(
    file: FeatureFile,
    row_group: int,
    codecs: tuple[ColumnCodec, FinalCodec],
    *,
    arrow_threads: bool = True,
) -> Decoded:
    """Read and decompress one row group on a handle of its own, and view its rows as tensors in the
    stored form. ``arrow_threads``: columns in parallel on Arrow's pool (the decompression releases
    the GIL); else all on the calling thread."""
    table = file.read(READ_COLUMNS, row_group, use_threads=arrow_threads)
    return Decoded(
        input_ids=_list_column(table.column("input_ids"), torch.int64),
        loss_mask=_list_column(table.column("loss_mask"), torch.bool),
        aux=codecs[0].views(table.column("aux_hidden")),
        last=codecs[1].views(table.column("last_hidden")),
    )


def _list_column(column: pa.ChunkedArray, dtype: torch.dtype) -> list[torch.Tensor]:
    """Each list value as a tensor viewing the Arrow values buffer (numpy view, no copy)."""
    out = []
    with warnings.catch_warnings():  # Arrow buffers are read-only; the views are never written to
        warnings.simplefilter("ignore", UserWarning)
        for chunk in column.chunks:
            offsets = chunk.offsets.to_numpy()
            values = chunk.values.to_numpy(zero_copy_only=True)
            out += [torch.from_numpy(values[a:b]) for a, b in itertools.pairwise(offsets)]
    return [t if t.dtype == dtype else t.to(dtype) for t in out]
