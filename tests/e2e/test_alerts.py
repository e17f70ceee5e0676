"""The alert automation on a real Prefect server (its trigger and action services): a nightly run
that fails posts one notification, with the run's name, state and link, to a webhook receiver on
loopback; a run of a deployment the automation does not watch posts nothing. No worker and no
pipeline: the runs are moved to Failed over REST, as a worker's flow run would report it (the full
night's alert is in ``test_prefect_ui.py``)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from e2e_support import PrefectServer, WebhookReceiver

pytestmark = [pytest.mark.e2e]


@pytest.fixture
def webhook() -> Iterator[WebhookReceiver]:
    receiver = WebhookReceiver()
    yield receiver
    receiver.close()


def _failed_run(server: PrefectServer, deployment_id: str, name: str) -> str:
    run = server.post(f"/deployments/{deployment_id}/create_flow_run", {"name": name})
    for state in (
        {"type": "RUNNING", "name": "Running"},
        {"type": "FAILED", "name": "Failed", "message": "boom"},
    ):
        server.post(f"/flow_runs/{run['id']}/set_state", {"state": state, "force": True})
    return run["id"]


def test_a_failing_nightly_run_posts_one_notification_with_name_state_and_link(
    prefect_server: PrefectServer, webhook: WebhookReceiver
):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from deployments.automations import ensure_alert_automation, ensure_webhook_block

    flow = prefect_server.post("/flows/", {"name": "data-scaling"})
    nightly = prefect_server.post("/deployments/", {"name": "tiny", "flow_id": flow["id"]})
    other = prefect_server.post("/deployments/", {"name": "other", "flow_id": flow["id"]})
    # what deploy.py apply talks to
    with temporary_settings(updates={PREFECT_API_URL: prefect_server.api}):
        block = ensure_webhook_block(webhook.url)
        first = ensure_alert_automation("tiny", [nightly["id"]], block)
        assert ensure_alert_automation("tiny", [nightly["id"]], block).id == first.id  # idempotent
    time.sleep(5)  # the trigger service loads the new automation
    run_id = _failed_run(prefect_server, nightly["id"], "failing-night")
    _failed_run(prefect_server, other["id"], "unwatched-run")
    deadline = time.monotonic() + 120
    while not webhook.received and time.monotonic() < deadline:
        time.sleep(1)
    time.sleep(10)  # a second notification (a duplicate, the unwatched run) would arrive by now
    assert len(webhook.received) == 1, webhook.received
    text = webhook.received[0]["text"]
    assert "failing-night" in text and "Failed" in text and f"/runs/flow-run/{run_id}" in text, text
