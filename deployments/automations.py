"""The automations ``deploy.py apply`` creates: zombie runs marked Crashed, and alerts on failed
nights (docs/DESIGN.md, "Prefect usage").

Alerts: when a top-level run of the nightly or the regen deployment ends Failed or Crashed, a
Prefect notification block sends the run's name, state, message and UI link: a generic webhook block
``eagle3-alerts`` (``--alert-webhook URL``, Slack-compatible JSON) or any notification block already
on the server (``--alert-block slack-webhook/ops``). The Prefect server's automation services send
it, so no worker is needed.

Zombie runs:

A worker that dies with its machine leaves its flow run ``Running`` forever, and the deployment's
concurrency slot with it, so the next nightly run would wait behind a ghost. Flow runs started by a
worker emit ``prefect.flow-run.heartbeat`` events every ``PREFECT_FLOWS_HEARTBEAT_FREQUENCY``
seconds (``infra/prefect-worker.sh`` sets it); this automation is a *proactive* trigger per flow
run: after a heartbeat, if neither another heartbeat nor a terminal state arrives within ``misses``
heartbeat periods, the run is marked ``Crashed``. Crashed frees the concurrency slot, and the next
run of the same command resumes from the run root's manifests and journals. Prefect Cloud ships this
as a managed automation; self-hosted servers need it created once (idempotent here).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from uuid import UUID

from prefect.automations import Automation
from prefect.blocks.notifications import CustomWebhookNotificationBlock
from prefect.client.schemas.objects import StateType
from prefect.events.actions import ChangeFlowRunState, SendNotification
from prefect.events.schemas.automations import EventTrigger, Posture
from prefect.events.schemas.events import ResourceSpecification

ZOMBIE_AUTOMATION = "eagle3-crash-zombie-flow-runs"
HEARTBEAT = "prefect.flow-run.heartbeat"
TERMINAL_EVENTS = ("Completed", "Failed", "Cancelled", "Crashed")


def zombie_automation(*, heartbeat_s: int = 60, misses: int = 3) -> Automation:
    """The automation object (not yet on the server): Crashed after ``misses`` missed heartbeats."""
    if heartbeat_s < 30:
        raise ValueError(
            f"heartbeat_s={heartbeat_s}: Prefect emits heartbeats at most every 30 s; use >= 30"
        )
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
    """Create the automation on the current ``PREFECT_API_URL`` server, or update it in place if it
    exists."""
    return _create_or_update(zombie_automation(heartbeat_s=heartbeat_s, misses=misses))


# the webhook block ``deploy.py apply --alert-webhook URL`` creates or updates
ALERT_BLOCK = "eagle3-alerts"
ALERT_STATES = ("Failed", "Crashed")
ALERT_SUBJECT = "eagle3: {{ flow.name }}/{{ deployment.name }} run {{ flow_run.name }} is {{ flow_run.state.name }}"
ALERT_BODY = (
    "Flow run {{ flow_run.name }} ({{ flow.name }}/{{ deployment.name }}) entered {{ flow_run.state.name }}: "
    "{{ flow_run.state.message }}\n{{ flow_run|ui_url }}"
)


def alert_automation_name(deployment_name: str) -> str:
    return f"eagle3-alert-{deployment_name}"


def alert_automation(
    deployment_name: str, deployment_ids: Sequence[str], block_document_id: UUID
) -> Automation:
    """Notify through the block when a top-level run of these deployments (the nightly and the regen
    re-triggers) fails or crashes; a stage subflow of a failing night is not a deployment run, so a
    night alerts once."""
    deployments = {
        "prefect.resource.role": "deployment",
        "prefect.resource.id": [f"prefect.deployment.{i}" for i in deployment_ids],
    }
    return Automation(
        name=alert_automation_name(deployment_name),
        description=f"Notify ({ALERT_STATES}) for runs of deployments {list(deployment_ids)} of {deployment_name!r}.",
        trigger=EventTrigger(
            expect={f"prefect.flow-run.{state}" for state in ALERT_STATES},
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            match_related=ResourceSpecification(deployments),
            posture=Posture.Reactive,
            threshold=1,
            within=timedelta(0),
        ),
        actions=[
            SendNotification(
                block_document_id=block_document_id, subject=ALERT_SUBJECT, body=ALERT_BODY
            )
        ],
    )


def ensure_alert_automation(
    deployment_name: str, deployment_ids: Sequence[str], block_document_id: UUID
) -> Automation:
    """Create the alert automation, or update it in place (``apply`` stays idempotent)."""
    wanted = alert_automation(deployment_name, deployment_ids, block_document_id)
    return _create_or_update(wanted)


def _create_or_update(wanted: Automation) -> Automation:
    try:
        existing = Automation.read(name=wanted.name)
    except ValueError:  # Automation.read raises ValueError when no automation has that name
        return wanted.create()
    wanted.id = existing.id
    wanted.update()
    return wanted


def webhook_block(url: str, *, name: str = ALERT_BLOCK) -> CustomWebhookNotificationBlock:
    """A generic webhook notification block posting a Slack-compatible JSON body (``{"text": ...}``,
    which Slack, Mattermost and most chat webhooks accept). Private and loopback URLs are allowed:
    the operator chose this URL."""
    return CustomWebhookNotificationBlock(
        name=name,
        url=url,
        method="POST",
        allow_private_urls=True,
        json_data={"text": "{{subject}}\n{{body}}", "subject": "{{subject}}", "body": "{{body}}"},
    )


def ensure_webhook_block(url: str, *, name: str = ALERT_BLOCK) -> UUID:
    """Save the webhook block under ``name`` (overwritten: the URL may change); returns its document
    id."""
    return webhook_block(url, name=name).save(name, overwrite=True)


def notification_block_id(slug_and_name: str) -> UUID:
    """The document id of an existing notification block, named ``<block type slug>/<name>`` (e.g.
    ``slack-webhook/ops``); a missing one is an error that says how to create it."""
    from prefect.blocks.core import Block

    try:
        block = Block.load(slug_and_name)
    except ValueError as exc:
        raise ValueError(
            f"--alert-block {slug_and_name}: {exc}; create the block in the UI (Blocks) or use "
            "--alert-webhook URL"
        ) from None
    return block._block_document_id  # type: ignore[return-value]
