"""The thinking world: agentic sample datasets and a tiny target that thinks and calls tools, built
once and cached.

Built and cached exactly like the tiny world (``eagle3.worlds.world.build_world``: content-addressed
directory ``think-world-<fingerprint>``, built aside and renamed into place, ``world.json`` last),
from its own spec, so the tiny world and everything keyed on it are untouched. The target is the
tiny world's Llama trained on what it will be asked to continue: one text per finished answer
(``eagle3.worlds.agentic.training_texts``), the loss on what the model writes in it, a third of them
with thinking off (the template's switch), so it writes ``reasoning</think>answer`` when thinking is
on, a bare answer when it is off, and Kimi-style tool calls when its tools fit the question.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from eagle3.worlds.agentic import Agentic, AgenticFactory, training_texts
from eagle3.worlds.agentic_samples import AGENTIC_VERSION, write_agentic_samples
from eagle3.worlds.samples import BAD_ROWS_FILE, SAMPLES_VERSION
from eagle3.worlds.world import TinyWorld, TrainedWorldSpec, build_world

THINK_WORLD_VERSION = "1"
_ROLE_NAMES = ("system", "user", "assistant", "tool", "tool_declare", "## Return of ")


@dataclass(frozen=True)
class ThinkWorldSpec(TrainedWorldSpec):
    """Everything the thinking world depends on; the defaults are the world the ``tiny_think``
    recipe uses."""

    DIR_PREFIX: ClassVar[str] = "think-world"
    VERSION: ClassVar[str] = THINK_WORLD_VERSION
    VERSIONS: ClassVar[dict[str, str]] = {
        "think_world_version": THINK_WORLD_VERSION,
        "agentic_version": AGENTIC_VERSION,
        "samples_version": SAMPLES_VERSION,
    }
    rows_per_source: int = 120
    train_conversations: int = 3000
    thinking_off_fraction: float = 0.35
    train_steps: int = 300
    train_seq_len: int = 512


def tokenizer_corpus(conversations: list[Agentic]) -> Iterator[str]:
    """The texts the tokenizer learns from: every message's text, call and result, the tools as the
    template writes them, the role names."""
    yield from _ROLE_NAMES
    for conv in conversations:
        if conv.tools:
            yield json.dumps(conv.tools, separators=(",", ":"), ensure_ascii=False)
        for m in conv.messages:
            yield from (
                m.get("content") or "",
                m.get("reasoning_content") or "",
                m.get("tool_call_id") or "",
            )
            yield from (c["id"] + c["arguments"] for c in m.get("tool_calls") or [])


def _build_into(
    root: Path, spec: ThinkWorldSpec, say: Callable[[str], None], threads: int
) -> TinyWorld:
    import torch  # only to build (as eagle3.worlds.world)
    import transformers

    from eagle3.worlds.think_target import EOS, build_think_tokenizer
    from eagle3.worlds.tiny_target import build_model, train_on_texts

    started = time.perf_counter()
    say(f"writing agentic sample datasets ({spec.rows_per_source} rows per source)")
    samples = write_agentic_samples(
        root / "data", seed=spec.seed, rows_per_source=spec.rows_per_source
    )
    factory = AgenticFactory(spec.seed + 1)
    conversations = [factory.make() for _ in range(spec.train_conversations)]
    say(f"training tokenizer (vocab {spec.vocab_size})")
    tokenizer = build_think_tokenizer(tokenizer_corpus(conversations), vocab_size=spec.vocab_size)
    tokenizer.model_max_length = spec.max_position_embeddings
    rng = random.Random(spec.seed)
    off = spec.thinking_off_fraction
    views = [
        t for c in conversations for t in training_texts(tokenizer, c, thinking=rng.random() >= off)
    ]
    texts, spans = [text for text, _ in views], [s for _, s in views]
    model_seed = spec.seed if spec.model_seed is None else spec.model_seed
    model = build_model(
        tokenizer,
        num_layers=spec.num_layers,
        hidden_size=spec.hidden_size,
        num_heads=spec.num_heads,
        num_kv_heads=spec.num_kv_heads,
        intermediate_size=spec.intermediate_size,
        max_position_embeddings=spec.max_position_embeddings,
        vocab_size=spec.vocab_size,
        seed=model_seed,
        stop_tokens=(EOS,),
    )
    say(f"training the thinking target ({spec.train_steps} steps, {threads} threads)")
    train_started = time.perf_counter()
    losses = train_on_texts(
        model,
        tokenizer,
        texts,
        steps=spec.train_steps,
        batch_size=spec.train_batch_size,
        seq_len=spec.train_seq_len,
        lr=spec.train_lr,
        seed=model_seed,
        num_threads=threads,
        spans=spans,
    )
    train_seconds = time.perf_counter() - train_started
    model_dir = root / "model"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    report = {
        "fingerprint": spec.fingerprint(),
        "train_texts": len(texts),
        "train_loss_first": losses[0],
        "train_loss_last": losses[-1],
        "train_seconds": round(train_seconds, 2),
        "train_threads": threads,
        "params": sum(p.numel() for p in model.parameters()),
        "vocab_size": model.config.vocab_size,
        "build_seconds": round(time.perf_counter() - started, 2),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    data_dir = root / "data"
    return TinyWorld(
        root=root,
        data_dir=data_dir,
        model_dir=model_dir,
        samples={k: v for k, v in samples.items() if k != "bench"},
        bench_dir=samples["bench"],
        pretokenized=None,
        bad_rows=data_dir / BAD_ROWS_FILE,
        report=report,
    )


def build_think_world(
    cache_dir: Path,
    spec: ThinkWorldSpec = ThinkWorldSpec(),
    *,
    progress: Callable[[str], None] | None = None,
    num_threads: int | None = None,
) -> tuple[TinyWorld, bool]:
    """The thinking world for ``spec`` under ``cache_dir`` and whether it was a cache hit (as
    ``build_tiny_world``)."""
    return build_world(cache_dir, spec, _build_into, progress=progress, num_threads=num_threads)
