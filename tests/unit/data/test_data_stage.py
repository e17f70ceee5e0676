"""The prompts stage end to end on the sample files of every format: ground truth, books, no-op
reruns."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
from data_stage_helpers import bad_rows, normalize

from eagle3.data.dedup import shingles
from eagle3.data.normalize import prompts_fingerprint
from eagle3.data.parquet import open_shard
from eagle3.data.schema import PROMPT_SCHEMA, QUARANTINE_SCHEMA, REASONS
from eagle3.rundir.runroot import Manifest


def _bench_prompts(data: Path) -> list[str]:
    lines = [line for f in (data / "bench").glob("*.jsonl") for line in f.read_text().splitlines()]
    return [" ".join(re.findall(r"\w+", json.loads(line)["prompt"].lower())) for line in lines]


def _truth_contradicts_row(data: Path, source: str, row: int, reason: str, got: str | None) -> bool:
    """Where the planted truth is not the only right answer.

    * A planted ``no_user_turn`` row built from a conversation that starts with a system prompt
      keeps the user turn (``[conv[1]]`` is the user turn then), so it is a valid prompt-only row.
    * A planted ``duplicate`` of a row that quotes a benchmark prompt is contaminated first
      (decontamination runs per source, before the cross-source dedup).
    """
    if reason == "duplicate" and got == "contaminated":
        return True
    if reason != "no_user_turn" or source != "openhermes":
        return False
    turns = json.loads((data / "openhermes.json").read_text())[row]["conversations"]
    return any(t["from"] == "human" for t in turns)


def test_every_planted_bad_row_is_quarantined_with_its_reason(normalized_run, data_world):
    _config, out = normalized_run
    quarantine = pq.read_table(out / "quarantine.parquet").to_pylist()
    got = {(r["source"], int(r["source_row"])): r["reason"] for r in quarantine}
    wrong = []
    for source, rows in bad_rows(data_world["data"]).items():
        for row, reason in rows.items():
            seen = got.get((source, row))
            if seen != reason and not _truth_contradicts_row(
                data_world["data"], source, row, reason, seen
            ):
                wrong.append((source, row, reason, got.get((source, row))))
    assert wrong == []


def test_rows_quarantined_beyond_the_ground_truth_are_real_contamination_or_near_duplicates(
    normalized_run, data_world
):
    """Generated rows share templates, so a few good rows quote a bench prompt or nearly repeat
    another prompt: each such extra quarantine must be provably right."""
    config, out = normalized_run
    truth = bad_rows(data_world["data"])
    bench = _bench_prompts(data_world["data"])
    bench_ids = {
        json.loads(line)["id"]
        for f in (data_world["data"] / "bench").glob("*.jsonl")
        for line in f.read_text().splitlines()
    }
    kept = [r for f in sorted(out.glob("shard-*.parquet")) for r in pq.read_table(f).to_pylist()]
    # near-duplicates are judged on these turns (eagle3.data.dedup: not the system prompt)
    prompt = ("user", "tool")
    kept_shingles = [
        shingles([m["content"] for m in r["messages"] if m["role"] in prompt]) for r in kept
    ]
    for r in pq.read_table(out / "quarantine.parquet").to_pylist():
        if int(r["source_row"]) in truth[r["source"]]:
            continue
        if r["reason"] == "near_duplicate":
            turns = [m["content"] for m in json.loads(r["raw"])["messages"] if m["role"] in prompt]
            mine = shingles(turns)
            best = max(len(mine & k) / len(mine | k) for k in kept_shingles)
            t, perms = config.normalize.near_dup_threshold, config.normalize.minhash_num_perm
            # MinHash estimates Jaccard within ~3 sigma
            assert best >= t - 3 * (t * (1 - t) / perms) ** 0.5, r
            continue
        assert r["reason"] == "contaminated", r
        text = " ".join(re.findall(r"\w+", r["raw"].lower()))
        # the raw row is truncated to 2 KB
        named = re.search(r'"benchmark": "\w+/([\w-]+)"', r["raw"])
        assert any(p in text for p in bench) or (named and named.group(1) in bench_ids), r


def test_books_balance_per_source_and_shards_hold_exactly_the_kept_rows(normalized_run):
    _config, out = normalized_run
    manifest = Manifest.read(out)
    assert manifest is not None and manifest.verify(out) == []
    rows = [r for f in sorted(out.glob("shard-*.parquet")) for r in pq.read_table(f).to_pylist()]
    quarantine = pq.read_table(out / "quarantine.parquet").to_pylist()
    kept_by_source = Counter(r["source"] for r in rows)
    quarantined_by_source = Counter(r["source"] for r in quarantine)
    for name, s in manifest.stats["sources"].items():
        assert kept_by_source[name] == s["kept"] == s["in"] - sum(s["quarantined"].values())
        assert quarantined_by_source[name] == sum(s["quarantined"].values())
        assert s["duplicates"] == s["quarantined"].get("duplicate", 0) + s["quarantined"].get(
            "near_duplicate", 0
        )
    assert len({r["sample_id"] for r in rows}) == len(rows)
    assert set(Counter(r["reason"] for r in quarantine)) <= set(REASONS)


def test_shards_follow_the_prompt_contract(normalized_run):
    config, out = normalized_run
    shards = sorted(out.glob("shard-*.parquet"))
    assert [p.name for p in shards] == [f"shard-{i:05d}.parquet" for i in range(len(shards))]
    for path in shards:
        pf = open_shard(path, schema=PROMPT_SCHEMA)
        assert pf.metadata.num_rows <= config.normalize.shard_size
    open_shard(out / "quarantine.parquet", schema=QUARANTINE_SCHEMA)
    rows = pq.read_table(shards[-1]).to_pylist() + pq.read_table(shards[0]).to_pylist()
    pretok = [r for r in rows if r["source"] == "pretokenized"]
    assert pretok and all(len(r["input_ids"]) == len(r["loss_mask"]) for r in pretok)
    chat = [r for r in rows if r["source"] != "pretokenized"]
    assert all(r["input_ids"] is None and r["n_user_turns"] >= 1 for r in chat)
    assert all(json.loads(r["meta"])["license"] for r in rows)
    raws = pq.read_table(out / "quarantine.parquet").column("raw").to_pylist()
    assert max(len(r.encode()) for r in raws) <= 2048


def test_same_config_twice_is_a_manifest_hit(normalized_run, caplog):
    config, out = normalized_run
    before = (out / "manifest.json").read_text()
    with caplog.at_level("INFO"):
        assert normalize(config) == out
    assert (out / "manifest.json").read_text() == before
    assert "manifest hit" in caplog.text


def test_changing_one_source_cap_changes_the_fingerprint_and_takes_exactly_the_cap(config_factory):
    base = config_factory()
    capped = config_factory(["sources.0.max_rows=40"])
    assert prompts_fingerprint(base, "cat") != prompts_fingerprint(capped, "cat")
    assert prompts_fingerprint(base, "cat") == prompts_fingerprint(config_factory(), "cat")
    out = normalize(capped)
    stats = Manifest.read(out).stats["sources"]["sharegpt"]
    assert stats["planned"] == stats["in"] == 40
    assert stats["kept"] + sum(stats["quarantined"].values()) == 40
