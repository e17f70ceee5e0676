"""Conversations of the thinking world: answers that think first, tool calls and their results, a
coding agent.

Design choices:
- Messages are in the project's shape (``eagle3.data.schema``): an assistant turn has
  ``reasoning_content``, ``content`` and ``tool_calls`` (``{"id", "name", "arguments"}``, ids
  ``functions.<name>:<k>`` as Kimi writes them, arguments as JSON text), a tool result
  ``tool_call_id``. The sample writers (``eagle3.worlds.agentic_samples``) turn them into each
  source's layout.
- Kinds: ``chat``, ``math`` and ``code`` are the tiny world's conversations
  (``ConversationFactory``) with a thinking line before each answer; ``weather`` and ``calc`` call
  one tool (weather conversations may ask again about a second city); ``coding`` is an agent that
  runs the tests, reads the file, writes the fix and reports.
- Regular, low-entropy text (a few templates per kind, small pools): a 2M-parameter target learns to
  think, pick a tool and copy its argument from the prompt in a few hundred steps, and its greedy
  answers give a draft something to learn.
- ``training_texts``: what the target is trained on is what it sees when it generates: one text per
  finished answer (an assistant turn followed by a user turn or nothing), the template's generation
  prompt for it followed by the answer as written (thinking included when on), so the tool chain
  before it keeps its thinking as the template shows it and earlier answers show theirs dropped.
  Each text comes with the spans the model wrote (the answer, and the chain turns before it as the
  template keeps them): the loss is on those only, as in SFT. Trained on every token, the template's
  own ``<think></think>`` (earlier answers, thinking off) taught a 2M-parameter model to close the
  block at once when the switch was on.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from eagle3.data.dialect import REASONING_FORMATS, TOOL_CALL_FORMATS
from eagle3.data.template import ChatOptions, prompt_char_spans
from eagle3.worlds.conversations import ConversationFactory
from eagle3.worlds.think_target import DIALECT

Message = dict[str, Any]
Spans = list[tuple[int, int]]
KINDS = ("chat", "math", "code", "weather", "calc", "coding")
TOOL_KINDS = ("weather", "calc", "coding")
_REASONING, _CALLS = REASONING_FORMATS[DIALECT], TOOL_CALL_FORMATS[DIALECT]


def _tool(name: str, description: str, **params: str) -> dict[str, Any]:
    properties = {key: {"type": "string", "description": text} for key, text in params.items()}
    schema = {"type": "object", "properties": properties, "required": list(params)}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": schema},
    }


TOOLS = {
    "get_weather": _tool("get_weather", "Current weather in a city.", city="City name"),
    "calculator": _tool(
        "calculator", "Evaluate an arithmetic expression.", expression="For example 12 * 7"
    ),
    "run_tests": _tool("run_tests", "Run the tests in a file.", path="Test file"),
    "read_file": _tool("read_file", "Read a file.", path="File path"),
    "write_file": _tool(
        "write_file", "Write a file.", path="File path", content="New file content"
    ),
}
_TOOLSETS = {
    "weather": ("get_weather",),
    "calc": ("calculator",),
    "coding": ("run_tests", "read_file", "write_file"),
}
_SKIES = ("sunny", "cloudy", "light rain", "windy", "foggy", "snowing")
_GREETINGS = ("", "Hi! ", "Quick question: ", "Hello. ")
_WEATHER_ASKS = (
    "What is the weather in {city} {when}?",
    "Is it cold in {city} {when}?",
    "How is the weather in {city} {when}?",
    "Should I take a coat in {city} {when}?",
)
_WHEN = ("today", "right now", "this morning", "this afternoon", "tonight", "at the moment")
_CALC_ASKS = (
    "Please use the calculator: what is {expr} for my {thing}?",
    "Can you compute {expr} for the {thing}?",
    "I need {expr} for my {thing}, please use the calculator.",
)
_THINGS = ("budget", "garden plan", "recipe", "shop order", "class list", "trip")
_MODULES = ("stats", "utils", "numbers", "helpers", "mathx", "tools")
_CODING_ASKS = (
    "The tests for `{f}` fail: test_{f} expects {want}. Please fix {path}.",
    "test_{f} fails (it wants {want}). Can you fix {path}?",
    "Please fix {path}: the test for `{f}` expects {want} and fails.",
)
_THOUGHTS = {
    "chat": "The user wants practical advice. I will give a few short tips.",
    "math": "I need to work this out step by step before I answer.",
    "code": "The user needs a small Python function. I will write it and explain it in one sentence.",
}


@dataclass(frozen=True)
class Pools:
    """What tool conversations draw their arguments from; the gate's held-out prompts draw from
    other pools, so no training prompt shares a benchmark prompt's city, expression or function
    (decontamination would drop it)."""

    cities: tuple[str, ...]
    numbers: tuple[int, int]
    funcs: tuple[str, ...]


TRAIN_POOLS = Pools(
    (
        "Lisbon",
        "Kyoto",
        "Oslo",
        "Lima",
        "Cairo",
        "Quebec",
        "Hanoi",
        "Porto",
        "Dakar",
        "Perth",
        "Quito",
        "Riga",
        "Seoul",
        "Tunis",
        "Bergen",
        "Cusco",
        "Malaga",
        "Nagoya",
        "Turku",
        "Accra",
    ),
    (11, 99),
    ("total", "average_of", "count_items", "largest", "smallest", "sum_of", "score", "mean_value"),
)
HELD_OUT_POOLS = Pools(
    ("Nairobi", "Reykjavik", "Lyon", "Hobart", "Sapporo", "Gdansk"),
    (101, 199),
    ("median_of", "spread", "range_of"),
)


@dataclass
class Agentic:
    """One conversation: its kind, messages and tool declarations (None without tools)."""

    kind: str
    messages: list[Message]
    tools: list[dict[str, Any]] | None = None


class _Calls:
    """Counts a conversation's calls, so ids follow Kimi's ``functions.<name>:<k>``."""

    def __init__(self) -> None:
        self.k = 0

    def turn(self, reasoning: str, name: str, **arguments: str) -> Message:
        call = {
            "id": _CALLS.call_id(name, self.k),
            "name": name,
            "arguments": json.dumps(arguments),
        }
        self.k += 1
        return {
            "role": "assistant",
            "reasoning_content": reasoning,
            "content": "",
            "tool_calls": [call],
        }


def _result(turn: Message, content: str) -> Message:
    return {"role": "tool", "tool_call_id": turn["tool_calls"][0]["id"], "content": content}


def _answer(reasoning: str, content: str) -> Message:
    return {"role": "assistant", "reasoning_content": reasoning, "content": content}


def _weather(rng: random.Random, calls: _Calls, city: str, ask: str) -> list[Message]:
    temp, sky = rng.randint(-5, 35), rng.choice(_SKIES)
    turn = calls.turn(
        f"The user asks about the weather in {city}. I will call get_weather.",
        "get_weather",
        city=city,
    )
    return [
        {"role": "user", "content": ask.format(city=city)},
        turn,
        _result(turn, f"{city}: {temp} C, {sky}"),
        _answer(
            f"The tool says {city} has {temp} C and is {sky}.",
            f"Right now it is {temp} C and {sky} in {city}.",
        ),
    ]


def _weather_conversation(rng: random.Random, pools: Pools) -> tuple[list[Message], str]:
    city, other = rng.sample(pools.cities, 2)
    calls = _Calls()
    ask = rng.choice(_GREETINGS) + rng.choice(_WEATHER_ASKS).replace("{when}", rng.choice(_WHEN))
    messages = _weather(rng, calls, city, ask)
    if rng.random() < 0.4:
        messages += _weather(rng, calls, other, "Thanks! And in {city}?")
    return messages, f"weather {messages[0]['content']}"


def _calc_conversation(rng: random.Random, pools: Pools) -> tuple[list[Message], str]:
    a, b = rng.randint(*pools.numbers), rng.randint(3, 19)
    op = rng.choice("+-*")
    expr, value = f"{a} {op} {b}", {"+": a + b, "-": a - b, "*": a * b}[op]
    turn = _Calls().turn(
        f"The user wants {expr}. I will use the calculator.", "calculator", expression=expr
    )
    messages = [
        {
            "role": "user",
            "content": rng.choice(_CALC_ASKS).format(expr=expr, thing=rng.choice(_THINGS)),
        },
        turn,
        _result(turn, str(value)),
        _answer(f"The calculator returned {value}.", f"{expr} = {value}."),
    ]
    return messages, f"calc {expr}"


def _coding_conversation(rng: random.Random, pools: Pools) -> tuple[list[Message], str]:
    fname, module, extra = rng.choice(pools.funcs), rng.choice(_MODULES), rng.randint(1, 9)
    path, test = f"{module}/{fname}.py", f"tests/test_{fname}.py"
    want = rng.randint(10, 60)
    calls = _Calls()
    run = calls.turn("I will run the tests first.", "run_tests", path=test)
    read = calls.turn("The test fails. I will read the source.", "read_file", path=path)
    body = f"def {fname}(values):\n    return sum(values)"
    write = calls.turn(
        f"The function adds {extra} by mistake. I will remove it.",
        "write_file",
        path=path,
        content=body + "\n",
    )
    ask = rng.choice(_CODING_ASKS).format(f=fname, want=want, path=path)
    messages = [
        {"role": "user", "content": ask},
        run,
        _result(run, f"FAILED {test}::test_{fname} - assert {want + extra} == {want}"),
        read,
        _result(read, f"{body} + {extra}\n"),
        write,
        _result(write, "ok"),
        _answer(
            "The fix is written.", f"I fixed `{fname}` in {path}: it added {extra} to the sum."
        ),
    ]
    return messages, f"coding {ask}"


def _thinking(messages: list[Message], kind: str) -> list[Message]:
    """A plain conversation with a thinking line before each answer (math: its first sentence)."""
    out = []
    for m in messages:
        if m["role"] != "assistant":
            out.append(dict(m))
            continue
        first, _, rest = m["content"].partition(". ")
        reasoning, content = (
            (first + ".", rest) if kind == "math" and rest else (_THOUGHTS[kind], m["content"])
        )
        out.append(_answer(reasoning, content))
    return out


_BUILDERS = {
    "weather": _weather_conversation,
    "calc": _calc_conversation,
    "coding": _coding_conversation,
}


class AgenticFactory:
    """Seeded source of distinct conversations of every kind (a repeated core is drawn again)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.plain = ConversationFactory(seed + 7919)
        self.seen: set[str] = set()

    def make(self, kind: str | None = None, *, held_out: bool = False) -> Agentic:
        """A fresh conversation; ``held_out``: its tool arguments from the held-out pools (the
        gate's prompts)."""
        for _ in range(1000):
            kind_ = kind or self.rng.choice(KINDS)
            if kind_ not in _BUILDERS:
                _kind, conv = self.plain.make(kind=kind_)
                return Agentic(kind_, _thinking(conv, kind_))
            messages, key = _BUILDERS[kind_](self.rng, HELD_OUT_POOLS if held_out else TRAIN_POOLS)
            if key not in self.seen:
                self.seen.add(key)
                return Agentic(kind_, messages, [TOOLS[name] for name in _TOOLSETS[kind_]])
        raise RuntimeError(
            f"template pools exhausted for kind={kind!r}: ask for fewer conversations"
        )


def generation_text(message: Message, *, thinking: bool, eos: str) -> str:
    """An assistant turn as the target writes it after the generation prompt (reasoning only when
    thinking)."""
    head = (message.get("reasoning_content") or "") + _REASONING.think_end if thinking else ""
    return (
        head + (message.get("content") or "") + _CALLS.format(message.get("tool_calls") or []) + eos
    )


def training_texts(
    tokenizer: Any, conversation: Agentic, *, thinking: bool
) -> list[tuple[str, Spans]]:
    """One text per finished answer of ``conversation`` and the character spans the model wrote in
    it (module docstring): the answer, and the earlier turns the template shows as written (a turn
    whose thinking the template dropped starts with its ``</think>`` and is left out)."""
    options = ChatOptions(tools=conversation.tools, kwargs={"thinking": thinking})
    messages = conversation.messages
    texts = []
    for k, m in enumerate(messages):
        if m["role"] == "assistant" and (
            k + 1 == len(messages) or messages[k + 1]["role"] == "user"
        ):
            prompt, spans = prompt_char_spans(tokenizer, messages[:k], options)
            kept = [(a, b) for a, b in spans if not prompt.startswith(_REASONING.think_end, a)]
            answer = generation_text(m, thinking=thinking, eos=tokenizer.eos_token)
            texts.append((prompt + answer, [*kept, (len(prompt), len(prompt) + len(answer))]))
    return texts
