"""The zombie-run automation for self-hosted Prefect servers (DESIGN §7).

A worker that dies with its machine leaves its flow run ``Running`` forever, and the deployment's concurrency slot
with it, so the next nightly run would wait behind a ghost. Flow runs started by a worker emit
``prefect.flow-run.heartbeat`` events every ``PREFECT_FLOWS_HEARTBEAT_FREQUENCY`` seconds (``infra/prefect-worker.sh``
sets it); this automation is a *proactive* trigger per flow run: after a heartbeat, if neither another heartbeat
nor a terminal state arrives within ``misses`` heartbeat periods, the run is marked ``Crashed``. Crashed frees the
concurrency slot, and the next run of the same command resumes from the run root's manifests and journals.
Prefect Cloud ships this as a managed automation; self-hosted servers need it created once (idempotent here).
"""

from __future__ import annotations

from datetime import timedelta

from prefect.automations import Automation
from prefect.client.schemas.objects import StateType
from prefect.events.actions import ChangeFlowRunState
from prefect.events.schemas.automations import EventTrigger, Posture
from prefect.events.schemas.events import ResourceSpecification

ZOMBIE_AUTOMATION = "eagle3-crash-zombie-flow-runs"
HEARTBEAT = "prefect.flow-run.heartbeat"
TERMINAL_EVENTS = ("Completed", "Failed", "Cancelled", "Crashed")


def zombie_automation(*, heartbeat_s: int = 60, misses: int = 3) -> Automation:
    """The automation object (not yet on the server): Crashed after ``misses`` missed heartbeats."""
    if heartbeat_s < 30:
        raise ValueError(f"heartbeat_s={heartbeat_s}: Prefect emits heartbeats at most every 30 s; use >= 30")
    return Automation(
        name=ZOMBIE_AUTOMATION,
        description=(
            f"Mark a flow run Crashed when it misses {misses} heartbeats ({heartbeat_s} s each): its worker died. "
            "Re-running the same command resumes from the run root."
        ),
        trigger=EventTrigger(
            after={HEARTBEAT},
            expect={HEARTBEAT, *(f"prefect.flow-run.{state}" for state in TERMINAL_EVENTS)},
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=heartbeat_s * misses),
        ),
        actions=[
            ChangeFlowRunState(
                state=StateType.CRASHED,
                message=f"no heartbeat for {heartbeat_s * misses} s: the worker or its machine died",
            )
        ],
    )


def ensure_zombie_automation(*, heartbeat_s: int = 60, misses: int = 3) -> Automation:
    """Create the automation on the current ``PREFECT_API_URL`` server, or update it in place if it exists."""
    wanted = zombie_automation(heartbeat_s=heartbeat_s, misses=misses)
    try:
        existing = Automation.read(name=ZOMBIE_AUTOMATION)
    except ValueError:  # Automation.read raises ValueError when no automation has that name
        return wanted.create()
    wanted.id = existing.id
    wanted.update()
    return wanted
