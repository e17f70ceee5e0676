"""The train flow wires plan -> train (worker subprocess) -> export and returns the export path."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from eagle3.capture.stage import FeatureSource
from eagle3.config.pipeline import with_overrides
from eagle3.model.export_format import validate_export

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tasks"))
from test_train_tasks import TRAIN_OVERRIDES, train_stage_inputs


@pytest.mark.slow
def test_train_flow_trains_and_exports_a_valid_draft(
    tiny_config, write_regen_stage, tmp_path, prefect_harness
):
    from flows.train import train_flow

    config = with_overrides(tiny_config, [f"root={tmp_path / 'root'}", *TRAIN_OVERRIDES])
    features, vocab = train_stage_inputs(config, write_regen_stage)
    result = train_flow(config, FeatureSource.stored(features), str(Path(vocab).parent))
    assert result.train_samples == 8
    assert Path(result.export) == Path(result.out_dir) / "export"
    assert validate_export(Path(result.export)) == []
    assert result.summary["steps"] == 4


@pytest.mark.slow
def test_train_on_a_damaged_feature_shard_exits_2_once_naming_it_and_its_fix_last_and_exports_nothing(
    tiny_config, write_regen_stage, tmp_path, prefect_harness, caplog
):
    import logging

    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from eagle3.capture.schema import FEATURE_SCHEMA
    from flows.cli import app
    from flows.commands.common import EXIT_USAGE

    root = f"root={tmp_path / 'root'}"
    config = with_overrides(tiny_config, [root, *TRAIN_OVERRIDES])
    features, vocab = train_stage_inputs(config, write_regen_stage)
    shard = Path(features) / "shard-00000.parquet"
    column = (
        pq.ParquetFile(shard).metadata.row_group(0).column(FEATURE_SCHEMA.names.index("aux_hidden"))
    )
    data = bytearray(shard.read_bytes())
    start = column.dictionary_page_offset or column.data_page_offset
    # inside the hidden states' pages; the footer stays intact
    at = start + column.total_compressed_size // 2
    data[at : at + 64] = bytes(64)
    shard.write_bytes(bytes(data))
    caplog.set_level(logging.INFO, logger="eagle3")
    sets = [arg for item in [root, *TRAIN_OVERRIDES] for arg in ("--set", item)]
    result = CliRunner().invoke(app, ["train", "--features", features, "--vocab", vocab, *sets])
    assert result.exit_code == EXIT_USAGE, result.output  # damaged input: a data error
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: train failed") and "Traceback" not in last
    # the writer's footer hash listed: pages are checked
    assert f"{shard} row group 0: does not read back" in last
    # the fix that works comes first: a plain re-run of train would read the same damaged shard
    # again
    assert (
        "Re-run only those" not in last
        and "read damaged input: rebuild it as said below, then re-run" in last
    )
    assert last.endswith(
        "Fix: delete the damaged file(s), then run `eagle3 capture` to rebuild them"
    )
    starts = [
        r
        for r in caplog.records
        if r.name == "eagle3.train.stage" and r.getMessage().startswith("starting:")
    ]
    assert len(starts) == 1  # a data error is not retried
    assert not list((tmp_path / "root" / "drafts").glob("*/export"))
