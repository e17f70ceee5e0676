from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eagle3.data.parquet import (
    ShardError,
    ShardWriter,
    open_shard,
    shard_is_valid,
    shard_metadata,
    write_table,
)

SCHEMA = pa.schema([("id", pa.string()), ("blob", pa.binary())])


def _rows(n: int, size: int = 1000) -> list[dict]:
    return [{"id": f"r{i}", "blob": bytes([i % 256]) * size} for i in range(n)]


def test_rotates_shards_by_rows_and_reports_what_it_wrote(tmp_path: Path):
    with ShardWriter(tmp_path, SCHEMA, rows_per_shard=40, metadata={"k": "v"}) as writer:
        writer.write_rows(_rows(100))
    infos = writer.close()
    assert [i.path.name for i in infos] == [
        "shard-00000.parquet",
        "shard-00001.parquet",
        "shard-00002.parquet",
    ]
    assert [i.rows for i in infos] == [40, 40, 20]
    assert all(i.bytes == i.path.stat().st_size for i in infos)
    assert shard_metadata(infos[0].path) == {"k": "v"}
    ids = [r for i in infos for r in pq.read_table(i.path).column("id").to_pylist()]
    assert ids == [f"r{i}" for i in range(100)]
    assert not list(tmp_path.glob("*.tmp"))


def test_row_groups_are_sized_by_bytes(tmp_path: Path):
    with ShardWriter(tmp_path, SCHEMA, row_group_bytes=10_000) as writer:
        for _ in range(10):
            writer.write_rows(_rows(5, size=1000))
    info = writer.close()[0]
    meta = pq.ParquetFile(info.path).metadata
    assert meta.num_rows == 50
    assert 4 <= meta.num_row_groups <= 6


def test_abort_leaves_no_partial_file_under_a_final_name(tmp_path: Path):
    with pytest.raises(RuntimeError), ShardWriter(tmp_path, SCHEMA, row_group_bytes=1) as writer:
        writer.write_rows(_rows(3))
        raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []


def test_truncated_shard_is_detected(tmp_path: Path):
    info = write_table(tmp_path / "q.parquet", pa.Table.from_pylist(_rows(20), schema=SCHEMA))
    assert shard_is_valid(info.path, schema=SCHEMA, rows=20)
    with open(info.path, "rb+") as fh:
        fh.truncate(info.bytes - 7)
    assert not shard_is_valid(info.path, schema=SCHEMA)
    with pytest.raises(ShardError, match="delete it so the stage rebuilds it"):
        open_shard(info.path)


def test_schema_mismatch_is_refused(tmp_path: Path):
    other = pa.schema([("id", pa.int64())])
    info = write_table(tmp_path / "o.parquet", pa.Table.from_pylist([{"id": 1}], schema=other))
    with pytest.raises(ShardError, match="wrong type"):
        open_shard(info.path, schema=SCHEMA)
    assert os.path.exists(info.path)


def test_binary_columns_get_neither_dictionary_nor_statistics_and_the_others_keep_both(
    tmp_path: Path,
):
    """A dictionary on a column of multi-KB blobs is hashed until it overflows and leaves the chunk
    in two encodings, and its statistics compare every blob with the running min and max (3.5x the
    write's CPU): the feature shard's states must be plain without statistics, its ids
    dictionary-encoded with statistics."""
    from eagle3.capture.schema import FEATURE_SCHEMA

    rows = [
        {
            "sample_id": f"s{i}",
            "input_ids": [7] * 50,
            "loss_mask": [1] * 50,
            "seq_len": 50,
            "aux_hidden": os.urandom(4096),
            "last_hidden": os.urandom(2048),
        }
        for i in range(64)
    ]
    with ShardWriter(tmp_path, FEATURE_SCHEMA) as writer:
        writer.write_rows(rows)
    (info,) = writer.close()
    chunks = pq.ParquetFile(info.path).metadata.row_group(0)
    columns = {chunks.column(j).path_in_schema: chunks.column(j) for j in range(chunks.num_columns)}
    assert set(columns) >= {"aux_hidden", "last_hidden", "input_ids.list.element", "seq_len"}
    for blob in ("aux_hidden", "last_hidden"):
        assert "RLE_DICTIONARY" not in columns[blob].encodings and not columns[blob].is_stats_set
    for value in ("input_ids.list.element", "sample_id"):
        assert "RLE_DICTIONARY" in columns[value].encodings and columns[value].is_stats_set
    assert columns["seq_len"].statistics.min == 50 == columns["seq_len"].statistics.max
    assert pq.read_table(info.path).column("aux_hidden").to_pylist() == [
        r["aux_hidden"] for r in rows
    ]


def test_a_shard_is_hashed_and_synced_as_it_is_written_not_read_back(tmp_path: Path, monkeypatch):
    """A capture shard on a GPU node is tens of GB: its sha256 comes from the bytes on their way to
    the disk, and each row group is synced when written, so finishing it waits for one row group,
    not the whole file."""
    import hashlib

    import eagle3.data.parquet as parquet

    def read_back(path: Path) -> str:
        raise AssertionError(f"{path} was read back to hash it")

    synced: list[int] = []
    fsync = os.fsync

    def spy(fd: int) -> None:
        synced.append(os.fstat(fd).st_size)
        fsync(fd)

    monkeypatch.setattr(parquet, "sha256_file", read_back)
    monkeypatch.setattr(parquet.os, "fsync", spy)
    with ShardWriter(tmp_path, SCHEMA, row_group_bytes=10_000, compression="none") as writer:
        for _ in range(3):
            writer.write_rows(_rows(12, size=1000))
    (info,) = writer.close()
    assert info.sha256 == hashlib.sha256(info.path.read_bytes()).hexdigest()
    assert pq.ParquetFile(info.path).metadata.num_row_groups == 3
    file_syncs = synced[:-1]  # the last fsync is the directory's, after the rename
    # each row group, then the footer
    assert len(file_syncs) == 4 and file_syncs == sorted(set(file_syncs))
    assert file_syncs[0] > 12_000 and file_syncs[-1] == info.bytes


def _flipped_reads(
    data: bytes, table: pa.Table, end: int, *, checked: bool
) -> tuple[int, list[int]]:
    """Each byte of ``data[4:end]`` flipped alone (all 8 bits): (how many reads refused, offsets
    read wrongly)."""
    import io

    refused, wrong = 0, []
    for offset in range(4, end):
        damaged = bytearray(data)
        damaged[offset] ^= 0xFF
        try:
            back = pq.ParquetFile(io.BytesIO(damaged), page_checksum_verification=checked).read()
        except (OSError, pa.ArrowInvalid):
            refused += 1
            continue
        if not back.equals(table):
            wrong.append(offset)
    return refused, wrong


def test_every_byte_a_read_uses_is_checked_by_a_page_checksum_or_the_footer_hash(tmp_path: Path):
    """The loader hashes only footers before training and lets Arrow check each page's CRC32 as it
    reads it (``eagle3.rundir.integrity``). That is only as strong as a whole-file sha256 if no
    damage can get past both: every byte before the footer, flipped, is refused by a checked read or
    reads back unchanged (a page statistic, padding), while an unchecked read of the same file
    decodes some flips into wrong rows; every byte of the footer, flipped, changes
    ``footer_sha256``."""
    from eagle3.rundir.runroot import footer_sha256

    schema = pa.schema(
        [
            ("id", pa.string()),
            ("blob", pa.binary()),
            ("ids", pa.list_(pa.int32())),
            ("n", pa.int64()),
        ]
    )
    rows = [
        {"id": f"r{i}", "blob": os.urandom(200), "ids": list(range(i, i + 9)), "n": i}
        for i in range(6)
    ]
    with ShardWriter(
        tmp_path,
        schema,
        row_group_bytes=600,
        compression={"blob": "none", "id": "zstd", "ids": "zstd", "n": "zstd"},
    ) as writer:
        for row in rows:
            writer.write_rows([row])
    (info,) = writer.close()
    data, table = info.path.read_bytes(), pq.read_table(info.path)
    assert pq.ParquetFile(info.path).metadata.num_row_groups >= 2
    footer = len(data) - 8 - int.from_bytes(data[-8:-4], "little")

    refused, wrong = _flipped_reads(data, table, footer, checked=True)
    assert wrong == [] and refused > 0.9 * (footer - 4)
    assert _flipped_reads(data, table, footer, checked=False)[1]  # what the checksums catch

    assert info.footer_sha256 == footer_sha256(info.path)
    for offset in range(footer, len(data)):
        damaged = bytearray(data)
        damaged[offset] ^= 0xFF
        info.path.write_bytes(damaged)
        assert footer_sha256(info.path) != info.footer_sha256, offset
