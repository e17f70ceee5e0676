"""The train flow wires plan -> train (worker subprocess) -> export and returns the export path."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from eagle3.config import with_overrides
from eagle3.model.export_format import validate_export

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tasks"))
from test_train_tasks import TRAIN_OVERRIDES, train_stage_inputs


@pytest.mark.slow
def test_train_flow_trains_and_exports_a_valid_draft(tiny_config, write_regen_stage, tmp_path, prefect_harness):
    from flows.train import train_flow

    config = with_overrides(tiny_config, [f"root={tmp_path / 'root'}", *TRAIN_OVERRIDES])
    features, vocab = train_stage_inputs(config, write_regen_stage)
    result = train_flow(config, features, str(Path(vocab).parent))
    assert result["train_samples"] == 8
    assert Path(result["export"]) == Path(result["out_dir"]) / "export"
    assert validate_export(Path(result["export"])) == []
    assert result["summary"]["steps"] == 4
