"""A generated corpus of malformed rows per input format (ShareGPT JSON array, JSONL, Parquet,
pre-tokenized): every case is kept or quarantined with a known reason, no row is lost or counted
twice, and nothing raises.

Cases are the cross product of turn contents (types, blank, control-only, invisible-only, lone
surrogates, ...) and roles, the same contents as a system prompt, plus structural damage (missing or
mistyped turn lists); one source file per format holds every case, so the whole corpus costs four
normalize runs. Each case's text is unique, so deduplication does not hide a case.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from data_stage_helpers import VOCAB, normalize

from eagle3.data.prompt_shards import QUARANTINE_FILE
from eagle3.data.schema import REASONS
from eagle3.rundir.layout import shard_files
from eagle3.rundir.runroot import Manifest

_WORDS = (
    "amber",
    "basil",
    "cedar",
    "delta",
    "ember",
    "fjord",
    "gravel",
    "harbor",
    "iris",
    "juniper",
    "kelp",
    "lumen",
    "maple",
    "nectar",
    "onyx",
    "pebble",
    "quartz",
    "raven",
    "sable",
    "tundra",
)
BLANK_LIKE = {
    "empty": "",
    "spaces": "   \n\t",
    "controls": "\x00\x01\x02",
    "invisible": "\u200b\ufeff\u2060",
    "del_c1": "\x7f\x85\x9f",
}
CONTENTS: dict[str, Any] = {
    "text": None,
    **BLANK_LIKE,
    "surrogate": "caf\udcff",
    "null": None,
    "int": 42,
    "float": 1.5,
    "bool": True,
    "list": ["a"],
    "dict": {"a": 1},
}
ROLES: dict[str, Any] = {
    "human": "human",
    "gpt_first": "gpt",
    "narrator": "narrator",
    "system_only": "system",
    "null": None,
    "int": 7,
}
STRUCTURAL: dict[str, Any] = {
    "no_turn_key": {"other": 1},
    "turns_string": {"conversations": "hi"},
    "turns_null": {"conversations": None},
    "turns_empty": {"conversations": []},
    "turn_is_list": {"conversations": [["human", "hi"]]},
    "turn_is_int": {"conversations": [3]},
    "turn_missing_value": {"conversations": [{"from": "human"}]},
    "turn_missing_from": {"conversations": [{"value": "hi"}]},
    "row_int": 5,
    "row_null": None,
    "row_list": [1, 2],
    "row_string": "text",
    "two_users": None,
    "assistant_only": None,
}


def _text(rng: random.Random, i: int) -> str:
    return f"Case {i}: " + " ".join(rng.choice(_WORDS) for _ in range(12)) + "?"


def _content(kind: str, rng: random.Random, i: int) -> Any:
    return _text(rng, i) if kind == "text" else CONTENTS[kind]


def turn_cases() -> list[tuple[str, dict[str, Any] | Any]]:
    """(case name, ShareGPT row): the first case is a good row (format detection reads it)."""
    rng = random.Random(0)
    cases: list[tuple[str, Any]] = [
        (
            "good",
            {
                "conversations": [
                    {"from": "human", "value": _text(rng, 0)},
                    {"from": "gpt", "value": "Fine."},
                ]
            },
        )
    ]
    for c in CONTENTS:
        for r in ROLES:
            i = len(cases)
            turns = [
                {"from": ROLES[r], "value": _content(c, rng, i)},
                {"from": "gpt", "value": _text(rng, -i)},
            ]
            cases.append((f"{r}/{c}", {"conversations": turns}))
    for c in CONTENTS:  # the same contents in a system prompt before a good exchange
        i = len(cases)
        turns = [
            {"from": "system", "value": _content(c, rng, i)},
            {"from": "human", "value": _text(rng, i)},
            {"from": "gpt", "value": "Sure."},
        ]
        cases.append((f"system/{c}", {"conversations": turns}))
    for name, row in STRUCTURAL.items():
        i = len(cases)
        if name == "two_users":
            row = {
                "conversations": [
                    {"from": "human", "value": _text(rng, i)},
                    {"from": "human", "value": "b"},
                ]
            }
        elif name == "assistant_only":
            row = {"conversations": [{"from": "gpt", "value": _text(rng, i)}]}
        cases.append((f"structural/{name}", row))
    return cases


def pretokenized_cases() -> list[tuple[str, Any]]:
    """(case name, pre-tokenized row) over id and mask variants; the first is good."""
    rng = random.Random(1)
    ids_kinds: dict[str, Any] = {
        "good": None,
        "empty": [],
        "negative": [-1, 5],
        "too_big": [VOCAB, 3],
        "floats": [1.0, 2.0],
        "strings": ["1"],
        "null": None,
        "nested": [[1]],
        "bools": [True, False],
    }
    mask_kinds: dict[str, Any] = {
        "match": None,
        "short": "short",
        "twos": "twos",
        "null": None,
        "strings": ["1"],
    }
    cases: list[tuple[str, Any]] = []
    for ik, ids in ids_kinds.items():
        for mk, mask in mask_kinds.items():
            good_ids = [rng.randrange(VOCAB) for _ in range(rng.randint(8, 40))]
            row_ids = good_ids if ik == "good" else ids
            n = len(row_ids) if isinstance(row_ids, list) else 3
            row_mask = {"match": [1] * n, "short": [1] * max(n - 1, 0), "twos": [2] * n}.get(
                mk, mask
            )
            cases.append(
                (
                    f"{ik}/{mk}",
                    {"id": f"pt-{len(cases)}", "input_ids": row_ids, "loss_mask": row_mask},
                )
            )
    return cases


def _parquet_table(cases: list[tuple[str, Any]]) -> pa.Table:
    """The turn cases Parquet can hold in one typed column (string role/content or null)."""
    turn = pa.struct([("from", pa.string()), ("value", pa.string())])

    def fits(row: Any) -> bool:
        turns = row.get("conversations") if isinstance(row, dict) else None
        return isinstance(turns, list) and all(
            isinstance(t, dict)
            and set(t) == {"from", "value"}
            and all(v is None or (isinstance(v, str) and "\udcff" not in v) for v in t.values())
            for t in turns
        )

    return pa.table(
        {
            "conversations": pa.array(
                [row["conversations"] for _, row in cases if fits(row)], type=pa.list_(turn)
            )
        }
    )


def _write(fmt: str, path: Path) -> int:
    """Write the corpus of ``fmt`` to ``path``; returns the number of cases (rows)."""
    cases = pretokenized_cases() if fmt == "pretokenized" else turn_cases()
    if fmt == "parquet":
        table = _parquet_table(cases)
        pq.write_table(table, path)
        return table.num_rows
    lines = [json.dumps(row) for _, row in cases]
    if fmt == "sharegpt":
        path.write_text("[\n" + ",\n".join(lines) + "\n]\n")
    else:
        path.write_text("\n".join(lines) + "\n")
    return len(cases)


FORMATS = {
    "sharegpt": "rows.json",
    "jsonl": "rows.jsonl",
    "parquet": "rows.parquet",
    "pretokenized": "rows.jsonl",
}


def test_the_corpus_has_over_a_hundred_cases_per_turn_format():
    assert len(turn_cases()) >= 100 and len(pretokenized_cases()) >= 40


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_every_generated_case_is_kept_or_quarantined_with_a_reason(fmt, config_factory, tmp_path):
    path = tmp_path / FORMATS[fmt]
    n = _write(fmt, path)
    adapter = {"jsonl": "sharegpt"}.get(fmt, fmt)  # JSONL of ShareGPT rows
    config = config_factory(
        ["gate.prompt_sets={}", f"sources=[{{adapter: {adapter}, path: '{path}'}}]"],
        root=tmp_path / "run",
    )
    out = normalize(config)
    stats = Manifest.read(out).stats["sources"][adapter]
    kept = {
        row
        for shard in shard_files(out).values()
        for row in pq.read_table(shard).column("source_row").to_pylist()
    }
    quarantine = pq.read_table(out / QUARANTINE_FILE).to_pylist()
    reasons = {q["source_row"]: q["reason"] for q in quarantine}
    assert stats["in"] == n == stats["kept"] + sum(stats["quarantined"].values())
    assert len(kept) + len(reasons) == n and not kept & set(reasons), "every case exactly once"
    assert set(reasons.values()) <= set(REASONS) and stats["kept"] >= 1
    if fmt != "pretokenized":
        by_case = dict(zip([name for name, _ in turn_cases()], map(str, range(n)), strict=False))
        for kind in BLANK_LIKE if fmt != "parquet" else ():
            # no printable content is an empty prompt
            assert reasons[by_case[f"human/{kind}"]] == "empty", kind
