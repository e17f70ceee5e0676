"""The runtime preflight's smoke check names the cause its accept length points at."""

from __future__ import annotations

from eagle3.gate.accept import SpecCounts
from eagle3.gate.preflight_runtime import check_smoke


def _smoke(tokens: int, passes: int, algorithm: str | None = None) -> str:
    check = check_smoke(
        [SpecCounts(completion_tokens=tokens, verify_ct=passes)], algorithm=algorithm
    )
    assert not check.ok
    return check.message


def test_smoke_check_tells_a_blind_draft_from_a_weak_one():
    assert "no aux hidden states" in _smoke(128, 125)  # 1.02: the misconfiguration's signature
    weak = _smoke(128, 99)  # 1.29: a SmolLM2 draft trained on a few hundred conversations
    assert "train it on more data" in weak and "aux hidden states" not in weak
    assert "--speculative-algorithm EAGLE3" in _smoke(128, 99, algorithm="EAGLE")
