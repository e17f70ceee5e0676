"""The reference server's speculative engine: target-greedy output, true verify counts, SGLang finish rules."""

from __future__ import annotations

import argparse

import pytest
import torch

from eagle3.serve.engine import SamplingParams, Sequence
from eagle3.serve.speculative import build_speculative_engine, check_speculative_args

pytestmark = pytest.mark.slow


def _args(world, algorithm: str = "EAGLE3") -> argparse.Namespace:
    return argparse.Namespace(
        speculative_algorithm=algorithm,
        speculative_draft_model_path=str(world.export),
        speculative_num_steps=3,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=4,
        max_running_requests=4,
    )


def _target(world):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(world.model_dir, dtype=torch.float32).eval()


def _run(engine, prompts, params):
    seqs = [Sequence(f"r{i}", p, params) for i, p in enumerate(prompts)]
    engine.admit(seqs)
    finished = []
    while engine.num_running():
        stepped, done = engine.step()
        assert stepped == done  # one whole request per step
        finished += done
    return finished


def test_speculative_engine_reproduces_target_greedy_with_fewer_passes(gate_world):
    from eagle3.bench.prompts import load_gate_prompts

    target = _target(gate_world)
    engine = build_speculative_engine(target, gate_world.tokenizer, _args(gate_world), context_length=1024)
    prompts = [
        list(p.input_ids)
        for p in load_gate_prompts(gate_world.config.gate.prompt_sets, gate_world.tokenizer, per_set=1)
    ]
    done = _run(engine, prompts, SamplingParams(max_new_tokens=24, temperature=0.0))
    assert [s.rid for s in done] == ["r0", "r1", "r2"]
    eos = engine.finish.eos_ids
    for seq, prompt in zip(done, prompts, strict=True):
        ref = target.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False, eos_token_id=sorted(eos))
        expected = ref[0, len(prompt) :].tolist()
        assert seq.output_ids == expected[: len(seq.output_ids)] and len(seq.output_ids) == len(expected)
        assert seq.finish_reason["type"] == ("stop" if seq.output_ids[-1] in eos else "length")
        assert 0 < seq.verify_ct < len(seq.output_ids)


def test_ignore_eos_decodes_to_max_new_tokens(gate_world):
    engine = build_speculative_engine(_target(gate_world), gate_world.tokenizer, _args(gate_world), context_length=1024)
    (seq,) = _run(engine, [[1, 2, 3]], SamplingParams(max_new_tokens=20, temperature=0.0, ignore_eos=True))
    assert len(seq.output_ids) == 20 and seq.finish_reason == {"type": "length", "length": 20}


def test_unknown_algorithm_and_missing_draft_are_refused_with_the_fix(gate_world, tmp_path):
    with pytest.raises(ValueError, match="use EAGLE3"):
        check_speculative_args(_args(gate_world, "NEXTN"))
    args = _args(gate_world)
    args.speculative_draft_model_path = str(tmp_path / "missing")
    with pytest.raises(ValueError, match="is not a directory"):
        check_speculative_args(args)
    assert check_speculative_args(_args(gate_world, "EAGLE")) == "last_hidden_only"
