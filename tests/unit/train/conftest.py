"""A tiny draft-training world: the tiny world's target, target-generated (greedy) answers,
a draft vocab, a config, and training batches captured online from the target (the batch dict of the brief)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from eagle3.config import PipelineConfig, TargetConfig, with_overrides

DRAFT_VOCAB = 512
TRAIN_PROMPTS, HELD_OUT = 64, 20


@torch.no_grad()
def greedy_answers(target, tokenizer, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Plain greedy decoding (HF generate), cut after the first eos; one prompt at a time (no padding effects)."""
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    outs = []
    for ids in prompts:
        out = target.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                              eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)[0, len(ids):].tolist()
        outs.append(out[: out.index(eos) + 1] if eos in out else out)
    return outs


@torch.no_grad()
def batched_answers(target, tokenizer, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Target answers for training data, 32 prompts per left-padded ``generate`` call (cheap on CPU)."""
    eos, pad = tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.pad_token_id
    outs = []
    for start in range(0, len(prompts), 32):
        chunk = prompts[start : start + 32]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        gen = target.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                              eos_token_id=eos, pad_token_id=pad)[:, width:].tolist()
        outs += [g[: g.index(eos) + 1] if eos in g else g for g in gen]
    return outs


def write_vocab(sequences, vocab_size: int, draft_size: int, path: Path) -> Path:
    """The draft vocab of the loss-masked tokens, built and saved by the vocab module."""
    from eagle3.model.vocab import build_vocab, save_vocab

    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ids, mask in sequences:
        counts.index_add_(0, torch.tensor(ids), torch.tensor(mask, dtype=torch.long))
    return save_vocab(build_vocab(counts, draft_size), path)


@pytest.fixture(scope="session")
def draft_world(tiny_world, tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eagle3.data.template import render_prompt
    from eagle3.dev.samples import generate_conversations
    from eagle3.train.trainer import batches_from_target

    model_dir = Path(tiny_world.model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    target = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    convs = generate_conversations(TRAIN_PROMPTS + HELD_OUT, seed=11)
    prompts = [render_prompt(tokenizer, [c[0]] if c[0]["role"] == "user" else c[:2]) for c in convs]
    answers = batched_answers(target, tokenizer, prompts[:TRAIN_PROMPTS], 40)
    sequences = [(p + a, [0] * len(p) + [1] * len(a)) for p, a in zip(prompts, answers, strict=False)]
    root = tmp_path_factory.mktemp("draft-root")
    vocab_path = root / "vocab.safetensors"
    write_vocab(sequences, target.config.vocab_size, DRAFT_VOCAB, vocab_path)
    hf = target.config
    base = PipelineConfig(
        name="draft-test", root=str(root),
        target=TargetConfig(model_path=str(model_dir), num_layers=hf.num_hidden_layers, hidden_size=hf.hidden_size,
                            vocab_size=hf.vocab_size, context_length=1024, dtype="float32"),
    )
    config = with_overrides(base, [
        f"vocab.draft_vocab_size={DRAFT_VOCAB}", "train.precision=fp32", "train.device=cpu", "train.lr=3e-3",
        "train.batch_size=4", "train.log_every=1", "train.save_every=1000", "train.ttt_steps=4",
        "speculative.num_steps=3", "speculative.num_draft_tokens=4",
    ])
    batches = batches_from_target(target, sequences, layer_ids=config.sglang_layer_ids, batch_size=4)
    return SimpleNamespace(model_dir=model_dir, tokenizer=tokenizer, target=target, config=config,
                           vocab_path=vocab_path, batches=batches, sequences=sequences,
                           held_out=prompts[TRAIN_PROMPTS:], eos=tokenizer.convert_tokens_to_ids("<|im_end|>"))
