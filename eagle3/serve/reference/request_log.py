"""Request logs as SGLang 0.5.23 writes them (``--log-requests*``), so served traffic reads the same
from either engine (``eagle3.data.served_log`` is the reader; its docstring describes the format).

The same flags, the same files and lines: ``<dir>/<hostname>_0.log`` per ``--log-requests-target``
directory (or stdout), rotated hourly by ``TimedRotatingFileHandler``, each line ``[YYYY-mm-dd
HH:MM:SS] `` + JSON in the ``json`` format; ``request.received`` when a request is admitted,
``request.finished`` when its answer is sent, ``request.received.openai`` (level >= 2) with a chat
request's raw payload, health probes under SGLang's ``HEALTH_CHECK_`` rids. The levels keep what
SGLang's keep: 0 drops the prompt, the output and the sampling parameters, 1 keeps the sampling
parameters, 2 cuts lists and strings over 2048 items to head + ``"..."`` + tail, 3 keeps everything.
Headers named in ``SGLANG_LOG_REQUEST_HEADERS`` (comma-separated) and ``x-smg-routing-key`` are
logged, as SGLang does. ``obj`` holds the request fields the reference server takes (``rid``,
``text``, ``input_ids``, ``sampling_params``, ``stream``); SGLang's holds every field of its
``GenerateReqInput``, which no reader of served traffic needs. The ``text`` format writes the same
events as one readable line each.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
from collections.abc import Mapping
from datetime import datetime
from logging.handlers import TimedRotatingFileHandler
from pathlib import Path
from typing import Any

HEALTH_CHECK_PREFIX = "HEALTH_CHECK"
ROUTING_HEADER = "x-smg-routing-key"
_SKIP = {  # the fields SGLang's levels 0 and 1 leave out of obj / out
    0: ({"text", "input_ids", "sampling_params"}, {"text", "output_ids"}),
    1: ({"text", "input_ids"}, {"text", "output_ids"}),
}
_CUT = 2048  # level 2's longest list or string


def add_flags(parser: argparse.ArgumentParser) -> None:
    """SGLang's request-logging flags, with its defaults."""
    group = parser.add_argument_group(
        "request logs (SGLang's flags; eagle3.serve.reference.request_log)"
    )
    group.add_argument(
        "--log-requests", action="store_true", help="Log every request and its answer."
    )
    group.add_argument(
        "--log-requests-level",
        type=int,
        default=2,
        choices=[0, 1, 2, 3],
        help="0: metadata, 1: + sampling params, 2: + inputs/outputs cut at 2048, 3: everything.",
    )
    group.add_argument("--log-requests-format", default="text", choices=["text", "json"])
    group.add_argument(
        "--log-requests-target",
        nargs="+",
        default=None,
        help="stdout and/or directories (<dir>/<hostname>_0.log, rotated hourly).",
    )


def _logger(target: str) -> logging.Logger:
    if target.lower() == "stdout":
        name, handler = f"{__name__}.stdout", logging.StreamHandler(sys.stdout)
    else:
        os.makedirs(target, exist_ok=True)
        path = Path(target) / f"{socket.gethostname()}_0.log"
        name = f"{__name__}.file.{path}"
        handler = TimedRotatingFileHandler(path, when="H", backupCount=0, encoding="utf-8")
    logger = logging.getLogger(name)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    if not logger.handlers:
        handler.setFormatter(
            logging.Formatter("[%(asctime)s] %(message)s", datefmt="%Y-%m-%d %H:%M:%S")
        )
        logger.addHandler(handler)
    return logger


def _cut(value: Any, limit: int) -> Any:
    """Level 2's shortening: a string or list over ``limit`` keeps its first and last ``limit // 2``
    items."""
    half = limit // 2
    if isinstance(value, str) and len(value) > limit:
        return value[:half] + "..." + value[-half:]
    if isinstance(value, (list, tuple)):
        items = [_cut(v, limit) for v in value]
        return [*items[:half], "...", *items[-half:]] if len(items) > limit else items
    if isinstance(value, dict):
        return {k: _cut(v, limit) for k, v in value.items()}
    return value


class RequestLog:
    """The logger of one server (``build_app`` keeps one when ``--log-requests`` is on)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.level, self.format = args.log_requests_level, args.log_requests_format
        self.targets = [_logger(t) for t in (args.log_requests_target or ["stdout"])]
        extra = os.environ.get("SGLANG_LOG_REQUEST_HEADERS", "")
        self.headers = [ROUTING_HEADER, *(h.strip().lower() for h in extra.split(",") if h.strip())]

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RequestLog | None:
        return cls(args) if getattr(args, "log_requests", False) else None

    def _shape(self, data: Mapping[str, Any], skip: set[str]) -> dict[str, Any]:
        kept = {k: v for k, v in data.items() if k not in skip}
        return _cut(kept, _CUT) if self.level == 2 else kept

    def _emit(self, event: str, data: dict[str, Any], headers: Mapping[str, str] | None) -> None:
        picked = {h: v for h in self.headers if (v := (headers or {}).get(h))}
        if picked:
            data["headers"] = picked
        if self.format == "json":
            line = json.dumps(
                {"timestamp": datetime.now().isoformat(), "event": event, **data},
                ensure_ascii=False,
            )
        else:
            line = f"{event}: " + ", ".join(f"{k}={v!r}" for k, v in data.items())
        for target in self.targets:
            target.info(line)

    def received(
        self, body: dict[str, Any], req: Any, headers: Mapping[str, str], *, chat: bool
    ) -> None:
        """A request admitted (``req``: the parsed ``GenerateRequest``; ``body``: what the client
        sent). A chat request first logs its raw payload (level >= 2) as
        ``request.received.openai``, without a rid."""
        if chat and self.level >= 2:
            self._emit("request.received.openai", {"obj": _cut(body, _CUT)}, headers)
        skip = _SKIP.get(self.level, (set(), set()))[0]
        obj = _obj(body, req, chat=chat)
        self._emit("request.received", {"rid": req.rid, "obj": self._shape(obj, skip)}, headers)

    def finished(
        self,
        body: dict[str, Any],
        req: Any,
        out: dict[str, Any],
        headers: Mapping[str, str],
        *,
        chat: bool,
        tokenizer: Any = None,
    ) -> None:
        """A request answered: ``out`` = text, output_ids, meta_info. From level 2, a prompt sent as
        ids is also logged as text (the tokenizer's decoding, special tokens kept), as SGLang's
        logger adds it."""
        skip_obj, skip_out = _SKIP.get(self.level, (set(), set()))
        obj = _obj(body, req, chat=chat)
        if self.level >= 2 and obj["text"] is None and tokenizer is not None:
            obj["text"] = tokenizer.decode(req.input_ids, skip_special_tokens=False)
        data = {
            "rid": req.rid,
            "obj": self._shape(obj, skip_obj),
            "out": self._shape(out, skip_out),
        }
        self._emit("request.finished", data, headers)


def _obj(body: dict[str, Any], req: Any, *, chat: bool) -> dict[str, Any]:
    """The request as SGLang's tokenizer manager logs it: a chat request as the rendered ids it
    became, a ``/generate`` request with the prompt the client sent (text or ids) and its sampling
    parameters as sent."""
    if chat:
        params = {k: v for k, v in vars(req.params).items() if v is not None}
        return {
            "rid": req.rid,
            "text": None,
            "input_ids": list(req.input_ids),
            "sampling_params": params,
            "stream": False,
        }
    text = body.get("text")
    return {
        "rid": req.rid,
        "text": text,
        "input_ids": None if text is not None else list(req.input_ids),
        "sampling_params": body.get("sampling_params") or {},
        "stream": bool(body.get("stream")),
    }
