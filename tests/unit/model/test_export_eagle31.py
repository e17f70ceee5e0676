"""The EAGLE 3.1 export: the flags where SGLang 0.5.23 reads them, the norm weights under the names
it loads (golden key set), a lossless reload, and the refusal of a key set that disagrees with the
flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig

from eagle3.config.pipeline import PipelineConfig, with_overrides
from eagle3.config.target import TargetConfig
from eagle3.model.draft import DraftConfig, DraftModel
from eagle3.model.export_format import (
    WEIGHTS_FILE,
    expected_shapes,
    load_draft,
    served_flags,
    validate_export,
)
from eagle3.train.checkpoint import save_checkpoint
from eagle3.train.export import export_draft

GOLDEN = Path(__file__).parent / "golden"
H, V, VD, LAYERS = 32, 64, 16, 8
FLAGS = {"fc_norm": True, "norm_output": True, "norm_before_fc": True}


def _export(
    tmp_path: Path,
    *,
    target=None,
    draft_vocab: int = VD,
    family: str = "llama",
    overrides: list[str] = (),
    **flags,
) -> tuple[Path, DraftModel]:
    """A draft with random weights (norms off 1) for ``target`` (a Llama one by default),
    checkpointed and exported through ``export_draft``; ``draft_vocab`` ``V`` is the full vocab."""
    target = target or LlamaConfig(
        hidden_size=H,
        intermediate_size=48,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=V,
        num_hidden_layers=LAYERS,
        max_position_embeddings=128,
    )
    draft_cfg = DraftConfig.from_target_config(target, draft_vocab_size=draft_vocab, **flags)
    torch.manual_seed(0)
    draft = DraftModel(draft_cfg)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if "norm" in name:
                p.copy_(torch.rand_like(p) + 0.5)
    out = tmp_path / "draft"
    save_checkpoint(
        out / "ckpt",
        5,
        model=draft.state_dict(),
        optimizer={},
        trainer={"draft_config": draft_cfg.to_dict()},
        rank_state={},
    )
    targets = torch.arange(V) if draft_vocab == V else torch.arange(0, 2 * draft_vocab, 2)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[targets] = True
    vocab = tmp_path / "vocab.safetensors"
    save_file({"d2t": targets - torch.arange(draft_vocab), "t2d": t2d}, str(vocab))
    config = with_overrides(
        PipelineConfig(
            name="t",
            root=str(tmp_path),
            target=TargetConfig(
                model_path="unused",
                num_layers=LAYERS,
                hidden_size=H,
                vocab_size=V,
                context_length=256,
                family=family,
            ),
        ),
        ["train.precision=fp32", *overrides],
    )
    return export_draft(config, out, vocab, None, tmp_path / "export"), draft


def test_eagle31_export_writes_the_flags_and_the_norm_weights_sglang_loads(tmp_path):
    export, _ = _export(tmp_path, **FLAGS)
    cfg = json.loads((export / "config.json").read_text())
    assert (
        cfg["fc_norm"] is True
        and cfg["norm_output"] is True
        and cfg["eagle_config"]["norm_before_fc"] is True
    )
    assert served_flags(cfg) == FLAGS
    golden = json.loads((GOLDEN / "export_keys_eagle31.json").read_text())
    assert sorted(load_file(str(export / WEIGHTS_FILE))) == golden == sorted(expected_shapes(cfg))
    shapes = expected_shapes(cfg)
    assert shapes["fc_norm.0.weight"] == (H,) and shapes["input_norm.weight"] == (3 * H,)
    assert validate_export(export) == []
    assert (
        "draft variant EAGLE 3.1 (fc_norm, norm_output, norm_before_fc)"
        in (export / "README.md").read_text()
    )


def test_eagle3_export_has_no_31_fields(tmp_path):
    export, _ = _export(tmp_path)
    cfg = json.loads((export / "config.json").read_text())
    assert not {"fc_norm", "norm_output", "use_aux_norm"} & set(cfg)
    assert cfg["eagle_config"] == {
        "eagle_aux_hidden_state_layer_ids": [1, 3, 4],
        "use_aux_hidden_state": True,
    }
    assert served_flags(cfg) == dict.fromkeys(FLAGS, False)
    assert "objective `kl`; draft variant EAGLE-3" in (export / "README.md").read_text()


@pytest.mark.parametrize("flags", [FLAGS, {"fc_norm": True, "norm_output": True}])
def test_reloaded_eagle31_export_gives_identical_logits_and_hidden(tmp_path, flags):
    export, draft = _export(tmp_path, **flags)
    model, *_ = load_draft(export)
    assert {k: getattr(model.config, k) for k in flags} == flags
    embeds, aux, positions = (
        torch.randn(2, 7, H),
        torch.randn(2, 7, 3 * H),
        torch.arange(7).expand(2, 7),
    )
    with torch.no_grad():
        got, want = model(embeds, aux, positions), draft.eval()(embeds, aux, positions)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_legacy_use_aux_norm_reads_as_fc_norm():
    assert served_flags({"use_aux_norm": True})["fc_norm"] is True
    # top level, as SGLang also reads it
    assert served_flags({"norm_before_fc": True})["norm_before_fc"] is True


def _rewrite(export: Path, *, config=None, tensors=None) -> list[str]:
    if config is not None:
        cfg = json.loads((export / "config.json").read_text())
        config(cfg)
        (export / "config.json").write_text(json.dumps(cfg))
    if tensors is not None:
        weights = load_file(str(export / WEIGHTS_FILE))
        tensors(weights)
        save_file(weights, str(export / WEIGHTS_FILE))
    return validate_export(export)


def test_norm_weights_without_their_flag_are_refused_as_weights_sglang_would_drop(tmp_path):
    export, _ = _export(tmp_path, fc_norm=True)
    problems = _rewrite(export, config=lambda c: c.pop("fc_norm"))
    assert any("unexpected tensor fc_norm.0.weight" in p for p in problems)


def test_a_flag_without_its_weights_is_refused(tmp_path):
    export, _ = _export(tmp_path)
    problems = _rewrite(
        export, config=lambda c: c["eagle_config"].__setitem__("norm_before_fc", True)
    )
    assert any("missing tensor input_norm.weight" in p for p in problems)
