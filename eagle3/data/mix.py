"""Mix selection: how many rows each source contributes, decided before any work starts.

``plan_mix`` splits ``mix.total`` across sources in proportion to ``weight``, capped per source by
``min(available, max_rows)``; what a capped source cannot give is redistributed to the others by
weight (water filling), and integer rounding uses largest remainders (ties by source order), so the
plan is exact and stable. Without ``mix.total`` every source gives ``min(available, max_rows)``.

Which rows are taken is decided while streaming with selection sampling (Knuth's Algorithm S): row
``i`` is taken with probability ``needed / remaining``, which yields exactly ``planned`` rows in
file order, uniformly, with O(1) memory, and is deterministic for (``mix.seed``, source name).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class MixLine:
    source: str
    available: int
    weight: float
    cap: int | None
    planned: int


def plan_mix(
    sources: list[tuple[str, int, float, int | None]], *, total: int | None
) -> list[MixLine]:
    """``sources`` = (name, available, weight, max_rows) in config order."""
    limits = {
        name: available if cap is None else min(available, cap)
        for name, available, _w, cap in sources
    }
    if total is None:
        return [MixLine(n, a, w, c, limits[n]) for n, a, w, c in sources]
    planned = {name: 0 for name, *_ in sources}
    weights = {name: w for name, _a, w, _c in sources}
    remaining = min(total, sum(limits.values()))
    open_ = [name for name, *_ in sources if limits[name] > 0]
    while remaining > 0 and open_:
        wsum = sum(weights[n] for n in open_)
        shares = {n: remaining * weights[n] / wsum for n in open_}
        capped = [n for n in open_ if planned[n] + shares[n] >= limits[n]]
        if capped:  # fill capped sources to their limit, then share the rest again
            for n in capped:
                remaining -= limits[n] - planned[n]
                planned[n] = limits[n]
            open_ = [n for n in open_ if n not in capped]
            continue
        floors = {n: int(shares[n]) for n in open_}
        left = remaining - sum(floors.values())
        order = sorted(open_, key=lambda n: (-(shares[n] - floors[n]), open_.index(n)))
        for n in open_:
            planned[n] += floors[n]
        for n in order[:left]:
            planned[n] += 1
        remaining = 0
    return [MixLine(n, a, w, c, planned[n]) for n, a, w, c in sources]


def plan_table(lines: list[MixLine]) -> list[dict[str, object]]:
    return [asdict(line) | {"cap": line.cap if line.cap is not None else "-"} for line in lines]


class Selector:
    """Selection sampling: ``take()`` is called once per available row, in order; exactly
    ``planned`` say yes."""

    def __init__(self, *, available: int, planned: int, seed: int, source: str) -> None:
        digest = hashlib.sha256(f"{seed}/{source}".encode()).digest()
        self.rng = random.Random(int.from_bytes(digest[:8], "little"))
        self.remaining, self.needed = available, min(planned, available)
        self.all = self.needed >= available

    def take(self) -> bool:
        if self.all:
            return True
        if self.remaining <= 0:
            return False
        chosen = self.rng.random() * self.remaining < self.needed
        self.remaining -= 1
        if chosen:
            self.needed -= 1
        return chosen
