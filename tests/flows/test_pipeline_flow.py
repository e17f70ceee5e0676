"""The data-scaling flow's own tasks, its scaling step (the scaling stage through the generic stage
tasks) and its deployments, against the session's ephemeral Prefect API."""

from __future__ import annotations

from pathlib import Path

import pytest
from prefect.logging import disable_run_logger

from eagle3.gate.report import Decision, GateReport, write_report
from eagle3.recipes import ConfigRef
from eagle3.requirements import MissingRequirement
from eagle3.rundir.runroot import FileEntry, Manifest
from eagle3.scaling.curve import read_curve
from eagle3.scaling.night import Night
from eagle3.scaling.stage import PlanNightStage, ScalingStage
from tasks.common import resolve_config_task
from tasks.stage import finalize_task, plan_task, unit_cache_key, unit_task


@pytest.fixture(autouse=True)
def _no_run_logger():
    """Tasks are called as plain functions (``task.fn``): their run logger has no run to attach
    to."""
    with disable_run_logger():
        yield


def _prompts(tmp_path: Path, rows: list[int]) -> Path:
    out = tmp_path / "prompts" / "fp"
    out.mkdir(parents=True)
    files = [FileEntry(f"shard-{k:05d}.parquet", n, 1, "x") for k, n in enumerate(rows)]
    Manifest("prompts", "fp", files=[*files, FileEntry("quarantine.parquet", 2, 1, "y")]).write(out)
    return out


def _gate(tmp_path: Path, *, accept: float, speedup: float, passed: bool) -> Path:
    out = tmp_path / "gate" / f"g{accept}"
    report = GateReport(
        fingerprint=out.name,
        target="tiny",
        thresholds={
            "traffic": {"1": 1.0},
            "min_speedup": 1.05,
            "min_accept": 1.5,
            "min_gain_over_champion": 1.0,
        },
        prompts={},
        arms=[],
        decisions=[Decision("d", passed, "spec", speedup, accept, None)],
        passed=passed,
    )
    write_report(report, out)
    return out


def _plan_night(
    config, prompts: str, scale: int | None, shard_ids: list[int] | None = None
) -> Night:
    """Tonight's plan through the generic stage tasks (what ``flows.pipeline.data_scaling``
    runs)."""
    stage = PlanNightStage()
    plan = plan_task.fn(
        stage, config, {"prompts_dir": prompts, "scale": scale, "shard_ids": shard_ids}
    )
    reports = [unit_task.fn(stage, config, plan, unit) for unit in plan.units]
    return Night.of(finalize_task.fn(stage, config, plan, reports, []))


def _record(config, gate_dir: Path, **inputs):
    """Tonight's scaling point through the generic stage tasks (what ``flows.gate.scaling_flow``
    runs)."""
    stage = ScalingStage()
    plan = plan_task.fn(stage, config, {"gate_dir": str(gate_dir), **inputs})
    reports = [unit_task.fn(stage, config, plan, unit) for unit in plan.units]
    return finalize_task.fn(stage, config, plan, reports, [])


def test_config_from_a_recipe_or_a_yaml_file_with_overrides(tmp_path):
    from_recipe = resolve_config_task.fn(
        ConfigRef(recipe="kimi_k2_5", overrides=[f"root={tmp_path}"])
    )
    path = tmp_path / "cfg.yaml"
    path.write_text(from_recipe.to_yaml())
    from_file = resolve_config_task.fn(ConfigRef(recipe=str(path), overrides=["train.lr=0.5"]))
    assert from_recipe.root == str(tmp_path) and from_file.train.lr == 0.5


def test_a_deployed_night_whose_mode_lacks_its_extra_fails_before_any_stage(
    tmp_path, prefect_harness, hide_modules
):
    from flows.pipeline import data_scaling

    hide_modules("ray")
    state = data_scaling(
        recipe="tiny", overrides=[f"root={tmp_path}", "train.features=online"], return_state=True
    )
    error = state.result(raise_on_failure=False)
    assert state.is_failed() and isinstance(error, MissingRequirement), state.message
    assert "pip install 'eagle3-pipeline[ray]'" in str(error)
    assert not [p.name for p in tmp_path.iterdir() if p.is_dir()]  # no stage directory: nothing ran


def test_nights_grow_by_scale_and_explicit_shard_ids_win(tmp_path, prefect_harness):
    config = resolve_config_task.fn(ConfigRef(recipe="kimi_k2_5", overrides=[f"root={tmp_path}"]))
    prompts = _prompts(tmp_path, [10, 10, 10, 4])
    night1 = _plan_night(config, str(prompts), 15)
    assert night1.shard_ids == [0, 1] and night1.total_prompts == 20
    _record(
        config,
        _gate(tmp_path, accept=1.4, speedup=1.01, passed=False),
        total_prompts=20,
        train_samples=19,
        draft_fingerprint="a",
        label="night 1",
    )
    night2 = _plan_night(config, str(prompts), 15)
    assert night2.shard_ids == [0, 1, 2, 3] and night2.new_shard_ids == [2, 3] and night2.exhausted
    assert _plan_night(config, str(prompts), None, [3, 1]).shard_ids == [1, 3]
    with pytest.raises(ValueError, match=r"shards 0\.\.3"):
        _plan_night(config, str(prompts), None, [7])


def test_an_aimed_night_selects_rows_for_regen_and_publishes_its_plan_table(
    tmp_path, prefect_harness, write_prompt_pool
):
    from prefect.artifacts import Artifact

    overrides = [
        f"root={tmp_path}",
        "scaling.policy=aimed",
        "scaling.eval_per_domain=2",
        "normalize.shard_size=8",
    ]
    config = resolve_config_task.fn(ConfigRef(recipe="kimi_k2_5", overrides=overrides))
    prompts = write_prompt_pool(tmp_path / "prompts" / "p", {"chat": 20, "math": 20})
    night = _plan_night(config, str(prompts), 20)
    assert night.prompts_dir == night.select_dir != str(prompts) and night.total_prompts == 20
    # 10 rows per domain, shards of at most 8, one domain each
    assert night.shard_ids == [0, 1, 2, 3]
    table = Artifact.get("night-plan")
    assert table.type == "markdown" and "| chat | 18 | - | 0.50 | 10 rows |" in table.data
    assert _plan_night(config, str(prompts), 20).shard_ids == [0, 1, 2, 3], (
        "a night run again re-selected"
    )
    assert _plan_night(config, str(prompts), None, [3]).shard_ids == [3]


def test_scaling_point_comes_from_the_gate_report_and_is_published(tmp_path, prefect_harness):
    config = resolve_config_task.fn(ConfigRef(recipe="kimi_k2_5", overrides=[f"root={tmp_path}"]))
    for n, accept in enumerate((1.5, 1.9), start=1):
        result = _record(
            config,
            _gate(tmp_path, accept=accept, speedup=1.2, passed=True),
            total_prompts=100 * n,
            train_samples=90 * n,
            draft_fingerprint=f"d{n}",
            label=f"night {n}",
        )
    points = read_curve(tmp_path)
    assert [(p.train_samples, p.accept_length, p.speedup) for p in points] == [
        (90, 1.5, 1.2),
        (180, 1.9, 1.2),
    ]
    assert [p.report for p in points] == [
        str(tmp_path / "gate" / f"g{a}" / "report.json") for a in (1.5, 1.9)
    ]
    out = result.summary
    assert out["points"] == 2 and out["verdict"].startswith("still data-limited")
    assert Path(out["png"]).is_file() and out["curve"] == str(tmp_path / "scaling" / "curve.jsonl")
    assert [row["train_samples"] for row in result.table] == [90, 180] and out[
        "verdict"
    ] in result.markdown
    # Re-recording night 2 replaces its point; the shared curve never marks a night done (no Prefect
    # cache).
    again = _record(
        config,
        _gate(tmp_path, accept=1.9, speedup=1.2, passed=True),
        total_prompts=200,
        train_samples=180,
        draft_fingerprint="d2",
        label="night 2",
    )
    assert again.summary["points"] == 2
    plan = ScalingStage().plan(
        config, gate_dir=tmp_path, total_prompts=1, train_samples=1, draft_fingerprint="d"
    )
    assert unit_cache_key(None, {"stage": ScalingStage(), "plan": plan, "unit": 0}) is None


def test_deployments_nightly_cron_with_timezone_one_at_a_time_and_regen_shard_ids():
    from deployments.deploy import DeploySpec, build_deployments

    spec = DeploySpec(recipe="kimi_k2_5", scale=5000, cron="30 1 * * *", timezone="Europe/Paris")
    by_flow = {d.flow_name: d for d in build_deployments(spec)}
    assert set(by_flow) == {"data-scaling", "regen", "gate"}
    nightly = by_flow["data-scaling"]
    (schedule,) = nightly.schedules
    assert schedule.schedule.cron == "30 1 * * *" and schedule.schedule.timezone == "Europe/Paris"
    assert (
        nightly.concurrency_limit == 1
        and nightly.concurrency_options.collision_strategy == "ENQUEUE"
    )
    assert nightly.parameters == {"recipe": "kimi_k2_5", "overrides": [], "scale": 5000}
    assert nightly.entrypoint == "flows.pipeline.data_scaling" and nightly.work_pool_name == "gpu"
    assert by_flow["regen"].work_pool_name == "cpu" and "shard_ids" in by_flow["regen"].parameters
    # resolved on the worker at run time, no frozen run root
    reference = {"recipe": "kimi_k2_5", "overrides": []}
    assert (
        by_flow["regen"].parameters["config"] == reference
        and by_flow["gate"].parameters["config"] == reference
    )


def test_zombie_automation_crashes_runs_that_miss_heartbeats():
    from deployments.automations import zombie_automation

    automation = zombie_automation(heartbeat_s=60, misses=3)
    trigger = automation.trigger
    assert trigger.posture == "Proactive" and trigger.within.total_seconds() == 180
    assert (
        "prefect.flow-run.heartbeat" in trigger.after
        and "prefect.flow-run.Completed" in trigger.expect
    )
    assert automation.actions[0].state == "CRASHED"
    with pytest.raises(ValueError, match="30"):
        zombie_automation(heartbeat_s=10)


def test_alert_automation_notifies_once_per_failed_or_crashed_run_of_the_nightly_and_regen_deployments():
    from uuid import uuid4

    from deployments.automations import alert_automation

    block = uuid4()
    automation = alert_automation("tiny", ["nightly-id", "regen-id"], block)
    trigger = automation.trigger
    assert (
        trigger.expect == {"prefect.flow-run.Failed", "prefect.flow-run.Crashed"}
        and trigger.threshold == 1
    )
    assert trigger.posture == "Reactive" and automation.name == "eagle3-alert-tiny"
    (related,) = (
        trigger.match_related
        if isinstance(trigger.match_related, list)
        else [trigger.match_related]
    )
    assert related["prefect.resource.id"] == [
        "prefect.deployment.nightly-id",
        "prefect.deployment.regen-id",
    ]
    (action,) = automation.actions
    assert action.block_document_id == block
    for field in ("{{ flow_run.name }}", "{{ flow_run.state.name }}", "{{ flow_run|ui_url }}"):
        assert field in action.subject + action.body


def test_the_webhook_block_posts_a_slack_compatible_text_with_subject_and_body():
    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    from deployments.automations import webhook_block

    block = webhook_block("http://127.0.0.1:9/alerts")
    assert isinstance(block, CustomWebhookNotificationBlock) and block.allow_private_urls
    request = block._build_request_args(
        "run sly-fox Failed\nhttp://ui/runs/flow-run/1", "eagle3: sly-fox is Failed"
    )
    assert request["url"] == "http://127.0.0.1:9/alerts" and request["method"] == "POST"
    assert (
        request["json"]["text"]
        == "eagle3: sly-fox is Failed\nrun sly-fox Failed\nhttp://ui/runs/flow-run/1"
    )


def test_each_configured_regen_server_gets_one_shard_slot_created_once(prefect_harness):
    from prefect.client.orchestration import get_client

    from deployments.deploy import ensure_server_limits

    servers = ["http://10.0.0.7:30000", "http://10.0.0.8:30000"]
    names = ensure_server_limits(servers)
    assert ensure_server_limits(servers) == names  # idempotent: a second apply finds them
    with get_client(sync_client=True) as client:
        limits = [client.read_global_concurrency_limit_by_name(name) for name in names]
    assert [(limit.name, limit.limit) for limit in limits] == [
        ("regen-server-10-0-0-7-30000", 1),
        ("regen-server-10-0-0-8-30000", 1),
    ]


def test_a_pool_or_slot_created_by_another_process_between_read_and_create_is_kept(
    prefect_harness, monkeypatch
):
    """``prefect worker start --pool P --type process`` creates its pool; started next to
    ``deploy.py apply`` it can do so between apply's read and create (the e2e suite lost that race:
    409 Conflict). Modelled here by a read that misses an object another client then creates
    first."""
    from prefect.client.orchestration import SyncPrefectClient, get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, WorkPoolCreate
    from prefect.exceptions import ObjectNotFound

    from deployments.deploy import ensure_server_limits, ensure_work_pools

    reads = {
        "read_work_pool": SyncPrefectClient.read_work_pool,
        "read_global_concurrency_limit_by_name": SyncPrefectClient.read_global_concurrency_limit_by_name,
    }

    def racing(method: str, create):
        def read(self, name):
            with get_client(sync_client=True) as other:  # the other process wins the race
                create(other, name)
            monkeypatch.setattr(SyncPrefectClient, method, reads[method])
            raise ObjectNotFound(http_exc=None)

        monkeypatch.setattr(SyncPrefectClient, method, read)

    racing(
        "read_work_pool",
        lambda c, name: c.create_work_pool(WorkPoolCreate(name=name, type="process")),
    )
    ensure_work_pools(["raced-pool"])
    racing(
        "read_global_concurrency_limit_by_name",
        lambda c, name: c.create_global_concurrency_limit(
            GlobalConcurrencyLimitCreate(name=name, limit=1)
        ),
    )
    (name,) = ensure_server_limits(["http://10.0.0.9:30000"])
    with get_client(sync_client=True) as client:
        assert client.read_work_pool("raced-pool").type == "process"
        assert client.read_global_concurrency_limit_by_name(name).limit == 1
