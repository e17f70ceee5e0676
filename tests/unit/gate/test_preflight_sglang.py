"""The seeds' bug on the real engine: SGLang 0.5.23 started with ``--speculative-algorithm EAGLE``
and an EAGLE-3 draft serves silently with the draft blind to the aux layers; preflight's live check
must refuse it, naming the flag and the measured against the expected accept length, and pass the
same draft served with ``EAGLE3``."""

from __future__ import annotations

import pytest

from eagle3.config.pipeline import with_overrides
from eagle3.gate import preflight, preflight_runtime
from eagle3.gate.prompts import load_gate_prompts
from eagle3.serve.launch_commands import build_launch

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

SGLANG_CPU = ["server.engine=sglang", "server.device=cpu", "server.mem_fraction_static=0.05"]


def _live_checks(gate_world, algorithm: str, log) -> dict[str, preflight.Check]:
    config = with_overrides(gate_world.config, [*SGLANG_CPU, f"speculative.algorithm={algorithm}"])
    prompts = load_gate_prompts(config.gate.prompt_sets, gate_world.tokenizer, per_set=2)
    with build_launch(config, "eagle3", draft=gate_world.export, port=0).server(
        log_path=log
    ) as server:
        checks = preflight_runtime.run_runtime(
            server.url,
            [list(p.input_ids) for p in prompts],
            export_dir=gate_world.export,
            max_new_tokens=48,
        )
    return {c.name: c for c in checks}


def test_live_preflight_refuses_real_sglang_serving_the_draft_as_eagle_and_passes_it_as_eagle3(
    gate_world, sglang_python, tmp_path
):
    bad = _live_checks(gate_world, "EAGLE", tmp_path / "eagle.log")
    assert (
        not bad["server_algorithm"].ok
        and "--speculative-algorithm EAGLE3" in bad["server_algorithm"].message
    )
    smoke = bad["smoke_accept"]
    assert (
        not smoke.ok
        and "--speculative-algorithm EAGLE," in smoke.message
        and "expected >= 1.5" in smoke.message
    )
    measured = float(smoke.message.split()[2])
    # SGLang's own spec_accept_length: the draft sees the last layer only
    assert measured < 1.5, smoke.message
    assert "(spec_accept_length," in smoke.message

    good = _live_checks(gate_world, "EAGLE3", tmp_path / "eagle3.log")
    assert all(c.ok for c in good.values()), [c.line() for c in good.values()]
    served = float(good["smoke_accept"].message.split()[2])
    # blind, the draft adds under half its tokens per pass
    assert served - 1 > 2 * (measured - 1), (served, measured)
