"""Decoding engines behind the reference server.

An ``Engine`` owns the model and the running batch; the scheduler (``scheduler.py``) owns the
waiting queue and calls ``admit`` and ``step`` from one worker thread. Keeping the engine behind
this small protocol is what lets a speculative engine (EAGLE-3 draft + chain verification) slot in
later: it implements the same two calls and reports more than one token per step and the true number
of target forward passes (``verify_ct``).

``HFEngine`` design (continuous batching with a per-sequence KV cache):

* A ``GrowingCache`` (``kv_cache``: appends in place) holds the running batch, left padded: row
  ``b`` of every layer's keys is sequence ``b``'s keys, with zeros in padding columns that the 2-D
  attention mask hides. Position ids are explicit (count of real tokens so far), so RoPE is
  applied per sequence no matter where it sits in the padded cache.
* ``step`` either prefills newly admitted sequences and merges their cache into the running one (pad
  both on the left to a common length, concatenate on the batch axis), or runs one batched decode
  forward for every running sequence. Prefill groups the new prompts by length (``prefill_groups``):
  one left-padded forward per group, whose padding is at most ``PREFILL_PAD_WASTE`` of its real
  tokens, since a burst of chat prompts (ShareGPT's first turns: 31 to 218 tokens in one batch)
  padded to its longest computed twice the tokens it had (profiled: 42% of a regen server's time in
  prefill, 2.1x padded), where SGLang packs prompts without padding. Finished rows are removed with
  ``batch_select_indices`` and leading all-padding columns are trimmed.
* Greedy decoding of a sequence therefore gives the same tokens alone or in any batch (up to float
  rounding), and so does seeded sampling: each request draws from its own coin stream
  (``sampling.RowSampling``, made at admission by ``row_sampling``: its ``sampling_seed``, else a
  seed from the engine's generator).
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import torch

from eagle3.serve.reference.protocol import Sequence
from eagle3.serve.reference.sampling import next_tokens, row_sampling

logger = logging.getLogger(__name__)


class FinishChecker:
    """EOS, stop strings, max_new_tokens and the context length; sets ``seq.finish_reason``
    SGLang-style."""

    def __init__(self, tokenizer: Any, eos_ids: set[int], context_length: int) -> None:
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.context_length = context_length

    def check(self, seq: Sequence) -> None:
        token = seq.output_ids[-1]
        if not seq.params.ignore_eos and token in self.eos_ids:
            seq.finish_reason = {"type": "stop", "matched": token}
            return
        if seq.params.stop:
            tail = self.tokenizer.decode(seq.output_ids[-32:], skip_special_tokens=True)
            for stop in seq.params.stop:
                if stop and tail.endswith(stop):
                    seq.finish_reason = {"type": "stop", "matched": stop}
                    return
        if (
            len(seq.output_ids) >= seq.params.max_new_tokens
            or len(seq.prompt_ids) + len(seq.output_ids) >= self.context_length
        ):
            seq.finish_reason = {"type": "length", "length": len(seq.output_ids)}


PREFILL_PAD_WASTE = 0.1  # a prefill forward's padding: at most this share of its real prompt tokens


def prefill_groups(lengths: list[int], *, waste: float = PREFILL_PAD_WASTE) -> list[list[int]]:
    """Indices into ``lengths`` grouped for prefill, shortest first: a group's padded tokens (its
    longest prompt times its size) are at most ``1 + waste`` times its real tokens (a single prompt
    is a group of its own)."""
    groups: list[list[int]] = []
    total = 0
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        if groups and lengths[i] * (len(groups[-1]) + 1) <= (1 + waste) * (total + lengths[i]):
            groups[-1].append(i)
            total += lengths[i]
        else:
            groups.append([i])
            total = lengths[i]
    return groups


def cache_keyword(model: Any) -> str:
    """transformers renamed ``past_key_values`` to ``cache`` during 5.x: the keyword this model's
    forward takes."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def left_pad(tensor: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    missing = length - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


class HFEngine:
    """A transformers causal LM decoding a continuously batched set of sequences (see module
    docstring)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_running: int,
        context_length: int,
        seed: int = 0,
        prefix_cache_tokens: int = 0,
    ) -> None:
        # local: keeps `import eagle3.serve.reference` light for synthetic mode
        from eagle3.serve.reference.kv_cache import GrowingCache
        from eagle3.serve.reference.prefix_cache import PrefixCache

        self._cache_cls = GrowingCache
        self._cache_kw = cache_keyword(model)
        self.model = model
        self.device = next(model.parameters()).device
        self.max_running = max_running
        eos = model.generation_config.eos_token_id if model.generation_config is not None else None
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if tokenizer.eos_token_id is not None:
            eos_ids.add(int(tokenizer.eos_token_id))
        self.finish = FinishChecker(tokenizer, eos_ids, context_length)
        self.generator = torch.Generator(device="cpu").manual_seed(seed)
        self._pending: list[Sequence] = []
        self._running: list[Sequence] = []
        self._cache: Any = None
        self._mask: torch.Tensor | None = None  # [B, S] 1 on real tokens, 0 on left padding
        self.prefix = PrefixCache(prefix_cache_tokens) if prefix_cache_tokens else None

    def flush(self) -> None:
        """Forget every cached prefix (``/flush_cache``)."""
        if self.prefix is not None:
            self.prefix.clear()

    def num_running(self) -> int:
        return len(self._running) + len(self._pending)

    def admit(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            row_sampling(seq, self.generator)
        self._pending.extend(seqs)

    def reset(self) -> None:
        self._pending, self._running, self._cache, self._mask = [], [], None, None

    @torch.inference_mode()
    def step(self) -> tuple[list[Sequence], list[Sequence]]:
        if self._pending:
            pending, self._pending = self._pending, []
            misses = []
            for seq in pending:
                hit = self.prefix.match(seq.prompt_ids) if self.prefix is not None else None
                if hit is None:
                    misses.append(seq)
                else:
                    self._prefill_after(seq, hit)
            for group in prefill_groups([len(s.prompt_ids) for s in misses]):
                self._prefill([misses[i] for i in group])
            stepped = pending
        elif self._running:
            stepped = self._decode()
        else:
            return [], []
        done = [s for s in stepped if s.finished]
        if done:
            self._drop_finished()
        return stepped, done

    def _forward(
        self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        out = self.model(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            position_ids=positions.to(self.device),
            **{self._cache_kw: cache},
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1, :].float().cpu()  # [B, V]

    def _advance(self, seqs: list[Sequence], logits: torch.Tensor) -> None:
        for seq, token in zip(seqs, next_tokens(logits, [s.sampling for s in seqs]), strict=True):
            seq.output_ids.append(token)
            seq.verify_ct += 1
            self.finish.check(seq)

    def _prefill(self, seqs: list[Sequence]) -> list[Sequence]:
        width = max(len(s.prompt_ids) for s in seqs)
        ids = torch.zeros(len(seqs), width, dtype=torch.long)
        mask = torch.zeros(len(seqs), width, dtype=torch.long)
        for b, s in enumerate(seqs):
            ids[b, width - len(s.prompt_ids) :] = torch.tensor(s.prompt_ids)
            mask[b, width - len(s.prompt_ids) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [B, S]
        cache = self._cache_cls()
        logits = self._forward(ids, mask, positions, cache)
        self._advance(seqs, logits)
        self._merge(cache, mask)
        self._running.extend(seqs)
        return seqs

    def _prefill_after(self, seq: Sequence, hit: Any) -> None:
        """Prefill ``seq``'s prompt after its cached prefix (``hit``: a ``prefix_cache.Hit``)."""
        suffix = seq.prompt_ids[hit.tokens :]
        total = hit.tokens + len(suffix)
        cache = self._cache_cls(ddp_cache_data=hit.layers)
        mask = torch.ones(1, total, dtype=torch.long)
        positions = torch.arange(hit.tokens, total)[None]  # [1, S]: the suffix after the prefix
        logits = self._forward(torch.tensor([suffix]), mask, positions, cache)
        seq.cached_tokens = hit.tokens
        self._advance([seq], logits)
        self._merge(cache, mask)
        self._running.append(seq)

    def _merge(self, cache: Any, mask: torch.Tensor) -> None:
        if self._cache is None or self._mask is None:
            self._cache, self._mask = cache, mask
            return
        width = max(self._mask.shape[1], mask.shape[1])
        merged = []
        # [B, heads, S, D] per layer
        for (k0, v0, _), (k1, v1, _) in zip(self._cache, cache, strict=True):
            merged.append(
                (
                    torch.cat([left_pad(k0, width, 2), left_pad(k1, width, 2)], dim=0),
                    torch.cat([left_pad(v0, width, 2), left_pad(v1, width, 2)], dim=0),
                )
            )
        self._cache = self._cache_cls(ddp_cache_data=merged)
        self._mask = torch.cat([left_pad(self._mask, width, 1), left_pad(mask, width, 1)], dim=0)

    def _decode(self) -> list[Sequence]:
        assert self._mask is not None
        ids = torch.tensor([[s.output_ids[-1]] for s in self._running], dtype=torch.long)  # [B, 1]
        positions = self._mask.sum(-1, keepdim=True)  # [B, 1]: real tokens so far = next position
        self._mask = torch.cat(
            [self._mask, torch.ones(len(self._running), 1, dtype=torch.long)], dim=1
        )
        logits = self._forward(ids, self._mask, positions, self._cache)
        self._advance(self._running, logits)
        return list(self._running)

    def _keep_prefixes(self) -> None:
        """The finished sequences' keys and values into the prefix cache: prompt and answer, the
        answer's last token excluded (never fed); a row's real columns are its last ones (left
        padding)."""
        assert self.prefix is not None and self._mask is not None
        for b, seq in enumerate(self._running):
            fed = len(seq.prompt_ids) + len(seq.output_ids) - 1
            if seq.finished and int(self._mask[b].sum()) == fed:
                rows = slice(b, b + 1)
                layers = [(k[rows, :, -fed:], v[rows, :, -fed:]) for k, v, _ in self._cache]
                self.prefix.put([*seq.prompt_ids, *seq.output_ids[:-1]], layers)

    def _drop_finished(self) -> None:
        assert self._mask is not None
        if self.prefix is not None:
            self._keep_prefixes()
        keep = [i for i, s in enumerate(self._running) if not s.finished]
        self._running = [self._running[i] for i in keep]
        if not keep:
            self._cache, self._mask = None, None
            return
        index = torch.tensor(keep, dtype=torch.long)
        cache_index = index.to(self.device)
        mask = self._mask[index]
        # leading columns that are padding in every row
        first = int((mask.sum(0) > 0).nonzero()[0].item())
        self._mask = mask[:, first:]
        self._cache = self._cache_cls(
            ddp_cache_data=[
                (k[cache_index, :, first:], v[cache_index, :, first:]) for k, v, _ in self._cache
            ]
        )
