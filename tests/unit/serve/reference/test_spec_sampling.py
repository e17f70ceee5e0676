"""The reference server's speculative engines at a temperature: the batched engine's output has the
target's distribution (the statistical test of ``test_sampling``, here through the real engine: a
transformers target, an exported draft, batched verify forwards, caches compacted between passes),
the planted bug and the lossy threshold fail it, measured acceptance equals the acceptance the two
models' probabilities give, and seeded requests give the same tokens alone, batched, and through the
single-sequence reference decoder.

The distribution test runs on a micro target (vocab V, random weights made peaked) so the first K
tokens can be enumerated; N rows of one prompt, each with its own seed, are one batch.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from eagle3.model.export_format import expected_shapes
from eagle3.serve.reference import spec_batch
from eagle3.serve.reference.protocol import SamplingParams, Sequence
from eagle3.serve.reference.sampling import RowSampling, sample, target_probs, verify_chain
from eagle3.serve.reference.spec_decoder import SpeculativeDecoder

V, H, K, STEPS = 6, 32, 3, 2
N = 4000
ALPHA_Z = 3.719  # chi-square critical values at alpha 1e-4 (Wilson-Hilferty)
PROMPT = [1, 2, 3]
T1 = (1.0, 1.0, -1)


@pytest.fixture(scope="module")
def micro(tmp_path_factory) -> SimpleNamespace:
    """A 2-layer Llama over V tokens with a peaked head, and a random EAGLE-3 draft export for
    it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=V,
        hidden_size=H,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    target = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(10.0)  # random init is near uniform: make each choice matter
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": H,
        "intermediate_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 1,
        "vocab_size": V,
        "draft_vocab_size": V,
        "max_position_embeddings": 64,
        "tie_word_embeddings": False,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": [0, 0, 1],
            "use_aux_hidden_state": True,
        },
    }
    gen = torch.Generator().manual_seed(1)
    tensors = {
        k: torch.randn(shape, generator=gen) * 0.5 for k, shape in expected_shapes(cfg).items()
    }
    tensors["d2t"], tensors["t2d"] = (
        torch.zeros(V, dtype=torch.long),
        torch.ones(V, dtype=torch.bool),
    )
    out = tmp_path_factory.mktemp("micro-draft")
    (out / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    return SimpleNamespace(target=target, export=out)


def exact(target, sampling: RowSampling) -> torch.Tensor:
    """P(first K tokens after PROMPT), the V**K sequences in lexicographic order, by enumeration."""
    seqs = torch.cartesian_prod(*[torch.arange(V)] * K)
    prob = torch.ones(seqs.shape[0])
    with torch.no_grad():
        logits = target(torch.cat([torch.tensor([PROMPT] * len(seqs)), seqs], 1)).logits.float()
    for i in range(K):
        probs = target_probs(logits[:, len(PROMPT) - 1 + i], [sampling] * len(seqs))
        prob = prob * probs.gather(1, seqs[:, i : i + 1])[:, 0]
    return prob


def chi_square(tokens: torch.Tensor, expected_p: torch.Tensor) -> tuple[float, float]:
    """(X2, critical value at alpha 1e-4) over the V**K cells, cells expecting < 5 pooled."""
    counts = torch.bincount(tokens @ (V ** torch.arange(K - 1, -1, -1)), minlength=V**K).double()
    expected = expected_p.double() * tokens.shape[0]
    small = expected < 5
    obs = torch.cat([counts[~small], counts[small].sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = exp > 0
    df = int(keep.sum()) - 1
    x2 = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    return x2, df * (1 - 2 / (9 * df) + ALPHA_Z * math.sqrt(2 / (9 * df))) ** 3


def speculate_batch(
    micro, thresholds=(1.0, 1.0)
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """N rows of PROMPT at T=1 (seeds 0..N-1) in one batch until each has K tokens: (first K tokens
    ``[N, K]``, each pass's accepted drafts and draft probabilities)."""
    decoder = SpeculativeDecoder(micro.target, None, micro.export, STEPS)
    decoder.accept_thresholds = thresholds
    batch = spec_batch.ChainBatch(decoder)
    rows = [RowSampling.seeded(*T1, seed) for seed in range(N)]
    out = [[t] for t in batch.prefill([PROMPT] * N, rows)]
    accepted, probs = [], []
    while min(len(o) for o in out) < K:
        cycle = batch.cycle()
        for o, new in zip(out, cycle.tokens, strict=True):
            o += new
        accepted.append(torch.tensor(cycle.accepted))
        probs.append(cycle.draft_probs)
    return torch.tensor([o[:K] for o in out]), accepted, probs


@pytest.fixture(scope="module")
def distribution(micro) -> torch.Tensor:
    return exact(micro.target, RowSampling(*T1))


@pytest.fixture(scope="module")
def exact_run(micro) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    return speculate_batch(micro)


def test_the_batched_engine_samples_the_targets_distribution(exact_run, distribution):
    tokens, _, _ = exact_run
    x2, critical = chi_square(tokens, distribution)
    assert x2 < critical
    assert len(set(map(tuple, tokens.tolist()))) > 20  # the world is not near-deterministic


def test_the_batched_engine_fails_the_test_with_a_planted_bug_or_a_lossy_threshold(
    micro, distribution, monkeypatch
):
    lossy, _, _ = speculate_batch(micro, thresholds=(1.0, 0.7))
    x2, critical = chi_square(lossy, distribution)
    assert x2 > critical

    def keeps_rejected(
        probs, proposal, coins, final, **thresholds
    ):  # the residual is p: the draft not removed
        out = verify_chain(probs, proposal, coins, final, **thresholds)
        rows, rejected = torch.arange(len(proposal)), out.accepted < proposal.shape[1]
        tokens = out.tokens.clone()
        tokens[rows[rejected], out.accepted[rejected]] = sample(
            probs[rows, out.accepted][rejected], final[rejected]
        )
        return out._replace(tokens=tokens)

    monkeypatch.setattr(spec_batch, "verify_chain", keeps_rejected)
    buggy, _, _ = speculate_batch(micro)
    x2, critical = chi_square(buggy, distribution)
    assert x2 > critical


def test_measured_acceptance_equals_the_acceptance_the_models_probabilities_give(exact_run):
    """Draft j of a pass is accepted with probability p_j(x_j) given the drafts before it were:
    summed over the passes that reached position j, the accepted count and the sum of p_j(x_j) agree
    within 4.5 standard deviations (a martingale: each term's variance is p(1 - p))."""
    _, accepted, probs = exact_run
    for j in range(STEPS):
        reached = torch.cat([a >= j for a in accepted])
        p = torch.cat(probs)[:, j][reached]
        hits = torch.cat([a > j for a in accepted])[reached].double()
        sd = float((p * (1 - p)).sum().sqrt())
        assert sd > 5, f"position {j + 1}: too few undecided passes to test"
        assert abs(float(hits.sum() - p.sum())) < 4.5 * sd


def _engine(world, seed: int = 0):
    import argparse

    from transformers import AutoModelForCausalLM

    from eagle3.serve.reference.spec_engine import build_speculative_engine

    target = AutoModelForCausalLM.from_pretrained(world.model_dir, dtype=torch.float32).eval()
    args = argparse.Namespace(
        speculative_algorithm="EAGLE3",
        speculative_draft_model_path=str(world.export),
        speculative_num_steps=3,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=4,
        max_running_requests=16,
        random_seed=seed,
    )
    return build_speculative_engine(target, world.tokenizer, args, context_length=1024)


def _serve(
    engine, prompts: list[list[int]], seeds: list[int | None], temperature: float = 1.0
) -> list[Sequence]:
    seqs = [
        Sequence(
            f"r{i}",
            p,
            SamplingParams(max_new_tokens=24, temperature=temperature, top_p=0.95, sampling_seed=s),
        )
        for i, (p, s) in enumerate(zip(prompts, seeds, strict=True))
    ]
    engine.admit(seqs)
    while engine.num_running():
        engine.step()
    return seqs


@pytest.mark.slow
def test_a_seeded_request_gives_the_same_tokens_alone_batched_and_in_the_reference_decoder(
    gate_world,
):
    from eagle3.gate.prompts import load_gate_prompts

    prompts = [
        list(p.input_ids)
        for p in load_gate_prompts(
            gate_world.config.gate.prompt_sets, gate_world.tokenizer, per_set=4
        )
    ]
    engine = _engine(gate_world)
    batched = _serve(engine, prompts, list(range(len(prompts))))
    alone = [_serve(engine, [p], [i])[0] for i, p in enumerate(prompts)]
    assert [s.output_ids for s in batched] == [s.output_ids for s in alone]
    assert [s.verify_ct for s in batched] == [s.verify_ct for s in alone]
    decoder, eos = engine.batch.d, sorted(engine.finish.eos_ids)
    for i, (prompt, seq) in enumerate(zip(prompts, batched, strict=True)):
        ref = decoder.generate(prompt, 24, eos, RowSampling.seeded(1.0, 0.95, -1, i))
        assert (ref.tokens, ref.passes) == (seq.output_ids, seq.verify_ct)
    other = _serve(engine, prompts, [1000 + i for i in range(len(prompts))])
    assert [s.output_ids for s in other] != [s.output_ids for s in batched]
    greedy = _serve(engine, prompts, [None] * len(prompts), temperature=0.0)
    assert [s.output_ids for s in greedy] != [s.output_ids for s in batched]
