"""Deterministic sample datasets in each real source's on-disk format, with planted bad rows.

Design choices:
- Template pools plus one seeded `random.Random`: a seed gives byte-identical files. Good rows have
  distinct prompts across all sources and bench sets; any two good conversations have word 5-gram
  Jaccard < 0.8.
- Bad rows sit at deterministic positions (about 5% of each file, at least one per reason the format
  can express) and are listed in `bad_rows.json` as `{adapter: [{"row": i, "reason": r, "detail":
  d}]}`, `row` being the 0-based position in the file (list index, line number or Parquet row).
  `local_jsonl` (question/answer pairs) cannot express the role-level reasons: see
  `REASONS_BY_ADAPTER`.
- Bad text is held in Python as lone surrogates: JSON files carry `\\udcff` escapes, JSONL and
  Parquet files the raw invalid bytes (surrogateescape). A Parquet file with such a row still opens
  with `pq.read_table`; only turning that row into Python raises `UnicodeDecodeError`, the way
  broken real data behaves.
- sharegpt also holds 3 well-formed rows whose user turn is a bench prompt verbatim (reason
  `contaminated`).
"""

from __future__ import annotations

import hashlib
import json
import random
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from eagle3.worlds.conversations import SYSTEM_PROMPTS, Conversation, ConversationFactory

SAMPLES_VERSION = "1"
MANIFEST_FILE = "samples.json"
BAD_ROWS_FILE = "bad_rows.json"
BAD_TEXT = "\udcff\udcfe"  # written as invalid UTF-8 bytes (JSONL/Parquet) or \u escapes (JSON)
TOO_LONG_CHARS = 60_000
BENCH_SETS = ("chat", "math", "code")
BENCH_PER_SET = 16
ALL_REASONS = (
    *("empty", "no_user_turn", "unknown_role", "not_alternating"),
    *("too_long", "bad_encoding", "malformed", "duplicate"),
)
ADAPTERS = (
    "sharegpt",
    "ultrachat",
    "perfect_blend",
    "openhermes",
    "magpie",
    "tulu3",
    "local_jsonl",
)
_EXTS = ("json", "parquet", "parquet", "json", "jsonl", "parquet", "jsonl")
FILE_NAMES = {
    name: f"{name.removesuffix('_jsonl')}.{ext}" for name, ext in zip(ADAPTERS, _EXTS, strict=True)
}
REASONS_BY_ADAPTER = {name: ALL_REASONS for name in ADAPTERS} | {
    "local_jsonl": ("empty", "too_long", "bad_encoding", "malformed", "duplicate"),
}


def _bad_conversation(
    reason: str, conv: Conversation, occurrence: int, *, single: bool
) -> Conversation:
    """A conversation-level defect made from a fresh `conv`; `malformed` and `duplicate` are
    row-level."""
    conv = [m for m in conv if m["role"] != "system"]
    user, reply = conv[0]["content"], conv[1]["content"]
    if reason == "empty":
        return (
            [] if occurrence % 2 == 0 and not single else [{"role": "user", "content": ""}, conv[1]]
        )
    if reason == "no_user_turn":
        return (
            [{"role": "system", "content": SYSTEM_PROMPTS[0]}, conv[1]]
            if occurrence % 2
            else [conv[1]]
        )
    if reason == "unknown_role":
        return [{"role": "narrator", "content": "The scene opens in a quiet kitchen."}, *conv]
    if reason == "not_alternating":
        return [conv[0], {"role": "user", "content": "Also, please answer quickly."}, *conv[1:]]
    if reason == "too_long":
        filler = (user + " ") * (TOO_LONG_CHARS // (len(user) + 1) + 1)
        return [{"role": "user", "content": filler[:TOO_LONG_CHARS]}, conv[1]]
    if reason == "bad_encoding":
        return [
            {"role": "user", "content": user[:20] + BAD_TEXT + user[20:]},
            {"role": "assistant", "content": reply},
        ]
    return conv


_SHAREGPT_ROLES = {"user": "human", "assistant": "gpt"}


def _sharegpt_turns(conv: Conversation) -> list[dict[str, Any]]:
    return [
        {"from": _SHAREGPT_ROLES.get(m["role"], m["role"]), "value": m["content"]} for m in conv
    ]


def _first(conv: Conversation, role: str) -> str:
    return next((m["content"] for m in conv if m["role"] == role), "")


def _stable_id(*parts: object) -> str:
    return hashlib.sha256("/".join(map(str, parts)).encode("utf-8", "surrogateescape")).hexdigest()


def _to_row(adapter: str, conv: Conversation, i: int, kind: str) -> dict[str, Any]:
    """One row in the adapter's native layout (before any row-level breakage)."""
    sid = _stable_id(adapter, i)
    if adapter == "sharegpt":
        return {"id": f"{sid[:8]}_{i}", "conversations": _sharegpt_turns(conv)}
    if adapter == "ultrachat":
        prompt = _first(conv, "user")
        return {
            "prompt": prompt,
            "prompt_id": _stable_id(prompt),
            "messages": [dict(m) for m in conv],
        }
    if adapter == "perfect_blend":
        return {"conversations": _sharegpt_turns(conv), "source": f"tiny/{kind}"}
    if adapter == "openhermes":
        turns = [t | {"weight": 1.0 if t["from"] == "gpt" else None} for t in _sharegpt_turns(conv)]
        source = {"chat": "airoboros2.2", "math": "metamath", "code": "glaive-code-assist"}[kind]
        return {
            "conversations": turns,
            "source": source,
            "category": None if kind == "code" else kind,
        }
    if adapter == "magpie":
        category = {"chat": "Advice seeking", "math": "Math", "code": "Coding & Debugging"}[kind]
        return {
            "uuid": str(uuid.UUID(sid[:32])),
            "model": "tiny-teacher",
            "instruction": _first(conv, "user"),
            "response": _first(conv, "assistant"),
            "conversations": _sharegpt_turns(conv),
            "task_category": category,
        }
    if adapter == "tulu3":
        return {
            "id": f"tiny_{kind}_{i}",
            "messages": [dict(m) for m in conv],
            "source": f"tiny-sft/{kind}",
        }
    if adapter == "local_jsonl":
        return {"question": _first(conv, "user"), "answer": _first(conv, "assistant"), "uid": i}
    raise ValueError(f"unknown adapter {adapter!r}; known: {', '.join(ADAPTERS)}")


def _break_row(
    adapter: str, row: dict[str, Any], occurrence: int
) -> tuple[dict[str, Any] | str, str]:
    """A `malformed` variant of a row: wrong types or missing keys (JSON), nulls (Parquet),
    truncated lines (JSONL). Returns the row (or a raw line) and a short description."""
    turns_key = "messages" if adapter in ("ultrachat", "tulu3") else "conversations"
    text_key = "value" if turns_key == "conversations" else "content"
    if adapter in ("magpie", "local_jsonl") and occurrence % 3 == 0:
        return json.dumps(row, ensure_ascii=False)[:40], "truncated_json_line"
    if adapter == "local_jsonl" and occurrence % 3 == 1:
        return {**row, "question": ["not", "a", "string"]}, "question_is_list"
    if adapter == "local_jsonl":
        return {k: v for k, v in row.items() if k != "answer"}, "missing_answer"
    # typed Parquet columns: breakage is a null
    if adapter in ("ultrachat", "perfect_blend", "tulu3"):
        if occurrence % 2 == 0:
            return {**row, turns_key: None}, f"null_{turns_key}"
        turns = [dict(t) for t in row[turns_key]]
        turns[-1][text_key] = None
        return {**row, turns_key: turns}, f"null_{text_key}"
    variant = occurrence % 3
    if variant == 2:
        return {k: v for k, v in row.items() if k != turns_key}, f"missing_{turns_key}"
    turns = [dict(t) for t in row[turns_key]]
    turns[-1][text_key] = 42 if variant == 0 else ["a", "list"]
    return {**row, turns_key: turns}, f"{text_key}_is_{'number' if variant == 0 else 'list'}"


def _plan_bad_rows(adapter: str, n: int, rng: random.Random) -> dict[int, str]:
    """Row index -> reason: about 5% of `n`, every reason the adapter can express at least once."""
    reasons = REASONS_BY_ADAPTER[adapter]
    k = max(len(reasons), round(0.05 * n))
    if n < 2 * k + 8:
        raise ValueError(
            f"rows_per_source={n} is too small to plant {k} bad rows; use at least {2 * k + 8}"
        )
    extra = [rng.choice([r for r in reasons if r != "too_long"]) for _ in range(k - len(reasons))]
    order = [*reasons, *extra]
    rng.shuffle(order)
    return dict(zip(sorted(rng.sample(range(4, n), k)), order, strict=True))


def _build_rows(
    adapter: str,
    n: int,
    factory: ConversationFactory,
    contaminated: dict[int, tuple[str, Conversation]],
) -> tuple[list[dict[str, Any] | str], list[dict[str, Any]]]:
    """All rows of one file (dicts, or raw strings for broken JSONL lines) and their bad-row
    records."""
    rng = factory.rng
    plan = _plan_bad_rows(adapter, n, rng)
    single = adapter in ("magpie", "local_jsonl")
    system = adapter not in ("ultrachat", "magpie", "local_jsonl")
    rows: list[dict[str, Any] | str] = []
    records: list[dict[str, Any]] = []
    good: list[tuple[int, str, Conversation]] = []
    occurrences: dict[str, int] = {}
    for i in range(n):
        reason = plan.get(i)
        occurrence = occurrences[reason] = occurrences.get(reason, -1) + 1 if reason else 0
        detail = reason or ""
        if i in contaminated:
            kind, conv = contaminated[i]
            records.append(
                {
                    "row": i,
                    "reason": "contaminated",
                    "detail": f"user turn is bench prompt {kind}-000",
                }
            )
        elif reason == "duplicate":
            source, kind, conv = good[rng.randrange(len(good))]
            conv, detail = [dict(m) for m in conv], f"copy of row {source}"
        else:
            kind, conv = factory.make(multi_turn=not single, system=system)
            if reason not in (None, "malformed"):
                conv = _bad_conversation(reason, conv, occurrence, single=single)
        row: dict[str, Any] | str = _to_row(adapter, conv, i, kind)
        if reason == "malformed":
            row, detail = _break_row(adapter, row, occurrence)
        if reason:
            records.append({"row": i, "reason": reason, "detail": detail})
        elif i not in contaminated:
            good.append((i, kind, conv))
        rows.append(row)
    return rows, records


_MSG = pa.struct([("content", pa.string()), ("role", pa.string())])
_TURN = pa.struct([("from", pa.string()), ("value", pa.string())])
PARQUET_SCHEMAS = {
    "ultrachat": pa.schema(
        [("prompt", pa.string()), ("prompt_id", pa.string()), ("messages", pa.list_(_MSG))]
    ),
    "perfect_blend": pa.schema([("conversations", pa.list_(_TURN)), ("source", pa.string())]),
    "tulu3": pa.schema(
        [("id", pa.string()), ("messages", pa.list_(_MSG)), ("source", pa.string())]
    ),
}


def _binary_type(t: pa.DataType) -> pa.DataType:
    """The same type with every string replaced by binary (identical buffer layout)."""
    if pa.types.is_string(t):
        return pa.binary()
    if pa.types.is_list(t):
        return pa.list_(_binary_type(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _binary_type(f.type)) for f in t])
    return t


def _to_bytes(value: Any) -> Any:
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    if isinstance(value, list):
        return [_to_bytes(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_bytes(v) for k, v in value.items()}
    return value


def write_parquet(path: Path, rows: list[dict[str, Any]], schema: pa.Schema) -> None:
    """Strings go in as bytes and are viewed as strings without validation, so bad UTF-8 survives as
    is."""
    columns = [
        pa.array([_to_bytes(r[f.name]) for r in rows], type=_binary_type(f.type)).view(f.type)
        for f in schema
    ]
    pq.write_table(pa.Table.from_arrays(columns, schema=schema), path)


def write_json(path: Path, rows: list[Any]) -> None:
    path.write_text(json.dumps(rows, ensure_ascii=True, indent=1) + "\n", encoding="ascii")


def write_jsonl(path: Path, rows: list[Any]) -> None:
    lines = [r if isinstance(r, str) else json.dumps(r, ensure_ascii=False) for r in rows]
    path.write_bytes(b"".join(line.encode("utf-8", "surrogateescape") + b"\n" for line in lines))


def write_rows(path: Path, rows: list[Any], schema: pa.Schema | None = None) -> None:
    """One sample file: Parquet of ``schema`` when given, else JSONL or JSON by the file's
    suffix."""
    if schema is not None:
        write_parquet(path, rows, schema)
    elif path.suffix == ".jsonl":
        write_jsonl(path, rows)
    else:
        write_json(path, rows)


def _write_bench(bench_dir: Path, factory: ConversationFactory) -> dict[str, list[Conversation]]:
    """16 single-turn prompts per set; returns the full conversations (prompt + reference
    answer)."""
    bench_dir.mkdir(parents=True, exist_ok=True)
    sets = {}
    for name in BENCH_SETS:
        sets[name] = [
            factory.make(kind=name, multi_turn=False, system=False)[1] for _ in range(BENCH_PER_SET)
        ]
        rows = [
            {"id": f"{name}-{j:03d}", "prompt": conv[0]["content"]}
            for j, conv in enumerate(sets[name])
        ]
        write_jsonl(bench_dir / f"{name}.jsonl", rows)
    return sets


def file_stats(path: Path) -> dict[str, Any]:
    return {"bytes": path.stat().st_size, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def write_samples(out_dir: Path, *, seed: int = 0, rows_per_source: int = 200) -> dict[str, Path]:
    """Write every adapter's sample file, the bench sets, `bad_rows.json` and the `samples.json`
    manifest.

    Returns adapter name -> file path, plus `"bench"` -> the bench directory. Same seed, same bytes.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    factory = ConversationFactory(seed)
    bench = _write_bench(out_dir / "bench", factory)
    paths: dict[str, Path] = {}
    bad_rows: dict[str, list[dict[str, Any]]] = {}
    files: dict[str, dict[str, Any]] = {}
    for adapter in ADAPTERS:
        contaminated: dict[int, tuple[str, Conversation]] = {}
        if adapter == "sharegpt":
            # rows 0-3 are never planted bad rows
            spots = factory.rng.sample(range(1, 4), len(BENCH_SETS))
            contaminated = {
                i: (name, bench[name][0]) for i, name in zip(spots, BENCH_SETS, strict=True)
            }
        rows, bad_rows[adapter] = _build_rows(adapter, rows_per_source, factory, contaminated)
        paths[adapter] = out_dir / FILE_NAMES[adapter]
        write_rows(paths[adapter], rows, PARQUET_SCHEMAS.get(adapter))
        counts = {"rows": len(rows), "bad_rows": len(bad_rows[adapter])}
        files[adapter] = {"path": FILE_NAMES[adapter], **counts, **file_stats(paths[adapter])}
    (out_dir / BAD_ROWS_FILE).write_text(json.dumps(bad_rows, indent=1) + "\n")
    manifest = {
        "version": SAMPLES_VERSION,
        "seed": seed,
        "rows_per_source": rows_per_source,
        "files": files,
        "bench": {
            name: {"path": f"bench/{name}.jsonl", "rows": BENCH_PER_SET} for name in BENCH_SETS
        },
        "bad_rows": BAD_ROWS_FILE,
    }
    (out_dir / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1) + "\n")
    return paths | {"bench": out_dir / "bench"}
