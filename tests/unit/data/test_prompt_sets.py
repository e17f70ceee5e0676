"""Prompt sets in the formats people have: one reader for the gate, decontamination and ``eagle3
eval``; an unknown shape is refused in one line naming the file, the row and the shapes expected, at
config load too."""

from __future__ import annotations

import gzip
import json

import pytest

from eagle3.config.base import ConfigError
from eagle3.data.decontam import load_prompt_sets
from eagle3.data.prompt_sets import PromptSetError, read_prompt_set
from eagle3.gate.prompts import load_prompt_set
from eagle3.recipes import resolve

MT_BENCH = [
    {
        "question_id": 81,
        "category": "writing",
        "turns": [
            "Compose a travel blog post about Hawaii.",
            "Rewrite it, every sentence starting with A.",
        ],
    },
    {
        "question_id": 82,
        "category": "writing",
        "turns": ["Draft a short email to your supervisor."],
    },
]
HUMANEVAL = [
    {"task_id": "HumanEval/0", "prompt": "def has_close_elements(numbers):\n", "entry_point": "x"}
]


def _jsonl(path, rows, *, gz=False):
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        (
            MT_BENCH,
            [
                ("81", "Compose a travel blog post about Hawaii.", "turns"),
                ("82", "Draft a short email to your supervisor.", "turns"),
            ],
        ),
        (HUMANEVAL, [("HumanEval/0", "def has_close_elements(numbers):\n", "prompt")]),
        (
            [{"id": "g1", "question": "What is 2+2?", "answer": "4"}],
            [("g1", "What is 2+2?", "text")],
        ),
        (
            [
                {
                    "id": "s1",
                    "conversations": [
                        {"from": "gpt", "value": "earlier reply"},
                        {"from": "human", "value": "hi"},
                        {"from": "gpt", "value": "hello"},
                        {"from": "human", "value": "more"},
                    ],
                }
            ],
            [("s1", "hi", "sharegpt")],
        ),
        (
            [
                {
                    "messages": [
                        {"role": "system", "content": "Be brief."},
                        {"role": "user", "content": "Why?"},
                    ]
                }
            ],
            [("set-0", "Why?", "messages")],
        ),
        (
            ["a bare prompt", "another"],
            [("set-0", "a bare prompt", "string"), ("set-1", "another", "string")],
        ),
    ],
    ids=["mt_bench", "humaneval", "text_column", "sharegpt", "messages", "plain_strings"],
)
def test_every_known_shape_reads_its_id_and_prompt(tmp_path, rows, expected):
    got = read_prompt_set(_jsonl(tmp_path / "p.jsonl", rows), "set")
    assert [(r.prompt_id, r.prompt, r.shape) for r in got] == expected


def test_every_user_turn_is_kept_for_decontamination_and_a_system_turn_for_the_prompt(tmp_path):
    sharegpt = [
        {
            "conversations": [
                {"from": "system", "value": "S"},
                {"from": "human", "value": "one"},
                {"from": "gpt", "value": "x"},
                {"from": "human", "value": "two"},
            ]
        }
    ]
    row = read_prompt_set(_jsonl(tmp_path / "s.jsonl", sharegpt), "s")[0]
    assert row.turns == ("one", "two")
    assert row.messages == ({"role": "system", "content": "S"}, {"role": "user", "content": "one"})
    mt = load_prompt_sets({"chat": str(_jsonl(tmp_path / "mt.jsonl", MT_BENCH))})
    assert [pid for pid, _ in mt] == [
        "chat/81",
        "chat/81",
        "chat/82",
    ]  # MT-bench's second turn is checked too


def test_gzip_and_json_arrays_read_like_jsonl_whatever_the_name(tmp_path):
    gz = _jsonl(tmp_path / "HumanEval.jsonl.gz", HUMANEVAL, gz=True)
    assert read_prompt_set(gz, "code")[0].prompt_id == "HumanEval/0"
    misnamed = _jsonl(tmp_path / "mt.jsonl", MT_BENCH, gz=True)  # gzip bytes under a plain name
    assert len(read_prompt_set(misnamed, "chat")) == 2
    array = tmp_path / "mt.json"
    array.write_text(json.dumps(MT_BENCH))
    assert [p.prompt_id for p in load_prompt_set("chat", str(array))] == ["81", "82"]


def test_an_unknown_shape_is_refused_in_one_line_naming_file_row_and_fields(tmp_path):
    path = _jsonl(tmp_path / "odd.jsonl", [*MT_BENCH, {"query": "what?", "qid": 3}])
    with pytest.raises(PromptSetError) as err:
        read_prompt_set(path, "chat")
    message = str(err.value)
    assert "\n" not in message and str(path) in message and "row 3" in message
    assert (
        "['qid', 'query']" in message and "'turns' (MT-bench" in message and "'prompt'" in message
    )


def test_a_cut_file_is_refused_not_read_short(tmp_path):
    path = tmp_path / "cut.json"
    path.write_text(json.dumps(MT_BENCH)[:-40])
    with pytest.raises(PromptSetError, match=r"row 2 is malformed"):
        read_prompt_set(path, "chat")


def test_a_config_naming_a_prompt_set_of_unknown_shape_fails_at_load(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE3_HOME", str(tmp_path))
    odd = _jsonl(tmp_path / "odd.jsonl", [{"query": "what?"}])
    good = _jsonl(tmp_path / "mt.jsonl", MT_BENCH)
    assert resolve("tiny", [f"gate.prompt_sets={{chat: {good}}}"]).gate.prompt_sets == {
        "chat": str(good)
    }
    with pytest.raises(ConfigError, match=rf"{odd} row 1 has keys \['query'\]"):
        resolve("tiny", [f"gate.prompt_sets={{chat: {odd}}}"])
