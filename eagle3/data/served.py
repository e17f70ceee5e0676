"""Served traffic as a data source: SGLang request logs -> pre-tokenized prompt rows that skip
regeneration.

A request the target answered is a prompt of the real mix with the target's own answer, at the
sampling its user asked for: what regeneration produces, already produced. A ``served`` source
(``eagle3 datasets list``) points at a log directory (``eagle3.data.served_log``); each finished
request becomes one row whose ``input_ids`` are the prompt ids exactly as served followed by the
output ids exactly as served, and whose ``loss_mask`` covers the output only (earlier assistant
turns in a multi-turn prompt were the client's history, not this answer). Regen passes such rows
through without a server, capture reads them as it reads any row.

Per request, in this order (the first rule that applies names the quarantine reason):

1. the log record itself: ``malformed``, ``partial``, ``unfinished``, ``unmatched``, ``duplicate``
   (``served_log``);
2. the user's filters (``served.drop_headers``, ``served.hook``, ``served.drop_patterns``):
   ``filtered``, first, so a request a filter drops never reaches the quarantine with its content
   (its ``raw`` is the rid, the file and line and the filter);
3. ``health_check`` (rid ``HEALTH_CHECK...``), ``aborted``, ``cut_short`` (``finish_reason: length``
   unless ``served.keep_truncated``);
4. ``no_content``: ids dropped or cut by a log level below 3, or counts that disagree with
   ``meta_info``;
5. ``held_out``: the request's key hashes below ``served.held_out`` (the gate's served prompt set);
6. ``template_mismatch``: the prompt is not the target's chat template over some turns
   (``eagle3.data.template_inverse``), e.g. raw text, or traffic rendered for another model;
7. then the normalizer's usual checks: ids outside the vocabulary, context length, decontamination
   against the gate's prompts, exact and near duplicates against every other source (a served row
   wins a tie: it costs no regeneration).

Each row's ``meta`` records its provenance: ``served`` = the server (log file stem), the rid, the
file and line, received and finished times, the sampling parameters the user sent, the finish
reason, the latency and, from a speculative server, the accept length. A log directory may hold
``server_info.json`` (``/server_info`` of the server that wrote it; the project's launcher writes
one): a model path or revision other than the target's refuses the whole source before any row is
read (``check_provenance``).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import re
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle3.config.pipeline import PipelineConfig
from eagle3.data.adapters import Converted, RowError
from eagle3.data.readers import RawRow, truncate_raw
from eagle3.data.schema import (
    ABORTED,
    CUT_SHORT,
    FILTERED,
    HEALTH_CHECK,
    HELD_OUT,
    MALFORMED,
    NO_CONTENT,
    TEMPLATE_MISMATCH,
)
from eagle3.data.served_log import SERVER_INFO_FILE, LogReject, ServedRequest, iter_log
from eagle3.data.template_inverse import Glue, TemplateMismatch, learn_glue, recover_messages
from eagle3.errors import DataError

SERVED = "served"  # the row format of served sources (eagle3.data.catalog)
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "max_new_tokens", "sampling_seed")
SPEC_KEYS = ("spec_accept_length", "spec_verify_ct")
Hook = Callable[[ServedRequest], "str | None"]


class ServedRowError(RowError):
    """A served request that does not become a row; ``raw`` is what the quarantine keeps of it."""

    def __init__(self, reason: str, detail: str, raw: str) -> None:
        super().__init__(reason, detail)
        self.raw = raw


def served_labels(config: PipelineConfig) -> set[str]:
    """The labels of the config's served sources."""
    from eagle3.data import catalog

    return {s.label for s in config.sources if catalog.get(s.adapter).row_format == SERVED}


def held_out(key: str, share: float) -> bool:
    """Whether a request key falls in the held-out share (a fixed hash of the key, so stable across
    nights)."""
    point = int(hashlib.sha256(f"held-out:{key}".encode()).hexdigest()[:8], 16)
    return share > 0 and point < share * 2**32


def load_hook(spec: str | None) -> Hook | None:
    if spec is None:
        return None
    module, _, name = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise DataError(
            f"served.hook {spec!r} cannot be loaded ({exc}); make the module importable"
        ) from exc
    if not callable(fn):
        raise DataError(f"served.hook {spec!r} is not a function")
    return fn


def check_provenance(config: PipelineConfig, log_dir: Path) -> dict[str, Any] | None:
    """The ``server_info.json`` of a log directory (None when it has none); raises ``DataError``
    naming both when it was served by another model or revision than the target."""
    path = log_dir / SERVER_INFO_FILE if log_dir.is_dir() else log_dir.parent / SERVER_INFO_FILE
    if not path.is_file():
        return None
    info = json.loads(path.read_text())
    target = config.target
    served = (str(info.get("model_path") or ""), info.get("revision"))
    same_model = (
        Path(served[0]).expanduser() == Path(target.model_path).expanduser()
        or served[0] == target.model_path
    )
    if not same_model or (served[1] or None) != (target.revision or None):
        by = f"{served[0]}@{served[1] or 'default'}"
        raise DataError(
            f"served logs {log_dir} were written by {by}, the target is {target.model_path}@"
            f"{target.revision or 'default'}: rows answered by another model or revision are not "
            "the target's; point the source at the target's logs"
        )
    return info


def served_tokenizer(config: PipelineConfig) -> Any:
    """A tokenizer of the target for one served source alone: normalization runs sources on threads,
    and a fast tokenizer used from two threads at once fails (``Already borrowed``)."""
    from eagle3.target_io import load_own_tokenizer

    return load_own_tokenizer(config.target)


def _compact(req: ServedRequest, detail: str, **extra: Any) -> str:
    return truncate_raw(
        {"rid": req.rid, "file": req.file, "line": req.line, "detail": detail, **extra}
    )


def _prompt_id(messages: list[dict[str, Any]]) -> str:
    # normalize reads served sources through this module
    from eagle3.data.normalize import sample_id

    return sample_id(messages)


def _ints(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        return value
    return None


@dataclass
class ServedReader:
    """Reads one served source: its records as raw rows, and each record converted (module
    docstring)."""

    config: PipelineConfig
    files: Sequence[Path]
    tokenizer: Any
    glue: Glue | None = None
    hook: Hook | None = None
    filters: Counter[str] = field(default_factory=Counter)  # filter -> requests it dropped
    _held: set[str] | None = None  # prompt ids of the held-out requests, read on first use

    @classmethod
    def open(cls, config: PipelineConfig, files: Sequence[Path], tokenizer: Any) -> ServedReader:
        try:
            glue: Glue | None = learn_glue(tokenizer)
        except TemplateMismatch:
            glue = None  # every prompt is then a template_mismatch, named per row
        return cls(config, files, tokenizer, glue, load_hook(config.served.hook))

    def rows(self) -> Iterator[RawRow]:
        for index, record in enumerate(iter_log(self.files)):
            if isinstance(record, LogReject):
                yield RawRow(
                    index,
                    None,
                    record.reason,
                    truncate_raw(
                        {
                            "file": record.file,
                            "line": record.line,
                            "detail": record.detail,
                            "raw": record.raw,
                        }
                    ),
                )
            else:
                yield RawRow(index, record)

    def convert(self, raw: RawRow) -> Converted:
        """The row of one record; raises ``ServedRowError`` with the quarantine reason and a compact
        raw."""
        if raw.error is not None:
            raise ServedRowError(raw.error, "unreadable log record", raw.raw)
        req: ServedRequest = raw.value
        try:
            prompt, output, messages = self.read(req)
        except ServedRowError as err:
            if err.reason == FILTERED:
                self.filters[err.detail] += 1
            raise
        share = self.config.served.held_out
        if held_out(req.key, share) or (share and _prompt_id(messages) in self._held_prompts()):
            raise ServedRowError(
                HELD_OUT,
                "in the gate's served prompt set (or the same prompt as one)",
                _compact(req, "held out"),
            )
        answer = self.tokenizer.decode(output, skip_special_tokens=True)
        return Converted(
            [*messages, {"role": "assistant", "content": answer}],
            meta=self._meta(req),
            input_ids=prompt + output,
            loss_mask=[0] * len(prompt) + [1] * len(output),
        )

    def read(self, req: ServedRequest) -> tuple[list[int], list[int], list[dict[str, Any]]]:
        """Prompt ids, output ids and the prompt's turns of a usable request (rules 2-4 and 6 of the
        module docstring); raises ``ServedRowError``."""
        self._filter(req)
        self._finished(req)
        prompt, output = self._ids(req)
        return prompt, output, self._messages(req, prompt)

    def held_out_requests(self) -> list[tuple[ServedRequest, list[dict[str, Any]]]]:
        """The usable requests whose key falls in ``served.held_out``, with their prompt's turns:
        the gate's served prompt set (``eagle3.gate.served_profile``)."""
        out = []
        for record in iter_log(self.files):
            if isinstance(record, ServedRequest) and held_out(
                record.key, self.config.served.held_out
            ):
                try:
                    out.append((record, self.read(record)[2]))
                except ServedRowError:
                    continue
        return out

    @staticmethod
    def view(conv: Converted) -> dict[str, Any]:
        """A row as a quarantine row keeps it: where it was logged and the head of its last user
        turn."""
        served = conv.meta["served"]
        user = next((m["content"] for m in reversed(conv.messages) if m["role"] == "user"), "")
        return {k: served[k] for k in ("rid", "file", "line")} | {"prompt": user[:200]}

    def _held_prompts(self) -> set[str]:
        if self._held is None:
            self._held = {_prompt_id(messages) for _req, messages in self.held_out_requests()}
        return self._held

    def _texts(self, req: ServedRequest) -> list[str]:
        texts = []
        for ids, text in (
            (_ints(req.input_ids), req.prompt_text),
            (_ints(req.output_ids), req.output_text),
        ):
            texts.append(
                self.tokenizer.decode(ids, skip_special_tokens=False) if ids else text or ""
            )
        return texts

    def _filter(self, req: ServedRequest) -> None:
        cfg = self.config.served
        hit = next((f"header:{h}" for h in cfg.drop_headers if h in req.headers), None)
        if hit is None and self.hook is not None:
            said = self.hook(req)
            hit = f"hook:{said}" if said else None
        if hit is None and cfg.drop_patterns:
            texts = self._texts(req)
            hit = next(
                (f"pattern:{p}" for p in cfg.drop_patterns if any(re.search(p, t) for t in texts)),
                None,
            )
        if hit is not None:
            raise ServedRowError(
                FILTERED,
                hit,
                truncate_raw({"rid": req.rid, "file": req.file, "line": req.line, "filter": hit}),
            )

    def _finished(self, req: ServedRequest) -> None:
        kind = req.finish_type
        if req.health_check:
            raise ServedRowError(
                HEALTH_CHECK, "the server's own health probe", _compact(req, "health check")
            )
        if kind == "abort":
            raise ServedRowError(
                ABORTED, "finish_reason abort", _compact(req, "aborted", meta=req.meta_info)
            )
        if kind == "length" and not self.config.served.keep_truncated:
            raise ServedRowError(
                CUT_SHORT,
                "finish_reason length (served.keep_truncated=true keeps it)",
                _compact(req, "cut at max_new_tokens"),
            )
        if kind not in ("stop", "length"):
            raise ServedRowError(
                MALFORMED, f"finish_reason {kind!r}", _compact(req, f"finish_reason {kind!r}")
            )

    def _ids(self, req: ServedRequest) -> tuple[list[int], list[int]]:
        meta = req.meta_info
        prompt = _ints(req.input_ids)
        if prompt is None and isinstance(req.prompt_text, str) and req.input_ids is None:
            # as SGLang tokenizes a text prompt
            prompt = list(self.tokenizer(req.prompt_text)["input_ids"])
        output = _ints(req.output_ids)
        problem = None
        if prompt is None or output is None:
            problem = "prompt or output ids are missing or cut (serve with --log-requests-level 3)"
        elif meta.get("prompt_tokens") not in (None, len(prompt)):
            problem = (
                f"{len(prompt)} prompt ids but meta_info.prompt_tokens={meta['prompt_tokens']}"
            )
        elif meta.get("completion_tokens") not in (None, len(output)):
            claimed = meta["completion_tokens"]
            problem = f"{len(output)} output ids but meta_info.completion_tokens={claimed}"
        if problem is not None or not prompt or not output:
            problem = problem or "an empty prompt or answer"
            raise ServedRowError(NO_CONTENT, problem, _compact(req, problem))
        assert prompt is not None and output is not None
        return prompt, output

    def _messages(self, req: ServedRequest, prompt: list[int]) -> list[dict[str, Any]]:
        try:
            if self.glue is None:
                raise TemplateMismatch(
                    "the target's chat template does not render a plain conversation"
                )
            return recover_messages(self.tokenizer, prompt, self.glue)
        except TemplateMismatch as exc:
            head = self.tokenizer.decode(prompt[:64], skip_special_tokens=False)
            raise ServedRowError(
                TEMPLATE_MISMATCH, str(exc), _compact(req, str(exc), prompt_head=head)
            ) from None

    def _meta(self, req: ServedRequest) -> dict[str, Any]:
        meta = req.meta_info
        served = {
            "server": Path(req.file).name.split(".log")[0],
            "rid": req.rid,
            "key": req.key,
            "file": req.file,
            "line": req.line,
            "received_at": req.received_at,
            "finished_at": req.finished_at,
            "sampling": {
                k: req.sampling_params[k] for k in SAMPLING_KEYS if k in req.sampling_params
            },
            "finish_reason": req.finish_type,
            "e2e_latency": meta.get("e2e_latency"),
        } | {k: meta[k] for k in SPEC_KEYS if k in meta}
        route = req.headers.get(self.config.scaling.served_domain_header.lower())
        return {"license": "served", "served": served, **({"route": route} if route else {})}


def held_out_prompts(config: PipelineConfig) -> list[tuple[str, str]]:
    """``(id, user turn)`` of every held-out request of the config's local served sources: what
    normalization decontaminates every source against, as it does the gate's prompt sets."""
    if not config.served.held_out:
        return []
    from eagle3.data import catalog
    from eagle3.data.served_log import log_files

    out = []
    for source in config.sources:
        if catalog.get(source.adapter).row_format != SERVED or not source.path:
            continue
        reader = ServedReader.open(config, log_files(source.path), served_tokenizer(config))
        for req, messages in reader.held_out_requests():
            users = [m["content"] for m in messages if m["role"] == "user"]
            out += [(f"served/{req.rid}/{i}", text) for i, text in enumerate(users)]
    return out
