"""Row-level normalization: role mapping per format, system-prompt policy, NFC, validation reasons,
sample ids."""

from __future__ import annotations

import pytest

from eagle3.config.data import NormalizeConfig
from eagle3.data import catalog
from eagle3.data.adapters import RowError, convert_row
from eagle3.data.normalize import normalize_messages, sample_id

CFG = NormalizeConfig()


def _convert(adapter: str, row, columns=None):
    entry = catalog.get(adapter)
    return convert_row(entry, {**entry.columns, **(columns or {})}, row)


def _reason(adapter: str, row, cfg=CFG, columns=None) -> str | None:
    try:
        normalize_messages(_convert(adapter, row, columns).messages, cfg)
    except RowError as err:
        return err.reason
    return None


@pytest.mark.parametrize("name", ["human", "user", "HUMAN"])
def test_user_role_names_map_to_user(name):
    conv = _convert("sharegpt", {"conversations": [{"from": name, "value": "hi"}]})
    assert conv.messages == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("name", ["gpt", "chatgpt", "bing", "bard", "assistant", "model"])
def test_assistant_role_names_map_to_assistant(name):
    conv = _convert(
        "sharegpt",
        {"conversations": [{"from": "human", "value": "a"}, {"from": name, "value": "b"}]},
    )
    assert conv.messages[1]["role"] == "assistant"


def test_column_mapping_reads_flat_question_answer_rows():
    cols = {"user": "question", "assistant": "answer", "id": "uid"}
    conv = _convert("jsonl", {"question": "Q?", "answer": "A.", "uid": 7}, cols)
    assert conv.messages == [
        {"role": "user", "content": "Q?"},
        {"role": "assistant", "content": "A."},
    ]
    assert conv.meta["id"] == 7


def test_generic_adapters_read_messages_or_conversations_columns():
    for row in (
        {"messages": [{"role": "user", "content": "x"}]},
        {"conversations": [{"from": "human", "value": "x"}]},
    ):
        assert _convert("parquet", row).messages == [{"role": "user", "content": "x"}]


def test_system_column_and_capybara_pairs_and_openai_content_parts():
    ot = _convert(
        "openthoughts", {"system": "Think.", "conversations": [{"from": "user", "value": "q"}]}
    )
    assert ot.messages[0] == {"role": "system", "content": "Think."}
    cap = _convert(
        "capybara",
        {"conversation": [{"input": "q1", "output": "a1"}, {"input": "q2", "output": None}]},
    )
    assert [m["role"] for m in cap.messages] == ["user", "assistant", "user"]
    parts = _convert(
        "tulu3", {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    )
    assert parts.messages[0]["content"] == "hi"


@pytest.mark.parametrize(
    ("turns", "reason"),
    [
        ([], "empty"),
        ([("human", "  "), ("gpt", "x")], "empty"),
        ([("gpt", "x")], "no_user_turn"),
        ([("system", "s"), ("gpt", "x")], "no_user_turn"),
        ([("human", "a"), ("human", "b")], "not_alternating"),
        ([("human", "a"), ("gpt", "b"), ("gpt", "c")], "not_alternating"),
        ([("human", "a"), ("system", "b")], "not_alternating"),
        ([("human", "a"), ("narrator", "b")], "unknown_role"),
        ([("human", "a\udcff")], "bad_encoding"),
        ([("human", "x" * 40_000)], "too_long"),
        ([("human", 3)], "malformed"),
        ([("human", "a"), ("gpt", "b"), ("tool", "r"), ("gpt", "c"), ("human", "d")], None),
        ([("human", "a"), ("gpt", "")], None),
        ([("gpt", "a reply to a split-off question"), ("human", "a"), ("gpt", "b")], None),
    ],
)
def test_validation_reasons(turns, reason):
    row = {"conversations": [{"from": r, "value": v} for r, v in turns]}
    assert _reason("sharegpt", row) == reason


def test_text_is_nfc_normalized():
    decomposed = "cafe\u0301"
    out = normalize_messages([{"role": "user", "content": decomposed}], CFG)
    assert out[0]["content"] == "caf\u00e9"


@pytest.mark.parametrize(
    ("policy", "expected"),
    [("keep", ["system", "user"]), ("drop", ["user"]), ("replace", ["system", "user"])],
)
def test_system_prompt_policy(policy, expected):
    cfg = NormalizeConfig(
        system_prompt_policy=policy, system_prompt="New." if policy == "replace" else None
    )
    out = normalize_messages(
        [{"role": "system", "content": "Old."}, {"role": "user", "content": "q"}], cfg
    )
    assert [m["role"] for m in out] == expected
    if policy == "replace":
        assert out[0]["content"] == "New."
        assert normalize_messages([{"role": "user", "content": "q"}], cfg)[0] == {
            "role": "system",
            "content": "New.",
        }


def test_sample_id_depends_on_prompt_content_only():
    a = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a1"}]
    b = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a2"}]
    c = [{"role": "user", "content": "q2"}]
    assert sample_id(a) == sample_id(b) != sample_id(c)
    assert sample_id([], [1, 2]) != sample_id([], [1, 3])


def test_pretokenized_rows_need_integer_lists():
    with pytest.raises(RowError, match="input_ids"):
        _convert("pretokenized", {"input_ids": "1 2 3", "loss_mask": [0, 1, 1]})


def test_a_leading_reply_without_its_question_is_dropped_not_the_row():
    """ShareGPT's cleaned split cuts long conversations into parts; a later part opens with the
    reply to a question left in the previous part (36% of the shipped file's rows)."""
    roles = ["system", "assistant", "user", "assistant"]
    texts = ["S", "the rest of an answer", "and now?", "ok"]
    messages = [{"role": r, "content": t} for r, t in zip(roles, texts, strict=True)]
    out = normalize_messages(messages, CFG)
    assert [m["role"] for m in out] == ["system", "user", "assistant"]
    assert out[1]["content"] == "and now?"
