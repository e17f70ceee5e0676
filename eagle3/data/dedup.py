"""Exact and near-duplicate detection across all sources, in one pass over the normalized spills.

* Exact: the ``sample_id`` is a hash of the normalized prompt content (see ``normalize.sample_id``);
  the first row with an id wins, later ones are ``duplicate``. Memory: the 16-byte digest per kept
  row in a set (about 90 bytes per row with Python's object and set-slot overhead).
* Near-duplicate: a MinHash signature (``normalize.minhash_num_perm`` permutations, datasketch) over
  the word 3-gram shingles of each user and tool turn (shingles never cross turn boundaries; a turn
  with fewer than 3 words is one shingle; the system prompt is left out: agentic datasets share one
  of thousands of words, which made every row a near-duplicate of every other) and a MinHash LSH
  index at ``normalize.near_dup_threshold``. LSH candidates are confirmed with the estimated Jaccard
  of the stored signatures, so banding false positives never drop a row. Memory: the signature (8
  bytes x num_perm, 512 B at 64) plus the LSH band keys (about b x 100 B), roughly 1-2 KB per kept
  row.
* Rows without messages (pre-tokenized only) are deduplicated exactly on their token ids and never
  near-deduped.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
from datasketch import MinHash, MinHashLSH

from eagle3.data.schema import DUPLICATE, NEAR_DUPLICATE

SHINGLE_WORDS = 3
_WORD = re.compile(r"\w+")


def shingles(turns: Sequence[str]) -> set[bytes]:
    out: set[bytes] = set()
    for k, text in enumerate(turns):
        toks = _WORD.findall(text.lower())
        if len(toks) < SHINGLE_WORDS:
            if toks:
                out.add(f"{k}:{' '.join(toks)}".encode())
            continue
        for i in range(len(toks) - SHINGLE_WORDS + 1):
            out.add(" ".join(toks[i : i + SHINGLE_WORDS]).encode())
    return out


class Deduper:
    """Stateful duplicate filter; ``check`` returns None (keep) or a quarantine reason."""

    def __init__(self, *, threshold: float, num_perm: int) -> None:
        self.threshold, self.num_perm = threshold, num_perm
        self.seen: set[bytes] = set()
        self.lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
        # reused: clear() + update is cheaper than a new object
        self._m = MinHash(num_perm=num_perm, seed=1)
        self.signatures: list[np.ndarray] = []

    def check(self, sample_id: str, prompt_turns: Sequence[str]) -> str | None:
        key = bytes.fromhex(sample_id)[:16]
        if key in self.seen:
            return DUPLICATE
        items = shingles(prompt_turns) if prompt_turns else set()
        if items:
            m = self._m
            m.clear()
            m.update_batch(list(items))
            for cand in self.lsh.query(m):
                if float(np.mean(self.signatures[cand] == m.hashvalues)) >= self.threshold:
                    return NEAR_DUPLICATE
            self.lsh.insert(len(self.signatures), m, check_duplication=False)
            self.signatures.append(m.hashvalues.copy())
        self.seen.add(key)
        return None
