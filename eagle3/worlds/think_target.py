"""The thinking world's tokenizer and chat template: shaped like Kimi-K2.5's (thinking block, tool
calls, results).

Design choices (what Kimi-K2.5's published ``chat_template.jinja`` does, kept where the pipeline
meets it):
- Roles open with ``<|im_system|>`` / ``<|im_user|>`` / ``<|im_assistant|>`` + name +
  ``<|im_middle|>`` and close with ``<|im_end|>``, the chat model's ``eos_token``. Tools are
  declared first, ``<|im_system|>tool_declare<|im_middle|>``
  + the tools as compact JSON; a tool result is ``<|im_system|>tool<|im_middle|>## Return of
    <id>\\n<content>``.
- An assistant turn is ``<think>reasoning</think>content`` then its calls,
  ``<|tool_calls_section_begin|>``
  ``<|tool_call_begin|>functions.<name>:<k><|tool_call_argument_begin|><arguments><|tool_call_end|>``
  ... ``<|tool_calls_section_end|>`` (``eagle3.data.dialect`` ``kimi_k2``). The arguments are
  written as given when a
  string (OpenAI messages carry a JSON string) and as JSON otherwise (SGLang hands the template
  parsed arguments).
- The template's own rule for earlier turns: every turn up to the last assistant turn without tool
  calls is history and renders ``<think></think>``, its reasoning dropped; the turns after it (the
  tool chain in flight) keep theirs.
- ``thinking`` (default on; ``chat_template_kwargs={"thinking": false}`` turns it off) opens the
  block in the generation prompt (``<think>``) so the output starts inside it; off, the prompt
  closes it (``<think></think>``) and every turn renders without reasoning. SGLang's template
  detection reads the switch from the ``set thinking = thinking if thinking is defined else true``
  line.
- Role markers are special tokens (the model never writes them, ``skip_special_tokens`` drops them);
  the thinking and tool-call markers are added but not special, so decoded text keeps them, as
  Kimi's tokenizer does.
- No BOS in the template (Kimi renders none); the tokenizer still has one for transformers' sake.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from eagle3.data.dialect import REASONING_FORMATS, TOOL_CALL_FORMATS

logger = logging.getLogger(__name__)

DIALECT = "kimi_k2"  # the reasoning and tool-call parser names of this template (SGLang's)
BOS, EOS, PAD = "[BOS]", "[EOS]", "[PAD]"
IM_END, IM_USER, IM_ASSISTANT, IM_SYSTEM, IM_MIDDLE = (
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_system|>",
    "<|im_middle|>",
)
SPECIAL_TOKENS = (BOS, EOS, PAD, IM_END, IM_USER, IM_ASSISTANT, IM_SYSTEM, IM_MIDDLE)
_REASONING, _CALLS = REASONING_FORMATS[DIALECT], TOOL_CALL_FORMATS[DIALECT]
MARKERS = (
    _REASONING.think_start,
    _REASONING.think_end,
    _CALLS.section_start,
    _CALLS.section_end,
    _CALLS.call_start,
    _CALLS.call_args,
    _CALLS.call_end,
)
CHAT_TEMPLATE = (
    "{%- set thinking = thinking if thinking is defined else true -%}"
    "{%- if tools -%}"
    "{{- '<|im_system|>tool_declare<|im_middle|>' + (tools | tojson(separators=(',', ':'))) + '<|im_end|>' -}}"
    "{%- endif -%}"
    "{%- set ns = namespace(history_end=-1) -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' and not m.tool_calls -%}{%- set ns.history_end = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' -%}"
    "{{- '<|im_system|>system<|im_middle|>' + m.content + '<|im_end|>' -}}"
    "{%- elif m.role == 'user' -%}"
    "{{- '<|im_user|>user<|im_middle|>' + m.content + '<|im_end|>' -}}"
    "{%- elif m.role == 'tool' -%}"
    "{{- '<|im_system|>tool<|im_middle|>## Return of ' + (m.tool_call_id or '') + '\\n' + m.content + '<|im_end|>' -}}"
    "{%- elif m.role == 'assistant' -%}"
    "{%- set content = m.content or '' -%}"
    "{%- set reasoning = m.reasoning_content or '' -%}"
    "{%- if not reasoning and '</think>' in content -%}"
    "{%- set reasoning = content.split('</think>')[0].replace('<think>', '') -%}"
    "{%- set content = content.split('</think>')[1:] | join('</think>') -%}"
    "{%- endif -%}"
    "{{- '<|im_assistant|>assistant<|im_middle|>' -}}"
    "{%- if thinking and loop.index0 > ns.history_end -%}{{- '<think>' + reasoning + '</think>' -}}"
    "{%- else -%}{{- '<think></think>' -}}{%- endif -%}"
    "{{- content -}}"
    "{%- if m.tool_calls -%}"
    "{{- '<|tool_calls_section_begin|>' -}}"
    "{%- for tc in m.tool_calls -%}"
    "{%- set args = tc.function.arguments -%}"
    "{{- '<|tool_call_begin|>' + tc.id + '<|tool_call_argument_begin|>' -}}"
    "{{- args if args is string else (args | tojson) -}}"
    "{{- '<|tool_call_end|>' -}}"
    "{%- endfor -%}"
    "{{- '<|tool_calls_section_end|>' -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_assistant|>assistant<|im_middle|>' -}}"
    "{{- '<think>' if thinking else '<think></think>' -}}"
    "{%- endif -%}"
)


def build_think_tokenizer(
    corpus: Iterable[str], *, vocab_size: int = 2048
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``corpus`` with the role tokens (special) and the
    thinking and tool-call markers (added, not special) of the template above."""
    if vocab_size < len(SPECIAL_TOKENS) + len(MARKERS) + 256 + 1:
        raise ValueError(
            f"vocab_size={vocab_size} is too small for the byte alphabet and the template's tokens"
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(MARKERS),
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.add_tokens([AddedToken(marker, special=False, normalized=False) for marker in MARKERS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=IM_END, pad_token=PAD, unk_token=None
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    logger.info(
        "trained the thinking world's tokenizer: %d entries (asked for %d)",
        len(tokenizer),
        vocab_size,
    )
    return tokenizer
