"""A CPU world whose domains differ in what the target does, not only in their labels (the
aimed-scaling benchmark).

The tiny world's sources are the same three kinds of conversation (chat, math, code) under eight
dataset formats: as domains they differ by label only, and even its three kinds learn alike
(``BENCHMARKS.md``, "Aimed vs uniform nights": a draft trained on 140 rows of one kind and 20 of
each other lands within 0.1 accept length of the even split, whichever kind got the 140). Here a
tiny chat target (``eagle3.worlds.tiny_target``, 300 steps) is trained on four domains built to make
a draft's job differ, and what the trained target then does (its greedy answers) is what the
benchmark meets:

* ``recite``: "recite the <title> passage" -> one of eight fixed ~40-word passages. The target
  recites them word for word: eight long answers, the same whatever the wording of the request.
* ``copy``: "repeat these words" + 6-9 words from a list of 96, trained on the same words said back.
  The tiny target did not learn to copy: it answers 6-9 list words of its own, loosely tied to the
  prompt (hard to predict).
* ``noise``: "draw a code for ticket N" -> 10 symbols drawn afresh for every training conversation
  (a flat target distribution). Greedy decoding of it collapses to nearly one code ("Your code is
  U7R7M9F."): short and easy.
* ``chat``: the tiny world's advice conversations (templated tips): in between.

Everything is a pure function of ``DomainsWorldSpec`` and built once under
``<cache>/domains-world-<fp>`` (``world.json`` written last, the directory renamed into place), like
the tiny world.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from eagle3.worlds.conversations import Conversation, ConversationFactory
from eagle3.worlds.world import WORLD_FILE, build_cached, default_threads

DOMAINS_VERSION = "1"
DOMAINS = ("chat", "copy", "noise", "recite")

_WORD_LIST = """
    apple river stone cloud maple tiger lemon piano candle garden rocket silver window ocean bridge forest
    pepper violet hammer island jacket kettle ladder magnet needle orange pencil rabbit saddle tunnel velvet wagon
    anchor basket cactus dragon engine falcon ginger harbor igloo jungle koala lantern meadow nectar oyster parrot
    quartz radish salmon tomato umbrella vessel walnut yogurt zebra acorn beacon cobalt dolphin ember fossil glacier
    hazel iris juniper kernel lotus marble nutmeg orchid pebble quiver raven sparrow thistle urchin valley willow
    badger canyon dune elbow fern goblet harp ivory jasper kiwi lilac mango nickel olive plum quill
"""
_WORDS = tuple(_WORD_LIST.split())
_TITLES = ("harbor", "mountain", "library", "orchard", "lighthouse", "market", "winter", "railway")
_CODE_SYMBOLS = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
_ASKS = {
    "copy": (
        "Repeat these words exactly:",
        "Please say these words back:",
        "Echo the following words:",
    ),
    "recite": (
        "Please recite the {t} passage.",
        "Recite the {t} passage for me.",
        "Can you recite the {t} passage?",
    ),
    "noise": (
        "Draw a code for ticket {n}.",
        "Give me a fresh code for ticket {n}.",
        "Ticket {n} needs a code.",
    ),
}
_OPENERS = ("", "Hi! ", "Hello. ", "Quick one: ", "Hey, ")
_CLOSERS = (
    "",
    " Thanks!",
    " Go slowly.",
    " Word for word, please.",
    " I am practicing.",
    " It is for a class.",
)


def _passage(title: str) -> str:
    """A fixed ~40-word passage per title (words drawn by a title-seeded generator)."""
    rng = random.Random(f"passage:{title}")
    words = [rng.choice(_WORDS) for _ in range(36)]
    return f"The {title} passage: " + " ".join(words[:18]) + ". " + " ".join(words[18:]) + "."


def domain_conversation(
    domain: str, rng: random.Random, chat: ConversationFactory
) -> tuple[Conversation, str]:
    """One single-turn conversation of ``domain`` and its prompt key (distinct prompts have distinct
    keys)."""
    if domain == "chat":
        conv = chat.make(kind="chat", multi_turn=False, system=False)[1]
        return conv, conv[0]["content"]
    opener = rng.choice(_OPENERS)
    if domain == "copy":
        words = rng.sample(_WORDS, rng.randint(6, 9))
        prompt, answer = f"{opener}{rng.choice(_ASKS['copy'])} {' '.join(words)}", " ".join(words)
    elif domain == "recite":
        title = rng.choice(_TITLES)
        ask = rng.choice(_ASKS["recite"]).format(t=title)
        prompt, answer = opener + ask + rng.choice(_CLOSERS), _passage(title)
    elif domain == "noise":
        ticket = rng.randint(100, 99999)
        code = "".join(rng.choice(_CODE_SYMBOLS) for _ in range(10))
        prompt, answer = (
            opener + rng.choice(_ASKS["noise"]).format(n=ticket),
            f"Your code is {code}.",
        )
    else:
        raise ValueError(f"unknown domain {domain!r}: use one of {DOMAINS}")
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}], prompt


def domain_prompts(domain: str, n: int, *, seed: int, distinct: bool = True) -> list[Conversation]:
    """``n`` conversations of ``domain`` (their user turn is the prompt); ``distinct``: no prompt
    twice."""
    rng, chat, seen = random.Random(f"{seed}:{domain}"), ConversationFactory(seed), set()
    out: list[Conversation] = []
    for _ in range(100 * n):
        conv, key = domain_conversation(domain, rng, chat)
        if not distinct or key not in seen:
            seen.add(key)
            out.append(conv)
            if len(out) == n:
                return out
    raise RuntimeError(f"{domain}: could not draw {n} distinct prompts")


@dataclass(frozen=True)
class DomainsWorldSpec:
    seed: int = 0
    vocab_size: int = 2048
    num_layers: int = 8
    hidden_size: int = 128
    train_conversations: int = 4000  # per domain 1,000
    train_steps: int = 300
    train_seq_len: int = 256

    def fingerprint(self) -> str:
        payload = json.dumps({"version": DOMAINS_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def build_domains_world(cache_dir: Path, spec: DomainsWorldSpec = DomainsWorldSpec()) -> Path:
    """The target's directory (model + tokenizer) of the world for ``spec``, built once and cached
    (built aside and renamed into place, ``world.json`` last:
    ``eagle3.worlds.world.build_cached``)."""
    final = Path(cache_dir) / f"domains-world-{spec.fingerprint()}"
    build_cached(final, lambda tmp: _build_into(tmp, spec))
    return final / "model"


def _build_into(root: Path, spec: DomainsWorldSpec) -> None:
    from eagle3.worlds.tiny_target import build_model, build_tokenizer, train_model

    started = time.perf_counter()
    per = spec.train_conversations // len(DOMAINS)
    convs = [c for d in DOMAINS for c in domain_prompts(d, per, seed=spec.seed + 1, distinct=False)]
    random.Random(spec.seed).shuffle(convs)
    tokenizer = build_tokenizer(
        (m["content"] for c in convs for m in c), vocab_size=spec.vocab_size
    )
    model = build_model(
        tokenizer,
        num_layers=spec.num_layers,
        hidden_size=spec.hidden_size,
        vocab_size=spec.vocab_size,
        seed=spec.seed,
    )
    losses = train_model(
        model,
        tokenizer,
        convs,
        steps=spec.train_steps,
        seq_len=spec.train_seq_len,
        seed=spec.seed,
        num_threads=default_threads(),
    )
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    report = {
        "spec": asdict(spec),
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "build_seconds": round(time.perf_counter() - started, 1),
    }
    (root / WORLD_FILE).write_text(json.dumps(report, indent=1) + "\n")
