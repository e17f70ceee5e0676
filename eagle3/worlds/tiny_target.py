"""A tiny chat target for CPU runs: byte-level BPE tokenizer, ChatML template, small Llama, short
training.

Design choices:
- Byte-level BPE (ByteLevel pre-tokenizer and decoder) so every string, emoji and code included,
  round-trips. The tokenizer has no post-processor: `tokenizer(text)` adds nothing, and the chat
  template writes the single `<|begin_of_text|>` itself, so encoding a rendered conversation never
  doubles the BOS.
- ChatML template (`<|im_start|>{role}\\n{content}<|im_end|>\\n`). It has the prefix property the
  project renderer relies on: rendering `messages[:i]` (with the generation prompt when
  `messages[i]` is the assistant's) is a string prefix of rendering `messages[:i + 1]`. `{%
  generation %}` wraps assistant content plus its `<|im_end|>`, so transformers'
  `return_assistant_tokens_mask` marks exactly the trained-on tokens.
- `<|im_end|>` is the chat model's `eos_token` (generation stops at the end of a turn); the
  generation config also stops at `<|end_of_text|>`.
- Training packs rendered conversations into one token stream and samples windows that start at a
  conversation start, so position 0 is always `<|begin_of_text|>` as at inference. It is
  deterministic for a seed and a thread count (deterministic algorithms on, threads pinned, both
  restored afterwards).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from eagle3.data.template import span_mask

logger = logging.getLogger(__name__)
Spans = list[tuple[int, int]]

BOS, EOT, IM_START, IM_END, PAD = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|pad|>",
)
SPECIAL_TOKENS = (BOS, EOT, IM_START, IM_END, PAD)
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- generation -%}{{- message['content'] + '<|im_end|>' -}}{%- endgeneration -%}"
    "{{- '\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def build_tokenizer(corpus: Iterable[str], *, vocab_size: int = 2048) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on `corpus` and wrap it with the special tokens and the chat
    template.

    The vocabulary holds the 5 special tokens (ids 0-4), the 256 byte symbols and merges up to
    `vocab_size` (fewer when the corpus runs out of pairs seen at least twice).
    """
    if vocab_size < len(SPECIAL_TOKENS) + 256 + 1:
        raise ValueError(
            f"vocab_size={vocab_size} is too small: byte-level BPE needs at least 262 entries"
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=IM_END, pad_token=PAD, unk_token=None
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    logger.info(
        "trained byte-level BPE tokenizer: %d entries (asked for %d)", len(tokenizer), vocab_size
    )
    return tokenizer


def build_model(
    tokenizer: PreTrainedTokenizerFast,
    *,
    num_layers: int = 8,
    hidden_size: int = 128,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 352,
    max_position_embeddings: int = 2048,
    vocab_size: int | None = None,
    seed: int = 0,
    stop_tokens: Sequence[str] = (EOT,),
) -> LlamaForCausalLM:
    """A randomly initialised Llama with untied embeddings (as EAGLE-3 targets have).

    The vocabulary is padded up to ``vocab_size`` (like real targets, whose embedding tables are
    larger than their tokenizers), so the tiny recipe's ``target.vocab_size`` holds whatever size
    BPE training reaches. BOS, EOS (the end of a turn) and PAD are the tokenizer's; generation also
    stops at ``stop_tokens``.
    """
    bos, eos, pad = tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id
    stops = [eos, *tokenizer.convert_tokens_to_ids(list(stop_tokens))]
    config = LlamaConfig(
        vocab_size=max(len(tokenizer), vocab_size or 0),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=False,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=bos, eos_token_id=stops, pad_token_id=pad, do_sample=False
    )
    return model


def render_conversations(
    tokenizer: PreTrainedTokenizerFast, conversations: Sequence[Sequence[dict[str, Any]]]
) -> list[str]:
    """Render each conversation with the tokenizer's chat template (no generation prompt)."""
    return [tokenizer.apply_chat_template(list(conv), tokenize=False) for conv in conversations]


@contextmanager
def _deterministic(num_threads: int | None) -> Iterator[None]:
    """Deterministic kernels and a pinned thread count for the block; the previous settings come
    back after."""
    was_deterministic, threads = (
        torch.are_deterministic_algorithms_enabled(),
        torch.get_num_threads(),
    )
    torch.use_deterministic_algorithms(True)
    if num_threads:
        torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
        torch.set_num_threads(threads)


def _token_stream(
    tokenizer: PreTrainedTokenizerFast,
    texts: Sequence[str],
    seq_len: int,
    spans: Sequence[Spans] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """All texts as one 1-D id stream, the offsets where a window of `seq_len` can start, and (with
    `spans`: the character spans of each text to learn) a 0/1 stream of the tokens to learn."""
    enc = tokenizer(list(texts), add_special_tokens=False, return_offsets_mapping=spans is not None)
    encoded = enc["input_ids"]
    lengths = torch.tensor([len(ids) for ids in encoded])
    starts = torch.cumsum(lengths, 0) - lengths
    stream = torch.tensor([i for ids in encoded for i in ids], dtype=torch.long)
    starts = starts[starts + seq_len <= len(stream)]
    if len(starts) == 0:
        raise ValueError(
            f"conversations hold {len(stream)} tokens, fewer than one window of seq_len={seq_len}"
        )
    if spans is None:
        return stream, starts, None
    learn = [
        bit
        for offsets, s in zip(enc["offset_mapping"], spans, strict=True)
        for bit in span_mask(offsets, s)
    ]
    return stream, starts, torch.tensor(learn, dtype=torch.bool)


def _lr_at(step: int, steps: int, lr: float) -> float:
    """Linear warm-up over the first 5% of steps, then cosine decay to a tenth of `lr`."""
    warmup = max(1, steps // 20)
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def train_model(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    conversations: Sequence[Sequence[dict[str, Any]]],
    *,
    steps: int = 300,
    batch_size: int = 8,
    seq_len: int = 256,
    lr: float = 3e-3,
    seed: int = 0,
    num_threads: int | None = None,
) -> list[float]:
    """Next-token training on chat-rendered conversations (all tokens); returns the loss of every
    step.

    AdamW (betas 0.9/0.95, weight decay 0.1), grad-norm clip 1.0, warm-up then cosine schedule.
    """
    texts = render_conversations(tokenizer, conversations)
    return train_on_texts(
        model,
        tokenizer,
        texts,
        steps=steps,
        batch_size=batch_size,
        seq_len=seq_len,
        lr=lr,
        seed=seed,
        num_threads=num_threads,
    )


def train_on_texts(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    texts: Sequence[str],
    *,
    steps: int = 300,
    batch_size: int = 8,
    seq_len: int = 256,
    lr: float = 3e-3,
    seed: int = 0,
    num_threads: int | None = None,
    spans: Sequence[Spans] | None = None,
) -> list[float]:
    """``train_model`` on texts already rendered (windows start at a text's start); the losses of
    every step. With ``spans`` (per text, the character spans the model wrote), only those tokens
    are predicted (SFT's loss mask)."""
    stream, starts, learn = _token_stream(tokenizer, texts, seq_len, spans)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    losses: list[float] = []
    model.train()
    with _deterministic(num_threads):
        torch.manual_seed(seed)
        for step in range(steps):
            picks = starts[torch.randint(len(starts), (batch_size,), generator=generator)]
            batch = torch.stack([stream[s : s + seq_len] for s in picks.tolist()])  # [B, T]
            labels = batch
            if learn is not None:
                labels = batch.masked_fill(
                    ~torch.stack([learn[s : s + seq_len] for s in picks.tolist()]), -100
                )
            for group in optimizer.param_groups:
                group["lr"] = _lr_at(step, steps, lr)
            loss = model(input_ids=batch, labels=labels).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(loss.item())
            if step % 50 == 0 or step == steps - 1:
                logger.info("tiny target step %d/%d loss %.3f", step + 1, steps, losses[-1])
    model.eval()
    return losses
