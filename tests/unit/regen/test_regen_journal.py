"""The journal survives a torn last line and damaged lines (kept aside in its rejects file, their
samples redone), resumes multi-turn samples from their journaled turns, and compacts into one row
per sample id."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from eagle3.config.pipeline import PipelineConfig
from eagle3.config.target import TargetConfig
from eagle3.regen.conversation import failed_row, pretokenized_row
from eagle3.regen.journal import TURN_KEY, Journal, read_journal, rejects_path
from eagle3.regen.plan import plan_regen
from eagle3.regen.shard import compact_shard, regen_shard


def test_torn_last_line_is_ignored_and_cut_before_appending(tmp_path):
    path = tmp_path / "shard-00000.journal.jsonl"
    torn = '{"sample_id": "b", "inp'
    path.write_text(
        json.dumps(pretokenized_row({"sample_id": "a", "input_ids": [1]})) + "\n" + torn
    )
    assert [r["sample_id"] for r in read_journal(path)] == ["a"]
    with Journal(path, fsync_every=1) as journal:
        assert journal.done == {"a"}
        journal.append(pretokenized_row({"sample_id": "c", "input_ids": [1]}))
    assert [r["sample_id"] for r in read_journal(path)] == ["a", "c"]
    assert not rejects_path(path).exists()  # a torn tail is an interrupted write, not damage


DAMAGE = {
    "not JSON": b"not json",
    "no sample_id": b'{"status": "ok", "attempts": 1}',
    "not a JSON object": b'["x", 1]',
    "field 'attempts'": b'{"sample_id": "typed", "status": "ok", "attempts": "three"}',
    "status is": b'{"sample_id": "unfinished", "status": null}',
    "turn field 'text'": b'{"sample_id": "turned", "_turn": 0, "text": 5}',
}


@pytest.mark.parametrize("reason", sorted(DAMAGE))
def test_each_damaged_line_goes_to_rejects_with_its_line_number_and_the_good_lines_stay(
    tmp_path, reason
):
    path = tmp_path / "shard-00000.journal.jsonl"
    good = [
        json.dumps(pretokenized_row({"sample_id": sid, "input_ids": [1, 2]})).encode()
        for sid in ("a", "c")
    ]
    path.write_bytes(b"\n".join([good[0], DAMAGE[reason], good[1]]) + b"\n")
    # reading skips it, never raises
    assert [r["sample_id"] for r in read_journal(path)] == ["a", "c"]
    with Journal(path, fsync_every=1) as journal:
        assert journal.done == {"a", "c"}  # the damaged line's sample is redone
    [reject] = [json.loads(line) for line in rejects_path(path).read_text().splitlines()]
    assert (
        reject["line"] == 2
        and reason in reject["reason"]
        and reject["text"] == DAMAGE[reason].decode()
    )
    # moved out, not left to be rejected again
    assert path.read_bytes() == good[0] + b"\n" + good[1] + b"\n"


def test_a_row_with_a_wrong_field_type_is_redone_and_the_shard_compacts(
    tmp_path, regen_model_dir, regen_helpers
):
    rows = [
        {"sample_id": sid, "messages": [], "input_ids": [5, 6], "loss_mask": [0, 1]}
        for sid in ("x", "y")
    ]
    prompts = regen_helpers.write_prompts(tmp_path, [rows])
    # pretokenized: no request
    config = regen_helpers.config(tmp_path, regen_model_dir, ["http://127.0.0.1:9"])
    plan = plan_regen(config, prompts)
    journal = plan.out_dir / "shard-00000.journal.jsonl"
    # does not fit uint8: ArrowInvalid at compaction
    bad = pretokenized_row(rows[1]) | {"loss_mask": [0, 300]}
    journal.write_text(json.dumps(pretokenized_row(rows[0])) + "\n" + json.dumps(bad) + "\n")
    report = regen_shard(config, plan, 0, ["http://127.0.0.1:9"])
    table = pq.read_table(plan.out_dir / "shard-00000.parquet").to_pylist()
    assert [(r["sample_id"], r["loss_mask"]) for r in table] == [("x", [0, 1]), ("y", [0, 1])]
    assert report.rows == 2
    assert "loss_mask" in rejects_path(journal).read_text()


def test_journaled_turns_resume_from_the_first_gap_and_finished_samples_drop_theirs(tmp_path):
    path = tmp_path / "shard-00000.journal.jsonl"
    turn = {
        "text": "t",
        "finish_reason": "stop",
        "completion_tokens": 1,
        "round_trip": True,
        "latency_s": 0.1,
        "attempts": 1,
        "server": "s",
    }
    with Journal(path, fsync_every=8) as journal:
        for sid, k in (("m", 0), ("m", 1), ("m", 0), ("gap", 1), ("done", 0)):
            journal.append({"sample_id": sid, TURN_KEY: k} | turn | {"text": f"{sid}{k}"})
        journal.append(pretokenized_row({"sample_id": "done", "input_ids": [1]}))
    with Journal(path, fsync_every=8) as journal:
        assert journal.done == {"done"}
        assert {sid: [t["text"] for t in ts] for sid, ts in journal.turns.items()} == {
            "m": ["m0", "m1"]
        }
    assert [r["sample_id"] for r in read_journal(path)] == ["done"]  # turn lines are not rows


def test_compaction_dedups_by_sample_id_in_prompts_order(tmp_path, regen_model_dir, regen_helpers):
    rows = [
        {"sample_id": sid, "messages": [], "input_ids": [5, 6], "loss_mask": [0, 1]}
        for sid in ("x", "y", "z")
    ]
    prompts = regen_helpers.write_prompts(tmp_path, [rows])
    config = PipelineConfig(
        name="t",
        root=str(tmp_path),
        target=TargetConfig(
            model_path=str(regen_model_dir), num_layers=8, hidden_size=128, vocab_size=2048
        ),
    )
    plan = plan_regen(config, prompts)
    with Journal(
        tmp_path / "regen" / plan.fingerprint / "shard-00000.journal.jsonl", fsync_every=8
    ) as journal:
        for sid in ("z", "x", "z", "y", "x"):
            journal.append(pretokenized_row(next(r for r in rows if r["sample_id"] == sid)))
        journal.append(failed_row({"sample_id": "y"}, "late duplicate", attempts=1))
    report = compact_shard(config, plan, 0, template="t")
    table = pq.read_table(tmp_path / "regen" / plan.fingerprint / "shard-00000.parquet").to_pylist()
    assert [r["sample_id"] for r in table] == ["x", "y", "z"]
    assert report.rows == 3 and report.failed == 0
