"""Streaming row readers for local files: JSON arrays, JSONL and Parquet, never a whole dataset in
memory.

* JSONL: one row per line, read line by line. Bytes are decoded with ``surrogateescape`` so invalid
  UTF-8 survives as lone surrogates and is quarantined as ``bad_encoding`` by normalization instead
  of failing the file.
* JSON arrays: an incremental reader over 1 MiB chunks with ``json.JSONDecoder.raw_decode``; the
  buffer only ever holds the current element plus one chunk. A file whose top level is an object is
  read as JSONL (a common mislabelling). A truncated or broken element ends the file: the rest is
  one ``malformed`` row (JSON has no resynchronisation point inside an array).
* Parquet: record batches of ``batch_size`` rows; a batch whose strings are not valid UTF-8 is
  retried row by row so only the bad rows are reported ``bad_encoding``.
* gzip: a JSON or JSONL file may be gzip-compressed (``x.jsonl.gz``, as HumanEval ships): it is
  recognised by its magic bytes, whatever its name, and read through the same streaming readers.

Every reader yields ``RawRow(index, value, error, raw)``; ``index`` counts rows across the source's
files in order (the ``source_row`` key), ``error`` is a quarantine reason when the row could not be
parsed.
"""

from __future__ import annotations

import codecs
import gzip
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from eagle3.data.schema import BAD_ENCODING, MALFORMED, RAW_MAX_BYTES

CHUNK_CHARS = 1 << 20
# a JSON element larger than this is reported malformed instead of buffered
MAX_ELEMENT_CHARS = 256 << 20
DATA_SUFFIXES = (".jsonl", ".json", ".parquet")


@dataclass(frozen=True)
class RawRow:
    index: int
    value: Any
    error: str | None = None
    raw: str = ""


def truncate_raw(value: Any, limit: int = RAW_MAX_BYTES) -> str:
    """A JSON rendering of ``value`` cut to ``limit`` UTF-8 bytes (invalid text escaped, never
    raising)."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=True, default=repr)
    data = text.encode("utf-8", "backslashreplace")
    if len(data) <= limit:
        return data.decode("utf-8")
    return data[: limit - 3].decode("utf-8", "ignore") + "..."


GZIP_MAGIC = b"\x1f\x8b"


def file_format(path: Path) -> str:
    """``jsonl``, ``json`` or ``parquet`` from the name (a trailing ``.gz`` names the compression,
    not the format)."""
    path = Path(path)
    suffix = Path(path.stem).suffix.lower() if path.suffix.lower() == ".gz" else path.suffix.lower()
    if suffix not in DATA_SUFFIXES or (suffix == ".parquet" and path.suffix.lower() == ".gz"):
        raise ValueError(
            f"{path}: unsupported file type {suffix!r}; use one of {DATA_SUFFIXES} "
            "(JSON and JSONL may be gzip-compressed: .jsonl.gz)"
        )
    return suffix[1:]


def open_binary(path: Path) -> Any:
    """``path`` opened for reading bytes, decompressed when it is gzip (by its magic bytes, not its
    name)."""
    with open(path, "rb") as fh:
        magic = fh.read(2)
    return gzip.open(path, "rb") if magic == GZIP_MAGIC else open(path, "rb")


_UTF16_BOMS = (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE, codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE)


def file_problem(path: Path) -> str | None:
    """Why a data file cannot be read as a whole (one line naming the file, what and the fix), else
    None: an empty file, text that is not UTF-8 (a UTF-16/32 byte-order mark, or every other byte
    NUL), a Parquet file whose footer does not read (cut short, or not Parquet). Bad rows inside a
    readable file are not this: they are quarantined."""
    path = Path(path)
    if path.stat().st_size == 0:
        return f"{path}: empty file (0 bytes); re-download it or remove it from sources"
    if file_format(path) == "parquet":
        try:
            pq.ParquetFile(path)
        except (pa.ArrowException, OSError) as exc:
            return (
                f"{path}: not a readable Parquet file ({exc}); re-download it (it may be cut short)"
            )
        return None
    try:
        with open_binary(path) as fh:
            head = fh.read(4096)
    except (OSError, EOFError) as exc:  # gzip magic, but not a readable gzip stream
        return f"{path}: not a readable gzip file ({exc}); re-download it (it may be cut short)"
    # BOM, or UTF-16 without one
    if head.startswith(_UTF16_BOMS) or head.count(b"\x00") > len(head) // 4:
        return (
            f"{path}: text is UTF-16/32, not UTF-8; convert it, e.g. `iconv -f UTF-16 -t UTF-8 {path} > "
            f"{path.with_suffix('.utf8' + path.suffix)}`, and point sources at the result"
        )
    return None


def iter_rows(files: Sequence[Path], *, batch_size: int = 1024) -> Iterator[RawRow]:
    """Rows of ``files`` in order, indexed across files."""
    offset = 0
    for path in files:
        reader = {"jsonl": _iter_jsonl, "json": _iter_json, "parquet": _iter_parquet}[
            file_format(path)
        ]
        count = 0
        for row in reader(Path(path), batch_size):
            count = row.index + 1
            yield RawRow(row.index + offset, row.value, row.error, row.raw)
        offset += count


def count_rows(path: Path) -> int:
    """Row count of one file: Parquet footer, JSONL non-blank lines, or JSON array elements
    (streamed)."""
    fmt = file_format(path)
    if fmt == "parquet":
        return pq.ParquetFile(path).metadata.num_rows
    n = 0
    for row in (_iter_jsonl if fmt == "jsonl" else _iter_json)(Path(path), 1024):
        n = row.index + 1
    return n


def _decode_lines(path: Path) -> Iterator[str]:
    with open_binary(path) as fh:
        for line in fh:
            yield line.decode("utf-8", "surrogateescape")


def _iter_jsonl(path: Path, _batch_size: int) -> Iterator[RawRow]:
    """Blank lines are not rows (they do not advance the index). A gzip stream cut short ends the
    file with one ``malformed`` row saying so (what was cut cannot be counted)."""
    index = 0
    try:
        for line in _decode_lines(path):
            text = line.strip()
            if not text:
                continue
            try:
                value = json.loads(text)
            except (json.JSONDecodeError, RecursionError):  # Recursion: absurdly nested garbage
                yield RawRow(index, None, MALFORMED, truncate_raw(text))
            else:
                yield RawRow(index, value)
            index += 1
    except (EOFError, gzip.BadGzipFile) as exc:
        yield RawRow(index, None, MALFORMED, f"gzip stream cut short after {index} rows ({exc})")


class _Chunks:
    """Text of a file in chunks (incremental UTF-8 decoding with surrogateescape)."""

    def __init__(self, path: Path) -> None:
        self.fh = open_binary(path)
        self.decoder = codecs.getincrementaldecoder("utf-8")("surrogateescape")
        self.eof = False

    def read(self) -> str:
        try:
            data = self.fh.read(CHUNK_CHARS)
        except (EOFError, gzip.BadGzipFile):  # a gzip stream cut short: what was read is all
            data = b""
        if not data:
            self.eof = True
            return self.decoder.decode(b"", final=True)
        return self.decoder.decode(data)

    def close(self) -> None:
        self.fh.close()


def _skip_ws(buf: str, pos: int) -> int:
    while pos < len(buf) and buf[pos] in " \t\r\n":
        pos += 1
    return pos


def _iter_json(path: Path, batch_size: int) -> Iterator[RawRow]:
    chunks = _Chunks(path)
    try:
        buf = chunks.read()
        while not chunks.eof and not buf.strip():
            buf += chunks.read()
        pos = _skip_ws(buf, 0)
        if pos < len(buf) and buf[pos] == "{":
            chunks.close()
            yield from _iter_jsonl(path, batch_size)
            return
        if pos >= len(buf) or buf[pos] != "[":
            if buf.strip():
                yield RawRow(0, None, MALFORMED, truncate_raw(buf[:RAW_MAX_BYTES]))
            return
        yield from _iter_array(chunks, buf, pos + 1)
    finally:
        chunks.close()


def _iter_array(chunks: _Chunks, buf: str, pos: int) -> Iterator[RawRow]:
    decoder = json.JSONDecoder()
    index = 0
    while True:
        if pos > CHUNK_CHARS:  # compact: drop what was consumed, keep at least one chunk ahead
            buf, pos = buf[pos:], 0
        if len(buf) - pos < CHUNK_CHARS and not chunks.eof:
            buf += chunks.read()
        pos = _skip_ws(buf, pos)
        if pos >= len(buf):
            if chunks.eof:  # cut between two elements: the rows are whole, the cut is reported
                cut = f"JSON array ends without ']' after {index} rows (cut short)"
                yield RawRow(index, None, MALFORMED, cut)
                return
            continue
        if buf[pos] == "]":
            return
        if buf[pos] == "," and index:
            pos += 1
            continue
        try:
            value, end = decoder.raw_decode(buf, pos)
        except (json.JSONDecodeError, RecursionError):
            end = -1
        # incomplete element: read on, or give up
        if end == -1 or (end == len(buf) and not chunks.eof):
            if chunks.eof or len(buf) - pos > MAX_ELEMENT_CHARS:
                yield RawRow(index, None, MALFORMED, truncate_raw(buf[pos : pos + RAW_MAX_BYTES]))
                return
            buf, pos = buf[pos:] + chunks.read(), 0
            continue
        yield RawRow(index, value)
        index += 1
        pos = end


def _iter_parquet(path: Path, batch_size: int) -> Iterator[RawRow]:
    pf = pq.ParquetFile(path)
    index = 0
    for batch in pf.iter_batches(batch_size=batch_size):
        try:
            rows = batch.to_pylist()
        except UnicodeDecodeError:
            rows = None
        if rows is not None:
            for row in rows:
                yield RawRow(index, row)
                index += 1
            continue
        for i in range(batch.num_rows):
            yield _parquet_row(batch.slice(i, 1), index)
            index += 1


def _parquet_row(one: pa.RecordBatch, index: int) -> RawRow:
    try:
        return RawRow(index, one.to_pylist()[0])
    except UnicodeDecodeError:
        raw = {}
        for name, column in zip(one.schema.names, one.columns, strict=True):
            try:
                raw[name] = column.to_pylist()[0]
            except UnicodeDecodeError:
                raw[name] = "<invalid UTF-8>"
        return RawRow(index, None, BAD_ENCODING, truncate_raw(raw))
