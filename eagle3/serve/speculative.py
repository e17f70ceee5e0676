"""Speculative engine of the reference server: ``--speculative-algorithm EAGLE3|EAGLE`` with a draft attached.

It implements the scheduler's ``Engine`` protocol (``admit``/``step``/``num_running``/``reset``) on top of
``eagle3.serve.specdec.SpeculativeDecoder`` (real greedy chain speculative decoding: the output is the target's
greedy decoding, ``verify_ct`` is the true number of target verify passes).

Design choices:
- Algorithms behave as in SGLang: ``EAGLE3`` feeds the draft the 3 concatenated aux layers named by the draft's
  ``eagle_config``; ``EAGLE`` feeds it the target's last (post-norm) hidden state only, which is H wide, so the
  draft's ``fc`` is skipped and an EAGLE-3 draft accepts ~1 token per pass. The reference server reproduces this
  misconfiguration on purpose, so preflight's runtime check can be tested against a real server.
- One sequence per ``step``: the decoder runs a whole request (``generate``) and hands it back finished. Chain
  verification is per sequence anyway, so throughput equals interleaved decoding; concurrency only queues.
- Greedy only, like the decoder: a request with ``temperature > 0`` is decoded greedily (logged once). EOS, stop
  strings, ``max_new_tokens`` and the context length are applied by the plain engine's ``FinishChecker`` to the
  decoded ids, so both engines finish requests by the same rules.
- Chain only: ``--speculative-eagle-topk`` above 1 (tree drafts) is run as a chain of ``num_steps`` (logged).
"""

from __future__ import annotations

import argparse
import logging
from collections import deque
from pathlib import Path
from typing import Any

from eagle3.serve.engine import FinishChecker, Sequence
from eagle3.serve.protocol import DEFAULT_NUM_STEPS

logger = logging.getLogger(__name__)

AUX_MODES: dict[str, str] = {"EAGLE3": "eagle3", "EAGLE": "last_hidden_only"}


class SpeculativeEngine:
    """The ``Engine`` protocol over a ``SpeculativeDecoder`` (see module docstring)."""

    def __init__(self, decoder: Any, finish: FinishChecker, *, max_running: int) -> None:
        self.decoder = decoder
        self.finish = finish
        self.max_running = max_running
        self._queue: deque[Sequence] = deque()
        self._warned_sampling = False

    def admit(self, seqs: list[Sequence]) -> None:
        self._queue.extend(seqs)

    def num_running(self) -> int:
        return len(self._queue)

    def reset(self) -> None:
        self._queue.clear()

    def step(self) -> tuple[list[Sequence], list[Sequence]]:
        if not self._queue:
            return [], []
        seq = self._queue.popleft()
        self._decode(seq)
        return [seq], [seq]

    def _decode(self, seq: Sequence) -> None:
        params = seq.params
        if params.temperature > 1e-6 and not self._warned_sampling:
            logger.warning("speculative engine decodes greedily: temperature %.2f is ignored", params.temperature)
            self._warned_sampling = True
        budget = min(params.max_new_tokens, self.finish.context_length - len(seq.prompt_ids))
        eos = () if params.ignore_eos else tuple(self.finish.eos_ids)
        output, seq.verify_ct, seq.accepted_drafts = self.decoder.generate(seq.prompt_ids, max(budget, 1), eos)
        for token in output:  # the plain engine's finish rules, token by token
            seq.output_ids.append(int(token))
            self.finish.check(seq)
            if seq.finished:
                return
        seq.finish_reason = {"type": "length", "length": len(seq.output_ids)}


def check_speculative_args(args: argparse.Namespace) -> str:
    """The decoder's aux mode for the requested algorithm; ``ValueError`` naming the fix otherwise."""
    algorithm = args.speculative_algorithm
    if algorithm not in AUX_MODES:
        raise ValueError(
            f"--speculative-algorithm {algorithm!r} is not served here: use EAGLE3 (or EAGLE to reproduce serving an "
            "EAGLE-3 draft without its aux layers)"
        )
    if not args.speculative_draft_model_path:
        raise ValueError("--speculative-algorithm needs --speculative-draft-model-path <export dir>")
    if not Path(args.speculative_draft_model_path).is_dir():
        raise ValueError(f"--speculative-draft-model-path {args.speculative_draft_model_path} is not a directory")
    if (args.speculative_eagle_topk or 1) > 1:
        logger.warning(
            "--speculative-eagle-topk %s: the reference server drafts a chain (topk 1)", args.speculative_eagle_topk
        )
    return AUX_MODES[algorithm]


def build_speculative_engine(
    model: Any, tokenizer: Any, args: argparse.Namespace, *, context_length: int
) -> SpeculativeEngine:
    """The engine ``ModelBackend`` uses when ``--speculative-algorithm`` is given."""
    from eagle3.serve.specdec import SpeculativeDecoder

    aux_mode = check_speculative_args(args)
    steps = args.speculative_num_steps or DEFAULT_NUM_STEPS
    decoder = SpeculativeDecoder(model, tokenizer, Path(args.speculative_draft_model_path), steps, aux_mode)
    eos = model.generation_config.eos_token_id if model.generation_config is not None else None
    eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        eos_ids.add(int(tokenizer.eos_token_id))
    logger.info(
        "speculative engine: %s (aux %s), draft %s, %d steps",
        args.speculative_algorithm,
        aux_mode,
        args.speculative_draft_model_path,
        steps,
    )
    finish = FinishChecker(tokenizer, eos_ids, context_length)
    return SpeculativeEngine(decoder, finish, max_running=args.max_running_requests)
