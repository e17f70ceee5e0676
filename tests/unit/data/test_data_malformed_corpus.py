"""Crash-proofing: a corpus of malformed inputs per file format never crashes the prompts stage.

Each case is one good row followed by bad rows; the stage must finish, keep only the good row,
quarantine every bad row with a reason, and balance its books.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from data_stage_helpers import normalize

from eagle3.rundir.runroot import Manifest

GOOD = {
    "conversations": [
        {"from": "human", "value": "What is a good name for a cat?"},
        {"from": "gpt", "value": "Tom."},
    ]
}
BIG = "word " * (2 * 1024 * 1024)  # a 10 MB message


def _conv(*turns: tuple[Any, Any]) -> dict[str, Any]:
    return {"conversations": [{"from": r, "value": v} for r, v in turns]}


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# JSONL: raw lines (bytes); the good row first.
JSONL_CASES: dict[str, list[bytes]] = {
    "truncated_json": [json.dumps(GOOD)[:30].encode()],
    "wrong_types": [
        json.dumps(_conv(("human", 42), ("gpt", "x"))).encode(),
        b'{"conversations": "nope"}',
    ],
    "missing_keys": [b'{"conversations": [{"from": "human"}]}', b'{"other": 1}'],
    "empty_strings": [
        json.dumps(_conv(("human", ""), ("gpt", "x"))).encode(),
        b'{"conversations": []}',
    ],
    "ten_mb_message": [json.dumps(_conv(("human", BIG), ("gpt", "x"))).encode()],
    "invalid_utf8": [
        b'{"conversations": [{"from": "human", "value": "caf\xe9 \xff"}, {"from": "gpt", "value": "y"}]}'
    ],
    "not_alternating": [json.dumps(_conv(("human", "a"), ("human", "b"), ("gpt", "c"))).encode()],
    "unknown_role": [json.dumps(_conv(("narrator", "a"), ("human", "b"))).encode()],
    "nested_garbage": [
        _nested(50_000).encode(),
        b'{"conversations": [[["x"]]]}',
        b'[1, {"a": [null]}]',
    ],
    "scalars": [b"42", b"null", b'"text"', b"true"],
    "turn_is_list": [b'{"conversations": [["human", "hi"]]}'],
    "no_user_turn": [json.dumps(_conv(("gpt", "hello"))).encode()],
}


def _json_file(bad: list[bytes]) -> bytes:
    return b"[\n" + b",\n".join([json.dumps(GOOD).encode(), *bad]) + b"\n]\n"


# JSON array files: each case is the whole file after a good first element.
JSON_CASES: dict[str, bytes] = {
    "truncated_array": _json_file([]).rstrip()[:-1] + b', {"conversations": [{"from": "hum',
    "wrong_types": _json_file(
        [b'{"conversations": 7}', json.dumps(_conv(("human", ["a"]), ("gpt", "b"))).encode()]
    ),
    "missing_keys": _json_file([b'{"conversations": [{"value": "x"}]}', b"{}"]),
    "empty_strings": _json_file([json.dumps(_conv(("human", "   "), ("gpt", "b"))).encode()]),
    "ten_mb_message": _json_file([json.dumps(_conv(("human", BIG), ("gpt", "b"))).encode()]),
    "invalid_utf8": _json_file(
        [b'{"conversations": [{"from": "human", "value": "\xc3\x28 bad"}]}']
    ),
    "lone_surrogate_escape": _json_file(
        [b'{"conversations": [{"from": "human", "value": "a\\udcff"}]}']
    ),
    "not_alternating": _json_file(
        [json.dumps(_conv(("human", "a"), ("gpt", "b"), ("gpt", "c"))).encode()]
    ),
    "unknown_role": _json_file([json.dumps(_conv(("human", "a"), ("wizard", "b"))).encode()]),
    "nested_garbage": _json_file([_nested(50_000).encode()]),
    "broken_middle_element": _json_file([b'{"conversations": [,,]}', json.dumps(GOOD).encode()]),
    "scalars": _json_file([b"1", b"null", b'"s"']),
}

_TURN = pa.struct([("from", pa.string()), ("value", pa.string())])


def _good_turns() -> list[dict[str, str]]:
    return GOOD["conversations"]


def _bad_utf8_table() -> pa.Table:
    values = pa.array([b"fine", b"caf\xe9"], type=pa.binary()).view(pa.string())
    good = json.dumps(_good_turns())
    return pa.table({"conversations": pa.array([good, "x"]), "bad": values})


# Parquet: two-row tables, the first row good.
PARQUET_CASES: dict[str, pa.Table] = {
    "null_conversations": pa.table(
        {"conversations": pa.array([_good_turns(), None], type=pa.list_(_TURN))}
    ),
    "null_value": pa.table(
        {
            "conversations": pa.array(
                [_good_turns(), [{"from": "human", "value": None}]], type=pa.list_(_TURN)
            )
        }
    ),
    "empty_list": pa.table({"conversations": pa.array([_good_turns(), []], type=pa.list_(_TURN))}),
    "empty_strings": pa.table(
        {
            "conversations": pa.array(
                [_good_turns(), [{"from": "human", "value": ""}]], type=pa.list_(_TURN)
            )
        }
    ),
    "ten_mb_message": pa.table(
        {
            "conversations": pa.array(
                [_good_turns(), [{"from": "human", "value": BIG}]], type=pa.list_(_TURN)
            )
        }
    ),
    "invalid_utf8": pa.table(
        {
            "conversations": pa.array(
                [[{"from": b"human", "value": b"ok"}], [{"from": b"human", "value": b"\xff\xfe"}]],
                type=pa.list_(pa.struct([("from", pa.binary()), ("value", pa.binary())])),
            ).view(pa.list_(_TURN))
        }
    ),
    "not_alternating": pa.table(
        {"conversations": pa.array([_good_turns(), _good_turns()[:1] * 2], type=pa.list_(_TURN))}
    ),
    "unknown_role": pa.table(
        {
            "conversations": pa.array(
                [_good_turns(), [{"from": "ghost", "value": "boo"}]], type=pa.list_(_TURN)
            )
        }
    ),
    "missing_from_field": pa.table(
        {
            "conversations": pa.array(
                [[{"role": "user", "value": "hi"}], [{"value": "no role"}]],
                type=pa.list_(pa.struct([("role", pa.string()), ("value", pa.string())])),
            )
        }
    ),
    "nested_garbage": pa.table(
        {
            "conversations": pa.array([_good_turns(), None], type=pa.list_(_TURN)),
            "junk": [[[1]], [[2, 3], []]],
        }
    ),
    "no_user_turn": pa.table(
        {
            "conversations": pa.array(
                [_good_turns(), [{"from": "gpt", "value": "hi"}]], type=pa.list_(_TURN)
            )
        }
    ),
}


def _run(config_factory, tmp_path: Path, adapter: str, path: Path) -> dict[str, Any]:
    config = config_factory(
        ["gate.prompt_sets={}", f"sources=[{{adapter: {adapter}, path: '{path}'}}]"],
        root=tmp_path / "run",
    )
    out = normalize(config)
    stats = Manifest.read(out).stats["sources"][adapter]
    assert stats["in"] == stats["kept"] + sum(stats["quarantined"].values())
    return stats


@pytest.mark.parametrize("case", sorted(JSONL_CASES))
def test_malformed_jsonl_rows_are_quarantined_not_fatal(case, config_factory, tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b"\n".join([json.dumps(GOOD).encode(), *JSONL_CASES[case]]) + b"\n")
    stats = _run(config_factory, tmp_path, "jsonl", path)
    assert stats["kept"] == 1
    assert stats["in"] == 1 + len(JSONL_CASES[case])


@pytest.mark.parametrize("case", sorted(JSON_CASES))
def test_malformed_json_arrays_are_quarantined_not_fatal(case, config_factory, tmp_path):
    path = tmp_path / "rows.json"
    path.write_bytes(JSON_CASES[case])
    stats = _run(config_factory, tmp_path, "sharegpt", path)
    assert stats["kept"] == 1
    assert sum(stats["quarantined"].values()) >= 1


@pytest.mark.parametrize("case", sorted(PARQUET_CASES))
def test_malformed_parquet_rows_are_quarantined_not_fatal(case, config_factory, tmp_path):
    path = tmp_path / "rows.parquet"
    pq.write_table(PARQUET_CASES[case], path)
    stats = _run(config_factory, tmp_path, "parquet", path)
    assert (stats["kept"], stats["in"]) == (1, 2)


def test_parquet_row_with_invalid_utf8_in_any_column_is_bad_encoding(config_factory, tmp_path):
    path = tmp_path / "rows.parquet"
    pq.write_table(_bad_utf8_table(), path)
    config = config_factory(
        [
            "gate.prompt_sets={}",
            f"sources=[{{adapter: parquet, path: '{path}', columns: {{user: bad}}}}]",
        ],
        root=tmp_path / "run",
    )
    stats = Manifest.read(normalize(config)).stats["sources"]["parquet"]
    assert stats["quarantined"] == {"bad_encoding": 1} and stats["kept"] == 1
