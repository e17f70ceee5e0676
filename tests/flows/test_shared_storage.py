"""Shared storage: deployments carry the run root's id and put Prefect results under the root; a
flow run on a machine that does not see that root stops at its first task with the shared-storage
message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eagle3.recipes import ConfigRef
from eagle3.rundir.runroot import RESULTS_DIR, claim_run_root


def test_deployments_carry_the_root_id_and_keep_results_under_the_root(
    tiny_world: Any, tmp_path: Path
):
    from deployments.deploy import DeploySpec, build_deployments, claim_shared_root

    root = tmp_path / "shared-root"
    spec, job_env = claim_shared_root(DeploySpec(recipe="tiny", overrides=[f"root={root}"]))
    root_id = claim_run_root(root)
    assert spec.overrides == [f"root={root}", f"root_id={root_id}"]
    assert claim_shared_root(spec)[0].overrides == spec.overrides, (
        "a second apply must keep the same id"
    )
    assert job_env == {"PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(root / RESULTS_DIR)}
    for deployment in build_deployments(spec, job_env=job_env):
        assert deployment.job_variables["env"] == job_env
        config = deployment.parameters.get("config") or deployment.parameters
        assert f"root_id={root_id}" in config["overrides"]


def test_flow_on_a_machine_without_the_shared_root_fails_at_its_first_task(
    tiny_world: Any, prefect_harness: None, tmp_path: Path
):
    from prefect.client.orchestration import get_client

    from flows.regen import regen_flow

    missing = tmp_path / "not-mounted-here"
    ref = ConfigRef(recipe="tiny", overrides=[f"root={missing}", "root_id=0123456789abcdef"])
    state = regen_flow(ref, return_state=True)
    assert state.is_failed()
    assert (
        "does not see the run's shared run root" in state.message
        and "shared filesystem" in state.message
    )
    assert not missing.exists(), "nothing may be written to a local stand-in of the shared root"
    with get_client(sync_client=True) as client:
        task_runs = client.read_task_runs()
    ran = {
        t.name.rsplit("-", 1)[0]
        for t in task_runs
        if t.flow_run_id == state.state_details.flow_run_id
    }
    assert ran == {"resolve-config"}, f"tasks ran before the check: {ran}"
