"""What the HTTP layer generates with: a model (tokenizer + scheduler + engine) or the synthetic
load generator.

``ModelGenerator`` loads a transformers causal LM and its tokenizer and runs them through the
scheduler. ``SyntheticGenerator`` has no model at all: every request sleeps ``--synthetic-delay``
seconds and returns ``--synthetic-tokens`` ids cycling through a fixed range. It exists only so the
client-scaling benchmark can push a million requests through a real HTTP server; ``/model_info`` and
the log say so.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, ClassVar

from eagle3.serve.reference.protocol import Completion, SamplingParams

logger = logging.getLogger(__name__)

SYNTHETIC_FIRST_ID = 5  # byte-level BPE vocabularies hold ids 5..260 (specials, then the 256 bytes)
SYNTHETIC_CYCLE = 256


class ModelGenerator:
    """A transformers model behind the scheduler (see ``engine.HFEngine``)."""

    synthetic = False

    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        from eagle3.serve.reference.hf_engine import HFEngine
        from eagle3.serve.reference.scheduler import Scheduler
        from eagle3.target_io import TargetRef, load_causal_lm, load_tokenizer

        if args.num_threads:
            torch.set_num_threads(args.num_threads)
        dtype = "auto" if args.dtype == "auto" else getattr(torch, args.dtype)
        # the flags name a local directory (no revision, no remote code: SGLang's server has those
        # flags, this one does not)
        self.tokenizer = load_tokenizer(TargetRef(args.tokenizer_path or args.model_path))
        model = load_causal_lm(TargetRef(args.model_path), dtype=dtype).to(args.device).eval()
        self.architectures = list(model.config.architectures or [type(model).__name__])
        self.vocab_size = int(model.config.vocab_size)
        self.context_length = int(
            args.context_length or getattr(model.config, "max_position_embeddings", 4096)
        )
        self.speculative: Any = None
        # EAGLE3 / EAGLE with a draft: eagle3.serve.reference.spec_engine
        if args.speculative_algorithm:
            from eagle3.serve.reference.spec_engine import build_speculative_engine

            engine: Any = build_speculative_engine(
                model, self.tokenizer, args, context_length=self.context_length
            )
            self.speculative = engine
        else:
            engine = HFEngine(
                model,
                self.tokenizer,
                max_running=args.max_running_requests,
                context_length=self.context_length,
                seed=args.random_seed,
                prefix_cache_tokens=args.prefix_cache_tokens,
            )
        self.scheduler = Scheduler(engine)
        self.scheduler.start()
        logger.info(
            "loaded %s (%s) context=%d", args.model_path, self.architectures, self.context_length
        )

    @property
    def num_waiting(self) -> int:
        return self.scheduler.num_waiting

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def chat_ids(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """The chat template over OpenAI messages, with the request's tools and
        ``chat_template_kwargs``."""
        text = self.tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=True, **(kwargs or {})
        )
        return self.encode(text)

    async def generate(
        self,
        rid: str,
        prompt_ids: list[int],
        params: SamplingParams,
        on_tokens: Callable[[list[int]], None] | None = None,
    ) -> Completion:
        if params.max_new_tokens == 0:  # SGLang answers at once, nothing generated
            return Completion(rid, prompt_ids, [], {"type": "length", "length": 0}, 0, 0.0)
        future = self.scheduler.submit(rid, prompt_ids, params, on_tokens=on_tokens)
        try:
            return await future
        except asyncio.CancelledError:
            future.cancel()
            raise

    def counters(self) -> dict[str, float]:
        s = self.scheduler
        counters = {
            "completed_requests": s.completed,
            "completion_tokens": s.completion_tokens,
            "verify_ct": s.verify_ct,
            "avg_spec_accept_length": s.completion_tokens / s.verify_ct if s.verify_ct else 1.0,
        }
        # batched target verify forwards and the per-request passes they served
        if self.speculative is not None:
            counters |= {
                "verify_forwards": self.speculative.verify_forwards,
                "verify_passes": self.speculative.verify_passes,
            }
        return counters

    def flush(self) -> None:
        """Empty the engine's prefix cache (a speculative engine keeps none)."""
        flush = getattr(self.scheduler.engine, "flush", None)
        if flush is not None:
            flush()

    def close(self) -> None:
        self.scheduler.close()


class SyntheticGenerator:
    """No model: fixed delay, fixed number of cycling token ids. For the client-scaling benchmark
    only."""

    synthetic = True
    architectures: ClassVar[list[str]] = ["SyntheticLoadGenerator"]
    vocab_size = 1 << 31
    context_length = 1 << 30

    def __init__(self, args: argparse.Namespace) -> None:
        self.tokens = int(args.synthetic_tokens)
        self.delay = float(args.synthetic_delay)
        self.completed = 0
        self.in_flight = 0
        logger.warning(
            "SYNTHETIC LOAD MODE: no model; every request returns %d cycling ids after %.3fs "
            "(client-scaling benchmark only, outputs are meaningless)",
            self.tokens,
            self.delay,
        )

    @property
    def num_waiting(self) -> int:
        # no batch: every request in flight counts against --max-queued-requests
        return self.in_flight

    def encode(self, text: str) -> list[int]:
        return [SYNTHETIC_FIRST_ID + (b % SYNTHETIC_CYCLE) for b in text.encode()]

    def decode(self, ids: list[int]) -> str:
        return " ".join(str(i) for i in ids)

    def chat_ids(self, messages: list[dict[str, Any]], **_: Any) -> list[int]:
        return self.encode("".join(str(m.get("content", "")) for m in messages))

    async def generate(
        self,
        rid: str,
        prompt_ids: list[int],
        params: SamplingParams,
        on_tokens: Callable[[list[int]], None] | None = None,
    ) -> Completion:
        start = time.monotonic()
        self.in_flight += 1
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.in_flight -= 1
        n = min(self.tokens, params.max_new_tokens)
        out = [SYNTHETIC_FIRST_ID + (i % SYNTHETIC_CYCLE) for i in range(n)]
        if on_tokens is not None:
            on_tokens(out)
        self.completed += 1
        finish = {"type": "length", "length": n}
        return Completion(rid, prompt_ids, out, finish, n, time.monotonic() - start)

    def counters(self) -> dict[str, float]:
        return {"completed_requests": self.completed, "avg_spec_accept_length": 1.0}

    def flush(self) -> None:
        """Nothing is cached without a model."""

    def close(self) -> None:
        return None
