"""What the benchmark scripts' command lines share (imported by name: a script run as ``python
benchmarks/x.py`` has this folder on its path). Standard library only; torch is imported when a
script that uses it starts it."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def benchmark_parser(doc: str, *, quick: str) -> argparse.ArgumentParser:
    """A script's parser: its docstring's first line, ``--quick`` (``quick`` says what it shrinks
    to) and ``--rounds`` (arms alternate within each round, so a drift of the shared machine favours
    none)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternating rounds (>= 3 for a spread)"
    )
    return parser


def add_target_options(
    parser: argparse.ArgumentParser,
    *,
    hidden: int,
    layers: int,
    samples: int,
    devices: list[str] | None = None,
) -> None:
    """The capture benchmarks' tiny target and rows: ``--hidden``, ``--layers``, ``--samples``,
    ``--dtype``, ``--device`` (one of ``devices`` when given; CUDA when there is one),
    ``--threads``."""
    import torch

    parser.add_argument("--hidden", type=int, default=hidden)
    parser.add_argument("--layers", type=int, default=layers)
    parser.add_argument("--samples", type=int, default=samples)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=devices
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="torch intra-op threads (default: torch's)"
    )


def start_torch(args: Any, *, quick: tuple[int, int, int]) -> None:
    """Apply ``add_target_options``' ``--threads``, ``--quick`` (``quick``: hidden, layers, samples)
    and seed torch."""
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.hidden, args.layers, args.samples = quick
    torch.manual_seed(0)


def resumable(
    path: Path | None, key: dict[str, Any], run: Callable[[], dict[str, Any]]
) -> dict[str, Any]:
    """``run()``'s result, kept at ``path`` (``--resume``) under ``key`` (the arguments that change
    results) and reused from there while the key is the same."""
    if path is not None and path.exists() and json.loads(path.read_text())["key"] == key:
        print(f"reused {path}", flush=True)
        return json.loads(path.read_text())["result"]
    result = run()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.with_suffix(".tmp").write_text(json.dumps({"key": key, "result": result}))
        path.with_suffix(".tmp").replace(path)
    return result


def publish(summary: dict[str, Any], results: list[dict[str, Any]], out: Path | None) -> None:
    """Print the summary; with ``out``, write it with every result as JSON there."""
    if out is not None:
        out.write_text(json.dumps({"summary": summary, "results": results}, indent=1))
    print(json.dumps(summary, indent=2))
