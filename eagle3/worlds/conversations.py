"""Deterministic conversations for the tiny worlds: chat, math and code, 1-3 turns, some with a
system prompt, drawn from template pools by one seeded ``random.Random`` (a seed gives the same
conversations), with prompts that never repeat within a factory."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

Conversation = list[dict[str, Any]]  # messages: {"role": ..., "content": ...}


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
SYSTEM_PROMPTS = _pool("""
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
                conv.insert(0, {"role": "system", "content": self.rng.choice(SYSTEM_PROMPTS)})
            return kind_, conv
        raise RuntimeError(
            f"template pools exhausted for kind={kind!r}: lower rows_per_source or add templates"
        )


def generate_conversations(n: int, *, seed: int = 0) -> list[Conversation]:
    """`n` distinct chat/math/code conversations (1-3 turns, some with a system prompt), e.g. to
    train a target."""
    factory = ConversationFactory(seed)
    return [factory.make()[1] for _ in range(n)]
