"""What the status boards render of a stage's live tables and its progress note
(``tasks.monitor``)."""

from __future__ import annotations

from eagle3.stage import LiveTable, Progress
from tasks.monitor import card_description, status_line, status_markdown


def test_the_status_renders_a_stages_live_table_and_the_card_leads_with_the_eta_then_the_note():
    progress = Progress(
        done=3, total=12, unit="steps", per_s=0.5, tokens_per_s=120.0, note="store 2/3 batches held"
    )
    table = LiveTable(
        rows=[
            {
                "worker": "p0",
                "state": "capturing batch 7",
                "restarts": 1,
                "last_error": "batch 5: RpcError | socket closed",
            }
        ],
        description="producers",
    )
    markdown = status_markdown(
        "train", progress, None, (), state="running", tables={"producers": table}
    )
    assert "store 2/3 batches held" in markdown and "**producers**" in markdown
    assert "| worker | state | restarts | last_error |" in markdown
    assert "| p0 | capturing batch 7 | 1 | batch 5: RpcError / socket closed |" in markdown
    assert (
        card_description(progress) == "ETA 18 s - 3/12 steps - 120 tok/s - store 2/3 batches held"
    )
    assert status_line("train", progress, None, ()).endswith("ETA 18 s - store 2/3 batches held")
