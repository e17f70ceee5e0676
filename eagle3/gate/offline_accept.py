"""Offline acceptance of a draft (``eagle3 eval``, the aimed nights' domain eval) with the reference speculative
decoder (``eagle3.serve.reference.spec_decoder``), and prompt files rendered with the project's chat template.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from eagle3.serve.reference.spec_decoder import SpeculativeDecoder


def evaluate_acceptance(
    decoder: SpeculativeDecoder,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    eos_ids: Sequence[int],
    on_prompt: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Offline acceptance over prompts: total generated tokens / total verify passes.

    ``on_prompt`` is called after each prompt is decoded, so a caller (the CLI) can draw progress without
    re-implementing this loop."""
    tokens = passes = 0
    for ids in prompts:
        output, verify, _ = decoder.generate(ids, max_new_tokens, eos_ids)
        tokens += len(output)
        passes += verify
        if on_prompt is not None:
            on_prompt()
    return {"prompts": len(prompts), "tokens": tokens, "verify_passes": passes,
            "accept_length": tokens / passes if passes else float("nan"), "aux_mode": decoder.aux_mode}


def load_prompt_file(path: Path, tokenizer: Any, *, limit: int | None = None) -> list[list[int]]:
    """Prompt ids of a prompt set file (any shape ``eagle3.data.prompt_sets`` reads), rendered with
    the project's chat renderer as the gate renders them."""
    from eagle3.data.prompt_sets import read_prompt_set
    from eagle3.data.template import ChatOptions, render_prompt

    rows = read_prompt_set(path, Path(path).stem, limit=limit)
    return [
        render_prompt(
            tokenizer,
            list(row.messages) or [{"role": "user", "content": row.prompt}],
            ChatOptions(tools=list(row.tools) or None),
        )
        for row in rows
    ]
