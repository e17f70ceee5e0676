"""Decontamination: drop training prompts that overlap the gate's benchmark prompts (the draft never
trains on its exam).

Text is compared as lowercase word tokens (``\\w+``), each user turn separately. Two regimes:

* Long benchmark prompts (>= ``decontam_ngram`` words): n-gram containment, the GPT-3 / Llama
  practice. The prompt is indexed by its word n-grams; a user turn is contaminated when it contains
  >= ``decontam_threshold`` of them, so a benchmark question pasted inside a longer prompt is
  caught.
* Short benchmark prompts (fewer words): ``min(n, len)``-gram containment would flag every row that
  merely contains a generic phrase ("How can I sleep better at night?"), so a short prompt only
  matches a user turn that is essentially the same prompt: Jaccard similarity of word 3-grams
  (unigrams under 3 words) >= ``max(threshold, SHORT_MIN_JACCARD)``. Verbatim copies and light edits
  are caught, longer prompts that quote it are kept.

Memory: one 8-byte hash per benchmark n-gram (benchmark sets are small); rows are checked one at a
time.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections import defaultdict
from collections.abc import Iterable

from eagle3.data.prompt_sets import read_prompt_set

logger = logging.getLogger(__name__)

SHORT_N = 3
SHORT_MIN_JACCARD = 0.8
_WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _h(gram: tuple[str, ...]) -> int:
    return int.from_bytes(
        hashlib.blake2b(" ".join(gram).encode("utf-8", "replace"), digest_size=8).digest(), "little"
    )


def ngrams(tokens: list[str], n: int) -> set[int]:
    n = min(n, len(tokens))
    return {_h(tuple(tokens[i : i + n])) for i in range(len(tokens) - n + 1)} if n else set()


class Decontaminator:
    """An n-gram index over benchmark prompts; ``match`` returns the id of an overlapped prompt."""

    def __init__(self, prompts: Iterable[tuple[str, str]], *, ngram: int, threshold: float) -> None:
        self.n, self.threshold = ngram, threshold
        self.short_threshold = max(threshold, SHORT_MIN_JACCARD)
        self.long_index: dict[int, set[int]] = defaultdict(set)  # gram -> prompt numbers
        self.long_totals: list[int] = []
        self.long_ids: list[str] = []
        self.short_index: dict[int, set[int]] = defaultdict(set)
        self.short_grams: list[set[int]] = []
        self.short_ids: list[str] = []
        for pid, prompt in prompts:
            toks = words(prompt)
            if len(toks) >= ngram:
                grams = ngrams(toks, ngram)
                for g in grams:
                    self.long_index[g].add(len(self.long_ids))
                self.long_ids.append(pid)
                self.long_totals.append(len(grams))
            elif toks:
                grams = ngrams(toks, SHORT_N)
                for g in grams:
                    self.short_index[g].add(len(self.short_ids))
                self.short_ids.append(pid)
                self.short_grams.append(grams)

    def __len__(self) -> int:
        return len(self.long_ids) + len(self.short_ids)

    def match(self, user_turns: Iterable[str]) -> str | None:
        for text in user_turns:
            toks = words(text)
            hit = self._match_long(toks) if len(toks) >= self.n and self.long_ids else None
            hit = hit or (self._match_short(toks) if self.short_ids else None)
            if hit is not None:
                return hit
        return None

    def _match_long(self, toks: list[str]) -> str | None:
        counts: dict[int, int] = defaultdict(int)
        for g in ngrams(toks, self.n):
            for k in self.long_index.get(g, ()):
                counts[k] += 1
        best = max(counts, key=lambda k: counts[k] / self.long_totals[k], default=None)
        if best is not None and counts[best] / self.long_totals[best] >= self.threshold:
            return self.long_ids[best]
        return None

    def _match_short(self, toks: list[str]) -> str | None:
        grams = ngrams(toks, SHORT_N)
        candidates = {k for g in grams for k in self.short_index.get(g, ())}
        for k in sorted(candidates):
            other = self.short_grams[k]
            if len(grams & other) / len(grams | other) >= self.short_threshold:
                return self.short_ids[k]
        return None


def load_prompt_sets(prompt_sets: dict[str, str]) -> list[tuple[str, str]]:
    """``(set/id, text)`` for every user turn of every row of the local sets
    (``eagle3.data.prompt_sets``: MT-bench's second turns are checked too); ``hub:`` entries are
    skipped with a warning."""
    out = []
    for name, where in sorted(prompt_sets.items()):
        if where.startswith("hub:"):
            skip = "decontamination skips gate prompt set %r (%s): only local files are read"
            logger.warning(skip, name, where)
            continue
        for row in read_prompt_set(where, name):
            out += [(f"{name}/{row.prompt_id}", turn) for turn in row.turns]
    return out
