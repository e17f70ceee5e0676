"""Reference EAGLE-3 speculative decoding (chain) with an HF target and an exported draft.

One round: the draft proposes ``num_steps`` tokens (one from the last real position, then
``num_steps - 1`` chained steps feeding its own pre-norm hidden back), the target verifies all of
them in one forward pass. Greedy: the longest prefix that equals the target's greedy choice is kept
plus the target's bonus token, so the output is exactly the target's greedy decoding. Sampled (a
``RowSampling`` with a temperature): speculative sampling
(``eagle3.serve.reference.sampling.verify_chain``), so the output has the target's distribution at
that sampling. Either way the draft only changes how many target passes it takes. Accept length =
generated tokens / target verify passes (SGLang's ``completion_tokens / spec_verify_ct``: the
prefill that yields the first token is not a verify pass).

Draft state mirrors SGLang: the draft KV cache holds one entry per *real* position ``t`` built from
the pair ``(target aux hidden of token t, token t+1)`` at RoPE position ``t``; speculative entries
are dropped after every verification (``DraftKVCache.crop``) and the accepted tokens' pairs are
appended with the target's aux hidden states from the verify pass. The target's ``DynamicCache`` is
cropped to the accepted length.

``aux="last_hidden_only"`` reproduces serving an EAGLE-3 draft with SGLang's plain ``EAGLE``
algorithm: the draft gets the target's final hidden state (HF ``hidden_states[-1]``, the post-norm
input of ``lm_head``, which is what SGLang hands EAGLE) instead of the 3-layer fusion, and because
that is already ``H`` wide ``fc`` is skipped. The accept length collapses towards 1.0, the signature
preflight looks for.

It lives in ``serve`` because the reference server's batched speculative engine
(``eagle3.serve.reference.spec_batch``) runs its loaded draft through ``draft_input`` and
``draft_step``, and this one-sequence loop is the reference the batched one is tested against; the
gate's offline acceptance (``eagle3.gate.offline_accept``) builds on it from the layer above.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

import torch

from eagle3.model.draft import DraftKVCache
from eagle3.model.export_format import load_draft, target_ids
from eagle3.serve.reference.sampling import (
    RowSampling,
    next_tokens,
    target_probs,
    verify_chain,
    verify_greedy,
)

AuxMode = Literal["eagle3", "last_hidden_only"]


@dataclass
class _State:
    """Per-sequence decoding state: target cache, draft cache, tokens so far (prompt +
    generated)."""

    target_cache: Any
    draft_cache: DraftKVCache
    tokens: list[int]
    # the draft hidden its next step reads (DraftModel.forward) [1, 1, H]
    draft_hidden: torch.Tensor | None = None
    next_draft_logits: torch.Tensor | None = None  # draft logits there [V_draft]


class SpeculativeDecoder:
    """Chain speculative decoding; ``generate`` returns the new token ids and each verify pass's
    counts. ``accept_thresholds`` (single, acc) are SGLang's ``--speculative-accept-threshold-*``
    (1.0: exact)."""

    accept_thresholds: tuple[float, float] = (1.0, 1.0)

    def __init__(
        self,
        target: torch.nn.Module,
        tokenizer: Any,
        draft_dir: Path,
        num_steps: int,
        aux_mode: AuxMode = "eagle3",
    ) -> None:
        if aux_mode not in ("eagle3", "last_hidden_only"):
            raise ValueError(f"aux_mode={aux_mode!r}: use 'eagle3' or 'last_hidden_only'")
        self.target, self.tokenizer, self.num_steps, self.aux_mode = (
            target.eval(),
            tokenizer,
            num_steps,
            aux_mode,
        )
        self.draft, d2t, _t2d, cfg = load_draft(draft_dir)
        self.device = next(target.parameters()).device
        self.draft.to(self.device)
        self.dtype = next(self.draft.parameters()).dtype
        self.draft_ids = target_ids(d2t).to(self.device)
        # eagle_config ids are output_of_layer; SGLang (Llama) adds 1 to get hidden_states indices.
        self.layer_ids = [i + 1 for i in cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]
        self.embed = target.get_input_embeddings()

    def _target_forward(self, ids: list[int], cache: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Target logits ``[S, V]`` and the draft's hidden input ``[1, S, 3H or H]`` for new tokens
        ``ids``."""
        out = self.target(
            input_ids=torch.tensor([ids], device=self.device),
            past_key_values=cache,
            use_cache=True,
            output_hidden_states=True,
        )
        return out.logits[0], self.draft_input(out.hidden_states)

    def draft_input(self, hidden_states: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """The draft's hidden input from HF ``hidden_states``: ``[B, S, 3H]`` (EAGLE3) or ``[B, S,
        H]`` (EAGLE)."""
        if self.aux_mode == "last_hidden_only":
            return hidden_states[-1]  # [B, S, H]: fc is skipped, as in SGLang's EAGLE algorithm
        # 3 x [B, S, H] -> [B, S, 3H]
        return torch.cat([hidden_states[i] for i in self.layer_ids], dim=-1)

    def draft_step(
        self, ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, cache: DraftKVCache
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft forward over target ids ``[B, S]``: (draft logits ``[B, S, V_draft]``, hidden
        ``[B, S, H]``)."""
        embeds = self.embed(ids.to(self.device)).to(self.dtype)  # [B, S] -> [B, S, H]
        return self.draft(embeds, hidden.to(self.dtype), positions.to(self.device), cache)

    def _draft_extend(
        self, state: _State, aux: torch.Tensor, next_tokens: list[int], start: int
    ) -> None:
        """Append real pairs ``(aux_t, token_{t+1})`` at positions ``start..`` to the draft
        cache."""
        positions = torch.arange(start, start + len(next_tokens))[None]
        logits, hidden = self.draft_step(
            torch.tensor([next_tokens]), aux, positions, state.draft_cache
        )
        state.draft_hidden, state.next_draft_logits = hidden[:, -1:], logits[0, -1]

    def _propose(self, state: _State, length: int) -> list[int]:
        """``num_steps`` draft tokens (target ids) continuing the sequence of ``length`` tokens."""
        proposal = [int(self.draft_ids[state.next_draft_logits.argmax()])]
        hidden = state.draft_hidden
        for j in range(1, self.num_steps):
            position = torch.tensor([[length - 2 + j]])
            logits, hidden = self.draft_step(
                torch.tensor([[proposal[-1]]]), hidden, position, state.draft_cache
            )
            proposal.append(int(self.draft_ids[logits[0, -1].argmax()]))
        return proposal

    def _verify(
        self, state: _State, proposal: list[int], sampling: RowSampling
    ) -> tuple[list[int], list[float]]:
        """One target pass over ``[last token] + proposal``; returns the accepted tokens + the next
        token, and the target's probability of each draft given the drafts before it."""
        length = len(state.tokens)  # the last token is not yet in the target cache
        logits, aux = self._target_forward([state.tokens[-1], *proposal], state.target_cache)
        drafts = torch.tensor([proposal])
        if sampling.greedy:
            verified = verify_greedy(logits.float().cpu()[None], drafts)
        else:
            coins = sampling.coins(len(proposal) + 1)[None]
            probs = target_probs(logits.float().cpu()[None], [sampling])
            single, acc = self.accept_thresholds
            coins, final = coins[:, :-1], coins[:, -1]
            verified = verify_chain(
                probs, drafts, coins, final, threshold_single=single, threshold_acc=acc
            )
        accepted = int(verified.accepted[0])
        new_tokens = verified.tokens[0, : accepted + 1].tolist()
        _crop_target_cache(state.target_cache, length + accepted)
        state.draft_cache.crop(length - 1)
        self._draft_extend(state, aux[:, : accepted + 1], new_tokens, start=length - 1)
        return new_tokens, verified.draft_probs[0].tolist()

    @torch.no_grad()
    def generate(
        self,
        input_ids: Sequence[int],
        max_new_tokens: int,
        eos_ids: Sequence[int] = (),
        sampling: RowSampling | None = None,
    ) -> Decoded:
        """Decode from a prompt, greedily or as ``sampling`` says; stops at ``max_new_tokens`` or
        after an eos id (kept in the output)."""
        from transformers import DynamicCache

        sampling = sampling if sampling is not None else RowSampling()
        prompt = [int(t) for t in input_ids]
        state = _State(target_cache=DynamicCache(), draft_cache=DraftKVCache(), tokens=list(prompt))
        logits, aux = self._target_forward(prompt, state.target_cache)
        state.tokens += next_tokens(logits[-1:].float().cpu(), [sampling])
        self._draft_extend(state, aux, state.tokens[1:], start=0)
        accepted: list[int] = []
        draft_probs: list[list[float]] = []
        draft_probs: list[list[float]]
        eos = set(eos_ids)
        while not self._done(state.tokens[len(prompt) :], max_new_tokens, eos):
            proposal = self._propose(state, len(state.tokens))
            new_tokens, probs = self._verify(state, proposal, sampling)
            state.tokens.extend(new_tokens)
            accepted.append(len(new_tokens) - 1)  # the next token is the target's, not a draft's
            draft_probs.append(probs)
        output = _truncate(state.tokens[len(prompt) :], max_new_tokens, eos)
        return Decoded(output, len(accepted), accepted, draft_probs)

    @staticmethod
    def _done(generated: list[int], max_new_tokens: int, eos: set[int]) -> bool:
        return len(generated) >= max_new_tokens or any(t in eos for t in generated)


class Decoded(NamedTuple):
    """A decoded request: its tokens, the target verify passes, the drafts each pass accepted, and
    each pass's ``p_j(x_j)`` (the target's probability of draft j given the drafts before it, at the
    request's sampling)."""

    tokens: list[int]
    passes: int
    accepted: list[int]
    draft_probs: list[list[float]]


def _crop_target_cache(cache: Any, keep: int) -> None:
    """Drop the rejected positions of an HF ``DynamicCache`` (a negative ``crop`` removes that many
    tokens)."""
    remove = cache.get_seq_length() - keep
    if remove > 0:
        cache.crop(-remove)


def _truncate(generated: list[int], max_new_tokens: int, eos: set[int]) -> list[int]:
    out = generated[:max_new_tokens]
    for i, tok in enumerate(out):
        if tok in eos:
            return out[: i + 1]
    return out
