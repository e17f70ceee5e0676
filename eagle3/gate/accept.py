"""Speculative-decoding counters of a server's answers, read across SGLang releases, and pooled over
requests.

Design choices:
- SGLang renames these fields between releases. 0.5.23 sends ``spec_verify_ct``,
  ``spec_accept_length`` (completion tokens / verify passes, the bonus token included),
  ``spec_accept_rate``, ``spec_num_correct_drafts``, ``spec_num_proposed_drafts`` and
  ``spec_correct_drafts_histogram`` (``python/sglang/srt/managers/tokenizer_manager.py``,
  ``_calculate_spec_decoding_metrics``); older 0.5.x releases send ``spec_accept_token_num`` /
  ``spec_draft_token_num``, and the aliases ``spec_accepted_drafts`` / ``spec_proposed_drafts`` /
  ``spec_accept_histogram`` exist. Each counter is read from the first of its names present, and the
  names read are kept, so a report says which fields its numbers come from.
- The server's own accept length is preferred: a level's accept length is the verify-weighted mean
  of the requests' ``spec_accept_length`` when every speculating request sent one (the server's
  definition, whatever a release makes it), else ``sum(completion_tokens) / sum(spec_verify_ct)``
  (docs/DESIGN.md, "Accept length"), computed here. Never the server's cumulative
  ``avg_spec_accept_length``, which counts every request since start.
- The accept rate (accepted / proposed draft tokens, no bonus) and the histogram (verify passes by
  accepted drafts) are pooled only when every speculating request sent them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

VERIFY_FIELD = "spec_verify_ct"
ACCEPT_LENGTH_FIELD = "spec_accept_length"
ACCEPTED_FIELDS: tuple[str, ...] = (
    "spec_num_correct_drafts",
    "spec_accepted_drafts",
    "spec_accept_token_num",
)
PROPOSED_FIELDS: tuple[str, ...] = (
    "spec_num_proposed_drafts",
    "spec_proposed_drafts",
    "spec_draft_token_num",
)
HISTOGRAM_FIELDS: tuple[str, ...] = ("spec_correct_drafts_histogram", "spec_accept_histogram")
COMPUTED = "completion_tokens/spec_verify_ct"  # the source of an accept length computed here


def _first(meta: Mapping[str, Any], names: Sequence[str]) -> tuple[str | None, Any]:
    for name in names:
        if meta.get(name) is not None:
            return name, meta[name]
    return None, None


@dataclass(frozen=True)
class SpecCounts:
    """One answer's speculative counters; ``fields`` names the ``meta_info`` keys they were read
    from."""

    completion_tokens: int = 0
    verify_ct: int = 0
    accept_length: float | None = None  # the server's own
    accepted_drafts: int | None = None
    proposed_drafts: int | None = None
    histogram: tuple[int, ...] | None = None
    fields: tuple[str, ...] = ()

    @classmethod
    def of(cls, meta: Mapping[str, Any]) -> SpecCounts:
        """The counters of one ``meta_info`` (a plain server's has none: ``verify_ct`` 0)."""
        fields = [VERIFY_FIELD] if meta.get(VERIFY_FIELD) else []
        accept = meta.get(ACCEPT_LENGTH_FIELD)
        if accept is not None:
            fields.append(ACCEPT_LENGTH_FIELD)
        accepted_name, accepted = _first(meta, ACCEPTED_FIELDS)
        proposed_name, proposed = _first(meta, PROPOSED_FIELDS)
        histogram_name, histogram = _first(meta, HISTOGRAM_FIELDS)
        fields += [n for n in (accepted_name, proposed_name, histogram_name) if n]
        return cls(
            completion_tokens=int(meta.get("completion_tokens") or 0),
            verify_ct=int(meta.get(VERIFY_FIELD) or 0),
            accept_length=float(accept) if accept is not None else None,
            accepted_drafts=int(accepted) if accepted is not None else None,
            proposed_drafts=int(proposed) if proposed is not None else None,
            histogram=tuple(int(n) for n in histogram) if histogram is not None else None,
            fields=tuple(fields),
        )


@dataclass(frozen=True)
class AcceptSummary:
    """Counters pooled over answers: the accept length and where it came from, the accept rate, the
    histogram."""

    verify_ct: int = 0
    accept_length: float | None = None
    source: str | None = None  # ACCEPT_LENGTH_FIELD (the server's own) or COMPUTED
    accepted_drafts: int | None = None
    proposed_drafts: int | None = None
    histogram: list[int] | None = None
    fields: tuple[str, ...] = ()

    @property
    def accept_rate(self) -> float | None:
        if self.accepted_drafts is None or not self.proposed_drafts:
            return None
        return self.accepted_drafts / self.proposed_drafts


def _sum_histograms(histograms: Iterable[Sequence[int]]) -> list[int]:
    total: list[int] = []
    for hist in histograms:
        total += [0] * (len(hist) - len(total))
        for i, n in enumerate(hist):
            total[i] += n
    return total


def pool(counts: Sequence[SpecCounts]) -> AcceptSummary:
    """The counters of many answers pooled (see the module docstring for which numbers are
    preferred)."""
    spec = [c for c in counts if c.verify_ct > 0]
    verify = sum(c.verify_ct for c in spec)
    if not spec:
        return AcceptSummary()
    if all(c.accept_length is not None for c in spec):
        accept, source = (
            sum(c.accept_length * c.verify_ct for c in spec) / verify,
            ACCEPT_LENGTH_FIELD,
        )  # type: ignore[operator]
    else:
        accept, source = sum(c.completion_tokens for c in spec) / verify, COMPUTED
    rated = all(c.accepted_drafts is not None and c.proposed_drafts is not None for c in spec)
    hist = all(c.histogram is not None for c in spec)
    return AcceptSummary(
        verify_ct=verify,
        accept_length=accept,
        source=source,
        accepted_drafts=sum(c.accepted_drafts or 0 for c in spec) if rated else None,
        proposed_drafts=sum(c.proposed_drafts or 0 for c in spec) if rated else None,
        histogram=_sum_histograms(c.histogram or () for c in spec) if hist else None,
        fields=tuple(dict.fromkeys(f for c in spec for f in c.fields)),
    )


def _set_entry(counts: Sequence[SpecCounts], *, prompts: int, requests: int) -> dict[str, Any]:
    spec = pool(counts)
    return {
        "accept_length": spec.accept_length,
        "completion_tokens": sum(c.completion_tokens for c in counts),
        "spec_verify_ct": spec.verify_ct,
        "prompts": prompts,
        "requests": requests,
        "accept_source": spec.source,
    }


def set_row(counts: Sequence[SpecCounts]) -> dict[str, Any]:
    """One prompt set's entry of a ``by_set`` mapping (``eagle3.gate.report``) from its answers, one
    per prompt."""
    return _set_entry(counts, prompts=len(counts), requests=len(counts))


def pool_rows(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Entries of one set (rounds, levels) pooled into one: the counters pooled as answers are, the
    requests summed, the prompts the set has (the most any entry saw)."""
    counts = [
        SpecCounts(
            completion_tokens=int(row["completion_tokens"]),
            verify_ct=int(row["spec_verify_ct"]),
            accept_length=row["accept_length"]
            if row.get("accept_source") == ACCEPT_LENGTH_FIELD
            else None,
        )
        for row in rows
    ]
    prompts = max((int(r["prompts"]) for r in rows), default=0)
    return _set_entry(counts, prompts=prompts, requests=sum(int(r["requests"]) for r in rows))
