"""EAGLE 3.1 in the draft head: the aux norms before ``fc`` and the post-norm hidden handed to the
next step, checked against a direct computation written from SGLang 0.5.23's ``llama_eagle3.py``
(not through the module's own ``fuse``), and the TTT unroll reading what SGLang feeds the next
step."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig

from eagle3.model.draft import DraftConfig, DraftModel, TTTCache
from eagle3.train.loss import TTTObjective, shift_left

H, V, VD = 32, 50, 20


def _config(**flags) -> DraftConfig:
    target = LlamaConfig(
        hidden_size=H,
        intermediate_size=48,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=V,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
    )
    return DraftConfig.from_target_config(target, draft_vocab_size=VD, **flags)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return weight * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _randomize_norms(model: DraftModel) -> None:
    """Norm weights start at 1; random ones make a forgotten or misplaced norm visible."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if (
                name.endswith("norm.weight")
                or ".norm" in name
                or name.startswith(("fc_norm", "input_norm"))
            ):
                p.copy_(torch.rand_like(p) + 0.5)


def _reference(
    model: DraftModel, embeds, aux, positions, *, fc_norm: bool, before: bool, norm_output: bool
):
    """One step computed directly: [input_norm over 3H] -> [per-chunk fc_norm] -> fc -> midlayer ->
    norm."""
    x = _rms(aux, model.input_norm.weight) if before else aux
    if fc_norm:
        x = torch.cat(
            [_rms(c, n.weight) for c, n in zip(x.chunk(3, -1), model.fc_norm, strict=True)], -1
        )
    fused = x @ model.fc.weight.T
    # the decoder layer itself is EAGLE-3's, tested elsewhere
    out = model.midlayer(embeds, fused, positions, None)
    normed = _rms(out, model.norm.weight)
    return normed @ model.lm_head.weight.T, normed if norm_output else out


@pytest.mark.parametrize(
    ("fc_norm", "before", "norm_output"),
    [(True, False, True), (True, False, False), (False, True, False), (True, True, True)],
)
def test_eagle31_step_equals_the_direct_computation(fc_norm, before, norm_output):
    torch.manual_seed(0)
    model = DraftModel(
        _config(fc_norm=fc_norm, norm_before_fc=before, norm_output=norm_output)
    ).eval()
    _randomize_norms(model)
    embeds, aux = torch.randn(2, 5, H), 3 * torch.randn(2, 5, 3 * H)
    positions = torch.arange(5).expand(2, 5)
    with torch.no_grad():
        logits, hidden = model(embeds, aux, positions)
        want_logits, want_hidden = _reference(
            model, embeds, aux, positions, fc_norm=fc_norm, before=before, norm_output=norm_output
        )
        plain = DraftModel(_config())
        plain.load_state_dict(
            {
                k: v
                for k, v in model.state_dict().items()
                if not k.startswith(("fc_norm", "input_norm"))
            }
        )
        plain_logits, _ = plain.eval()(embeds, aux, positions)
    torch.testing.assert_close(logits, want_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(hidden, want_hidden, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(logits, plain_logits, atol=1e-3)  # the norms changed the computation


def test_eagle31_norms_exist_only_with_their_flags_and_an_h_wide_hidden_skips_them():
    assert {
        n
        for n, _ in DraftModel(_config()).named_parameters()
        if "fc_norm" in n or "input_norm" in n
    } == set()
    model = DraftModel(_config(fc_norm=True, norm_before_fc=True))
    names = {n for n, _ in model.named_parameters()}
    assert {
        "fc_norm.0.weight",
        "fc_norm.1.weight",
        "fc_norm.2.weight",
        "input_norm.weight",
    } <= names
    hidden = torch.randn(1, 3, H)
    # a chained step's H-wide hidden: no fc, no aux norm (SGLang)
    assert torch.equal(model.fuse(hidden), hidden)


def test_norm_output_hands_the_post_norm_state_to_the_next_step():
    torch.manual_seed(1)
    embeds, aux, positions = torch.randn(1, 4, H), torch.randn(1, 4, 3 * H), torch.arange(4)[None]
    pre = DraftModel(_config(fc_norm=True)).eval()
    post = DraftModel(_config(fc_norm=True, norm_output=True)).eval()
    post.load_state_dict(pre.state_dict())
    _randomize_norms(pre)
    post.load_state_dict(pre.state_dict())
    with torch.no_grad():
        logits_pre, hidden_pre = pre(embeds, aux, positions)
        logits_post, hidden_post = post(embeds, aux, positions)
    torch.testing.assert_close(logits_pre, logits_post)  # the logits do not depend on the flag
    torch.testing.assert_close(hidden_post, pre.norm(hidden_pre))


@pytest.mark.parametrize("norm_output", [False, True])
def test_ttt_unroll_feeds_each_step_what_sglang_feeds_the_next_draft_step(norm_output):
    """Step k >= 1 of the unroll reads step k-1's returned hidden: post-norm with ``norm_output``,
    else pre-norm."""
    torch.manual_seed(2)
    draft = DraftModel(_config(fc_norm=True, norm_output=norm_output))
    _randomize_norms(draft)
    seen: list[torch.Tensor] = []
    returned: list[tuple[torch.Tensor, torch.Tensor]] = []

    def record(module, args, output):
        seen.append(args[1].detach())
        returned.append(tuple(o.detach() for o in output))

    draft.register_forward_hook(record)
    b, t, steps = 2, 9, 3
    ids, aux, embed = torch.randint(0, V, (b, t)), torch.randn(b, t, 3 * H), torch.randn(V, H)
    target = torch.softmax(torch.randn(b, t, VD), -1)
    masks = torch.ones(steps, b, t)
    TTTObjective(draft, steps=steps, decay=0.8)(ids, aux, embed, target, masks, torch.ones(steps))
    for k in range(1, steps):
        # step k reads step k-1's returned hidden
        torch.testing.assert_close(seen[k], returned[k - 1][1])
    # step 0's pre-norm output, recomputed outside the unroll (its attention is causal)
    with torch.no_grad():
        pre = draft.midlayer(
            F.embedding(shift_left(ids, 1), embed),
            draft.fuse(aux),
            torch.arange(t).expand(b, t),
            TTTCache(),
        )
    torch.testing.assert_close(
        seen[1], draft.norm(pre) if norm_output else pre, rtol=1e-5, atol=1e-5
    )
