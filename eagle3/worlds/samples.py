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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

Conversation = list[dict[str, Any]]  # messages: {"role": ..., "content": ...}

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


def _pool(text: str) -> tuple[str, ...]:
    """Entries separated by newlines or ` | `; a lone `-` stands for the empty string."""
    entries = (e.strip() for line in text.strip().splitlines() for e in line.split(" | "))
    return tuple("" if e == "-" else e for e in entries)


def _topics(text: str) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """Parse `# topic` lines followed by `Q questions` and `T tips` lines (entries split by ` |
    `)."""
    topics: dict[str, tuple[list[str], list[str]]] = {}
    for line in (raw.strip() for raw in text.strip().splitlines()):
        if line.startswith("# "):
            questions, tips = topics.setdefault(line[2:], ([], []))
        else:
            (tips if line.startswith("T ") else questions).extend(_pool(line[2:]))
    return {name: (tuple(q), tuple(t)) for name, (q, t) in topics.items()}


_NAMES = _pool(
    "Maya | Omar | Lena | Ravi | Sofia | Kenji | Amara | Lucas | Ines | Tariq | Greta | Noah | Priya"
)
_ITEMS = _pool(
    "apples | marbles | stickers | books | pencils | coins | shells | cards | cookies | stamps"
)
_SLOTS = {
    "city": _pool("Lisbon | Kyoto | Oslo | Lima | Cairo | Quebec | Hanoi | Porto"),
    "language": _pool("Spanish | Japanese | German | Swahili | Italian | Korean"),
    "subject": _pool("the ocean | old maps | bees | volcanoes | clocks | bridges"),
    "instrument": _pool("guitar | piano | violin | drums | flute"),
}
_TOPICS = _topics("""
    # sleep
    Q How can I sleep better at night? | Any tips for falling asleep faster?
    T Go to bed and wake up at the same time every day. | Keep your bedroom cool, dark and quiet.
    T Avoid screens for about an hour before bed. | Skip coffee after lunch.
    T A short walk in the afternoon makes it easier to fall asleep.
    # plants
    Q How often should I water a small houseplant? | Why are the leaves of my plant turning yellow?
    T Check the soil with a finger before watering. | Most plants like bright but indirect light.
    T Too much water is a more common problem than too little. | Use a pot with a hole in the bottom.
    T Feed the plant lightly in spring and summer.
    # travel
    Q What should I see on a weekend trip to {city}? | How do I plan two days in {city}?
    T Start with a walk through the old town in the morning. | Book one museum ahead of time.
    T Try a local market for lunch. | Keep the evening free for a slow dinner.
    T Public transport is usually faster than a taxi in the center.
    # language
    Q How do I start learning {language}? | What is the best way to practice {language} daily?
    T Learn the hundred most common words first. | Practice a little every day instead of a lot once.
    T Listen to simple podcasts while you walk. | Write three short sentences each evening.
    T Find a partner to talk with once a week.
    # books
    Q Can you suggest how to find a good book about {subject}? | I want to read more about {subject}.
    T Ask a librarian for a short introduction. | Look for a book with many pictures and maps.
    T Read the first chapter before you decide. | Pick one that tells the story of real people.
    T Keep notes of the ideas you like.
    # music
    Q How long does it take to learn the {instrument}? | How should I practice the {instrument}?
    T Practice for twenty minutes a day. | Learn one simple song you love first.
    T Play slowly until your hands know the movement. | Record yourself once a week.
    T Take a break when your fingers hurt.
    # money
    Q How can I save a bit of money each month? | What is a simple way to make a budget?
    T Write down what you spend for one month. | Move some money to savings on payday.
    T Cook at home a few more evenings each week. | Cancel subscriptions you do not use.
    T Set one clear goal, like a trip or a new bike.
""")
_GREETINGS = ("", "Hi! ", "Hello! ", "Hey there. ", "Good morning! ")
_CONTEXTS = _pool("""
    - | I have about {n} minutes a day for this. | My friend {name} suggested I ask you.
    I am {n} years old. | I tried {n} different things already.
""")
_OPENERS = ("", "Good question! ", "Sure. ", "Here are a few ideas. ", "Happy to help. ")
_CLOSERS = ("", " I hope this helps!", " Let me know if you want more detail.", " Good luck!")
_FOLLOW_UPS = (
    "Thanks! Can you give me one more tip?",
    "What should I avoid?",
    "Could you add one more idea?",
)
_SYSTEMS = _pool("""
    You are a helpful assistant. | You are a friendly tutor. Keep answers short.
    You are a careful assistant. Explain your reasoning. | You are a concise coding assistant.
""")
_MATH = _pool("""
    add {name} has {a} {item} and gets {b} more. How many {item} does {name} have now?
    sub {name} had {a} {item} and gave {b} to a friend. How many {item} are left?
    mul {name} buys {a} boxes with {b} {item} in each box. How many {item} is that in total?
    div {name} shares {p} {item} equally among {b} friends. How many {item} does each friend get?
    two {name} has {a} {item}, buys {b} more, then gives away {c}. How many {item} are left?
""")
_MATH_INTROS = _pool("""
    - | Quick math question: | Can you help me with this? | Solve this step by step.
    Here is a word problem. | My homework asks:
""")
_MATH_CLOSERS = (
    "",
    " Please show your work.",
    " Explain briefly.",
    " Give the final number at the end.",
)
_CODE = {  # task -> (request, body lines); {k} is a small integer, {arg} the parameter name
    "sum_above": (
        "returns the sum of the numbers in a list that are greater than {k}",
        ("total = 0", "for x in {arg}:", "    if x > {k}:", "        total += x", "return total"),
    ),
    "scale_all": ("multiplies every number in a list by {k}", ("return [x * {k} for x in {arg}]",)),
    "shift_all": ("adds {k} to every number in a list", ("return [x + {k} for x in {arg}]",)),
    "long_words": (
        "keeps only the words longer than {k} letters",
        ("return [w for w in {arg} if len(w) > {k}]",),
    ),
    "count_divisible": (
        "counts how many numbers in a list are divisible by {k}",
        (
            "count = 0",
            "for x in {arg}:",
            "    if x % {k} == 0:",
            "        count += 1",
            "return count",
        ),
    ),
    "repeat_text": (
        "repeats a string {k} times with a space between copies",
        ('return " ".join([{arg}] * {k})',),
    ),
}
_CODE_ASKS = (
    "Write a Python function",
    "Please write a Python function",
    "I need a Python function",
)
_CODE_CLOSERS = (
    "",
    " Keep it short.",
    " Use plain Python.",
    " Explain it briefly.",
    " No imports, please.",
)
_CODE_ARGS = ("values", "items", "data", "xs", "nums")


def _fill(rng: random.Random, text: str) -> str:
    slots = {key: rng.choice(pool) for key, pool in _SLOTS.items()}
    return text.format(name=rng.choice(_NAMES), n=rng.randint(2, 90), **slots)


def _chat(rng: random.Random, turns: int) -> tuple[Conversation, str]:
    """Small talk on one topic; later turns take tips the earlier answers did not use."""
    questions, tips = _TOPICS[rng.choice(sorted(_TOPICS))]
    unused = rng.sample(tips, len(tips))
    context = _fill(rng, rng.choice(_CONTEXTS))
    core = _fill(rng, rng.choice(questions)) + (" " + context if context else "")
    prompt = rng.choice(_GREETINGS) + core
    answer = rng.choice(_OPENERS) + " ".join(unused[:3]) + rng.choice(_CLOSERS)
    conv = [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
    for tip in unused[3 : 3 + turns - 1]:
        conv += [
            {"role": "user", "content": rng.choice(_FOLLOW_UPS)},
            {"role": "assistant", "content": f"One more idea: {tip}"},
        ]
    return conv, core


def _math(rng: random.Random, turns: int) -> tuple[Conversation, str]:
    """An arithmetic word problem with a worked answer ending in 'The answer is N.'"""
    op, template = rng.choice(_MATH).split(" ", 1)
    a, b, c = rng.randint(12, 99), rng.randint(2, 11), rng.randint(1, 9)
    item, name = rng.choice(_ITEMS), rng.choice(_NAMES)
    expr, ans = {
        "add": (f"{a} + {b}", a + b),
        "sub": (f"{a} - {b}", a - b),
        "mul": (f"{a} * {b}", a * b),
        "div": (f"{a * b} / {b}", a),
        "two": (f"{a} + {b} - {c}", a + b - c),
    }[op]
    question = template.format(name=name, item=item, a=a, b=b, c=c, p=a * b)
    prompt = " ".join(filter(None, (rng.choice(_MATH_INTROS), question))) + rng.choice(
        _MATH_CLOSERS
    )
    answer = f"We compute {expr} = {ans}. So {name} ends up with {ans} {item}. The answer is {ans}."
    conv = [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
    if turns > 1:
        conv += [
            {"role": "user", "content": "Can you check that answer?"},
            {"role": "assistant", "content": f"Yes. {expr} = {ans}, so the answer is {ans}."},
        ]
    return conv, question


def _code(rng: random.Random, turns: int) -> tuple[Conversation, str]:
    """A tiny Python function task; the answer is a fenced code block plus one sentence. Each task
    keeps one function name: a small model learns to write it, where copying a made-up name from the
    prompt degenerated."""
    fname = rng.choice(sorted(_CODE))
    request, body = _CODE[fname]
    k, arg = rng.randint(2, 99), rng.choice(_CODE_ARGS)
    prompt = f"{rng.choice(_CODE_ASKS)} `{fname}({arg})` that {request.format(k=k)}.{rng.choice(_CODE_CLOSERS)}"
    code = "\n".join(
        [f"def {fname}({arg}):", *("    " + line.format(k=k, arg=arg) for line in body)]
    )
    answer = f"Here is one way to do it:\n\n```python\n{code}\n```\n\nThe function `{fname}` {request.format(k=k)}."
    conv = [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
    if turns > 1:
        conv += [
            {"role": "user", "content": f"Can you show how to call `{fname}`?"},
            {"role": "assistant", "content": f"Call it like this: `result = {fname}(my_{arg})`."},
        ]
    return conv, f"{fname} {k} {arg}"


_KINDS: dict[str, Callable[[random.Random, int], tuple[Conversation, str]]] = {
    "chat": _chat,
    "math": _math,
    "code": _code,
}


class ConversationFactory:
    """Seeded source of conversations whose prompts never repeat: each generator returns a core key
    (the prompt without greetings and intros, or the code task and its constant) and a repeated key
    is drawn again."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.seen: set[str] = set()

    def make(
        self, *, kind: str | None = None, multi_turn: bool = True, system: bool = True
    ) -> tuple[str, Conversation]:
        """A fresh conversation and its kind (chat, math or code)."""
        for _ in range(1000):
            kind_ = kind or self.rng.choice(sorted(_KINDS))
            turns = self.rng.choice((1, 1, 2, 3)) if multi_turn else 1
            conv, core = _KINDS[kind_](self.rng, turns)
            key = f"{kind_}: " + " ".join(core.lower().split())
            if key in self.seen:
                continue
            self.seen.add(key)
            if system and self.rng.random() < 0.25:
                conv.insert(0, {"role": "system", "content": self.rng.choice(_SYSTEMS)})
            return kind_, conv
        raise RuntimeError(
            f"template pools exhausted for kind={kind!r}: lower rows_per_source or add templates"
        )


def generate_conversations(n: int, *, seed: int = 0) -> list[Conversation]:
    """`n` distinct chat/math/code conversations (1-3 turns, some with a system prompt), e.g. to
    train a target."""
    factory = ConversationFactory(seed)
    return [factory.make()[1] for _ in range(n)]


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
            [{"role": "system", "content": _SYSTEMS[0]}, conv[1]] if occurrence % 2 else [conv[1]]
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
