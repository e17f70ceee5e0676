from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from eagle3.config.base import ConfigError
from eagle3.config.pipeline import load_yaml, validate
from eagle3.recipes import load_recipe


def _base() -> dict:
    return {
        "name": "t",
        "root": "/tmp/x",
        "target": {"model_path": "m", "num_layers": 61, "hidden_size": 7168, "vocab_size": 163840},
    }


def test_default_aux_layers_follow_sglang_for_61_layers():
    cfg = validate(_base())
    assert cfg.capture.layer_convention == "input_of_layer"
    assert cfg.sglang_layer_ids == [2, 30, 58]
    assert cfg.export_layer_ids == [1, 29, 57]


def test_unknown_key_is_rejected_with_its_path():
    data = _base() | {"trian": {"lr": 1}}
    with pytest.raises(ConfigError, match=r"unknown key 'trian'"):
        validate(data)


def test_nested_unknown_key_is_rejected():
    data = _base() | {"train": {"learning_rate": 1e-4}}
    with pytest.raises(ConfigError, match=r"train.learning_rate"):
        validate(data)


@pytest.mark.parametrize(
    ("layers", "needle"),
    [
        ([2, 30], "has 2 ids"),
        ([2, 30, 30], "repeats a layer"),
        ([2, 30, 61], "outside"),
        ([30, 2, 58], "not ascending"),
    ],
)
def test_bad_layer_ids_fail_with_the_fix(layers, needle):
    data = _base() | {"capture": {"aux_layers": layers}}
    with pytest.raises(ConfigError, match=needle) as err:
        validate(data)
    assert "set capture.aux_layers to 3 ascending ids" in str(err.value)
    assert "[2, 30, 58]" in str(err.value)


def test_unnamed_layer_convention_lists_the_known_ones():
    data = _base() | {"capture": {"layer_convention": "hf"}}
    with pytest.raises(ConfigError, match="input_of_layer"):
        validate(data)


def test_output_convention_converts_both_ways():
    data = _base() | {"capture": {"aux_layers": [1, 29, 57], "layer_convention": "output_of_layer"}}
    cfg = validate(data)
    assert cfg.sglang_layer_ids == [2, 30, 58]
    assert cfg.export_layer_ids == [1, 29, 57]


def test_topk_one_requires_chain_draft_tokens():
    data = _base() | {"speculative": {"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 8}}
    with pytest.raises(ConfigError, match=r"num_draft_tokens to num_steps\+1 \(4\)"):
        validate(data)


def test_yaml_round_trip_and_overrides(tmp_path: Path):
    cfg = load_recipe("kimi_k2_5")
    path = tmp_path / "c.yaml"
    path.write_text(cfg.to_yaml())
    again = load_yaml(path, ["train.lr=2e-4", "regen.servers=[http://a:1, http://b:2]"])
    assert again.train.lr == 2e-4
    assert again.regen.servers == ["http://a:1", "http://b:2"]
    assert again.model_dump(exclude={"train", "regen"}) == cfg.model_dump(
        exclude={"train", "regen"}
    )


def test_override_of_missing_section_names_it():
    with pytest.raises(ConfigError, match="no config section 'trainer'"):
        load_recipe("tiny", ["trainer.lr=1"])


def test_override_with_bad_value_fails_like_a_bad_file():
    with pytest.raises(ConfigError, match=r"train\.lr"):
        load_recipe("tiny", ["train.lr=-1"])


def test_a_typed_replace_is_validated_like_an_override_and_leaves_the_original_alone():
    cfg = load_recipe("kimi_k2_5")
    served = cfg.replace(server=cfg.server.replace(tp=4), capture=cfg.capture.replace(gpus=4))
    assert (served.server.tp, served.capture.gpus) == (4, 4) and (
        cfg.server.tp,
        cfg.capture.gpus,
    ) == (8, 8)
    assert served.model_dump(exclude={"server", "capture"}) == cfg.model_dump(
        exclude={"server", "capture"}
    )
    # a cross-section rule holds for code too
    with pytest.raises(ValidationError, match=r"capture\.gpus"):
        cfg.replace(capture=cfg.capture.replace(gpus=4))  # 8 tensor-parallel ranks need 8
    with pytest.raises(ValidationError, match="lr"):
        cfg.train.replace(lr=-1)
    with pytest.raises(ValidationError, match="trian"):
        cfg.replace(trian={})


def test_deepseek_target_refuses_layers_sglang_would_serve_shifted():
    data = _base()
    data["target"]["family"] = "deepseek"
    assert validate(data).export_layer_ids == [1, 29, 57]
    with pytest.raises(
        ConfigError,
        match=r"as input_of_layer \[2, 29, 57\], not the captured \[3, 30, 58\].*"
        r"first aux layer must be 2",
    ):
        validate(data | {"capture": {"aux_layers": [3, 30, 58]}})
    with pytest.raises(ConfigError, match="first aux layer must be 2"):
        validate(
            data | {"capture": {"aux_layers": [2, 29, 57], "layer_convention": "output_of_layer"}}
        )
    # llama
    assert validate(_base() | {"capture": {"aux_layers": [3, 30, 58]}}).export_layer_ids == [
        2,
        29,
        57,
    ]


def test_unknown_target_family_names_the_known_ones():
    data = _base()
    data["target"]["family"] = "qwen"
    with pytest.raises(
        ConfigError, match=r"target.family: unknown target family 'qwen'.*\['llama', 'deepseek'\]"
    ):
        validate(data)
