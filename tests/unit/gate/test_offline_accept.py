"""Reference speculative decoding: output identical to plain greedy decoding, token for token, in
both aux modes; accept length accounting (generated tokens / verify passes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

from eagle3.gate.offline_accept import evaluate_acceptance
from eagle3.model.draft import DraftConfig, DraftModel
from eagle3.model.export_format import export_config, validate_export
from eagle3.serve.reference.spec_decoder import SpeculativeDecoder

V, VD, EOS = 256, 128, 3


@pytest.fixture(scope="module")
def target() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=V,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def draft_dir(target, tmp_path_factory) -> Path:
    """An untrained draft exported in the SGLang layout (aux layers output_of_layer [1, 3, 4])."""
    torch.manual_seed(1)
    cfg = DraftConfig.from_target_config(target.config, draft_vocab_size=VD)
    draft = DraftModel(cfg)
    out = tmp_path_factory.mktemp("draft")
    targets = torch.arange(0, V, V // VD)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[targets] = True
    save_file(
        {**draft.state_dict(), "d2t": targets - torch.arange(VD), "t2d": t2d},
        str(out / "model.safetensors"),
    )
    (out / "config.json").write_text(json.dumps(export_config(cfg, [1, 3, 4], dtype="float32")))
    assert validate_export(out) == []
    return out


def _prompts(n: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(2)
    return [
        torch.randint(4, V, (int(torch.randint(3, 20, (1,), generator=g)),), generator=g).tolist()
        for _ in range(n)
    ]


@torch.no_grad()
def _greedy(target, prompt: list[int], max_new_tokens: int) -> list[int]:
    out = target.generate(
        torch.tensor([prompt]),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=EOS,
        pad_token_id=0,
    )[0, len(prompt) :].tolist()
    return out[: out.index(EOS) + 1] if EOS in out else out


@pytest.mark.parametrize("aux_mode", ["eagle3", "last_hidden_only"])
def test_speculative_output_equals_plain_greedy_on_20_prompts(target, draft_dir, aux_mode):
    decoder = SpeculativeDecoder(target, None, draft_dir, num_steps=3, aux_mode=aux_mode)
    for prompt in _prompts(20):
        output, passes, accepted, _ = decoder.generate(prompt, 24, [EOS])
        assert output == _greedy(target, prompt, 24)
        assert len(output) >= 1 and passes <= len(output)
        assert len(accepted) == passes and all(0 <= a <= 3 for a in accepted)
        # the prefill token, one bonus per pass, the drafts kept
        assert len(output) <= 1 + passes + sum(accepted)


def test_accept_length_is_generated_tokens_over_verify_passes(target, draft_dir):
    decoder = SpeculativeDecoder(target, None, draft_dir, num_steps=2)
    prompts = _prompts(3)
    done: list[int] = []
    result = evaluate_acceptance(
        decoder, prompts, max_new_tokens=16, eos_ids=[], on_prompt=lambda: done.append(1)
    )
    assert result["tokens"] == 48 and len(done) == 3  # the progress hook fires once per prompt
    assert result["accept_length"] == pytest.approx(48 / result["verify_passes"])
    assert result["accept_length"] >= 1.0


def test_unknown_aux_mode_is_refused(target, draft_dir):
    with pytest.raises(ValueError, match="aux_mode"):
        SpeculativeDecoder(target, None, draft_dir, num_steps=2, aux_mode="eagle")  # type: ignore[arg-type]


def test_ratio_of_sums_interval_covers_the_ratio_and_needs_two_units():
    from eagle3.gate.offline_accept import ratio_of_sums

    ratio, interval = ratio_of_sums([30, 20, 50, 40], [10, 10, 20, 10])
    assert ratio == 140 / 50 and interval[0] < ratio < interval[1]
    assert ratio_of_sums([3, 6], [1, 2])[1] == [3.0, 3.0]  # every unit at the same ratio: no spread
    assert ratio_of_sums([3], [1]) == (3.0, None)


@pytest.mark.slow
def test_sampled_eval_expects_what_it_measures_and_is_exact_when_greedy(gate_world):
    """Along the sampled continuation, the expected accept length (from the target's probabilities
    of the drafts) estimates what the coins measure; greedy, p_j(x_j) is 0 or 1 and the two are
    equal."""
    from eagle3.config.sampling import SamplingParams
    from eagle3.gate.offline_accept import evaluate_sampled
    from eagle3.gate.prompts import load_gate_prompts

    model = _world_target(gate_world)
    decoder = SpeculativeDecoder(model, gate_world.tokenizer, gate_world.export, 3)
    sets, tokenizer = gate_world.config.gate.prompt_sets, gate_world.tokenizer
    prompts = [list(p.input_ids) for p in load_gate_prompts(sets, tokenizer, per_set=4)]
    eos = [gate_world.tokenizer.convert_tokens_to_ids("<|im_end|>")]
    greedy = evaluate_sampled(decoder, prompts, SamplingParams(), max_new_tokens=32, eos_ids=eos)
    measured = evaluate_acceptance(decoder, prompts, max_new_tokens=32, eos_ids=eos)
    assert greedy["accept_length"] == measured["accept_length"] > 1.5
    expected = greedy["expected_accept_length"]
    assert abs(expected - greedy["accept_length"]) < 0.05  # the last pass's cut
    at_1 = SamplingParams(temperature=1.0)
    hot = evaluate_sampled(decoder, prompts, at_1, max_new_tokens=32, eos_ids=eos, seeds=3)
    lo, hi = hot["interval"]
    assert lo <= hot["expected_accept_length"] <= hi and hot["sampling"] == "T=1"
    e_lo, e_hi = hot["expected_interval"]
    assert e_lo <= hot["accept_length"] <= e_hi
    assert hot["accept_length"] < measured["accept_length"]  # sampled text is harder to draft


def _world_target(world):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(world.model_dir, dtype=torch.float32).eval()
