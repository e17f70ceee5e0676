"""Streaming readers: JSON arrays are read incrementally, bad rows are reported with a reason,
indices are stable."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq

from eagle3.data import readers
from eagle3.data.readers import count_rows, iter_rows, truncate_raw


def test_json_array_reader_streams_elements_across_chunk_boundaries(tmp_path, monkeypatch):
    monkeypatch.setattr(readers, "CHUNK_CHARS", 7)
    rows = [{"i": i, "text": "é" * (i % 5) + "x" * i} for i in range(60)] + [12345, "tail"]
    path = tmp_path / "a.json"
    path.write_text(json.dumps(rows, ensure_ascii=False), encoding="utf-8")
    got = list(iter_rows([path]))
    assert [r.value for r in got] == rows
    assert [r.index for r in got] == list(range(len(rows)))
    assert count_rows(path) == len(rows)


def test_truncated_json_array_yields_its_good_prefix_then_one_malformed_row(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps([{"a": 1}, {"a": 2}, {"a": 3}])[:-8])
    got = list(iter_rows([path]))
    assert [r.value for r in got[:2]] == [{"a": 1}, {"a": 2}]
    assert got[-1].error == "malformed" and got[-1].index == 2


def test_json_object_file_is_read_as_jsonl(tmp_path):
    path = tmp_path / "lines.json"
    path.write_text('{"a": 1}\n{"a": 2}\n')
    assert [r.value for r in iter_rows([path])] == [{"a": 1}, {"a": 2}]


def test_jsonl_bad_lines_are_malformed_and_invalid_utf8_survives_as_surrogates(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_bytes(b'{"a": 1}\n\n{"a": \n{"a": "caf\xe9"}\n')
    got = list(iter_rows([path]))
    assert [r.index for r in got] == [0, 1, 2]
    assert got[1].error == "malformed"
    assert got[2].value == {"a": "caf\udce9"}


def test_parquet_reader_isolates_rows_with_invalid_utf8(tmp_path):
    values = pa.array([b"ok", b"\xff", b"fine"], type=pa.binary()).view(pa.string())
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"s": values}), path)
    got = list(iter_rows([path]))
    assert [r.value for r in got] == [{"s": "ok"}, None, {"s": "fine"}]
    assert got[1].error == "bad_encoding"


def test_rows_are_indexed_across_files_in_order(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text('{"x": 0}\n{"x": 1}\n')
    b.write_text('{"x": 2}\n')
    assert [(r.index, r.value["x"]) for r in iter_rows([a, b])] == [(0, 0), (1, 1), (2, 2)]


def test_truncate_raw_caps_at_2kb_and_never_raises_on_bad_text():
    raw = truncate_raw({"text": "\udcff" + "é" * 5000})
    assert len(raw.encode("utf-8")) <= 2048 and raw.endswith("...")


def test_gzip_files_read_like_plain_ones_and_a_cut_stream_is_one_malformed_row(tmp_path):
    rows = [{"a": i} for i in range(50)]
    lines = "".join(json.dumps(r) + "\n" for r in rows).encode()
    jsonl = tmp_path / "r.jsonl.gz"
    jsonl.write_bytes(gzip.compress(lines))
    array = tmp_path / "r.json.gz"
    array.write_bytes(gzip.compress(json.dumps(rows).encode()))
    assert [r.value for r in iter_rows([jsonl])] == rows == [r.value for r in iter_rows([array])]
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gzip.compress(lines)[:-40])
    got = list(iter_rows([cut]))
    assert got[-1].error == "malformed" and "cut short" in got[-1].raw
    assert all(r.error is None for r in got[:-2]) and len(got) <= len(rows) + 1


def test_an_array_cut_between_two_rows_ends_with_a_malformed_row_not_silently(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps([{"a": 1}, {"a": 2}])[:-1] + ",")  # every row whole, the ']' gone
    got = list(iter_rows([path]))
    assert [r.value for r in got[:2]] == [{"a": 1}, {"a": 2}]
    assert got[2].error == "malformed" and "without ']' after 2 rows" in got[2].raw
