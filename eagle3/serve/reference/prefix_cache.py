"""A prefix cache for the reference server's plain engine: a prompt that starts with a finished
sequence's tokens prefills only the rest.

Regen sends each turn of a conversation as the whole history rendered again: the prompt of turn k+1
is turn k's prompt and answer, then the next user turn. SGLang's radix cache serves that prefix from
the keys and values it kept; on 38 ShareGPT conversations regenerated turn by turn (128-token
answers) it served 45,282 of 54,001 prompt tokens from cache and prefilled 8,719, where the
reference server prefilled all of them. ``PrefixCache`` keeps the keys and values of finished
sequences (prompt and answer, the answer's last token excluded: it was never fed), whole, least
recently used first out within a token budget, and ``match`` finds the longest prefix a new prompt
shares with one. It is no radix tree (two prompts sharing only a system prompt share nothing here,
below ``min_tokens``), and ``clear`` is what ``/flush_cache`` empties.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [1, kv_heads, tokens, D]


@dataclass(frozen=True)
class Hit:
    """``tokens`` leading prompt tokens whose keys and values are ``layers``."""

    tokens: int
    layers: KV


class PrefixCache:
    """Finished sequences' keys and values by their token ids (module docstring)."""

    def __init__(self, budget_tokens: int, *, min_tokens: int = 32) -> None:
        self.budget_tokens, self.min_tokens = budget_tokens, min_tokens
        self._entries: OrderedDict[tuple[int, ...], KV] = OrderedDict()
        self._tokens = 0
        self._lock = threading.Lock()  # the engine's thread puts and matches; /flush_cache clears

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, ids: list[int], layers: KV) -> None:
        """Keep ``layers`` (copied) as the keys and values of ``ids``; the oldest entries leave
        beyond the budget. Too short or too long a sequence is not kept."""
        if not self.min_tokens <= len(ids) <= self.budget_tokens:
            return
        key = tuple(ids)
        kept = [(k.clone(), v.clone()) for k, v in layers]
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return
            self._entries[key] = kept
            self._tokens += len(key)
            while self._tokens > self.budget_tokens:
                old, _ = self._entries.popitem(last=False)
                self._tokens -= len(old)

    def match(self, prompt: list[int]) -> Hit | None:
        """The longest prefix of ``prompt`` a kept sequence starts with, at least ``min_tokens``
        long and leaving at least one prompt token to compute; None when there is none."""
        query = torch.tensor(prompt)
        best: tuple[int, tuple[int, ...]] | None = None
        with self._lock:
            for key in self._entries:
                n = min(len(key), len(prompt) - 1)
                if n < self.min_tokens or (best is not None and n <= best[0]):
                    continue
                differs = (torch.tensor(key[:n]) != query[:n]).nonzero()
                shared = int(differs[0]) if len(differs) else n
                if shared >= self.min_tokens and (best is None or shared > best[0]):
                    best = (shared, key)
            if best is None:
                return None
            shared, key = best
            self._entries.move_to_end(key)
            layers = self._entries[key]
        return Hit(shared, [(k[:, :, :shared], v[:, :, :shared]) for k, v in layers])

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._tokens = 0
