"""Sample datasets: real on-disk formats, deterministic content, and planted bad rows that match the
ground truth."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from eagle3.worlds.conversations import generate_conversations
from eagle3.worlds.samples import (
    ADAPTERS,
    BAD_ROWS_FILE,
    BENCH_PER_SET,
    BENCH_SETS,
    MANIFEST_FILE,
    REASONS_BY_ADAPTER,
    TOO_LONG_CHARS,
    write_samples,
)

ROWS = 60


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_samples(tmp_path_factory.mktemp("samples"), seed=3, rows_per_source=ROWS)


@pytest.fixture(scope="module")
def bad_rows(samples: dict[str, Path]) -> dict[str, list[dict[str, Any]]]:
    return json.loads((samples["sharegpt"].parent / BAD_ROWS_FILE).read_text())


def _read_jsonl(path: Path) -> list[Any]:
    """Per-line decoding, the way an adapter must read: a bad line fails alone."""
    rows: list[Any] = []
    for line in path.read_bytes().splitlines():
        try:
            rows.append(json.loads(line.decode("utf-8")))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            rows.append(exc)
    return rows


def _read_parquet(path: Path) -> list[Any]:
    table = pq.read_table(path)
    rows: list[Any] = []
    for i in range(table.num_rows):
        try:
            rows.append(table.slice(i, 1).to_pylist()[0])
        except UnicodeDecodeError as exc:
            rows.append(exc)
    return rows


def _read(path: Path) -> list[Any]:
    if path.suffix == ".jsonl":
        return _read_jsonl(path)
    if path.suffix == ".parquet":
        return _read_parquet(path)
    return json.loads(path.read_text(encoding="ascii"))


def _messages(row: Any) -> list[tuple[str, str]] | None:
    """(role, text) pairs of a well-formed row in any format, or None when the row is not
    well-formed."""
    if not isinstance(row, dict):
        return None
    if "question" in row:
        return [("human", row["question"]), ("gpt", row["answer"])]
    turns = row.get("conversations", row.get("messages"))
    if not isinstance(turns, list):
        return None
    pairs = [(t.get("from", t.get("role")), t.get("value", t.get("content"))) for t in turns]
    return pairs if all(isinstance(text, str) for _, text in pairs) else None


def test_every_file_has_the_promised_row_count(samples: dict[str, Path]) -> None:
    manifest = json.loads((samples["sharegpt"].parent / MANIFEST_FILE).read_text())
    for adapter in ADAPTERS:
        assert len(_read(samples[adapter])) == ROWS == manifest["files"][adapter]["rows"], adapter


def test_every_format_contains_each_bad_row_reason(
    bad_rows: dict[str, list[dict[str, Any]]],
) -> None:
    for adapter in ADAPTERS:
        reasons = {r["reason"] for r in bad_rows[adapter]} - {"contaminated"}
        assert reasons == set(REASONS_BY_ADAPTER[adapter]), adapter


def test_bad_rows_are_about_five_percent_at_scale(tmp_path: Path) -> None:
    write_samples(tmp_path, rows_per_source=400)
    bad = json.loads((tmp_path / BAD_ROWS_FILE).read_text())
    for adapter in ADAPTERS:
        planted = [r for r in bad[adapter] if r["reason"] != "contaminated"]
        assert len(planted) == 20, adapter


def test_same_seed_writes_identical_bytes_and_another_seed_does_not(tmp_path: Path) -> None:
    first, second, other = (
        write_samples(tmp_path / name, seed=seed, rows_per_source=40)
        for name, seed in (("a", 1), ("b", 1), ("c", 2))
    )
    for adapter in ADAPTERS:
        assert first[adapter].read_bytes() == second[adapter].read_bytes(), adapter
        assert first[adapter].read_bytes() != other[adapter].read_bytes(), adapter


def test_good_rows_are_well_formed_and_distinct_across_sources(
    samples: dict[str, Path], bad_rows: dict[str, list[dict[str, Any]]]
) -> None:
    prompts: Counter[str] = Counter()
    for adapter in ADAPTERS:
        bad = {r["row"] for r in bad_rows[adapter]}
        for i, row in enumerate(_read(samples[adapter])):
            if i in bad:
                continue
            pairs = _messages(row)
            assert pairs, f"{adapter} row {i} is not well-formed: {row!r}"
            roles = [role for role, _ in pairs if role != "system"]
            assert roles[0] in ("human", "user") and len(roles) % 2 == 0, (adapter, i, roles)
            assert all(text.strip() and len(text) < 2000 for _, text in pairs), (adapter, i)
            prompts[next(text for role, text in pairs if role in ("human", "user"))] += 1
    assert max(prompts.values()) == 1


def test_bad_rows_show_their_defect(
    samples: dict[str, Path], bad_rows: dict[str, list[dict[str, Any]]]
) -> None:
    for adapter in ADAPTERS:
        rows = _read(samples[adapter])
        for record in bad_rows[adapter]:
            row, reason = rows[record["row"]], record["reason"]
            pairs = _messages(row)
            if reason == "malformed":
                assert pairs is None or isinstance(row, Exception), (adapter, record)
            elif reason == "bad_encoding":
                text = " ".join(t for _, t in pairs) if pairs else ""
                assert isinstance(row, UnicodeDecodeError) or "\udcff" in text, (adapter, record)
            elif reason == "too_long":
                assert max(len(t) for _, t in pairs) >= TOO_LONG_CHARS, (adapter, record)
            elif reason == "unknown_role":
                assert any(role == "narrator" for role, _ in pairs), (adapter, record)
            elif reason == "empty":
                assert not pairs or any(not t for _, t in pairs), (adapter, record)
            elif reason == "no_user_turn":
                assert all(role not in ("human", "user") for role, _ in pairs), (adapter, record)
            elif reason == "not_alternating":
                roles = [role for role, _ in pairs]
                assert any(a == b for a, b in itertools.pairwise(roles)), (adapter, record)
            elif reason == "duplicate":
                source = int(record["detail"].rsplit(" ", 1)[1])
                assert pairs == _messages(rows[source]) and source < record["row"], (
                    adapter,
                    record,
                )


def test_json_files_escape_lone_surrogates_and_jsonl_holds_raw_bytes(
    samples: dict[str, Path],
) -> None:
    assert b"\\udcff" in samples["sharegpt"].read_bytes()
    assert b"\xff\xfe" in samples["magpie"].read_bytes()
    assert b"\xff\xfe" in samples["local_jsonl"].read_bytes()


def test_bench_prompts_leak_into_sharegpt_only_where_recorded(
    samples: dict[str, Path], bad_rows: dict[str, list[dict[str, Any]]]
) -> None:
    bench = {}
    for name in BENCH_SETS:
        rows = _read_jsonl(samples["bench"] / f"{name}.jsonl")
        assert len(rows) == BENCH_PER_SET and all(set(r) == {"id", "prompt"} for r in rows)
        bench.update({r["prompt"]: r["id"] for r in rows})
    leaked = {
        i
        for i, row in enumerate(_read(samples["sharegpt"]))
        if any(text in bench for _, text in _messages(row) or [])
    }
    recorded = {r["row"] for r in bad_rows["sharegpt"] if r["reason"] == "contaminated"}
    assert leaked == recorded and len(recorded) == 3


def test_generated_conversations_alternate_and_vary() -> None:
    conversations = generate_conversations(300, seed=5)
    kinds = Counter(
        "```python" in c[-1]["content"] or "answer is" in c[-1]["content"] for c in conversations
    )
    assert kinds[True] > 50 and kinds[False] > 50
    assert any(c[0]["role"] == "system" for c in conversations)
    assert any(len(c) >= 4 for c in conversations)
    for conv in conversations:
        roles = [m["role"] for m in conv if m["role"] != "system"]
        assert roles == ["user", "assistant"] * (len(roles) // 2)
