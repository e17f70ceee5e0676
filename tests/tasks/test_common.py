"""The progress artifact of a resumed stage: the bar starts at its share, the rate and ETA count new work only."""

from __future__ import annotations

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

from tasks.common import Progress


def _latest_progress(key: str) -> float:
    with get_client(sync_client=True) as client:
        [artifact] = client.read_latest_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    return float(artifact.data)


def test_resumed_progress_starts_at_the_done_share_and_rates_only_this_runs_work(prefect_harness):
    progress = Progress("resumed-stage", total=10, already_done=4, every_s=0)
    assert _latest_progress(progress.key) == 40.0
    assert "4/10 samples (0.00/s" in progress._describe() and "ETA unknown" in progress._describe()
    progress.update(10)
    assert _latest_progress(progress.key) == 100.0
    assert "ETA 0.0 min" in progress._describe()
