"""Command-line arguments of the reference server (argparse: the library cannot import typer).

Flag spellings follow ``sglang.launch_server`` where SGLang has the flag (``--model-path``,
``--context-length``, ``--max-running-requests``, ``--max-queued-requests``, the ``--speculative-*``
family), so the same generated launch line can point at either server. ``--speculative-algorithm
EAGLE3`` (or ``EAGLE``) with a draft runs chain speculative decoding (greedy, or speculative
sampling for a request with a temperature) (``eagle3.serve.reference.spec_engine``) and every
speculative flag is reported by ``/server_info``. ``--reasoning-parser`` splits
``/v1/chat/completions`` replies into ``reasoning_content`` and ``content`` as SGLang's does.
``--fault-*`` flags exist for tests only and ``--synthetic-*`` only for the client-scaling
benchmark.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eagle3.data.dialect import REASONING_FORMATS
from eagle3.serve.reference.request_log import add_flags as add_log_flags


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="eagle3 serve",
        description="Reference server: a transformers causal LM behind SGLang's HTTP API.",
    )
    p.add_argument(
        "--model",
        "--model-path",
        dest="model_path",
        help="Model directory (save_pretrained layout).",
    )
    p.add_argument(
        "--tokenizer-path", default=None, help="Tokenizer directory (default: the model directory)."
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument(
        "--context-length",
        type=int,
        default=None,
        help="Default: the model's max_position_embeddings.",
    )
    p.add_argument(
        "--max-running-requests", type=int, default=32, help="Sequences decoded together per step."
    )
    p.add_argument(
        "--max-queued-requests", type=int, default=None, help="Waiting-queue cap; 503 when full."
    )
    p.add_argument(
        "--prefix-cache-tokens",
        type=int,
        default=8192,
        help="Tokens of finished sequences kept to serve prompts that start with them (0: off); "
        "8,192 is the token pool of the project's SGLang CPU launch.",
    )
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--random-seed", type=int, default=0)
    p.add_argument(
        "--num-threads", type=int, default=None, help="torch intra-op threads (default: torch's)."
    )
    p.add_argument(
        "--request-log",
        default=None,
        help="Append the rid of every completed request to this file.",
    )
    p.add_argument("--log-level", default="info")
    p.add_argument(
        "--reasoning-parser",
        default=None,
        choices=sorted(REASONING_FORMATS),
        help="Split a chat reply's thinking into reasoning_content (SGLang's flag; eagle3.data.dialect).",
    )
    add_log_flags(p)
    spec = p.add_argument_group(
        "speculative decoding (SGLang flags; a draft is run as chain speculation)"
    )
    spec.add_argument(
        "--speculative-algorithm",
        default=None,
        help="EAGLE3, or EAGLE (the draft sees the last hidden state only).",
    )
    spec.add_argument(
        "--speculative-draft-model-path", default=None, help="Draft export directory."
    )
    spec.add_argument(
        "--speculative-num-steps",
        type=int,
        default=None,
        help="Draft tokens per verify (default 3).",
    )
    spec.add_argument(
        "--speculative-eagle-topk", type=int, default=None, help="Above 1 still drafts a chain."
    )
    spec.add_argument(
        "--speculative-num-draft-tokens",
        type=int,
        default=None,
        help="Reported only: a chain verifies num-steps.",
    )
    spec.add_argument(
        "--speculative-accept-threshold-single",
        type=float,
        default=1.0,
        help="Sampled verify: accept a draft whose target probability reaches this "
        "(1.0: exact; lower is lossy).",
    )
    spec.add_argument(
        "--speculative-accept-threshold-acc",
        type=float,
        default=1.0,
        help="Sampled verify: accept a draft when the coin < its target probability / this "
        "(1.0: exact).",
    )
    faults = p.add_argument_group("fault injection (tests only)")
    faults.add_argument(
        "--fault-fail-rate",
        type=float,
        default=0.0,
        help="Answer 500 to this fraction of /generate.",
    )
    faults.add_argument(
        "--fault-extra-latency", type=float, default=0.0, help="Seconds added to every /generate."
    )
    faults.add_argument(
        "--fault-crash-after",
        type=int,
        default=None,
        help="Answer N requests, then admit none and exit (code 70).",
    )
    faults.add_argument(
        "--fault-bad-request-every", type=int, default=None, help="Answer 400 to every Nth request."
    )
    faults.add_argument(
        "--fault-stall-first-s",
        type=float,
        default=0.0,
        help="Hold the first generation request this many seconds.",
    )
    faults.add_argument(
        "--fault-slow-s", type=float, default=0.0, help="Seconds added to each slow-block request."
    )
    faults.add_argument(
        "--fault-slow-fraction",
        type=float,
        default=0.0,
        help="Fraction of request blocks that are slow (seeded).",
    )
    faults.add_argument(
        "--fault-slow-block",
        type=int,
        default=1,
        help="Consecutive requests per block (a slowdown lasts a while).",
    )
    faults.add_argument("--fault-seed", type=int, default=0)
    synth = p.add_argument_group("synthetic load mode (client-scaling benchmark only: no model)")
    synth.add_argument(
        "--synthetic-tokens", type=int, default=None, help="Return N tokens per request, no model."
    )
    synth.add_argument(
        "--synthetic-delay", type=float, default=0.0, help="Seconds before a synthetic reply."
    )
    return p


def _looks_local(model: str) -> bool:
    """A filesystem path rather than a Hub id (``org/name``): absolute, relative with ``./``, or
    ``~``."""
    return model.startswith(("/", "./", "../", "~")) or Path(model).exists()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.synthetic_tokens is None and not args.model_path:
        parser.error("--model PATH is required (or --synthetic-tokens N for the load benchmark)")
    if (
        args.model_path
        and _looks_local(args.model_path)
        and not Path(args.model_path).expanduser().is_dir()
    ):
        parser.exit(
            2,
            f"{parser.prog}: error: --model {args.model_path}: no such model directory (pass a local HF "
            "model dir or a Hub id)\n",
        )  # one line: the usage text would bury it
    if args.synthetic_tokens is not None and args.synthetic_tokens <= 0:
        parser.error("--synthetic-tokens must be > 0")
    for name in ("fault_fail_rate", "fault_slow_fraction"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            parser.error(f"--{name.replace('_', '-')} must be in [0, 1]")
    for name in (
        "fault_crash_after",
        "fault_bad_request_every",
        "fault_slow_block",
        "max_queued_requests",
    ):
        value = getattr(args, name)
        if value is not None and value <= 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0")
    spec = [
        args.speculative_num_steps,
        args.speculative_eagle_topk,
        args.speculative_num_draft_tokens,
    ]
    if any(v is not None for v in spec) and not all(v is not None for v in spec):
        parser.error(
            "set all three of --speculative-num-steps, --speculative-eagle-topk, --speculative-num-draft-tokens "
            "or none (SGLang's rule)"
        )
    return args


def server_info(args: argparse.Namespace) -> dict[str, Any]:
    """Resolved server args as ``/server_info`` reports them (SGLang key names)."""
    info = {k: v for k, v in vars(args).items()}
    info["model_path"] = args.model_path or "synthetic"
    info["tokenizer_path"] = args.tokenizer_path or args.model_path
    return info
