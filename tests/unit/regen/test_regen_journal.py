"""The journal survives a torn last line; compaction keeps one row per sample id."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from eagle3.config import PipelineConfig, TargetConfig
from eagle3.regen.journal import Journal, JournalError, read_journal
from eagle3.regen.plan import plan_regen
from eagle3.regen.sample import failed_row, pretokenized_row
from eagle3.regen.shard import compact_shard


def test_torn_last_line_is_ignored_and_cut_before_appending(tmp_path):
    path = tmp_path / "shard-00000.journal.jsonl"
    path.write_text(json.dumps({"sample_id": "a"}) + "\n" + '{"sample_id": "b", "inp')
    assert [r["sample_id"] for r in read_journal(path)] == ["a"]
    with Journal(path, fsync_every=1) as journal:
        assert journal.done == {"a"}
        journal.append({"sample_id": "c"})
    assert [r["sample_id"] for r in read_journal(path)] == ["a", "c"]


def test_a_damaged_middle_line_is_an_error(tmp_path):
    path = tmp_path / "j.jsonl"
    path.write_text('{"sample_id": "a"}\nnot json\n{"sample_id": "c"}\n')
    with pytest.raises(JournalError, match="delete the journal"):
        read_journal(path)


def test_compaction_dedups_by_sample_id_in_prompts_order(tmp_path, regen_model_dir, regen_helpers):
    rows = [{"sample_id": sid, "messages": [], "input_ids": [5, 6], "loss_mask": [0, 1]} for sid in ("x", "y", "z")]
    prompts = regen_helpers.write_prompts(tmp_path, [rows])
    config = PipelineConfig(
        name="t",
        root=str(tmp_path),
        target=TargetConfig(model_path=str(regen_model_dir), num_layers=8, hidden_size=128, vocab_size=2048),
    )
    plan = plan_regen(config, prompts)
    with Journal(tmp_path / "regen" / plan.fingerprint / "shard-00000.journal.jsonl", fsync_every=8) as journal:
        for sid in ("z", "x", "z", "y", "x"):
            journal.append(pretokenized_row(next(r for r in rows if r["sample_id"] == sid)))
        journal.append(failed_row({"sample_id": "y"}, "late duplicate", attempts=1))
    report = compact_shard(config, plan, 0, template="t")
    table = pq.read_table(tmp_path / "regen" / plan.fingerprint / "shard-00000.parquet").to_pylist()
    assert [r["sample_id"] for r in table] == ["x", "y", "z"]
    assert report.rows == 3 and report.failed == 0
