"""Column contracts of the prompts stage (docs/DESIGN.md, "Prompts") and the quarantine reasons.

Every stage that reads prompts imports ``PROMPT_SCHEMA`` from here; nobody re-declares it.
``input_ids`` and ``loss_mask`` are null except for pre-tokenized rows (already in the target's
token space), which skip regeneration.

A message is ``role`` + ``content``, and where a conversation calls tools
(``eagle3.data.toolcalls``): an assistant's ``tool_calls`` (``id``, ``name``, ``arguments`` as JSON
text) and ``reasoning_content`` (its thinking, kept apart from the content as the OpenAI API and the
chat templates of thinking models keep it), a tool result's ``tool_call_id``. ``tools`` is the
conversation's tool declarations (JSON text of a list), null when it has none.
"""

from __future__ import annotations

import pyarrow as pa

TOOL_CALL_TYPE = pa.struct([("id", pa.string()), ("name", pa.string()), ("arguments", pa.string())])
MESSAGE_TYPE = pa.struct(
    [
        ("role", pa.string()),
        ("content", pa.string()),
        ("reasoning_content", pa.string()),
        ("tool_calls", pa.list_(TOOL_CALL_TYPE)),
        ("tool_call_id", pa.string()),
    ]
)

PROMPT_SCHEMA = pa.schema(
    [
        ("sample_id", pa.string()),
        ("source", pa.string()),
        ("source_row", pa.string()),
        ("messages", pa.list_(MESSAGE_TYPE)),
        ("n_user_turns", pa.int32()),
        ("meta", pa.string()),
        ("input_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.uint8())),
        ("tools", pa.string()),
    ]
)

QUARANTINE_SCHEMA = pa.schema(
    [
        ("source", pa.string()),
        ("source_row", pa.string()),
        ("reason", pa.string()),
        ("raw", pa.string()),
    ]
)

ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")

# Quarantine reasons (enum-like strings stored in ``quarantine.parquet``).
EMPTY = "empty"  # no messages, or a user/tool turn with blank content
NO_USER_TURN = "no_user_turn"
UNKNOWN_ROLE = "unknown_role"
# user/assistant order broken (tool turns may follow an assistant turn)
NOT_ALTERNATING = "not_alternating"
# prompt over normalize.max_prompt_tokens (target tokenizer) or a message over max_message_chars
TOO_LONG = "too_long"
BAD_ENCODING = "bad_encoding"  # invalid UTF-8 / lone surrogates
DUPLICATE = "duplicate"  # same sample_id (normalized prompt content) as an earlier row
NEAR_DUPLICATE = "near_duplicate"  # MinHash/LSH estimated Jaccard >= normalize.near_dup_threshold
CONTAMINATED = "contaminated"  # overlaps a gate benchmark prompt
MALFORMED = "malformed"  # not parseable, wrong types, missing keys
# pre-tokenized row: ids outside the target vocab, or input_ids/loss_mask lengths differ
BAD_TOKENS = "bad_tokens"
# arguments not a JSON object, a result answering no call, a call left unanswered
BAD_TOOL_CALL = "bad_tool_call"
# Served traffic (SGLang request logs, eagle3.data.served_log and eagle3.data.served)
PARTIAL = "partial"  # a log line cut at the end of its file (copied or read while written)
UNFINISHED = "unfinished"  # received, never finished in the files read
UNMATCHED = "unmatched"  # finished; its receipt is not in the files read (rotated out)
HEALTH_CHECK = "health_check"  # the server's own /health_generate probes
ABORTED = "aborted"  # finish_reason abort: the client or the server stopped the answer
CUT_SHORT = "cut_short"  # finish_reason length (kept with served.keep_truncated)
NO_CONTENT = "no_content"  # ids dropped or cut by the log level, or counts off meta_info's
TEMPLATE_MISMATCH = "template_mismatch"  # the prompt is not the target's chat template's
FILTERED = "filtered"  # dropped by a served.* filter (the raw keeps no content)
HELD_OUT = "held_out"  # set aside as the gate's served prompt set: never trained on

REASONS: tuple[str, ...] = (
    EMPTY,
    NO_USER_TURN,
    UNKNOWN_ROLE,
    NOT_ALTERNATING,
    TOO_LONG,
    BAD_ENCODING,
    DUPLICATE,
    NEAR_DUPLICATE,
    CONTAMINATED,
    MALFORMED,
    BAD_TOKENS,
    BAD_TOOL_CALL,
    PARTIAL,
    UNFINISHED,
    UNMATCHED,
    HEALTH_CHECK,
    ABORTED,
    CUT_SHORT,
    NO_CONTENT,
    TEMPLATE_MISMATCH,
    FILTERED,
    HELD_OUT,
)

RAW_MAX_BYTES = 2048
