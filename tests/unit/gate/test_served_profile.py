"""The gate's load profile from served traffic (``gate.profile: served``,
``eagle3.gate.served_profile``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3.data.served_log import ServedRequest, iter_log, log_files
from eagle3.data.template import render_prompt
from eagle3.gate.report import Decision, GateReport, to_markdown
from eagle3.gate.served_profile import (
    PROFILE_FILE,
    SERVED_SET,
    load_profile,
    mean_concurrency,
    profile_dir,
    served_sampling,
    traffic_levels,
    with_served_profile,
)
from eagle3.recipes import load_recipe
from eagle3.target_io import load_tokenizer


def test_each_request_sits_at_the_mean_load_over_its_own_life():
    assert mean_concurrency([(0.0, 10.0)]) == [1.0]
    assert mean_concurrency([(0.0, 10.0), (0.0, 10.0)]) == [2.0, 2.0]
    assert mean_concurrency([(0.0, 10.0), (5.0, 15.0), (20.0, 21.0)]) == [1.5, 1.5, 1.0]


def _request(start: float, end: float, tokens: int) -> ServedRequest:
    out = {"meta_info": {"completion_tokens": tokens, "finish_reason": {"type": "stop"}}}
    return ServedRequest(
        rid=f"r{start}", received_at=start, finished_at=end, file="f", line=1, obj={}, out=out
    )


def test_levels_weigh_the_tokens_served_at_them_and_only_the_heaviest_are_kept():
    # 30 tokens at concurrency 1
    alone = [_request(100.0 + 10 * i, 105.0 + 10 * i, 10) for i in range(3)]
    busy = [_request(0.0, 10.0, 20) for _ in range(4)]  # 80 tokens at concurrency 4
    pair = [_request(50.0, 60.0, 5), _request(50.0, 60.0, 5)]  # 10 tokens at concurrency 2
    kept, every = traffic_levels(alone + busy + pair, max_levels=2)
    assert every == {1: 0.25, 2: round(10 / 120, 4), 4: round(80 / 120, 4)}
    assert kept == {1: round(30 / 110, 4), 4: round(80 / 110, 4)}


@pytest.fixture(scope="module")
def config(served_traffic, tmp_path_factory):
    return load_recipe("tiny_served", [f"root={tmp_path_factory.mktemp('profile-run')}"])


def test_the_served_profile_becomes_the_gates_traffic_lengths_and_prompt_set(
    served_traffic, config
):
    profiled = with_served_profile(config)
    gate, profile = profiled.gate, load_profile(config)
    assert gate.traffic == profile.traffic and abs(sum(gate.traffic.values()) - 1) < 1e-3
    assert set(gate.traffic) <= {1, 2, 4, 8} and len(gate.traffic) <= config.gate.max_levels
    requests = [
        r for r in iter_log(log_files(served_traffic.log_dir)) if isinstance(r, ServedRequest)
    ]
    assert profile.requests == len([r for r in requests if not r.health_check])
    completions = sorted(r.meta_info["completion_tokens"] for r in requests if not r.health_check)
    assert gate.max_new_tokens == completions[int(0.9 * len(completions))]
    assert (
        gate.prompt_sets == {SERVED_SET: profile.prompt_set}
        and "served requests" in gate.profile_note
    )
    assert profile.sampling[0]["temperature"] == 0 and profile.sampling[0]["share"] == 1.0
    assert list(gate.sampling) == ["greedy"]  # the logs' one sampling, in place of the recipe's
    assert with_served_profile(profiled) is profiled  # resolved once


def test_held_out_prompts_render_back_to_exactly_the_ids_that_were_served(served_traffic, config):
    profile = load_profile(config)
    tokenizer = load_tokenizer(config.target)
    by_rid = {
        r.rid: r
        for r in iter_log(log_files(served_traffic.log_dir))
        if isinstance(r, ServedRequest)
    }
    rows = [json.loads(line) for line in Path(profile.prompt_set).read_text().splitlines()]
    assert len(rows) == profile.held_out_prompts >= 4
    for row in rows:
        served = (
            by_rid[row["id"]].input_ids or tokenizer(by_rid[row["id"]].prompt_text)["input_ids"]
        )
        assert render_prompt(tokenizer, row["messages"]) == served


def test_the_profile_is_built_once_per_state_of_the_logs(config):
    path = profile_dir(config) / PROFILE_FILE
    load_profile(config)
    stamp = path.stat().st_mtime_ns
    assert load_profile(config).traffic == with_served_profile(config).gate.traffic
    assert path.stat().st_mtime_ns == stamp


def test_the_gate_report_says_how_its_profile_was_built():
    note = "from 12 served requests (2026-12-06 13:00:00 to 2026-12-06 13:01:00, 1 log files): ..."
    thresholds = {
        "traffic": {"1": 1.0},
        "min_speedup": 1.0,
        "min_accept": 1.2,
        "min_gain_over_champion": 1.0,
        "profile_note": note,
    }
    report = GateReport(
        fingerprint="f",
        target="t",
        thresholds=thresholds,
        prompts={},
        arms=[],
        decisions=[Decision("d", False, None, None, None, None)],
        passed=False,
    )
    assert f"traffic profile built {note}" in to_markdown(report)


def test_the_samplings_the_logs_hold_become_the_gates_sampling_profiles():
    observed = [
        {"temperature": 1.0, "top_p": 0.95, "top_k": -1, "share": 0.6},
        {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "share": 0.3},
        {"temperature": 0.7, "top_p": 1.0, "top_k": 0, "share": 0.06},  # top_k 0: not a sampling
        {"temperature": 0.2, "top_p": 1.0, "top_k": -1, "share": 0.04},  # under a tenth
    ]
    profiles = served_sampling(observed)
    assert list(profiles) == ["T=1 top_p=0.95", "greedy"]
    assert profiles["T=1 top_p=0.95"].decides and profiles["greedy"].decides  # 30% >= a quarter
    rare = served_sampling([{**observed[0], "share": 0.85}, {**observed[1], "share": 0.15}])
    assert rare["T=1 top_p=0.95"].decides and not rare["greedy"].decides
    assert served_sampling([]) == {}
