"""Normalization (docs/DESIGN.md, "Prompts"): raw rows of one source -> normalized prompt rows +
quarantine.

Per row, in this order (the first failing rule names the quarantine reason):
  malformed / unknown_role (adapter), bad_encoding (lone surrogates = invalid UTF-8), too_long (a
  message over ``max_message_chars``: a cheap gate before any other work), NFC, system-prompt
  policy, empty, no_user_turn, not_alternating (after dropping leading assistant turns: ShareGPT's
  split conversations start their later parts with the reply to a question the row no longer has;
  FastChat's and EAGLE's readers skip it too), bad_tool_call
  (``eagle3.data.toolcalls.link_tool_calls``: every call named, every result tied to a call),
  too_long (the prompt over ``max_prompt_tokens`` with the TARGET tokenizer, batched), contaminated
  (gate benchmark overlap).
Assistant turns stay in the row (regeneration replaces them). Pre-tokenized rows are checked against
``target.vocab_size`` and equal ``input_ids``/``loss_mask`` lengths (``bad_tokens``).

The prompt length is the token count of the non-assistant turn contents (and the tool declarations)
joined by newlines (the template's few tokens per turn are not counted). A prompt whose UTF-8 byte
length is <= the limit is never tokenized: byte-level BPE and byte-fallback tokenizers never emit
more tokens than bytes.

``sample_id`` is a hash of the normalized non-assistant turns (role + content, and the tool
declarations when the row has any): it is stable across sources and runs, identical prompts from two
sources dedup to one, and the assistant turns do not matter since regeneration replaces them.
``source_row`` is the row's position in the source (files in order), so the quarantine points back
to the exact row; the dataset's own id, if any, is kept in ``meta``.

Streaming: rows are read, converted and written in batches of ``BATCH`` rows; memory does not grow
with the source.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import unicodedata
from collections import Counter
from collections.abc import Callable
from itertools import dropwhile
from pathlib import Path
from typing import Any

from eagle3.config.data import NormalizeConfig, SourceConfig
from eagle3.config.pipeline import PipelineConfig
from eagle3.data import catalog
from eagle3.data.adapters import Converted, Message, RowError, convert_row
from eagle3.data.decontam import Decontaminator, load_prompt_sets
from eagle3.data.discover import load_catalog, source_record
from eagle3.data.mix import MixLine, Selector, plan_mix
from eagle3.data.parquet import ShardWriter
from eagle3.data.readers import RawRow, iter_rows, truncate_raw
from eagle3.data.schema import (
    BAD_ENCODING,
    BAD_TOKENS,
    CONTAMINATED,
    EMPTY,
    NO_USER_TURN,
    NOT_ALTERNATING,
    PROMPT_SCHEMA,
    QUARANTINE_SCHEMA,
    TOO_LONG,
)
from eagle3.data.served import (
    SERVED,
    ServedReader,
    held_out_prompts,
    served_labels,
    served_tokenizer,
)
from eagle3.data.toolcalls import ToolCallError, link_tool_calls
from eagle3.rundir.runroot import Manifest, atomic_write_json, fingerprint
from eagle3.target_io import load_tokenizer

logger = logging.getLogger(__name__)

BATCH = 512
# the writer buffers one row group: bounded, so memory does not grow with the source
ROW_GROUP_BYTES = 8 * 2**20
_TOKENIZER_LOCK = threading.Lock()
# 2: messages carry tool calls and reasoning, rows their tool declarations; 3: leading assistant
# turns dropped, every user turn of a gate prompt set (MT-bench's second turns) decontaminated
NORMALIZE_VERSION = "3"
# Characters that print nothing: whitespace, C0/C1 controls, soft hyphen, zero-width and bidi marks,
# word joiners, BOM. A turn made only of these is empty ("\x00\x01\x02" is no prompt); found by one
# C-level regex search.
_VISIBLE = re.compile(r"[^\s\x00-\x1f\x7f-\x9f\u00ad\u200b-\u200f\u202a-\u202e\u2060-\u2064\ufeff]")
_NEXT = {
    None: ("user",),
    "user": ("assistant",),
    "assistant": ("user", "tool"),
    "tool": ("tool", "assistant"),
}


def mix_lines(config: PipelineConfig, doc: dict[str, Any]) -> list[MixLine]:
    """The mix plan: rows planned per source from the catalog's available rows, weights and caps."""
    sources = [
        (s.label, source_record(doc, s.label)["rows"], s.weight, s.max_rows) for s in config.sources
    ]
    return plan_mix(sources, total=config.mix.total)


def spill_counts_path(out_dir: Path, label: str) -> Path:
    """``<prompts dir>/spill/<source>/counts.json``: written last, so its presence marks the
    source's rows on disk."""
    return Path(out_dir) / "spill" / label / "counts.json"


def source_counts(out_dir: Path, label: str) -> dict[str, Any] | None:
    """A source's counts once its rows are on disk (the finished stage's manifest, or its spill),
    else None."""
    manifest = Manifest.read(Path(out_dir))
    if manifest is not None:
        return manifest.stats["sources"].get(label)
    path = spill_counts_path(out_dir, label)
    return json.loads(path.read_text()) if path.exists() else None


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _blank(text: str) -> bool:
    """Whether ``text`` has no printable content (only whitespace, control and invisible format
    characters)."""
    return _VISIBLE.search(text) is None


def _texts(message: Message) -> list[str]:
    """Every string of a message: content, reasoning, calls."""
    calls = message.get("tool_calls") or []
    extra = [message.get("reasoning_content") or "", message.get("tool_call_id") or ""]
    return [message["content"], *extra, *(v for c in calls for v in c.values())]


def _nfc(message: Message) -> Message:
    """The message with its text NFC-normalized (call ids and arguments are data: kept as
    written)."""
    out = {**message, "content": unicodedata.normalize("NFC", message["content"])}
    if message.get("reasoning_content"):
        out["reasoning_content"] = unicodedata.normalize("NFC", message["reasoning_content"])
    if message.get("tool_calls"):
        out["tool_calls"] = [dict(c) for c in message["tool_calls"]]
    return out


def normalize_messages(messages: list[Message], cfg: NormalizeConfig) -> list[Message]:
    """Validated, NFC-normalized messages with the system-prompt policy applied; raises
    ``RowError``."""
    if not messages:
        raise RowError(EMPTY, "no messages")
    if any(_has_surrogate(t) for m in messages for t in _texts(m)):
        raise RowError(BAD_ENCODING, "invalid UTF-8 in a message")
    longest = max(sum(map(len, _texts(m))) for m in messages)
    if longest > cfg.max_message_chars:
        raise RowError(
            TOO_LONG,
            f"a message has {longest} chars > normalize.max_message_chars={cfg.max_message_chars}",
        )
    msgs = [_nfc(m) for m in messages]
    system = [m for m in msgs[:1] if m["role"] == "system"]
    body = msgs[len(system) :]
    if cfg.system_prompt_policy == "drop" or (system and _blank(system[0]["content"])):
        system = []
    if cfg.system_prompt_policy == "replace":
        system = [
            {"role": "system", "content": unicodedata.normalize("NFC", cfg.system_prompt or "")}
        ]
    if not body or any(_blank(m["content"]) for m in body if m["role"] != "assistant"):
        raise RowError(
            EMPTY,
            "no turns besides the system prompt"
            if not body
            else "a user/tool turn has no printable characters (blank, control or invisible only)",
        )
    if not any(m["role"] == "user" for m in body):
        raise RowError(NO_USER_TURN, "no user turn")
    # a leading reply answers a question the row does not have (ShareGPT's split parts): dropped
    body = list(dropwhile(lambda m: m["role"] == "assistant", body))
    prev = None
    for i, m in enumerate(body):
        if m["role"] not in _NEXT[prev]:
            raise RowError(NOT_ALTERNATING, f"turn {i}: {m['role']} after {prev or 'start'}")
        prev = m["role"]
    try:
        return system + link_tool_calls(body)
    except ToolCallError as err:
        raise RowError(err.reason, err.detail) from None


def prompt_turns(messages: list[Message]) -> list[str]:
    return [m["content"] for m in messages if m["role"] != "assistant"]


def sample_id(
    messages: list[Message], input_ids: list[int] | None = None, tools: str | None = None
) -> str:
    """Stable id: hash of the normalized non-assistant turns and tool declarations (or of the token
    ids for bare pre-tokenized rows)."""
    prompt: list[Any] = [[m["role"], m["content"]] for m in messages if m["role"] != "assistant"]
    if tools:
        prompt.append(["tools", tools])
    blob = (
        json.dumps(prompt, ensure_ascii=False)
        if prompt
        else "ids:" + ",".join(map(str, input_ids or []))
    )
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:32]


def tokenizer_identity(config: PipelineConfig) -> str:
    """Hash of the target tokenizer's vocabulary/merges and chat template (what too_long depends
    on)."""
    tok = load_tokenizer(config.target)
    backend = getattr(tok, "backend_tokenizer", None)
    vocab = backend.to_str() if backend is not None else json.dumps(sorted(tok.get_vocab().items()))
    return fingerprint(
        config.target.model_path, config.target.revision, vocab, tok.chat_template or ""
    )


def prompts_fingerprint(config: PipelineConfig, catalog_fp: str) -> str:
    """Fingerprint of the prompts stage: catalog, sources (incl. caps), mix, normalize, tokenizer,
    gate sets."""
    gate_sets = {
        k: v if v.startswith("hub:") else [v, Path(v).stat().st_size if Path(v).exists() else None]
        for k, v in config.gate.prompt_sets.items()
    }
    return fingerprint(
        NORMALIZE_VERSION,
        catalog_fp,
        [s.model_dump(mode="json") for s in config.sources],
        config.mix.model_dump(mode="json"),
        config.normalize.model_dump(mode="json"),
        tokenizer_identity(config),
        config.target.vocab_size,
        gate_sets,
        # what served rows may become; only with a served source (the others keep theirs)
        *([config.served.model_dump(mode="json")] if served_labels(config) else []),
    )


_DECONTAMINATORS: dict[str, Decontaminator] = {}
_DECONTAM_LOCK = threading.Lock()


def decontaminator(config: PipelineConfig) -> Decontaminator:
    """The index of the gate's prompts (its local sets, and the held-out served requests,
    ``eagle3.data.served.held_out_prompts``), built once per config."""
    key = config.model_dump_json(include={"gate", "normalize", "sources", "served", "target"})
    with _DECONTAM_LOCK:
        if key not in _DECONTAMINATORS:
            n = config.normalize
            prompts = [*load_prompt_sets(config.gate.prompt_sets), *held_out_prompts(config)]
            _DECONTAMINATORS[key] = Decontaminator(
                prompts, ngram=n.decontam_ngram, threshold=n.decontam_threshold
            )
        return _DECONTAMINATORS[key]


class _Books:
    """Per-source counters; quarantine rows are buffered and written in batches."""

    def __init__(self, label: str, qwriter: ShardWriter) -> None:
        self.label, self.qwriter = label, qwriter
        self.taken = 0
        self.kept = 0
        self.reasons: Counter[str] = Counter()
        self.pending: list[dict[str, Any]] = []

    def reject(self, index: int, reason: str, raw: Any) -> None:
        self.reasons[reason] += 1
        self.pending.append(
            {
                "source": self.label,
                "source_row": str(index),
                "reason": reason,
                "raw": truncate_raw(raw),
            }
        )
        if len(self.pending) >= BATCH:
            self.flush()

    def flush(self) -> None:
        self.qwriter.write_rows(self.pending)
        self.pending = []


def _check_tokens(conv: Converted, config: PipelineConfig) -> None:
    ids, mask = conv.input_ids or [], conv.loss_mask or []
    if not ids:
        raise RowError(EMPTY, "input_ids is empty")
    if len(ids) != len(mask):
        raise RowError(BAD_TOKENS, f"input_ids has {len(ids)} tokens, loss_mask {len(mask)}")
    vocab = config.target.vocab_size
    if min(ids) < 0 or max(ids) >= vocab:
        raise RowError(BAD_TOKENS, f"token ids outside [0, target.vocab_size={vocab})")
    if any(v not in (0, 1) for v in mask):
        raise RowError(BAD_TOKENS, "loss_mask values must be 0 or 1")
    if len(ids) > config.target.context_length:
        raise RowError(
            TOO_LONG, f"{len(ids)} tokens > target.context_length={config.target.context_length}"
        )


def _prepare(
    raw: RawRow, entry: catalog.DatasetEntry, columns: dict[str, str], config: PipelineConfig
) -> Converted:
    if raw.error is not None:
        raise RowError(raw.error, "unreadable row")
    conv = convert_row(entry, columns, raw.value)
    if conv.input_ids is not None:
        _check_tokens(conv, config)
        if conv.messages:
            conv.messages = normalize_messages(conv.messages, config.normalize)
        return conv
    conv.messages = normalize_messages(conv.messages, config.normalize)
    return conv


def _row(label: str, index: int, conv: Converted) -> dict[str, Any]:
    return {
        "sample_id": sample_id(conv.messages, conv.input_ids, conv.tools),
        "source": label,
        "source_row": str(index),
        "messages": conv.messages,
        "n_user_turns": sum(m["role"] == "user" for m in conv.messages),
        "meta": json.dumps(conv.meta, ensure_ascii=True, sort_keys=True),
        "input_ids": conv.input_ids,
        "loss_mask": conv.loss_mask,
        "tools": conv.tools,
    }


def _flush(
    batch: list[tuple[RawRow, Converted]],
    books: _Books,
    writer: ShardWriter,
    config: PipelineConfig,
) -> None:
    """Token-length and contamination checks for a batch of converted rows, then write the
    survivors."""
    limit = config.normalize.max_prompt_tokens
    texts = [
        "\n".join([*prompt_turns(c.messages), *([c.tools] if c.tools else [])]) for _r, c in batch
    ]
    long_idx = [
        i for i, t in enumerate(texts) if _utf8_len(t) > limit and batch[i][1].input_ids is None
    ]
    lengths = dict.fromkeys(range(len(batch)), 0)
    if long_idx:
        # per-source tasks share one tokenizer across threads; HF tokenizers are not reentrant
        with _TOKENIZER_LOCK:
            tokenizer = load_tokenizer(config.target)
            enc = tokenizer([texts[i] for i in long_idx], add_special_tokens=False)["input_ids"]
        lengths.update({i: len(ids) for i, ids in zip(long_idx, enc, strict=True)})
    decon = decontaminator(config)
    rows = []
    for i, (raw, conv) in enumerate(batch):
        if lengths[i] > limit:
            books.reject(raw.index, TOO_LONG, raw.value)
            continue
        user = [m["content"] for m in conv.messages if m["role"] == "user"]
        hit = decon.match(user) if len(decon) else None
        if hit is not None:
            books.reject(raw.index, CONTAMINATED, {"benchmark": hit, "row": raw.value})
            continue
        rows.append(_row(books.label, raw.index, conv))
    books.kept += len(rows)
    writer.write_rows(rows)


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8"))


def _stream(
    config: PipelineConfig,
    source: SourceConfig,
    files: list[Path],
    selector: Selector,
    books: _Books,
    writer: ShardWriter,
    on_progress: Callable[[int], None] | None,
) -> dict[str, int] | None:
    """Normalize the selected rows of one source; returns what a served source's filters dropped."""
    entry = catalog.get(source.adapter)
    columns = {**entry.columns, **source.columns}
    served = None
    if entry.row_format == SERVED:
        served = ServedReader.open(config, files, served_tokenizer(config))
    batch: list[tuple[RawRow, Converted]] = []
    for raw in served.rows() if served else iter_rows(files):
        if not selector.take():
            continue
        books.taken += 1
        try:
            if served is not None:
                conv = _prepare_served(served, raw, config)
                raw = RawRow(raw.index, served.view(conv))  # what a later quarantine row keeps
            else:
                conv = _prepare(raw, entry, columns, config)
            batch.append((raw, conv))
        except RowError as err:
            kept = getattr(err, "raw", None) or (raw.value if raw.error is None else raw.raw)
            books.reject(raw.index, err.reason, kept)
        if len(batch) >= BATCH:
            _flush(batch, books, writer, config)
            batch = []
            if on_progress:
                on_progress(books.taken)
    _flush(batch, books, writer, config)
    return dict(sorted(served.filters.items())) if served else None


def _prepare_served(served: ServedReader, raw: RawRow, config: PipelineConfig) -> Converted:
    """A served record's row (``eagle3.data.served``): its ids are fixed as served, so its turns
    are checked as they are (no system-prompt policy rewrites a prompt already answered)."""
    conv = served.convert(raw)
    _check_tokens(conv, config)
    as_served = config.normalize.replace(system_prompt_policy="keep")
    conv.messages = normalize_messages(conv.messages, as_served)
    return conv


def _run_source(
    config: PipelineConfig,
    source: SourceConfig,
    record: dict[str, Any],
    planned: int,
    out: Path,
    on_progress: Callable[[int], None] | None,
) -> dict[str, Any]:
    selector = Selector(
        available=record["rows"], planned=planned, seed=config.mix.seed, source=source.label
    )
    files = [Path(f["path"]) for f in record["files"]]
    with ShardWriter(out, PROMPT_SCHEMA, prefix="spill", row_group_bytes=ROW_GROUP_BYTES) as writer:
        with ShardWriter(
            out, QUARANTINE_SCHEMA, prefix="quarantine", row_group_bytes=ROW_GROUP_BYTES
        ) as qwriter:
            books = _Books(source.label, qwriter)
            filters = _stream(config, source, files, selector, books, writer, on_progress)
            books.flush()
            quarantine = qwriter.close()
        spill = writer.close()
    if books.taken != books.kept + sum(books.reasons.values()):
        raise RuntimeError(
            f"{source.label}: books do not balance ({books.taken} in, {books.kept} kept, {books.reasons})"
        )
    return {
        **({"filters": filters} if filters is not None else {}),
        "source": source.label,
        "in": books.taken,
        "kept": books.kept,
        "quarantined": dict(sorted(books.reasons.items())),
        "spill": str(spill[0].path) if spill else None,
        "quarantine": str(quarantine[0].path) if quarantine else None,
    }


def normalize_source(
    config: PipelineConfig,
    source: SourceConfig,
    catalog_dir: Path,
    out_dir: Path,
    *,
    on_progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Normalize one source into ``<out_dir>/spill/<source>/`` (prompt rows + quarantine) and return
    its counts.

    ``out_dir`` is the prompts stage directory; when its manifest exists the stage is done and the
    recorded counts are returned without work. A finished source (``counts.json`` written last) is
    not redone either.
    """
    done = source_counts(out_dir, source.label)
    if done is not None:
        return done
    counts_path = spill_counts_path(out_dir, source.label)
    doc = load_catalog(catalog_dir)
    line = next(m for m in mix_lines(config, doc) if m.source == source.label)
    counts = _run_source(
        config,
        source,
        source_record(doc, source.label),
        line.planned,
        counts_path.parent,
        on_progress,
    )
    counts |= {"available": line.available, "planned": line.planned}
    atomic_write_json(counts_path, counts)
    logger.info(
        "%s: %d in, %d kept, quarantined %s",
        source.label,
        counts["in"],
        counts["kept"],
        counts["quarantined"],
    )
    return counts
