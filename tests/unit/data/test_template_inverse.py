"""Recovering a served prompt's turns from its ids with the target's chat template as the only
oracle (``eagle3.data.template_inverse``)."""

from __future__ import annotations

import copy

import pytest

from eagle3.data.template import render_prompt
from eagle3.data.template_inverse import TemplateMismatch, learn_glue, recover_messages

CONVERSATIONS = [
    [{"role": "user", "content": "How do I boil an egg?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a prime."}],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke\nwith two lines."},
    ],
]
DEFAULT_SYSTEM = (
    "{{- bos_token -}}"
    "{%- if messages[0]['role'] != 'system' -%}"
    "{{- '<|im_start|>system\\nYou are helpful.<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
LLAMA3 = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' -}}"
    "{{- message['content'] + '<|eot_id|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}"
    "{%- endif -%}"
)


def _with_template(tokenizer, template: str):
    other = copy.deepcopy(tokenizer)
    other.chat_template = template
    return other


@pytest.mark.parametrize("conversation", CONVERSATIONS, ids=["one turn", "system", "multi-turn"])
def test_the_turns_of_a_rendered_prompt_come_back_exactly(tiny_tokenizer, conversation):
    ids = render_prompt(tiny_tokenizer, conversation)
    assert recover_messages(tiny_tokenizer, ids, learn_glue(tiny_tokenizer)) == conversation


def test_a_templates_default_system_prompt_is_not_a_turn_but_another_system_prompt_is(
    tiny_tokenizer,
):
    tokenizer = _with_template(tiny_tokenizer, DEFAULT_SYSTEM)
    glue = learn_glue(tokenizer)
    plain, custom = CONVERSATIONS[0], CONVERSATIONS[1]
    assert recover_messages(tokenizer, render_prompt(tokenizer, plain), glue) == plain
    assert recover_messages(tokenizer, render_prompt(tokenizer, custom), glue) == custom


def test_prompts_of_another_template_or_of_no_template_are_refused(tiny_tokenizer):
    glue = learn_glue(tiny_tokenizer)
    llama = render_prompt(_with_template(tiny_tokenizer, LLAMA3), CONVERSATIONS[2])
    raw = tiny_tokenizer("Once upon a time", add_special_tokens=False)["input_ids"]
    for ids in (llama, raw):
        with pytest.raises(TemplateMismatch):
            recover_messages(tiny_tokenizer, ids, glue)


def test_a_cut_that_does_not_render_back_is_refused_never_guessed(tiny_tokenizer):
    glue = learn_glue(tiny_tokenizer)
    ids = render_prompt(tiny_tokenizer, CONVERSATIONS[0])
    # not a rendering
    ids = [*ids[:3], *tiny_tokenizer(" extra", add_special_tokens=False)["input_ids"], *ids[3:]]
    try:
        recovered = recover_messages(tiny_tokenizer, ids, glue)
    except TemplateMismatch as exc:
        assert "render" in str(exc) or "start" in str(exc)
    else:
        assert render_prompt(tiny_tokenizer, recovered) == ids
