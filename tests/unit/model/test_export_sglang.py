"""The SGLang export format and its writer: exact key set (golden,
``export_format.expected_shapes``), shapes, config fields, refusal of broken exports, and a lossless
round trip (reloaded export gives identical logits)."""

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
from eagle3.model.export_format import WEIGHTS_FILE, expected_shapes, load_draft, validate_export
from eagle3.model.target_weights import load_target_head
from eagle3.rundir.runroot import FileEntry, Manifest
from eagle3.train.checkpoint import save_checkpoint
from eagle3.train.export import export_draft

GOLDEN = Path(__file__).parent / "golden" / "export_keys.json"
H, V, VD, LAYERS = 32, 64, 16, 8


@pytest.fixture
def trained_out(tmp_path) -> tuple[PipelineConfig, Path, Path, DraftModel]:
    """A training output dir with one checkpoint of a random draft, its vocab and the config."""
    target = LlamaConfig(
        hidden_size=H,
        intermediate_size=48,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=V,
        num_hidden_layers=LAYERS,
        max_position_embeddings=128,
    )
    draft_cfg = DraftConfig.from_target_config(
        target, draft_vocab_size=VD, max_position_embeddings=256
    )
    torch.manual_seed(0)
    draft = DraftModel(draft_cfg)
    out = tmp_path / "draft"
    save_checkpoint(
        out / "ckpt",
        5,
        model=draft.state_dict(),
        optimizer={},
        trainer={"draft_config": draft_cfg.to_dict()},
        rank_state={},
    )
    targets = torch.arange(0, 2 * VD, 2)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[targets] = True
    vocab = tmp_path / "vocab.safetensors"
    save_file(
        {"d2t": targets - torch.arange(VD), "t2d": t2d, "counts": torch.ones(V, dtype=torch.long)},
        str(vocab),
    )
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
            ),
        ),
        ["train.precision=fp32"],
    )
    return config, out, vocab, draft


def test_export_key_set_equals_golden_and_config_matches_sglang(trained_out, tmp_path):
    config, out, vocab, _ = trained_out
    export = export_draft(config, out, vocab, None, tmp_path / "export")
    golden = json.loads(GOLDEN.read_text())
    assert sorted(load_file(str(export / WEIGHTS_FILE))) == golden
    cfg = json.loads((export / "config.json").read_text())
    # the format's key set itself, not only what export wrote
    assert sorted(expected_shapes(cfg)) == golden
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["num_hidden_layers"] == 1
    assert (
        cfg["vocab_size"] == V
        and cfg["draft_vocab_size"] == VD
        and cfg["tie_word_embeddings"] is False
    )
    assert cfg["eagle_config"] == {
        "eagle_aux_hidden_state_layer_ids": [1, 3, 4],
        "use_aux_hidden_state": True,
    }
    assert cfg["max_position_embeddings"] >= 256 and "target_hidden_size" not in cfg
    # Hub metadata first (export_format.card_metadata), then the card
    card = (export / "README.md").read_text()
    assert card.startswith("---\nlicense: ") and "\n---\n\n# EAGLE-3 draft" in card
    assert validate_export(export) == []


def test_layer_ids_come_from_the_capture_manifest_and_must_agree(trained_out, tmp_path):
    config, out, vocab, _ = trained_out
    features = tmp_path / "features" / "fp"
    features.mkdir(parents=True)
    Manifest(
        "features",
        "fp",
        files=[],
        config={"layer_ids": [2, 4, 5], "layer_convention": "input_of_layer"},
    ).write(features)
    cfg = json.loads(
        (export_draft(config, out, vocab, features, tmp_path / "e") / "config.json").read_text()
    )
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    Manifest(
        "features",
        "fp",
        files=[FileEntry("x", 0, 0, "")],
        config={"layer_ids": [1, 4, 6], "layer_convention": "input_of_layer"},
    ).write(features)
    with pytest.raises(ValueError, match="capture used layers"):
        export_draft(config, out, vocab, features, tmp_path / "e2")


def test_reloaded_export_gives_identical_logits(trained_out, tmp_path):
    config, out, vocab, draft = trained_out
    model, d2t, t2d, _cfg = load_draft(export_draft(config, out, vocab, None, tmp_path / "export"))
    embeds, aux = torch.randn(2, 7, H), torch.randn(2, 7, 3 * H)
    positions = torch.arange(7).expand(2, 7)
    with torch.no_grad():
        assert torch.equal(
            model(embeds, aux, positions)[0], draft.eval()(embeds, aux, positions)[0]
        )
    assert torch.equal(d2t + torch.arange(VD), torch.arange(0, 2 * VD, 2)) and int(t2d.sum()) == VD


def _corrupt(export: Path, mutate) -> list[str]:
    tensors = load_file(str(export / "model.safetensors"))
    mutate(tensors)
    save_file(tensors, str(export / "model.safetensors"))
    return validate_export(export)


def test_corrupted_exports_are_refused(trained_out, tmp_path):
    config, out, vocab, _ = trained_out
    export = export_draft(config, out, vocab, None, tmp_path / "export")
    assert any("missing tensor d2t" in p for p in _corrupt(export, lambda t: t.pop("d2t")))
    export = export_draft(config, out, vocab, None, tmp_path / "export")
    problems = _corrupt(export, lambda t: t.__setitem__("fc.weight", torch.zeros(H, H)))
    assert any("fc.weight has shape" in p for p in problems)
    export = export_draft(config, out, vocab, None, tmp_path / "export")
    assert any(
        "unexpected tensor embed_tokens.weight" in p
        for p in _corrupt(export, lambda t: t.__setitem__("embed_tokens.weight", torch.zeros(V, H)))
    )
    with pytest.raises(ValueError, match="not a valid EAGLE-3 export"):
        load_draft(export)


def test_export_refuses_to_write_a_vocab_that_does_not_match(trained_out, tmp_path):
    config, out, vocab, _ = trained_out
    bad = tmp_path / "bad-vocab.safetensors"
    tensors = load_file(str(vocab))
    save_file({**tensors, "d2t": tensors["d2t"][:-1]}, str(bad))
    with pytest.raises(ValueError, match="refusing to write a broken export"):
        export_draft(config, out, bad, None, tmp_path / "export")
    assert not (tmp_path / "export").exists()


def test_target_head_reads_only_embed_and_lm_head_from_sharded_checkpoint(tmp_path):
    embed, head = torch.randn(V, H), torch.randn(V, H)
    save_file(
        {"model.embed_tokens.weight": embed, "model.norm.weight": torch.ones(H)},
        str(tmp_path / "a.safetensors"),
    )
    save_file({"lm_head.weight": head}, str(tmp_path / "b.safetensors"))
    index = {
        "weight_map": {
            "model.embed_tokens.weight": "a.safetensors",
            "model.norm.weight": "a.safetensors",
            "lm_head.weight": "b.safetensors",
        }
    }
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    loaded = load_target_head(str(tmp_path))
    assert (
        torch.equal(loaded.embed, embed) and torch.equal(loaded.lm_head, head) and not loaded.tied
    )
    tied_dir = tmp_path / "tied"
    tied_dir.mkdir()
    save_file({"model.embed_tokens.weight": embed}, str(tied_dir / "model.safetensors"))
    tied = load_target_head(str(tied_dir))
    assert tied.tied and torch.equal(tied.lm_head, embed)
