"""Aiming by served acceptance (``scaling.aim: served``): where the live draft fails, as the server
measured it.

A speculative server reports each request's ``spec_accept_length`` and ``spec_verify_ct`` in
``meta_info``, and its request log keeps ``meta_info`` at every level, 0 and 1 included (telemetry
without content, ``eagle3.data.served_log``). So the serving draft's accept length per domain of the
traffic is known without an eval set: pooled over a domain's requests, generated tokens / verify
passes (``eagle3.gate.accept``'s pooling, the exact windowed accept length). A request's domain is a
header the logs keep (``scaling.served_domain_header``, SGLang logs ``x-smg-routing-key`` by default
and the headers named in ``SGLANG_LOG_REQUEST_HEADERS``).

The rule (``allocate_headroom``, pure): an exploration floor split evenly over the domains with rows
left, then the rest of the budget in proportion to traffic share x headroom, the accept length a
domain has still to gain before the chain's bound ``num_steps + 1`` minus its served accept length.
No curve is fitted: the signal is there from the first night a draft serves, where the gain-slope
rule (``eagle3.scaling.allocation``) needs two nights per domain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from eagle3.data.served_log import ServedRequest, iter_log
from eagle3.scaling.allocation import AimedPlan, Allocation, DomainState

UNKNOWN = "unknown"


@dataclass(frozen=True)
class ServedAccept:
    """A domain's pooled served acceptance: tokens generated over verify passes, over its speculated
    requests."""

    accept_length: float
    requests: int
    verify_ct: int
    tokens: int


def served_accept(files: Sequence[Path], *, header: str) -> dict[str, ServedAccept]:
    """Per domain (the value of ``header``; ``unknown`` without it), the served accept length of the
    requests a speculative server answered (those with ``spec_verify_ct``; health probes left out).
    """
    sums: dict[str, list[int]] = {}
    for record in iter_log(files):
        if not isinstance(record, ServedRequest) or record.health_check:
            continue
        meta = record.meta_info
        verify, tokens = (
            int(meta.get("spec_verify_ct") or 0),
            int(meta.get("completion_tokens") or 0),
        )
        if verify <= 0:
            continue
        acc = sums.setdefault(record.headers.get(header.lower(), UNKNOWN), [0, 0, 0])
        acc[0], acc[1], acc[2] = acc[0] + 1, acc[1] + verify, acc[2] + tokens
    return {
        d: ServedAccept(tokens / verify, n, verify, tokens)
        for d, (n, verify, tokens) in sorted(sums.items())
    }


def allocate_headroom(
    domains: Sequence[DomainState], budget: float, *, unit: str, floor: float, ceiling: float
) -> AimedPlan:
    """Tonight's rows per domain for ``budget`` (prompts, or tokens at each domain's tokens per
    row): the floor evenly, the rest by share x (ceiling - served accept); a domain the logs did not
    measure weighs as the worst measured one. Pre-tokenized (free) rows are all taken, as under the
    gain rule."""
    live = [d for d in domains if d.pool_left > 0 and not d.free]
    cost = {d.name: (d.tokens_per_row if unit == "tokens" else 1.0) or 1.0 for d in live}
    measured = [d.accept for d in live if d.accept is not None]
    worst = min(measured) if measured else 1.0
    weight = {
        d.name: max(d.share, 0.0)
        * max(ceiling - (d.accept if d.accept is not None else worst), 0.0)
        for d in live
    }
    total = sum(weight.values())
    rows, spent, exact = {d.name: 0 for d in domains}, 0.0, {}
    for d in live:
        aimed = (1 - floor) * budget * (weight[d.name] / total if total else 1 / len(live))
        exact[d.name] = (floor * budget / len(live) + aimed) / cost[d.name]
        rows[d.name] = min(d.pool_left, int(exact[d.name]))
        spent += rows[d.name] * cost[d.name]
    # what rounding and full pools left, a row at a time: largest shortfall first, then the neediest
    while True:
        open_ = [d for d in live if rows[d.name] < d.pool_left and spent + cost[d.name] <= budget]
        if not open_:
            break
        d = max(open_, key=lambda d: (exact[d.name] - rows[d.name], weight[d.name]))
        rows[d.name], spent = rows[d.name] + 1, spent + cost[d.name]
    allocations = []
    for d in sorted(domains, key=lambda d: d.name):
        taken = d.pool_left if d.free else rows[d.name]
        headroom = weight.get(d.name, 0.0) / d.share if d.share else 0.0
        bound = "free" if d.free else "pool" if taken == d.pool_left else "headroom"
        why = (
            "pre-tokenized: no regeneration"
            if d.free
            else f"served accept {d.accept:.2f}, headroom {headroom:.2f} x share {d.share:.2f}"
            if d.accept is not None
            else "not served by the draft: weighed as the worst measured domain"
        )
        allocations.append(
            Allocation(
                d.name,
                taken,
                0.0 if d.free else taken * cost[d.name],
                d.pool_left,
                d.share,
                d.accept,
                headroom,
                why,
                bound,
            )
        )
    notes = (
        f"Aimed by served acceptance: floor {floor:g} of the budget evenly, the rest by traffic "
        f"share x ({ceiling:g} - the live draft's served accept length).",
    )
    return AimedPlan(budget=budget, unit=unit, allocations=tuple(allocations), notes=notes)
