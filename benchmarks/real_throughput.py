"""Regen and capture throughput on the real target (SmolLM2-135M-Instruct, float32, one torch
thread): tok/s per engine and concurrency against a bare batched forward of the same model, side by
side in one run.

    python benchmarks/real_throughput.py [--recipe smollm2] [--levels 1 4 16 64]
        [--max-new-tokens 64] [--engines reference sglang] [--rounds 2] [--capture] [--quick]

Prompts are ShareGPT's first user turns (the world's file, as regen sends them: chat template,
default system prompt), at most 256 tokens. Every arm runs under ``CPU_THREADS`` torch threads, as
the pipeline runs them.

- **bound** (decode): the model alone in a process of its own session (as each server runs:
  Linux's autogroup scheduler gives a session one slice of the CPU), the level's prompts in batches
  of ``c``, each batch prefilled untimed, then ``max_new_tokens`` batched decode forwards with
  transformers' own KV cache: generated tokens / decode seconds. What one thread computes without a
  server, scheduler, prefill or HTTP: the servers, which prefill too, stay below it.
- **regen** (per engine): one server per engine (``build_launch``, the pipeline's own launch line;
  at most the largest level running), ``--prompts-per-level`` x ``c`` requests sent at concurrency
  ``c`` with ``ignore_eos`` (every answer ``max_new_tokens`` long, so engines and levels do the same
  work): completion tokens / wall seconds.
- **capture** (``--capture``): the hf capture backend's forward (aux + final states to CPU) over
  batches of ``c`` full sequences (prompt + answer) / a bare forward of the same batches: prefill
  tok/s.

Rounds alternate the arms' order; each cell is the median over rounds, the ratios are per round (a
shared machine's load moves between arms; the ratios are what to read).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from eagle3.config.pipeline import PipelineConfig, with_overrides
from eagle3.recipes import resolve
from eagle3.serve.launch_commands import CPU_THREADS, build_launch

PROMPT_TOKENS = 256


def load_prompts(config: PipelineConfig, tokenizer: Any, count: int) -> list[list[int]]:
    """``count`` rendered ShareGPT first turns of at most ``PROMPT_TOKENS`` tokens (cycled when
    fewer exist)."""
    from eagle3.data.prompt_sets import shape_of
    from eagle3.data.readers import iter_rows
    from eagle3.data.template import render_prompt

    source = config.sources[0].path
    assert source is not None
    out: list[list[int]] = []
    for raw in iter_rows([Path(source)]):
        row = shape_of(raw.value) if raw.error is None else None
        if row is None:
            continue
        ids = render_prompt(tokenizer, [{"role": "user", "content": row.prompt}])
        if len(ids) <= PROMPT_TOKENS:
            out.append(ids)
        if len(out) == count:
            break
    return [out[i % len(out)] for i in range(count)]


async def _send(
    url: str, prompts: list[list[int]], concurrency: int, max_new_tokens: int
) -> tuple[int, float]:
    gate = asyncio.Semaphore(concurrency)
    params = {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as session:

        async def one(ids: list[int]) -> int:
            async with (
                gate,
                session.post(
                    f"{url}/generate", json={"input_ids": ids, "sampling_params": params}
                ) as r,
            ):
                body = await r.json()
                if r.status != 200:
                    raise RuntimeError(f"{url}: HTTP {r.status} {body}")
                return int(body["meta_info"]["completion_tokens"])

        start = time.perf_counter()
        tokens = await asyncio.gather(*(one(ids) for ids in prompts))
        return sum(tokens), time.perf_counter() - start


def regen_tok_s(url: str, prompts: list[list[int]], concurrency: int, max_new_tokens: int) -> float:
    tokens, seconds = asyncio.run(_send(url, prompts, concurrency, max_new_tokens))
    return tokens / seconds


def bound_in_own_session(
    model_dir: str, prompts: list[list[int]], batch: int, max_new_tokens: int
) -> float:
    """``bound_tok_s`` in a child process of its own session, as every server runs: under Linux's
    autogroup scheduling a session shares one slice of the CPU, so the bound measured in this
    process would compete with whatever else this session runs, the servers with nothing."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as spec:
        work = {"model": model_dir, "prompts": prompts, "batch": batch, "new": max_new_tokens}
        json.dump(work, spec)
        spec.flush()
        argv = [sys.executable, __file__, "--bound-worker", spec.name]
        done = subprocess.run(
            argv, capture_output=True, text=True, start_new_session=True, check=True
        )
    return float(done.stdout.strip().splitlines()[-1])


def bound_worker(spec_path: str) -> None:
    import torch

    from eagle3.target_io import TargetRef, load_causal_lm

    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(CPU_THREADS)
    model = load_causal_lm(TargetRef(spec["model"]), dtype=torch.float32).eval()
    prompts, batch, new = spec["prompts"], spec["batch"], spec["new"]
    seconds = sum(
        new * len(prompts[i : i + batch]) / bound_tok_s(model, prompts[i : i + batch], new)
        for i in range(0, len(prompts), batch)
    )
    print(len(prompts) * new / seconds)


def bound_tok_s(model: Any, prompts: list[list[int]], max_new_tokens: int) -> float:
    """Batched greedy decode of ``prompts`` with transformers' KV cache, in this process: tokens per
    second."""
    import torch
    from transformers import DynamicCache

    width = max(map(len, prompts))
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, width - len(p) :], mask[b, width - len(p) :] = torch.tensor(p), 1
    with torch.inference_mode():
        cache = DynamicCache()
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        start = time.perf_counter()
        for _ in range(max_new_tokens):
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)  # [B, 1]
            positions = mask.sum(-1, keepdim=True)
            mask = torch.cat([mask, torch.ones_like(nxt)], dim=1)
            out = model(
                input_ids=nxt,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
        return len(prompts) * max_new_tokens / (time.perf_counter() - start)


def capture_tok_s(
    config: PipelineConfig, model_dir: str, seqs: list[list[int]], batch: int
) -> tuple[float, float]:
    """(capture backend forward tok/s, bare forward tok/s) over ``seqs`` in batches of ``batch``
    sequences."""
    import torch

    from eagle3.capture.hf import load_hf_backend

    backend = load_hf_backend(config)
    model = backend.model
    tokens = sum(map(len, seqs))
    start = time.perf_counter()
    for i in range(0, len(seqs), batch):
        backend.forward(seqs[i : i + batch])
    captured = tokens / (time.perf_counter() - start)
    start = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(seqs), batch):
            chunk = seqs[i : i + batch]
            width = max(map(len, chunk))
            ids = torch.tensor([s + [0] * (width - len(s)) for s in chunk])
            model(input_ids=ids, output_hidden_states=True, logits_to_keep=1)
    return captured, tokens / (time.perf_counter() - start)


def _servers(
    config: PipelineConfig, engines: list[str], top: int, logs: Path, stack: contextlib.ExitStack
):
    served = with_overrides(config, [f"server.max_running_requests={top}"])
    urls = {}
    for engine in engines:
        command = build_launch(served, "baseline", engine=engine, port=0)
        urls[engine] = stack.enter_context(
            command.server(log_path=logs / f"{engine}.log", health_timeout_s=900)
        ).url
    return urls


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--bound-worker":
        bound_worker(sys.argv[2])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="smollm2")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--engines", nargs="+", default=["reference", "sglang"])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument(
        "--prompts-per-level", type=int, default=2, help="requests per level = this x c (>= 8)"
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--capture", action="store_true", help="also the capture backend vs a bare forward"
    )
    parser.add_argument("--quick", action="store_true", help="levels 1 4, 16 new tokens, one round")
    args = parser.parse_args()
    if args.quick:
        args.levels, args.max_new_tokens, args.rounds = [1, 4], 16, 1
    import torch

    from eagle3.target_io import load_tokenizer
    from eagle3.worlds.world import world_builders

    config = resolve(args.recipe)
    world_builders()[config.dev.world](Path(config.dev.cache_dir or "."))
    torch.set_num_threads(CPU_THREADS)
    model_dir = config.target.model_path
    tokenizer = load_tokenizer(config.target)
    top = max(args.levels)
    prompts = {
        c: load_prompts(config, tokenizer, max(8, args.prompts_per_level * c)) for c in args.levels
    }
    cells: dict[tuple[str, int], list[float]] = {}
    with (
        tempfile.TemporaryDirectory(prefix="real-throughput-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        urls = _servers(config, args.engines, top, Path(tmp), stack)
        for url in urls.values():  # warm-up: first requests pay one-time costs
            regen_tok_s(url, prompts[args.levels[0]][:2], 2, 4)
        for r in range(args.rounds):
            arms = ["bound", *args.engines]
            for c in args.levels:
                for arm in arms if r % 2 == 0 else arms[::-1]:
                    if arm == "bound":
                        tok_s = bound_in_own_session(model_dir, prompts[c], c, args.max_new_tokens)
                    else:
                        tok_s = regen_tok_s(urls[arm], prompts[c], c, args.max_new_tokens)
                    cells.setdefault((arm, c), []).append(tok_s)
                    print(f"round {r} c={c} {arm}: {tok_s:.1f} tok/s", flush=True)
    _print_regen(cells, args.levels, ["bound", *args.engines], args.rounds)
    if args.capture:
        _print_capture(config, model_dir, tokenizer, prompts, args)


def _print_regen(
    cells: dict[tuple[str, int], list[float]], levels: list[int], arms: list[str], rounds: int
) -> None:
    print(
        f"\n| c | {' | '.join(f'{a} tok/s' for a in arms)} | "
        + " | ".join(f"{a} / bound" for a in arms[1:])
        + " |"
    )
    print("|---:|" + "---:|" * (2 * len(arms) - 1))
    for c in levels:
        med = [statistics.median(cells[(a, c)]) for a in arms]
        ratios = []
        for a in arms[1:]:
            per_round = [x / y for x, y in zip(cells[(a, c)], cells[("bound", c)], strict=True)]
            ratios.append(
                f"{statistics.median(per_round):.2f} ({min(per_round):.2f}-{max(per_round):.2f})"
            )
        print(f"| {c} | " + " | ".join(f"{m:.1f}" for m in med) + " | " + " | ".join(ratios) + " |")
    print(f"(medians over {rounds} rounds; ratios per round: median (min-max))")


def _print_capture(
    config: PipelineConfig, model_dir: str, tokenizer: Any, prompts: dict, args: Any
) -> None:
    print("\n| c (sequences per batch) | capture tok/s | bare forward tok/s | capture / bare |")
    print("|---:|---:|---:|---:|")
    for c in args.levels:
        seqs = [p + [tokenizer.eos_token_id] * args.max_new_tokens for p in prompts[c]]
        pairs = [capture_tok_s(config, model_dir, seqs, c) for _ in range(args.rounds)]
        ratio = statistics.median(a / b for a, b in pairs)
        captured, bare = (
            statistics.median(a for a, _ in pairs),
            statistics.median(b for _, b in pairs),
        )
        print(f"| {c} | {captured:.0f} | {bare:.0f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
