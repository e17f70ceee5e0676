"""Regen client overhead: pipeline regen tok/s / a bare saturating aiohttp client's tok/s (goal >= 0.97).

Same reference server (tiny target, greedy), same prompts (rendered once with the project's renderer), same
concurrency, measured side by side in one run; the bare client runs before and after the pipeline and the mean is
used, so a drift of the shared machine does not favour one side. Also prints the server's own scaling: bare
tok/s at concurrency 1 vs the benchmark's concurrency (continuous batching must make it grow).

    python benchmarks/regen_overhead.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import aiohttp

from eagle3.config import PipelineConfig, RegenConfig, TargetConfig
from eagle3.data.parquet import ShardWriter
from eagle3.data.schema import PROMPT_SCHEMA
from eagle3.data.template import render_prompt
from eagle3.regen.shard import load_tokenizer
from eagle3.regen.stage import RegenStage
from eagle3.runroot import FileEntry, Manifest, fingerprint
from eagle3.serve.launch import reference_server
from eagle3.stage import run_stage


def build_target(out: Path) -> Path:
    from eagle3.dev.tiny_target import build_model, build_tokenizer

    corpus = [f"user asks question {i} about topic {i % 11} and the assistant answers" for i in range(2000)]
    tokenizer = build_tokenizer(corpus, vocab_size=1024)
    build_model(tokenizer, num_layers=4, max_position_embeddings=1024).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def write_prompts(root: Path, n: int, rows_per_shard: int) -> Path:
    fp = fingerprint("bench-prompts", n, rows_per_shard)
    out = root / "prompts" / fp
    rows = (
        {
            "sample_id": f"p{i:08d}",
            "source": "bench",
            "source_row": str(i),
            "n_user_turns": 1,
            "meta": "{}",
            "messages": [{"role": "user", "content": f"question {i} about topic {i % 11}, please answer"}],
            "input_ids": None,
            "loss_mask": None,
        }
        for i in range(n)
    )
    with ShardWriter(out, PROMPT_SCHEMA, rows_per_shard=rows_per_shard) as writer:
        batch = []
        for row in rows:
            batch.append(row)
            if len(batch) == 5000:
                writer.write_rows(batch)
                batch = []
        writer.write_rows(batch)
    infos = writer.close()
    Manifest(stage="prompts", fingerprint=fp, files=[FileEntry.of(i.path, rows=i.rows, base=out) for i in infos]).write(
        out
    )
    return out


async def bare_client(url: str, prompts: list[list[int]], params: dict, concurrency: int) -> float:
    """tok/s of a minimal client: a semaphore, one POST per prompt, nothing else."""
    gate = asyncio.Semaphore(concurrency)
    tokens = 0

    async def one(session: aiohttp.ClientSession, ids: list[int]) -> None:
        nonlocal tokens
        async with gate, session.post(f"{url}/generate", json={"input_ids": ids, "sampling_params": params}) as r:
            tokens += len((await r.json())["output_ids"])

    start = time.perf_counter()
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(one(session, ids) for ids in prompts))
    return tokens / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="48 prompts x 16 tokens (< 1 min)")
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    n, new = (48, 16) if args.quick else (args.prompts, args.max_new_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = build_target(root / "model")
        prompts_dir = write_prompts(root, n, rows_per_shard=max(n // 4, 1))
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model)
        ids = [
            render_prompt(tok, [{"role": "user", "content": f"question {i} about topic {i % 11}, please answer"}])
            for i in range(n)
        ]
        extra = ["--max-running-requests", str(args.concurrency), "--num-threads", "1"]
        with reference_server(model, extra_args=extra) as server:
            regen = RegenConfig(
                servers=[server.url], concurrency_per_server=args.concurrency, max_new_tokens=new, temperature=0.0
            )
            config = PipelineConfig(
                name="bench",
                root=str(root / "run"),
                regen=regen,
                target=TargetConfig(
                    model_path=str(model), num_layers=8, hidden_size=128, vocab_size=1024, context_length=1024
                ),
            )
            params = {"max_new_tokens": new, "temperature": 0.0, "top_p": 1.0, "top_k": -1, "stop": []}
            asyncio.run(bare_client(server.url, ids[:8], params, args.concurrency))  # warm-up
            load_tokenizer(str(model))  # both sides start with the tokenizer loaded
            bare1 = asyncio.run(bare_client(server.url, ids, params, args.concurrency))
            start = time.perf_counter()
            summary = run_stage(RegenStage(), config, prompts_dir=prompts_dir).summary
            pipeline = summary["completion_tokens"] / (time.perf_counter() - start)
            bare2 = asyncio.run(bare_client(server.url, ids, params, args.concurrency))
            serial = asyncio.run(bare_client(server.url, ids[: max(n // 4, 8)], params, 1))
    bare = (bare1 + bare2) / 2
    result = {
        "prompts": n,
        "max_new_tokens": new,
        "concurrency": args.concurrency,
        "bare_tok_s": round(bare, 1),
        "pipeline_tok_s": round(pipeline, 1),
        "ratio": round(pipeline / bare, 3),
        "server_tok_s_c1": round(serial, 1),
        f"server_tok_s_c{args.concurrency}": round(bare, 1),
        "batching_gain": round(bare / serial, 2),
    }
    print(json.dumps(result, indent=2))
    print(f"regen overhead ratio (pipeline / bare) = {result['ratio']:.3f}  (goal >= 0.97)")


if __name__ == "__main__":
    main()
