"""Speculative engine of the reference server: ``--speculative-algorithm EAGLE3|EAGLE`` with a draft
attached.

It implements the scheduler's ``Engine`` protocol (``admit``/``step``/``num_running``/``reset``) on
top of ``eagle3.serve.reference.spec_batch.ChainBatch`` (real chain speculative decoding of the
whole running batch: the output is the target's greedy decoding, or a sample of the target's
distribution at the request's sampling; ``verify_ct`` is the true number of target verify passes of
each request).

Design choices:
- Algorithms behave as in SGLang: ``EAGLE3`` feeds the draft the 3 concatenated aux layers named by
  the draft's ``eagle_config``; ``EAGLE`` feeds it the target's last (post-norm) hidden state only,
  which is H wide, so the draft's ``fc`` is skipped and an EAGLE-3 draft accepts ~1 token per pass.
  The reference server reproduces this misconfiguration on purpose, so preflight's runtime check can
  be tested against a real server.
- Batched, as SGLang: a ``step`` either prefills the requests admitted since the last step (they
  join the batch) or runs one draft-verify cycle for every running request, one batched target
  forward verifying all their drafts. Finished requests leave after the step that finished them, as
  in the plain engine (``engine.HFEngine``). ``verify_forwards`` counts those target forwards and
  ``verify_passes`` the per-request passes they served (``/server_info``'s ``internal_states``):
  more passes than forwards means forwards were shared.
- Sampling as SGLang on a GPU: a request with a temperature is verified by speculative sampling
  (SGLang's default kernel for a chain, ``eagle3.serve.reference.sampling``), with
  ``--speculative-accept-threshold-single`` and ``--speculative-accept-threshold-acc`` (1.0, the
  default, is exact; lower is lossy); each request draws from its own coin stream, seeded by its
  ``sampling_seed`` (SGLang honours that seed only under ``--enable-deterministic-inference``; here
  always). EOS, stop strings, ``max_new_tokens`` and the context length are applied by the plain
  engine's ``FinishChecker`` token by token, so both engines finish requests by the same rules;
  tokens a cycle produced past the finish are dropped.
- Chain only: ``--speculative-eagle-topk`` above 1 (tree drafts) is run as a chain of ``num_steps``
  (logged).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from eagle3.serve.reference.hf_engine import FinishChecker, Sequence
from eagle3.serve.reference.protocol import DEFAULT_NUM_STEPS
from eagle3.serve.reference.sampling import row_sampling
from eagle3.serve.reference.spec_batch import ChainBatch
from eagle3.serve.reference.spec_decoder import SpeculativeDecoder

logger = logging.getLogger(__name__)

AUX_MODES: dict[str, str] = {"EAGLE3": "eagle3", "EAGLE": "last_hidden_only"}


class SpeculativeEngine:
    """The ``Engine`` protocol over a ``ChainBatch`` (see module docstring)."""

    def __init__(
        self, decoder: SpeculativeDecoder, finish: FinishChecker, *, max_running: int, seed: int = 0
    ) -> None:
        import torch

        self.batch = ChainBatch(decoder)
        # seeds the requests that send no sampling_seed
        self.generator = torch.Generator(device="cpu").manual_seed(seed)
        self.finish = finish
        self.max_running = max_running
        self.verify_forwards = 0  # batched target verify forwards
        # per-request verify passes they served (the sum of every request's verify_ct)
        self.verify_passes = 0
        self._pending: list[Sequence] = []
        self._running: list[Sequence] = []

    def admit(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            row_sampling(seq, self.generator)
        self._pending.extend(seqs)

    def num_running(self) -> int:
        return len(self._running) + len(self._pending)

    def reset(self) -> None:
        self._pending, self._running = [], []
        self.batch.reset()

    def step(self) -> tuple[list[Sequence], list[Sequence]]:
        if self._pending:
            stepped, self._pending = self._prefill(self._pending), []
        elif self._running:
            stepped = self._verify()
        else:
            return [], []
        done = [s for s in stepped if s.finished]
        if done:
            keep = [i for i, s in enumerate(self._running) if not s.finished]
            self._running = [self._running[i] for i in keep]
            self.batch.select(keep)
        return stepped, done

    def _prefill(self, seqs: list[Sequence]) -> list[Sequence]:
        firsts = self.batch.prefill([s.prompt_ids for s in seqs], [s.sampling for s in seqs])
        for seq, token in zip(seqs, firsts, strict=True):
            self._emit(seq, [token])
        self._running.extend(seqs)
        return seqs

    def _verify(self) -> list[Sequence]:
        cycle = self.batch.cycle()
        self.verify_forwards += 1
        self.verify_passes += len(self._running)
        for seq, new, drafts in zip(self._running, cycle.tokens, cycle.accepted, strict=True):
            seq.verify_ct += 1
            seq.accepted_drafts.append(drafts)
            self._emit(seq, new)
        return list(self._running)

    def _emit(self, seq: Sequence, tokens: list[int]) -> None:
        """Append tokens by the plain engine's finish rules; what follows a finish is dropped."""
        for token in tokens:
            seq.output_ids.append(int(token))
            self.finish.check(seq)
            if seq.finished:
                return


def check_speculative_args(args: argparse.Namespace) -> str:
    """The decoder's aux mode for the requested algorithm; ``ValueError`` naming the fix
    otherwise."""
    algorithm = args.speculative_algorithm
    if algorithm not in AUX_MODES:
        raise ValueError(
            f"--speculative-algorithm {algorithm!r} is not served here: use EAGLE3 (or EAGLE to reproduce serving an "
            "EAGLE-3 draft without its aux layers)"
        )
    if not args.speculative_draft_model_path:
        raise ValueError(
            "--speculative-algorithm needs --speculative-draft-model-path <export dir>"
        )
    if not Path(args.speculative_draft_model_path).is_dir():
        raise ValueError(
            f"--speculative-draft-model-path {args.speculative_draft_model_path} is not a directory"
        )
    for flag in ("speculative_accept_threshold_single", "speculative_accept_threshold_acc"):
        if not 0.0 <= getattr(args, flag, 1.0) <= 1.0:
            name = flag.replace("_", "-")
            raise ValueError(f"--{name} must be in [0, 1] (1.0, the default, verifies exactly)")
    if (args.speculative_eagle_topk or 1) > 1:
        logger.warning(
            "--speculative-eagle-topk %s: the reference server drafts a chain (topk 1)",
            args.speculative_eagle_topk,
        )
    return AUX_MODES[algorithm]


def build_speculative_engine(
    model: Any, tokenizer: Any, args: argparse.Namespace, *, context_length: int
) -> SpeculativeEngine:
    """The engine ``ModelGenerator`` uses when ``--speculative-algorithm`` is given."""
    aux_mode = check_speculative_args(args)
    steps = args.speculative_num_steps or DEFAULT_NUM_STEPS
    decoder = SpeculativeDecoder(
        model, tokenizer, Path(args.speculative_draft_model_path), steps, aux_mode
    )
    single = getattr(args, "speculative_accept_threshold_single", 1.0)
    acc = getattr(args, "speculative_accept_threshold_acc", 1.0)
    decoder.accept_thresholds = (single, acc)
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
    seed = getattr(args, "random_seed", 0)
    return SpeculativeEngine(decoder, finish, max_running=args.max_running_requests, seed=seed)
