"""Preflight's runtime checks: ask a live speculative server what it serves (``/server_info``),
then a smoke run whose accept length must show that the draft gets its aux hidden states
(docs/DESIGN.md, "Preflight"). The static checks, which read only files, are
``eagle3.gate.preflight``."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from eagle3.gate.accept import SpecCounts, pool
from eagle3.gate.preflight import (
    BLIND_ACCEPT,
    EXPECTED_ALGORITHM,
    SMOKE_MIN_ACCEPT,
    WEAK_DRAFT,
    Check,
    failed,
)

logger = logging.getLogger(__name__)


def get_json(url: str, *, timeout_s: float = 30.0) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return json.loads(resp.read())


def check_server_info(info: dict[str, Any], export_dir: Path | str | None) -> list[Check]:
    """``/server_info`` must show EAGLE3 and (when given) the draft that was checked statically."""
    algo = info.get("speculative_algorithm")
    checks = [
        Check("server_algorithm", True, f"server runs {algo}")
        if algo == EXPECTED_ALGORITHM
        else Check(
            "server_algorithm",
            False,
            f"server reports speculative_algorithm={algo!r}, not {EXPECTED_ALGORITHM!r}: relaunch it with "
            f"--speculative-algorithm {EXPECTED_ALGORITHM} (the command from `eagle3 launch-sglang --arm eagle3`)",
        )
    ]
    if export_dir is not None:
        served = info.get("speculative_draft_model_path")
        same = served is not None and (
            str(served) == str(export_dir)
            or Path(str(served)).expanduser().resolve() == Path(export_dir).expanduser().resolve()
        )
        checks.append(
            Check("server_draft", True, f"server draft {served}")
            if same
            else Check(
                "server_draft",
                False,
                f"server serves draft {served!r}, not {export_dir}: relaunch with it",
            )
        )
    return checks


def check_smoke(
    counts: list[SpecCounts], *, min_accept: float = SMOKE_MIN_ACCEPT, algorithm: str | None = None
) -> Check:
    """The smoke requests' accept length (``eagle3.gate.accept``: the server's own when it sends it)
    against ``min_accept``; a server running another algorithm than EAGLE3 is named with the flag to
    fix."""
    summary = pool(counts)
    if summary.accept_length is None:
        return Check(
            "smoke_accept",
            False,
            "smoke requests report spec_verify_ct 0: the server is not speculating; launch it with --speculative-*",
        )
    measured = (
        f"accept length {summary.accept_length:.2f} measured ({summary.source}, "
        f"{sum(c.completion_tokens for c in counts)} tokens / {summary.verify_ct} verify passes)"
    )
    if summary.accept_length >= min_accept:
        return Check("smoke_accept", True, f"{measured} >= {min_accept} expected")
    if algorithm and algorithm != EXPECTED_ALGORITHM:
        why = (
            f"the server runs --speculative-algorithm {algorithm}, which drops the draft's 3-layer "
            f"aux hidden states: relaunch with --speculative-algorithm {EXPECTED_ALGORITHM}"
        )
    elif summary.accept_length < BLIND_ACCEPT:
        why = (
            "~1.0 means the draft gets no aux hidden states: check --speculative-algorithm "
            f"{EXPECTED_ALGORITHM} and the layer ids"
        )
    else:
        why = WEAK_DRAFT
    return Check("smoke_accept", False, f"{measured}, expected >= {min_accept}: {why}")


def run_runtime(
    url: str,
    prompt_ids: list[list[int]],
    *,
    export_dir: Path | str | None,
    max_new_tokens: int = 32,
    min_accept: float = SMOKE_MIN_ACCEPT,
    timeout_s: float = 300.0,
) -> list[Check]:
    """Ask a live speculative server what it runs, then a smoke run of ``prompt_ids`` (greedy, one
    at a time)."""
    from eagle3.gate.prompts import send_prompts

    try:
        info = get_json(f"{url.rstrip('/')}/server_info")
        checks = check_server_info(info, export_dir)
    except (OSError, ValueError) as exc:
        return [
            Check(
                "server_info",
                False,
                f"GET {url}/server_info failed ({exc}): is the server up at {url}?",
            )
        ]
    results = send_prompts(
        url, prompt_ids, concurrency=1, max_new_tokens=max_new_tokens, timeout_s=timeout_s
    )
    errors = [r.error for r in results if r.error]
    if errors:
        return [
            *checks,
            Check(
                "smoke_requests", False, f"{len(errors)} smoke requests failed, first: {errors[0]}"
            ),
        ]
    checks.append(
        check_smoke(
            [r.spec for r in results],
            min_accept=min_accept,
            algorithm=info.get("speculative_algorithm"),
        )
    )
    for check in failed(checks):
        logger.warning("preflight %s", check.line())
    return checks
