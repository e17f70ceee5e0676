"""Golden files of normalized rows, one per sample format: a change in normalization is a visible
diff.

Regenerate with ``EAGLE3_UPDATE_GOLDEN=1 pytest tests/unit/data/test_data_golden.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

GOLDEN = Path(__file__).parent / "golden"
SOURCES = (
    "sharegpt",
    "ultrachat",
    "perfect_blend",
    "openhermes",
    "magpie",
    "tulu3",
    "local_qa",
    "pretokenized",
)
PER_SOURCE = 3


def _set_fields(row: dict) -> dict:
    """The row as written, without the tool-call fields a plain chat row leaves unset (null in every
    message)."""
    messages = [
        {k: v for k, v in m.items() if v is not None or k == "content"} for m in row["messages"]
    ]
    return {k: v for k, v in row.items() if k != "tools" or v is not None} | {"messages": messages}


def _first_rows(out: Path, source: str) -> list[dict]:
    rows = []
    for path in sorted(out.glob("shard-*.parquet")):
        for row in pq.read_table(path).to_pylist():
            if row["source"] == source and len(rows) < PER_SOURCE:
                if row["input_ids"] is not None:
                    row["input_ids"], row["loss_mask"] = (
                        row["input_ids"][:24],
                        row["loss_mask"][:24],
                    )
                rows.append(_set_fields(row))
    return rows


@pytest.mark.parametrize("source", SOURCES)
def test_normalized_rows_match_the_golden_file(normalized_run, source):
    _config, out = normalized_run
    rows = _first_rows(out, source)
    assert len(rows) == PER_SOURCE
    path = GOLDEN / f"{source}.json"
    if os.environ.get("EAGLE3_UPDATE_GOLDEN") == "1":
        path.write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n")
    assert path.exists(), f"{path} missing: run with EAGLE3_UPDATE_GOLDEN=1 to create it"
    assert rows == json.loads(path.read_text())
