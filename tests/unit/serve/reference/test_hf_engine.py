"""The continuous-batching engine decodes greedily exactly like the model alone, whatever joins or
leaves."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from eagle3.serve.reference.hf_engine import PREFILL_PAD_WASTE, HFEngine, prefill_groups
from eagle3.serve.reference.protocol import SamplingParams, Sequence

PROMPTS = [
    "hello there, how are you",
    "a much longer prompt that asks the assistant a question about topic three and more words",
    "short",
    "user asks question 5 about topic 2",
    "and yet another prompt of middling size",
]


@pytest.fixture(scope="module")
def model_and_tokenizer(serve_model_dir: Path):
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(serve_model_dir)
    model = AutoModelForCausalLM.from_pretrained(serve_model_dir, dtype=torch.float32).eval()
    return model, tokenizer


def _alone(model, ids: list[int], n: int) -> list[int]:
    """Plain greedy decoding of one sequence with a full forward per token (no cache, no
    padding)."""
    seq = list(ids)
    with torch.inference_mode():
        for _ in range(n):
            logits = model(input_ids=torch.tensor([seq])).logits[0, -1]
            seq.append(int(logits.argmax()))
    return seq[len(ids) :]


def test_staggered_batched_greedy_equals_unbatched_greedy(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    # different max_new_tokens: sequences leave the batch at different steps
    lengths = [6, 3, 9, 5, 4]
    engine = HFEngine(model, tokenizer, max_running=8, context_length=512)
    seqs = [
        Sequence(
            str(i),
            tokenizer(p)["input_ids"],
            SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True),
        )
        for i, (p, n) in enumerate(zip(PROMPTS, lengths, strict=True))
    ]
    engine.admit(seqs[:2])
    steps = 0
    while engine.num_running():
        engine.step()
        steps += 1
        if steps == 2:
            engine.admit(seqs[2:4])  # joins while the first two decode
        if steps == 5:
            engine.admit(seqs[4:])
    for seq, n in zip(seqs, lengths, strict=True):
        assert seq.finish_reason == {"type": "length", "length": n}
        assert seq.verify_ct == n
        assert seq.output_ids == _alone(model, seq.prompt_ids, n), (
            f"sequence {seq.rid} differs from unbatched greedy"
        )


def test_eos_stops_generation_unless_ignored(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    ids = tokenizer(PROMPTS[0])["input_ids"]
    first = _alone(model, ids, 1)[0]
    engine = HFEngine(model, tokenizer, max_running=2, context_length=512)
    engine.finish.eos_ids = {first}  # make the model's first greedy token the end of sequence
    stop = Sequence("a", ids, SamplingParams(max_new_tokens=5, temperature=0.0))
    go_on = Sequence("b", ids, SamplingParams(max_new_tokens=5, temperature=0.0, ignore_eos=True))
    engine.admit([stop, go_on])
    while engine.num_running():
        engine.step()
    assert stop.output_ids == [first]
    assert stop.finish_reason == {"type": "stop", "matched": first}
    assert len(go_on.output_ids) == 5


def test_context_length_caps_generation(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    ids = tokenizer(PROMPTS[1])["input_ids"]
    engine = HFEngine(model, tokenizer, max_running=1, context_length=len(ids) + 3)
    seq = Sequence("a", ids, SamplingParams(max_new_tokens=50, temperature=0.0, ignore_eos=True))
    engine.admit([seq])
    while engine.num_running():
        engine.step()
    assert len(seq.output_ids) == 3
    assert seq.finish_reason["type"] == "length"


def test_prefill_groups_bound_padding_and_keep_every_prompt_once():
    lengths = [31, 218, 33, 50, 52, 101, 40, 41]
    groups = prefill_groups(lengths)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for group in groups:  # a group's padded tokens are within PREFILL_PAD_WASTE of its real ones
        longest, real = max(lengths[i] for i in group), sum(lengths[i] for i in group)
        assert longest * len(group) <= (1 + PREFILL_PAD_WASTE) * real
    assert prefill_groups([7, 7, 7]) == [[0, 1, 2]]  # equal prompts share one forward


def test_a_burst_of_prompts_of_mixed_lengths_decodes_as_each_alone(model_and_tokenizer):
    """Admitted together, the prompts are prefilled in length groups and merged: greedy output is
    unchanged."""
    model, tokenizer = model_and_tokenizer
    engine = HFEngine(model, tokenizer, max_running=8, context_length=512)
    params = SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)
    seqs = [Sequence(str(i), tokenizer(p)["input_ids"], params) for i, p in enumerate(PROMPTS)]
    assert len(prefill_groups([len(s.prompt_ids) for s in seqs])) > 1
    engine.admit(seqs)
    while engine.num_running():
        engine.step()
    for seq in seqs:
        assert seq.output_ids == _alone(model, seq.prompt_ids, 4)


def test_a_prompt_that_continues_a_finished_sequence_prefills_only_the_rest(model_and_tokenizer):
    """Regen's next turn is the last turn's prompt and answer, then more: the prefix cache serves
    the first part (as SGLang's radix cache does) and greedy output is the model's alone; a flush
    forgets it."""
    model, tokenizer = model_and_tokenizer
    engine = HFEngine(model, tokenizer, max_running=4, context_length=512, prefix_cache_tokens=4096)
    engine.prefix.min_tokens = 8
    params = SamplingParams(max_new_tokens=5, temperature=0.0, ignore_eos=True)
    first = Sequence("turn0", tokenizer(PROMPTS[1])["input_ids"], params)
    engine.admit([first])
    while engine.num_running():
        engine.step()
    follow_up = [*first.prompt_ids, *first.output_ids, *tokenizer(" and then?")["input_ids"]]
    second = Sequence("turn1", follow_up, params)
    engine.admit([second])
    while engine.num_running():
        engine.step()
    fed = len(first.prompt_ids) + len(first.output_ids) - 1  # the last answer token was never fed
    assert second.cached_tokens == fed == len(follow_up) - 4
    assert second.output_ids == _alone(model, follow_up, 5)
    engine.flush()
    third = Sequence("again", follow_up, params)
    engine.admit([third])
    while engine.num_running():
        engine.step()
    assert third.cached_tokens == 0  # flushed: all prefilled
    assert third.output_ids == second.output_ids
    assert len(engine.prefix) == 1  # ... and kept again once finished
