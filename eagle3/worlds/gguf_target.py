"""A GGUF chat model turned into a plain Hugging Face checkpoint, and checked against the GGUF it
came from.

Design choices:
- transformers reads GGUF (``from_pretrained(dir, gguf_file=...)``, with the ``gguf`` package) and
  dequantises every tensor to the requested dtype; ``save_pretrained`` refuses a model loaded that
  way. So the checkpoint is a fresh ``LlamaForCausalLM`` built from the loaded config (without its
  ``quantization_config``) with the loaded state dict copied in: the same numbers, saved as
  safetensors every engine reads (SGLang, the reference server, capture).
- The check is behavioural: greedy continuations of a few chat prompts, rendered with the model's
  own template, must give the same token ids from the saved checkpoint (loaded back from disk) as
  from the GGUF-loaded model.
- The generation config and the tokenizer are saved beside the weights, with the tokenizer's length
  limit set to the model's context (the GGUF tokenizer carries none), so servers read the same EOS
  and template the GGUF declares.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

CHECK_PROMPTS: tuple[str, ...] = (
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Give me three tips for sleeping better.",
    "Explain what a hash table is in two sentences.",
)
# Keys of a GGUF-loaded config that describe the file, not the model (dropped from the saved
# checkpoint's config).
_GGUF_ONLY_KEYS = (
    "quantization_config",
    "_name_or_path",
    "_model_name_or_path",
    "transformers_version",
)


class GGUFError(RuntimeError):
    """A GGUF file that cannot be converted; the message names the fix."""


def _require_gguf() -> None:
    try:
        import gguf  # noqa: F401 - transformers' GGUF reader needs it
    except ImportError:
        raise GGUFError(
            "converting a GGUF target needs the `gguf` package: "
            "pip install 'eagle3-pipeline[real]' "
            "(or `pip install 'gguf>=0.17,<0.20'`)"
        ) from None


def load_gguf(path: Path) -> tuple[Any, Any]:
    """The GGUF model dequantised to float32, and its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _require_gguf()
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    return model.eval(), tokenizer


def plain_copy(gguf_model: Any, name: str) -> Any:
    """A ``LlamaForCausalLM`` with the GGUF model's config and weights, free of its GGUF loading
    state."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    fields = {k: v for k, v in gguf_model.config.to_dict().items() if k not in _GGUF_ONLY_KEYS}
    fields |= {"architectures": ["LlamaForCausalLM"], "dtype": "float32"}
    config = LlamaConfig.from_dict(fields)
    config.name_or_path = name
    model = LlamaForCausalLM(config).to(torch.float32)
    missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise GGUFError(
            f"the GGUF's tensors do not fill a Llama of its config: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
    if config.tie_word_embeddings:
        model.tie_weights()
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    return model.eval()


def greedy_ids(
    model: Any, tokenizer: Any, prompts: Sequence[str], max_new_tokens: int
) -> list[list[int]]:
    """Greedy continuations (token ids, EOS included when reached) of ``prompts`` as single user
    turns."""
    import torch

    out = []
    for prompt in prompts:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}],
            add_generation_prompt=True,
            return_dict=True,
            return_tensors="pt",
        )
        with torch.no_grad():
            full = model.generate(
                **ids,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
            )
        out.append(full[0, ids["input_ids"].shape[1] :].tolist())
    return out


def convert_gguf(
    gguf: Path,
    out: Path,
    *,
    name: str,
    check_tokens: int,
    say: Callable[[str], None] = logger.info,
) -> dict[str, Any]:
    """Write ``gguf`` as a checkpoint in ``out`` (weights, config, generation config, tokenizer) and
    check it; returns what the check compared. Raises ``GGUFError`` when the checkpoint's greedy ids
    differ."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    say(f"loading {gguf.name} (dequantised to float32)")
    gguf_model, tokenizer = load_gguf(gguf)
    model = plain_copy(gguf_model, name)
    tokenizer.model_max_length = model.config.max_position_embeddings
    say(f"saving the checkpoint ({sum(p.numel() for p in model.parameters()):,} parameters)")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    say(
        f"checking greedy output of {len(CHECK_PROMPTS)} prompts ({check_tokens} tokens) "
        "against the GGUF"
    )
    expected = greedy_ids(gguf_model, tokenizer, CHECK_PROMPTS, check_tokens)
    del gguf_model, model
    saved = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    saved_tokenizer = AutoTokenizer.from_pretrained(str(out))
    got = greedy_ids(saved, saved_tokenizer, CHECK_PROMPTS, check_tokens)
    texts = [saved_tokenizer.decode(ids) for ids in got]
    if got != expected:
        bad = next(i for i, (a, b) in enumerate(zip(got, expected, strict=True)) if a != b)
        raise GGUFError(
            f"the converted checkpoint's greedy answer to {CHECK_PROMPTS[bad]!r} differs from the "
            f"GGUF's ({texts[bad]!r} vs {tokenizer.decode(expected[bad])!r}); "
            f"{out} is not the model"
        )
    return {
        "check_prompts": len(CHECK_PROMPTS),
        "check_tokens": sum(map(len, got)),
        "greedy_equal": True,
        "check_texts": texts,
        "num_layers": saved.config.num_hidden_layers,
        "hidden_size": saved.config.hidden_size,
        "vocab_size": saved.config.vocab_size,
        "params": sum(p.numel() for p in saved.parameters()),
        "eos_token": saved_tokenizer.eos_token,
        "eos_token_id": saved_tokenizer.eos_token_id,
    }
