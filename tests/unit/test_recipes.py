from __future__ import annotations

import pytest

from eagle3.config.base import ConfigError
from eagle3.recipes import RECIPES, load_recipe


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_loads_and_round_trips(name):
    cfg = load_recipe(name)
    assert cfg.name == name
    assert len(cfg.capture.aux_layers) == 3
    assert type(cfg).model_validate(cfg.model_dump(mode="json")) == cfg


@pytest.mark.parametrize(
    ("name", "layers", "hidden", "vocab", "sglang_ids", "export_ids"),
    [
        ("kimi_k2_5", 61, 7168, 163_840, [2, 30, 58], [1, 29, 57]),
        ("glm_5", 78, 6144, 154_880, [2, 39, 75], [1, 38, 74]),
        ("llama3_8b", 32, 4096, 128_256, [2, 16, 29], [1, 15, 28]),
        ("tiny", 8, 128, 2048, [2, 4, 5], [1, 3, 4]),
        ("smollm2", 30, 576, 49_152, [2, 15, 27], [1, 14, 26]),  # SGLang's own default for L=30
        ("tiny_think", 8, 128, 2048, [2, 4, 5], [1, 3, 4]),
    ],
)
def test_recipes_derive_aux_layers_from_the_target(
    name, layers, hidden, vocab, sglang_ids, export_ids
):
    cfg = load_recipe(name)
    assert (cfg.target.num_layers, cfg.target.hidden_size, cfg.target.vocab_size) == (
        layers,
        hidden,
        vocab,
    )
    assert cfg.sglang_layer_ids == sglang_ids
    assert cfg.export_layer_ids == export_ids


def test_unknown_recipe_lists_the_known_ones():
    with pytest.raises(ConfigError, match="glm_5, kimi_k2_5, llama3_8b, smollm2, tiny"):
        load_recipe("kimi")


def test_recipe_paths_resolve_from_eagle3_home_not_cwd(monkeypatch, tmp_path):
    monkeypatch.setenv("EAGLE3_HOME", str(tmp_path))
    cfg = load_recipe("tiny")
    assert cfg.root.startswith(str(tmp_path))
    assert all(s.path is None or s.path.startswith(str(tmp_path)) for s in cfg.sources)


@pytest.mark.parametrize("name", ["kimi_k2_5", "glm_5"])
def test_the_large_moe_targets_are_deepseek_family_and_captured_as_sglang_serves_them_on_8_gpus(
    name,
):
    cfg = load_recipe(name)
    # as the checkpoint says
    assert cfg.target.family == "deepseek" and cfg.capture.sglang.quantization is None
    assert (cfg.capture.backend, cfg.capture.device, cfg.capture.gpus, cfg.server.tp) == (
        "sglang",
        "cuda",
        8,
        8,
    )
    assert load_recipe("llama3_8b").target.family == "llama"


@pytest.mark.parametrize("name", ["kimi_k2_5", "glm_5", "llama3_8b"])
def test_large_recipes_store_the_compact_features_that_met_the_storage_goals(name):
    capture = load_recipe(name).capture
    assert (capture.encoding, capture.topk, capture.hidden_compression) == ("fp8_topk", 256, "lz4")


def test_kimi_refuses_aux_layers_sglang_would_serve_verbatim():
    """[3, 30, 58] exports as [2, 29, 57]; SGLang's DeepSeek path adds 1 only when the first id is
    1, so it would capture layers [2, 29, 57], not the trained [3, 30, 58]."""
    with pytest.raises(
        ConfigError, match=r"input_of_layer \[2, 29, 57\].*first aux layer must be 2"
    ):
        load_recipe("kimi_k2_5", ["capture.aux_layers=[3,30,58]"])


def test_tiny_think_is_the_tiny_recipe_on_the_thinking_world(monkeypatch, tmp_path):
    from eagle3.worlds.think_world import ThinkWorldSpec
    from eagle3.worlds.world import world_dir_for

    monkeypatch.setenv("EAGLE3_HOME", str(tmp_path))
    cfg, tiny = load_recipe("tiny_think"), load_recipe("tiny")
    world = world_dir_for(tmp_path / "cache", ThinkWorldSpec())
    assert cfg.target.model_path == str(world / "model") and cfg.dev.world == "think"
    assert all(s.path.startswith(str(world / "data")) for s in cfg.sources)
    assert sorted(cfg.gate.prompt_sets) == ["think", "tools"]
    assert (cfg.regen.reasoning_parser, cfg.regen.tool_call_parser, cfg.regen.thinking) == (
        "kimi_k2",
        "kimi_k2",
        True,
    )
    # a variant of tiny
    assert (cfg.train, cfg.capture, cfg.server) == (tiny.train, tiny.capture, tiny.server)


def test_a_target_whose_checkpoint_has_other_layers_is_refused_and_odd_aux_layers_warned(
    tmp_path, caplog
):
    """A config copied from another recipe keeps its layer count and aux layers; where the
    checkpoint's config.json is on disk, the count is checked at load, and aux layers that skip the
    upper half are named."""
    from eagle3.recipes import resolve

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"num_hidden_layers": 30}')
    refused = r"target.num_layers=8 but .* has 30 layers: set target.num_layers=30"
    with pytest.raises(ConfigError, match=refused):
        resolve("tiny", [f"target.model_path={model}"])
    with caplog.at_level("WARNING"):
        copied = ["target.num_layers=30", "capture.aux_layers=[2,4,5]"]
        resolve("tiny", [f"target.model_path={model}", *copied])
    assert "take no layer from the upper half of this 30-layer target" in caplog.text
    assert "[2, 15, 27]" in caplog.text
