"""The reference server's speculative engine: target-greedy output at every concurrency, true
per-request verify counts, SGLang finish rules, one batched target forward verifying every running
request."""

from __future__ import annotations

import argparse

import pytest
import torch

from eagle3.serve.reference.hf_engine import HFEngine
from eagle3.serve.reference.protocol import SamplingParams, Sequence
from eagle3.serve.reference.spec_engine import build_speculative_engine, check_speculative_args

pytestmark = pytest.mark.slow


def _args(world, algorithm: str = "EAGLE3", max_running: int = 4) -> argparse.Namespace:
    return argparse.Namespace(
        speculative_algorithm=algorithm,
        speculative_draft_model_path=str(world.export),
        speculative_num_steps=3,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=4,
        max_running_requests=max_running,
    )


def _target(world):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(world.model_dir, dtype=torch.float32).eval()


def _run(engine, prompts, params):
    seqs = [Sequence(f"r{i}", p, params) for i, p in enumerate(prompts)]
    return _drive(engine, seqs)


def _drive(engine, seqs: list[Sequence], *, joins_per_step: int = 3) -> list[Sequence]:
    """Step ``engine`` until every sequence finished, admitting at most ``joins_per_step`` into free
    room per step (so requests join between cycles while others run, as the scheduler admits them);
    finished ones in order."""
    waiting, finished = list(seqs), []
    while waiting or engine.num_running():
        room = min(engine.max_running - engine.num_running(), joins_per_step)
        if room > 0 and waiting:
            engine.admit(waiting[:room])
            waiting = waiting[room:]
        stepped, done = engine.step()
        assert all(s in stepped for s in done)
        finished += done
    return finished


def test_speculative_engine_reproduces_target_greedy_with_fewer_passes(gate_world):
    from eagle3.gate.prompts import load_gate_prompts

    target = _target(gate_world)
    engine = build_speculative_engine(
        target, gate_world.tokenizer, _args(gate_world), context_length=1024
    )
    prompts = [
        list(p.input_ids)
        for p in load_gate_prompts(
            gate_world.config.gate.prompt_sets, gate_world.tokenizer, per_set=1
        )
    ]
    done = sorted(
        _run(engine, prompts, SamplingParams(max_new_tokens=24, temperature=0.0)),
        key=lambda s: s.rid,
    )
    assert [s.rid for s in done] == ["r0", "r1", "r2"]
    eos = engine.finish.eos_ids
    for seq, prompt in zip(done, prompts, strict=True):
        ref = target.generate(
            torch.tensor([prompt]), max_new_tokens=24, do_sample=False, eos_token_id=sorted(eos)
        )
        expected = ref[0, len(prompt) :].tolist()
        assert seq.output_ids == expected[: len(seq.output_ids)] and len(seq.output_ids) == len(
            expected
        )
        assert seq.finish_reason["type"] == ("stop" if seq.output_ids[-1] in eos else "length")
        assert 0 < seq.verify_ct < len(seq.output_ids)


def test_ignore_eos_decodes_to_max_new_tokens(gate_world):
    engine = build_speculative_engine(
        _target(gate_world), gate_world.tokenizer, _args(gate_world), context_length=1024
    )
    (seq,) = _run(
        engine, [[1, 2, 3]], SamplingParams(max_new_tokens=20, temperature=0.0, ignore_eos=True)
    )
    assert len(seq.output_ids) == 20 and seq.finish_reason == {"type": "length", "length": 20}


def test_unknown_algorithm_and_missing_draft_are_refused_with_the_fix(gate_world, tmp_path):
    with pytest.raises(ValueError, match="use EAGLE3"):
        check_speculative_args(_args(gate_world, "NEXTN"))
    args = _args(gate_world)
    args.speculative_draft_model_path = str(tmp_path / "missing")
    with pytest.raises(ValueError, match="is not a directory"):
        check_speculative_args(args)
    assert check_speculative_args(_args(gate_world, "EAGLE")) == "last_hidden_only"


@pytest.fixture(scope="module")
def mixed_requests(gate_world):
    """16 requests over the gate prompts (whole and cut short: mixed lengths), each with its
    plain-greedy answer.

    Some requests end on EOS mid-batch (one token of a plain answer is made an extra EOS id), some
    on a stop string (the text a plain answer reaches after 6 tokens), some on ``max_new_tokens``;
    ``ignore_eos`` ones run on. The answers come from the plain engine decoding one request at a
    time, so everything compared is computed here."""
    from eagle3.gate.prompts import load_gate_prompts

    target, tokenizer = _target(gate_world), gate_world.tokenizer
    rendered = [
        list(p.input_ids)
        for p in load_gate_prompts(gate_world.config.gate.prompt_sets, tokenizer, per_set=4)
    ]
    prompts = [
        p if i % 2 == 0 else p[: max(2, len(p) // 2)] for i, p in enumerate((rendered * 2)[:16])
    ]
    params = [
        SamplingParams(max_new_tokens=16 + 3 * (i % 7), temperature=0.0, ignore_eos=i % 5 == 4)
        for i in range(16)
    ]
    plain = HFEngine(target, tokenizer, max_running=1, context_length=1024)
    first = _drive(plain, [Sequence("probe", prompts[0], params[0])])[0].output_ids
    eos = plain.finish.eos_ids | {first[len(first) // 2]}
    plain.finish.eos_ids = eos
    answers = _drive(
        plain,
        [Sequence(f"r{i}", p, q) for i, (p, q) in enumerate(zip(prompts, params, strict=True))],
    )
    for i in range(1, 16, 3):  # stop strings, reached mid-answer
        stop = tokenizer.decode(answers[i].output_ids[:6], skip_special_tokens=True)[-2:]
        if stop.strip():
            params[i].stop = [stop]
    answers = _drive(
        plain,
        [Sequence(f"r{i}", p, q) for i, (p, q) in enumerate(zip(prompts, params, strict=True))],
    )
    reasons = [a.finish_reason for a in answers]
    assert any(r["type"] == "stop" and isinstance(r["matched"], str) for r in reasons), (
        "no stop string was reached"
    )
    assert any(r["type"] == "stop" and isinstance(r["matched"], int) for r in reasons), (
        "no request ended on EOS"
    )
    assert any(r["type"] == "length" for r in reasons)
    return target, prompts, params, eos, {a.rid: a for a in answers}


def _speculate(world, target, prompts, params, eos, concurrency, algorithm="EAGLE3"):
    args = _args(world, algorithm, max_running=concurrency)
    engine = build_speculative_engine(target, world.tokenizer, args, context_length=1024)
    engine.finish.eos_ids = eos
    seqs = [Sequence(f"r{i}", p, q) for i, (p, q) in enumerate(zip(prompts, params, strict=True))]
    return engine, {s.rid: s for s in _drive(engine, seqs)}


@pytest.mark.parametrize("concurrency", [1, 4, 16])
def test_batched_speculation_equals_plain_greedy_whatever_joins_or_leaves(
    gate_world, mixed_requests, concurrency
):
    target, prompts, params, eos, answers = mixed_requests
    engine, done = _speculate(gate_world, target, prompts, params, eos, concurrency)
    for rid, answer in answers.items():
        assert done[rid].output_ids == answer.output_ids, (
            f"{rid} at concurrency {concurrency} is not plain greedy"
        )
        assert done[rid].finish_reason == answer.finish_reason
    assert engine.verify_passes == sum(s.verify_ct for s in done.values())
    if concurrency > 1:  # one target forward verified several requests' drafts
        assert engine.verify_forwards < engine.verify_passes
    else:
        assert engine.verify_forwards == engine.verify_passes


def test_per_request_counters_at_concurrency_16_equal_the_single_request_path(
    gate_world, mixed_requests
):
    target, prompts, params, eos, _answers = mixed_requests
    _engine, batched = _speculate(gate_world, target, prompts, params, eos, 16)
    decoder = _engine.batch.d
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        seq = batched[f"r{i}"]
        assert len(seq.accepted_drafts) == seq.verify_ct
        assert len(seq.output_ids) <= 1 + seq.verify_ct + sum(seq.accepted_drafts)
        if p.stop:  # the single-request decoder knows no stop strings
            continue
        alone = decoder.generate(prompt, p.max_new_tokens, () if p.ignore_eos else sorted(eos))
        assert (seq.output_ids, seq.verify_ct, seq.accepted_drafts) == (
            alone.tokens,
            alone.passes,
            alone.accepted,
        )


def test_eagle_without_aux_layers_still_collapses_the_accept_length_when_batched(
    gate_world, mixed_requests
):
    target, prompts, params, eos, answers = mixed_requests
    accept = {}
    for algorithm in ("EAGLE3", "EAGLE"):
        _engine, done = _speculate(gate_world, target, prompts, params, eos, 4, algorithm)
        # greedy stays right
        assert all(done[rid].output_ids == a.output_ids for rid, a in answers.items())
        tokens, passes = (
            sum(len(s.output_ids) for s in done.values()),
            sum(s.verify_ct for s in done.values()),
        )
        accept[algorithm] = tokens / passes
    # as the server-level test
    assert accept["EAGLE"] < 1.3 and accept["EAGLE3"] > accept["EAGLE"] + 0.3, accept
