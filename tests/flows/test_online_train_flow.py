"""The online train flow (``train.features=online``) wires vocab -> online training -> export: a valid draft, its
summary says online and why, and no features directory is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle3.config.pipeline import with_overrides
from eagle3.model.export_format import validate_export
from tests.unit.online.conftest import online_world  # noqa: F401  (the session fixture)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_online_train_flow_trains_and_exports_a_valid_draft_without_features(online_world, tmp_path,  # noqa: F811
                                                                              prefect_harness):
    import ray

    from flows.train import online_train_flow

    root = tmp_path / "root"
    config = with_overrides(online_world.config, [f"root={root}", "train.features=online", "train.epochs=1"])
    try:
        result = online_train_flow(config, str(online_world.regen))
    finally:
        ray.shutdown()
    assert validate_export(Path(result.export)) == []
    summary = result.summary
    assert summary["features"] == "online" and summary["features_decision"] == "train.features=online"
    assert summary["store"]["ready"] == 0 and summary["steps"] == summary["store"]["consumed"]
    assert not (root / "features").exists()
