"""Aux layer ids are checked at config load and the error names the fix."""

from __future__ import annotations

import pytest

from eagle3.config.base import ConfigError
from eagle3.config.pipeline import PipelineConfig, with_overrides
from eagle3.config.target import TargetConfig


def _config(*overrides: str) -> PipelineConfig:
    base = PipelineConfig(
        name="layers",
        root="/tmp/unused",
        target=TargetConfig(model_path="unused", num_layers=8, hidden_size=128, vocab_size=2048),
    )
    return with_overrides(base, list(overrides))


def test_default_layers_are_sglangs_in_input_of_layer_convention():
    config = _config()
    assert config.sglang_layer_ids == [2, 4, 5] and config.export_layer_ids == [1, 3, 4]


def test_wrong_count_of_layer_ids_fails_with_the_fix():
    with pytest.raises(
        ConfigError, match=r"exactly 3.*set capture.aux_layers to 3 ascending ids.*\[2, 4, 5\]"
    ):
        _config("capture.aux_layers=[2,4]")


def test_layer_id_at_or_beyond_num_layers_fails_with_the_fix():
    with pytest.raises(
        ConfigError, match=r"ids \[8\] are outside.*num_layers=8.*e\.g\. \[2, 4, 5\]"
    ):
        _config("capture.aux_layers=[2,4,8]")


def test_output_of_layer_convention_is_checked_in_its_own_range():
    config = _config("capture.layer_convention=output_of_layer", "capture.aux_layers=[1,3,6]")
    assert config.sglang_layer_ids == [2, 4, 7]
    with pytest.raises(ConfigError, match="outside"):
        _config("capture.layer_convention=output_of_layer", "capture.aux_layers=[1,3,7]")


def test_unnamed_convention_fails_with_the_known_ones():
    with pytest.raises(ConfigError, match=r"unknown layer convention 'hf_index'.*'input_of_layer'"):
        _config("capture.layer_convention=hf_index")


def test_device_auto_without_accelerate_names_the_extra(monkeypatch):
    import importlib.util

    from eagle3.capture.hf import load_hf_backend

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "accelerate" else real(name, *a),
    )
    with pytest.raises(
        RuntimeError, match=r"needs accelerate: pip install 'eagle3-pipeline\[multigpu\]'"
    ):
        load_hf_backend(_config("capture.device=auto"))
