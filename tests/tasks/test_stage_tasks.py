"""The generic stage tasks called as plain functions (``task.fn``), driven by the capture and vocab
stages: plan, units, finalize, the failure policy and the unit cache key; and the recorded result
that makes a finished plan cost nothing when it is run again."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import pytest
from prefect.logging import disable_run_logger

from eagle3.capture.stage import CaptureStage
from eagle3.config.pipeline import with_overrides
from eagle3.rundir.layout import VOCAB_FILE, read_failed_shards
from eagle3.rundir.runroot import Manifest
from eagle3.stage import (
    Plan,
    Stage,
    StageResult,
    UnitReport,
    UnitsFailed,
    recorded_result,
    run_stage,
)
from eagle3.train.vocab import VocabStage
from tasks.stage import finalize_task, plan_task, unit_cache_key, unit_task


@pytest.fixture
def capture_setup(tiny_config, write_regen_stage, tmp_path):
    config = with_overrides(tiny_config, [f"root={tmp_path / 'root'}", "vocab.draft_vocab_size=64"])
    return config, write_regen_stage(config.root_path / "regen" / "regenfp")


def _run(stage, config, inputs, *, failed=()):
    plan = plan_task.fn(stage, config, inputs)
    reports = [unit_task.fn(stage, config, plan, unit) for unit in plan.units if unit not in failed]
    return plan, finalize_task.fn(stage, config, plan, reports, list(failed))


def test_capture_then_vocab_through_the_generic_tasks(
    capture_setup, prefect_harness, record_hashes
):
    import eagle3.rundir.runroot as runroot

    config, regen = capture_setup
    hashed = record_hashes(runroot)
    with disable_run_logger():
        plan, result = _run(CaptureStage(), config, {"regen_dir": str(regen)})
        assert plan.units == (0, 1) and plan.missing == ()
        # the writers' sha256 reached the manifest
        assert [p for p in hashed if p.parent == result.out_dir] == []
        _vocab_plan, vocab = _run(VocabStage(), config, {"features": str(result.out_dir)})
    manifest = Manifest.read(result.out_dir)
    assert (
        result.done
        and manifest is not None
        and manifest.stats["rows"] + manifest.stats["quarantined"] == 10
    )
    assert manifest.verify(result.out_dir) == [] and read_failed_shards(result.out_dir) == []
    # so the loader checks pages as it reads them
    assert all(f.footer_sha256 for f in manifest.files)
    assert [row["state"] for row in result.table] == ["captured", "captured"]
    assert (
        Path(vocab.summary["vocab"]) == vocab.out_dir / VOCAB_FILE
        and (vocab.out_dir / VOCAB_FILE).exists()
    )
    assert Manifest.read(vocab.out_dir).config["features"] == str(result.out_dir)


def test_plan_reports_regen_shards_not_ready(capture_setup):
    config, regen = capture_setup
    with disable_run_logger():
        plan = plan_task.fn(
            CaptureStage(), config, {"regen_dir": str(regen), "shard_ids": [0, 1, 7]}
        )
    assert plan.units == (0, 1) and plan.missing == (7,)


def test_a_failed_unit_is_recorded_and_fails_the_stage_with_the_retrigger_command(
    capture_setup, prefect_harness
):
    config, regen = capture_setup
    with (
        disable_run_logger(),
        pytest.raises(UnitsFailed, match=r"capture failed .*\[1\].*--regen-dir .* --shard 1"),
    ):
        _run(CaptureStage(), config, {"regen_dir": str(regen)}, failed=(1,))
    features = next((config.root_path / "features").iterdir())
    assert read_failed_shards(features) == [1]
    assert Manifest.read(features) is None and (features / "shard-00000.parquet").exists()


def test_unit_cache_key_exists_only_while_the_output_does_and_follows_it(capture_setup):
    config, regen = capture_setup
    stage = CaptureStage()
    plan = stage.plan(config, regen_dir=regen)
    params = {"stage": stage, "plan": plan, "unit": 0}
    assert unit_cache_key(None, params) is None  # nothing on disk: never served from the cache
    plan.out_dir.mkdir(parents=True)
    (plan.out_dir / "shard-00000.parquet").write_bytes(b"x" * 100)
    whole = unit_cache_key(None, params)
    (plan.out_dir / "shard-00000.parquet").write_bytes(b"x" * 60)
    assert (
        whole.startswith(f"capture-{plan.fingerprint}-0-") and unit_cache_key(None, params) != whole
    )


class CountingStage(Stage[Plan]):
    """Two units that each write one file, inside a resource that counts how often it was started
    (regen's server)."""

    name = "counting"

    def __init__(self, out_dir: Path) -> None:
        self.out_dir, self.started, self.ran = out_dir, 0, []

    def plan(self, config, **inputs) -> Plan:
        return Plan(stage=self.name, fingerprint="fp", out_dir=self.out_dir, units=(0, 1))

    @contextmanager
    def resources(self, config, plan):
        self.started += 1
        yield "server"

    def run_unit(self, config, plan, unit, *, env=None, on_progress=None) -> UnitReport:
        self.ran.append(unit)
        plan.out_dir.mkdir(parents=True, exist_ok=True)
        self.unit_output(plan, unit).write_text(f"unit {unit} with {env}")
        return UnitReport(unit=unit, rows=1)

    def unit_output(self, plan: Plan, unit) -> Path:
        return plan.out_dir / f"out-{unit}.txt"

    def finalize(self, config, plan, reports, failed) -> StageResult:
        if failed:
            return self.failed_result(plan, failed)
        return StageResult(
            stage=self.name,
            fingerprint=plan.fingerprint,
            out_dir=plan.out_dir,
            done=True,
            summary={"rows": sum(r.rows for r in reports)},
        )


def _files(root: Path) -> dict[str, tuple[int, bytes]]:
    return {
        str(p.relative_to(root)): (p.stat().st_mtime_ns, p.read_bytes())
        for p in root.rglob("*")
        if p.is_file()
    }


def test_a_finished_plan_is_read_back_without_resources_units_or_writes(tmp_path, tiny_config):
    stage = CountingStage(tmp_path / "stage")
    first = run_stage(stage, tiny_config)
    assert (stage.started, sorted(stage.ran), first.summary) == (1, [0, 1], {"rows": 2})
    before = _files(tmp_path)

    again = run_stage(stage, tiny_config)

    # no server, no unit ran
    assert again == first and stage.started == 1 and sorted(stage.ran) == [0, 1]
    assert _files(tmp_path) == before  # not one file written or touched


def test_a_deleted_or_rewritten_output_makes_the_plan_run_again(tmp_path, tiny_config):
    stage = CountingStage(tmp_path / "stage")
    plan = stage.plan(tiny_config)
    run_stage(stage, tiny_config)
    stage.unit_output(plan, 1).unlink()
    assert recorded_result(stage, plan) is None
    run_stage(stage, tiny_config)
    assert stage.started == 2 and recorded_result(stage, plan) is not None
    output = stage.unit_output(plan, 0)
    # rewritten after the result was recorded
    os.utime(output, ns=(output.stat().st_mtime_ns + 10**9,) * 2)
    assert recorded_result(stage, plan) is None


def test_a_failed_run_records_nothing_and_finalize_task_records_a_success(
    tmp_path, tiny_config, prefect_harness
):
    stage = CountingStage(tmp_path / "stage")
    with disable_run_logger():
        plan = plan_task.fn(stage, tiny_config, {})
        report = unit_task.fn(stage, tiny_config, plan, 0)
        with pytest.raises(UnitsFailed):
            finalize_task.fn(stage, tiny_config, plan, [report], [1])
        assert recorded_result(stage, plan) is None
        report_1 = unit_task.fn(stage, tiny_config, plan, 1)
        result = finalize_task.fn(stage, tiny_config, plan, [report, report_1], [])
    assert recorded_result(stage, plan) == result


def test_units_hold_only_the_concurrency_limits_the_server_has(prefect_harness):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

    from tasks.stage import existing_limits

    with get_client(sync_client=True) as client:
        client.create_global_concurrency_limit(
            GlobalConcurrencyLimitCreate(name="regen-server-test-1", limit=1)
        )
    assert existing_limits(["regen-server-test-0", "regen-server-test-1"]) == [
        "regen-server-test-1"
    ]
    assert existing_limits([]) == []


def test_unit_task_runs_ask_for_no_concurrency_lease_when_the_stage_names_no_limit(
    tmp_path, tiny_config, prefect_harness, monkeypatch
):
    """A lease per task run, even on a limit that does not exist, held each long unit ~2 s in
    Pending (task tags)."""
    import prefect.concurrency._sync as prefect_concurrency
    from prefect import flow

    from flows.stage import run_stage as run_stage_flow

    asked: list[list[str]] = []
    acquire = prefect_concurrency.acquire_concurrency_slots_with_lease

    def recorded(names, *args, **kwargs):
        asked.append(list(names))
        return acquire(names, *args, **kwargs)

    monkeypatch.setattr(prefect_concurrency, "acquire_concurrency_slots_with_lease", recorded)
    stage = CountingStage(tmp_path / "stage")

    @flow(name="no-lease")
    def night() -> dict:
        return run_stage_flow(stage, tiny_config).summary

    assert night() == {"rows": 2} and sorted(stage.ran) == [0, 1]
    assert asked == []
