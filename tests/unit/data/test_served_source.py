"""Served traffic as a data source (``eagle3.data.served``): the tiny target's request logs
(``served_traffic``, written by the reference server) through discovery and normalization, and
damaged copies of them."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from data_stage_helpers import discover, normalize

from eagle3.data.served import held_out
from eagle3.data.served_log import ServedRequest, iter_log, log_files
from eagle3.errors import DataError
from eagle3.recipes import load_recipe
from eagle3.rundir.runroot import Manifest
from eagle3.worlds.served_traffic import ServedTrafficSpec


def _config(root: Path, logs: Path, *overrides: str):
    sources = f"sources=[{{adapter: served, name: served, path: {logs}}}]"
    return load_recipe("tiny_served", [f"root={root}", sources, *overrides])


def _rows(prompts: Path) -> list[dict[str, Any]]:
    return [
        r for p in sorted(prompts.glob("shard-*.parquet")) for r in pq.read_table(p).to_pylist()
    ]


def _quarantine(prompts: Path) -> list[dict[str, Any]]:
    return pq.read_table(prompts / "quarantine.parquet").to_pylist()


def _requests(logs: Path) -> dict[str, ServedRequest]:
    return {r.rid: r for r in iter_log(log_files(logs)) if isinstance(r, ServedRequest)}


def _rid(raw: dict[str, Any]) -> str | None:
    """The rid a quarantined served row names (its own, or the row's a later check quarantined)."""
    return raw.get("rid") or raw.get("row", {}).get("rid")


def _events(path: Path) -> list[tuple[str, dict[str, Any]]]:
    return [
        (line.split("] ", 1)[0] + "] ", json.loads(line.split("] ", 1)[1]))
        for line in path.read_text().splitlines()
    ]


def _write(path: Path, events: list[tuple[str, dict[str, Any]]]) -> None:
    path.write_text("".join(prefix + json.dumps(doc) + "\n" for prefix, doc in events))


@pytest.fixture(scope="module")
def normalized(served_traffic, tmp_path_factory):
    config = _config(tmp_path_factory.mktemp("served-run"), served_traffic.log_dir)
    return config, normalize(config)


def test_a_served_request_becomes_its_exact_ids_with_only_the_answer_trained(
    served_traffic, normalized
):
    _config, prompts = normalized
    requests, rows = _requests(served_traffic.log_dir), _rows(prompts)
    assert rows and all(r["source"] == "served" for r in rows)
    for row in rows:
        served = json.loads(row["meta"])["served"]
        req = requests[served["rid"]]
        output = req.output_ids
        assert row["input_ids"] == (req.input_ids or row["input_ids"][: -len(output)]) + output
        assert row["loss_mask"] == [0] * (len(row["input_ids"]) - len(output)) + [1] * len(output)
        assert served["finish_reason"] == "stop" and served["sampling"]["temperature"] == 0
        assert row["messages"][-1]["role"] == "assistant" and row["messages"][-2]["role"] == "user"
    stats = Manifest.read(prompts).stats["sources"]["served"]
    # every record, one way or another
    assert stats["in"] == len(list(iter_log(log_files(served_traffic.log_dir))))
    spec = ServedTrafficSpec()
    assert stats["quarantined"]["health_check"] == spec.requests // spec.health_every
    assert stats["quarantined"]["cut_short"] >= spec.requests // spec.short_every
    assert stats["quarantined"]["held_out"] >= 1 and stats["kept"] == len(rows)


def test_raw_text_is_refused_as_a_template_mismatch(served_traffic, tmp_path):
    config = _config(tmp_path / "run", served_traffic.log_dir, "served.keep_truncated=true")
    prompts = normalize(config)
    mismatched = [q for q in _quarantine(prompts) if q["reason"] == "template_mismatch"]
    assert len(mismatched) == 3 and all("Once upon a time" in q["raw"] for q in mismatched)
    kept = Manifest.read(prompts).stats["sources"]["served"]
    assert "cut_short" not in kept["quarantined"]  # kept: served.keep_truncated


def test_aborted_and_content_cut_by_the_log_level_are_quarantined_with_their_reason(
    served_traffic, tmp_path
):
    logs = tmp_path / "logs"
    logs.mkdir()
    events = _events(log_files(served_traffic.log_dir)[0])
    finished = [
        i
        for i, (_p, doc) in enumerate(events)
        if doc["event"] == "request.finished"
        and doc["out"]["meta_info"]["finish_reason"]["type"] == "stop"
    ]
    events[finished[0]][1]["out"]["meta_info"]["finish_reason"] = {
        "type": "abort",
        "message": "client gone",
    }
    cut = events[finished[1]][1]["out"]
    cut["output_ids"] = [*cut["output_ids"][:2], "...", *cut["output_ids"][-2:]]  # level 2's cut
    for i in (finished[2],):  # level 1: no ids, no text
        for key in ("input_ids", "text"):
            events[i][1]["obj"].pop(key)
    _write(logs / "vm_0.log", events)
    quarantine = Counter(
        q["reason"] for q in _quarantine(normalize(_config(tmp_path / "run", logs)))
    )
    assert quarantine["aborted"] == 1 and quarantine["no_content"] == 2


def test_filters_drop_by_header_pattern_and_hook_counted_and_without_content(
    served_traffic, tmp_path
):
    config = _config(
        tmp_path / "run",
        served_traffic.log_dir,
        "served.drop_patterns=['cookies']",
        "served.hook=data_stage_helpers:drop_code",
    )
    prompts = normalize(config)
    filters = Manifest.read(prompts).stats["sources"]["served"]["filters"]
    assert filters["pattern:cookies"] >= 1 and filters["hook:code"] >= 1
    dropped = [q for q in _quarantine(prompts) if q["reason"] == "filtered"]
    assert len(dropped) == sum(filters.values())
    assert all(set(json.loads(q["raw"])) == {"rid", "file", "line", "filter"} for q in dropped)
    assert not any("cookies" in json.dumps(r["messages"]) for r in _rows(prompts))


def test_logs_served_by_another_model_are_refused_by_name(served_traffic, tmp_path):
    logs = tmp_path / "logs"
    shutil.copytree(served_traffic.log_dir, logs)
    info = json.loads((logs / "server_info.json").read_text()) | {
        "model_path": "org/other-model",
        "revision": "v2",
    }
    (logs / "server_info.json").write_text(json.dumps(info))
    with pytest.raises(DataError, match=r"org/other-model@v2.*the target is .*model@default"):
        discover(_config(tmp_path / "run", logs))


def test_a_served_row_wins_a_tie_with_a_public_row_of_the_same_prompt(
    served_traffic, normalized, tmp_path
):
    _config, prompts = normalized
    served_row = _rows(prompts)[0]
    question = [m for m in served_row["messages"] if m["role"] != "assistant"]
    public = tmp_path / "public.jsonl"
    public.write_text(
        json.dumps({"messages": [*question, {"role": "assistant", "content": "x"}]}) + "\n"
    )
    served = f"{{adapter: served, name: served, path: {served_traffic.log_dir}}}"
    both = f"sources=[{{adapter: jsonl, name: public, path: {public}}}, {served}]"
    out = normalize(load_recipe("tiny_served", [f"root={tmp_path / 'run'}", both]))
    assert served_row["sample_id"] in {
        r["sample_id"] for r in _rows(out) if r["source"] == "served"
    }
    assert [q["reason"] for q in _quarantine(out) if q["source"] == "public"] == ["duplicate"]


def test_held_out_requests_and_their_prompts_never_reach_the_prompt_shards(
    served_traffic, normalized
):
    config, prompts = normalized
    requests = _requests(served_traffic.log_dir).values()
    held = {r.rid for r in requests if held_out(r.key, config.served.held_out)}
    kept = {json.loads(r["meta"])["served"]["rid"] for r in _rows(prompts)}
    assert held and not held & kept
    quarantined = {_rid(json.loads(q["raw"])): q["reason"] for q in _quarantine(prompts)}
    # held out, or unusable anyway
    assert held <= set(quarantined) and "held_out" in quarantined.values()


def test_each_logged_request_is_read_once_across_nights_and_copied_files(served_traffic, tmp_path):
    (live,) = log_files(served_traffic.log_dir)
    lines = live.read_text().splitlines(keepends=True)
    half = len(lines) // 2
    night1, night2 = tmp_path / "night1", tmp_path / "night2"
    night1.mkdir(), night2.mkdir()
    (night1 / "vm_0.log").write_text("".join(lines[:half]))
    # last night's file, rotated
    (night2 / "vm_0.log.2026-12-06_13").write_text("".join(lines[:half]))
    (night2 / "vm_0.log").write_text("".join(lines[half:]))
    # and a stray copy of it
    shutil.copy(night2 / "vm_0.log.2026-12-06_13", night2 / "backup_0.log")
    first = _rows(normalize(_config(tmp_path / "run1", night1)))
    out = normalize(_config(tmp_path / "run2", night2))
    second = _rows(out)
    ids = [r["sample_id"] for r in second]
    assert len(ids) == len(set(ids)), "a request was trained twice"
    keys = Counter(json.loads(r["meta"])["served"]["key"] for r in second)
    assert max(keys.values()) == 1
    # last night's rows are tonight's too, unless tonight's larger exam (held-out prompts) now
    # covers them
    dropped = {_rid(json.loads(q["raw"])): q["reason"] for q in _quarantine(out)}
    missing = [
        json.loads(r["meta"])["served"]["rid"] for r in first if r["sample_id"] not in set(ids)
    ]
    assert {dropped.get(rid) for rid in missing} <= {"contaminated", "near_duplicate"}
