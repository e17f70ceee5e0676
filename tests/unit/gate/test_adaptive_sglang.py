"""The gate's serving configuration on real SGLang 0.5.23 (this CPU, the project's runtime): the
tiny draft served with an emitted ``--speculative-adaptive-config`` starts, keeps adaptive
speculation on, and answers."""

from __future__ import annotations

import json
import shlex
import urllib.request

import pytest

from eagle3.config.gate import SpeculativeConfig
from eagle3.config.pipeline import with_overrides
from eagle3.gate.prompts import load_gate_prompts, send_prompts
from eagle3.gate.recommend import serving_config
from eagle3.gate.serving import StepResult, adaptive_tiers
from eagle3.serve.launch_commands import build_launch, split_speculative

pytestmark = [pytest.mark.slow, pytest.mark.sglang]


def test_sglang_serves_the_tiny_draft_with_the_emitted_adaptive_config(
    gate_world, sglang_python, tmp_path
):
    cfg = with_overrides(
        gate_world.config,
        ["server.engine=sglang", "server.device=cpu", "server.mem_fraction_static=0.05"],
    )
    # a crossover between 1 and 4: 3 steps from batch 1, drafting off from batch 2
    tiers = adaptive_tiers(
        {1: [StepResult(3, 1.3, [1.2, 1.4])], 4: [StepResult(3, 0.6, [0.5, 0.7])]}
    )
    recommended = serving_config(cfg, str(gate_world.export), tiers, tmp_path)
    assert recommended["config"] == {"1": {"candidate_steps": [3]}, "2": {"candidate_steps": [0]}}
    spec = SpeculativeConfig(num_steps=3, eagle_topk=1, num_draft_tokens=4)
    cmd = build_launch(
        cfg,
        "eagle3",
        draft=gate_world.export,
        speculative=spec,
        port=0,
        adaptive_config=recommended["config_path"],
    )
    printed = shlex.split(recommended["launch_sglang"])
    assert (
        split_speculative(cmd.server_args())[1]
        == split_speculative(printed[printed.index("-m") + 2 :])[1]
    )
    prompts = load_gate_prompts(cfg.gate.prompt_sets, gate_world.tokenizer, per_set=1)
    with cmd.server(log_path=tmp_path / "sglang.log") as server:
        with urllib.request.urlopen(f"{server.url}/server_info", timeout=60) as resp:
            info = json.loads(resp.read())
        results = send_prompts(
            server.url, [list(p.input_ids) for p in prompts], concurrency=1, max_new_tokens=16
        )
    assert info["speculative_adaptive"] is True, (
        "SGLang turned adaptive speculation off (see its log)"
    )
    assert info["speculative_adaptive_config"] == recommended["config_path"]
    assert all(r.error is None and r.completion_tokens > 0 for r in results), [
        r.error for r in results
    ]
    assert sum(r.spec.verify_ct for r in results) > 0  # batch 1: the tier that drafts
    assert "AdaptiveSpeculativeParams initialized" in (tmp_path / "sglang.log").read_text()
