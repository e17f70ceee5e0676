"""Batched chain speculation: every running sequence of the reference server's speculative engine
advances by one draft-verify cycle at once, as SGLang's EAGLE worker verifies the drafts of its
whole running batch in one target forward.

One cycle (``ChainBatch.cycle``) for B running rows:

1. draft: each row's first draft token comes from the draft logits kept since its last extend, then
   ``num_steps - 1`` batched draft forwards ``[B, 1]`` chain the rest (speculative draft-cache
   entries);
2. verify: one batched target forward over ``[last token] + proposal`` (``[B, num_steps + 1]``);
3. accept per row (``ChainBatch._verify``): a greedy row keeps the longest proposal prefix equal to
   the target's argmax, plus the target's bonus token; a sampled row is verified by speculative
   sampling (``eagle3.serve.reference.sampling.verify_chain``, SGLang's default kernel for a chain:
   exact at thresholds 1.0), from its own coin stream, so its tokens have the target's distribution
   at the request's temperature;
4. rejected positions leave both caches before anything attends to them again: the speculative draft
   entries (the same ``num_steps - 1`` columns in every row) are cropped, the target's rejected
   columns are masked, the accepted pairs are appended to the draft cache in one batched extend
   (rows of different accept lengths masked), and both caches are then compacted per row
   (``_compact_index``): a stable sort of each row's mask moves its real columns to the right in
   order, so masked columns are dropped and the left padding is as short as the longest row needs.

Layout (both caches, as ``engine.HFEngine``): rows left padded, a ``[B, S]`` mask of real columns,
explicit position ids (the count of real tokens), so RoPE and attention are per row wherever a row
sits in the padded cache. Invariant between cycles: a row of ``n`` tokens (prompt + output) holds
``n - 1`` real target columns (its last token is fed by the next verify) and ``n - 1`` real draft
columns, the pairs ``(aux_t, token_{t+1})`` for ``t < n - 1`` at RoPE position ``t``
(``specdec.SpeculativeDecoder``'s draft state, one row per sequence).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from eagle3.model.draft import DraftKVCache
from eagle3.serve.reference.hf_engine import cache_keyword, left_pad
from eagle3.serve.reference.sampling import (
    RowSampling,
    Verified,
    next_tokens,
    target_probs,
    verify_chain,
    verify_greedy,
)
from eagle3.serve.reference.spec_decoder import SpeculativeDecoder


def _compact_index(mask: torch.Tensor) -> torch.Tensor:
    """``[B, W]`` column index right-aligning each row's real columns in order (``W`` = the longest
    row)."""
    # padding first, real columns last, in order
    order = torch.sort(mask.to(torch.int8), dim=1, stable=True).indices
    return order[:, order.shape[1] - int(mask.sum(1).max()) :]


def _take_columns(tensors: list[torch.Tensor], index: torch.Tensor) -> list[torch.Tensor]:
    """Each ``[B, heads, S, D]`` tensor -> ``[B, heads, W, D]`` keeping columns ``index [B, W]`` per
    row; a slice (no copy) when every row keeps the same contiguous columns (one row, or rows that
    all accepted alike)."""
    first, width = int(index[0, 0]), index.shape[1]
    if bool((index == torch.arange(first, first + width, device=index.device)).all()):
        return [x[:, :, first : first + width] for x in tensors]
    return [
        x.gather(2, index[:, None, :, None].expand(-1, x.shape[1], -1, x.shape[3])) for x in tensors
    ]


def _cat_rows(a: torch.Tensor, b: torch.Tensor, dim: int) -> torch.Tensor:
    """Stack two left-padded row blocks: pad both on the left to a common length along ``dim``."""
    width = max(a.shape[dim], b.shape[dim])
    return torch.cat([left_pad(a, width, dim), left_pad(b, width, dim)], dim=0)


def _cat_kv(
    a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    return _cat_rows(a[0], b[0], 2), _cat_rows(a[1], b[1], 2)  # keys, values [B, kv, S, D]


def _kv(draft: DraftKVCache) -> tuple[torch.Tensor, torch.Tensor]:
    assert draft.k is not None and draft.v is not None, (
        "the draft cache of a running batch holds every row's pairs"
    )
    return draft.k, draft.v


def _cat(a: torch.Tensor | None, b: torch.Tensor) -> torch.Tensor:
    return b if a is None else torch.cat([a, b])


class Cycle(NamedTuple):
    """One draft-verify cycle of every row: its new tokens (accepted drafts then the next token),
    the drafts it accepted, and ``draft_probs [B, S]``: the target's probability of each draft given
    the drafts before it (at the row's sampling; its acceptance probability at thresholds 1.0)."""

    tokens: list[list[int]]
    accepted: list[int]
    draft_probs: torch.Tensor


class ChainBatch:
    """The target and draft caches of the running rows and each row's draft state (see module
    docstring)."""

    def __init__(self, decoder: SpeculativeDecoder) -> None:
        # local: keeps `import eagle3.serve.reference` light for synthetic mode
        from transformers import DynamicCache

        self.d = decoder
        self._cache_cls = DynamicCache
        self._cache_kw = cache_keyword(decoder.target)
        self.reset()

    def reset(self) -> None:
        # target keys/values per layer [B, kv, S, D]
        self._layers: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._draft = DraftKVCache()  # [B, kv, S, D]
        # [B, S] real columns, the same in both caches between cycles
        self._mask = torch.zeros(0, 0, dtype=torch.bool)
        # [B, 1, H] draft pre-norm output at each row's last real pair
        self._hidden: torch.Tensor | None = None
        # [B, V_draft] draft logits there: each row's next first draft
        self._logits: torch.Tensor | None = None
        # [B] each row's last token (not yet in the target cache)
        self._last = torch.zeros(0, dtype=torch.long)
        self._length = torch.zeros(0, dtype=torch.long)  # [B] tokens per row, prompt + output
        self._rows: list[RowSampling] = []  # each row's sampling and coin stream

    @property
    def size(self) -> int:
        return int(self._last.shape[0])

    def _target(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor,
        cache: Any,
        *,
        last_only: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Target logits ``[B, S, V]`` (``[B, 1, V]`` with ``last_only``) and the draft's hidden
        input ``[B, S, 3H or H]`` for ``ids [B, S]``."""
        dev = self.d.device
        out = self.d.target(
            input_ids=ids.to(dev),
            attention_mask=mask.long().to(dev),
            position_ids=positions.to(dev),
            **{self._cache_kw: cache},
            use_cache=True,
            output_hidden_states=True,
            logits_to_keep=1 if last_only else 0,
        )
        return out.logits.float().cpu(), self.d.draft_input(out.hidden_states)

    def _draft_step(
        self,
        draft: DraftKVCache,
        mask: torch.Tensor,
        ids: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        draft.key_mask = mask.to(self.d.device)  # every key after this step's append
        logits, out = self.d.draft_step(ids, hidden, positions, draft)
        return logits.float().cpu(), out

    @torch.inference_mode()
    def prefill(self, prompts: list[list[int]], rows: list[RowSampling] | None = None) -> list[int]:
        """Add a row per prompt (after the running ones), sampling as ``rows`` say (default greedy);
        returns each one's first token, drawn from the target as the plain engine draws it."""
        rows = rows if rows is not None else [RowSampling() for _ in prompts]
        width = max(len(p) for p in prompts)
        ids = torch.zeros(len(prompts), width, dtype=torch.long)
        mask = torch.zeros(len(prompts), width, dtype=torch.bool)
        for b, p in enumerate(prompts):
            ids[b, width - len(p) :] = torch.tensor(p)
            mask[b, width - len(p) :] = True
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)  # [B, S]
        cache = self._cache_cls()
        logits, aux = self._target(ids, mask, positions, cache, last_only=True)
        first = torch.tensor(next_tokens(logits[:, -1], rows), dtype=torch.long)  # [B]
        draft = DraftKVCache()
        # (aux_t, token_{t+1}) at every prompt position t
        pairs = torch.cat([ids[:, 1:], first[:, None]], dim=1)
        draft_logits, hidden = self._draft_step(draft, mask, pairs, aux, positions)
        layers = [(k, v) for k, v, _ in cache]
        if self.size:  # join the running rows: both blocks left padded to a common width
            layers = [_cat_kv(old, new) for old, new in zip(self._layers, layers, strict=True)]
            draft.k, draft.v = _cat_kv(_kv(self._draft), _kv(draft))
            mask = _cat_rows(self._mask, mask, 1)
        self._layers, self._draft, self._mask = layers, draft, mask
        self._hidden = _cat(self._hidden, hidden[:, -1:])
        self._logits = _cat(self._logits, draft_logits[:, -1])
        self._last = torch.cat([self._last, first])
        self._length = torch.cat([self._length, torch.tensor([len(p) + 1 for p in prompts])])
        self._rows = self._rows + list(rows)
        return first.tolist()

    @torch.inference_mode()
    def cycle(self) -> Cycle:
        """One draft-verify cycle of every row (``Cycle``)."""
        assert self._hidden is not None and self._logits is not None
        steps, rows = self.d.num_steps, torch.arange(self.size)
        proposal = self._propose()  # [B, steps]
        offsets = torch.arange(steps + 1)
        # [B, steps + 1]: the last token, then the drafts
        positions = (self._length - 1)[:, None] + offsets
        mask = torch.cat([self._mask, torch.ones(self.size, steps + 1, dtype=torch.bool)], dim=1)
        cache = self._cache_cls(ddp_cache_data=self._layers)
        logits, aux = self._target(
            torch.cat([self._last[:, None], proposal], dim=1), mask, positions, cache
        )
        verified = self._verify(logits, proposal)
        accepted, new = verified.accepted, verified.tokens
        # [B, steps + 1]: the last token and the accepted drafts
        keep = offsets[None] <= accepted[:, None]
        # rejected target columns: masked now, dropped by the compaction below
        mask[:, -(steps + 1) :] = keep
        self._layers = [(k, v) for k, v, _ in cache]
        self._extend_draft(new, aux, positions, keep)
        self._compact_target(mask)
        self._last, self._length = new[rows, accepted], self._length + accepted + 1
        tokens = [new[b, : int(a) + 1].tolist() for b, a in enumerate(accepted)]
        return Cycle(tokens, accepted.tolist(), verified.draft_probs)

    def _verify(self, logits: torch.Tensor, proposal: torch.Tensor) -> Verified:
        """Greedy rows by argmax; with any sampled row, speculative sampling from each row's coins
        (a greedy row's distribution is one-hot there, so it gets the greedy answer either way)."""
        if all(row.greedy for row in self._rows):
            return verify_greedy(logits, proposal)
        steps = proposal.shape[1]
        coins = torch.stack([row.coins(steps + 1) for row in self._rows])  # [B, steps + 1]
        single, acc = self.d.accept_thresholds
        probs = target_probs(logits, self._rows)
        coins, final = coins[:, :steps], coins[:, steps]
        return verify_chain(
            probs, proposal, coins, final, threshold_single=single, threshold_acc=acc
        )

    def _propose(self) -> torch.Tensor:
        """``num_steps`` draft tokens per row (target ids), chained in ``num_steps - 1`` batched
        draft forwards."""
        assert self._hidden is not None and self._logits is not None
        tokens = [self.d.draft_ids[self._logits.argmax(-1).to(self.d.device)].cpu()]
        hidden, mask = self._hidden, self._mask
        for j in range(1, self.d.num_steps):
            mask = torch.cat([mask, torch.ones(self.size, 1, dtype=torch.bool)], dim=1)
            # token n-1+j sits at n-2+j (pairs are shifted by one)
            positions = (self._length - 2 + j)[:, None]
            logits, hidden = self._draft_step(
                self._draft, mask, tokens[-1][:, None], hidden, positions
            )
            tokens.append(self.d.draft_ids[logits[:, -1].argmax(-1).to(self.d.device)].cpu())
        return torch.stack(tokens, dim=1)

    def _extend_draft(
        self, new: torch.Tensor, aux: torch.Tensor, positions: torch.Tensor, keep: torch.Tensor
    ) -> None:
        """Drop the speculative draft entries, append each row's accepted pairs (one batched, ragged
        extend)."""
        # the chain's entries: the same num_steps - 1 columns in every row
        self._draft.crop(self._mask.shape[1])
        rows, accepted = torch.arange(self.size), keep.sum(1) - 1
        width = int(accepted.max()) + 1
        mask = torch.cat([self._mask, keep[:, :width]], dim=1)
        logits, hidden = self._draft_step(
            self._draft, mask, new[:, :width], aux[:, :width], positions[:, :width]
        )
        last_pair = (rows.to(self.d.device), accepted.to(self.d.device))
        self._hidden, self._logits = hidden[last_pair][:, None], logits[rows, accepted]
        self._compact_draft(mask)

    def _compact_draft(self, mask: torch.Tensor) -> None:
        self._draft.k, self._draft.v = _take_columns(
            list(_kv(self._draft)), _compact_index(mask).to(self.d.device)
        )

    def _compact_target(self, mask: torch.Tensor) -> None:
        index = _compact_index(mask)
        self._mask = mask.gather(1, index)
        flat = _take_columns([x for kv in self._layers for x in kv], index.to(self.d.device))
        self._layers = list(zip(flat[0::2], flat[1::2], strict=True))

    def select(self, keep: list[int]) -> None:
        """Keep only rows ``keep`` (finished sequences leave); columns that were padding in every
        row go too."""
        if not keep:
            self.reset()
            return
        assert self._hidden is not None and self._logits is not None
        index = torch.tensor(keep, dtype=torch.long)
        dev_index = index.to(self.d.device)
        self._layers = [(k[dev_index], v[dev_index]) for k, v in self._layers]
        k, v = _kv(self._draft)
        self._draft.k, self._draft.v = k[dev_index], v[dev_index]
        self._hidden, self._logits = self._hidden[dev_index], self._logits[index]
        self._last, self._length = self._last[index], self._length[index]
        self._rows = [self._rows[i] for i in keep]
        mask = self._mask[index]
        self._compact_draft(mask)
        self._compact_target(mask)
