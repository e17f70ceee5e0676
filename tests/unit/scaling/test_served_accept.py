"""Aiming by served acceptance (``scaling.aim: served``, ``eagle3.scaling.served_accept``): the live
draft's accept length per domain read from request logs at level 1, and the headroom rule."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from eagle3.config.gate import SpeculativeConfig
from eagle3.data.served_log import log_files, log_flags
from eagle3.data.template import render_prompt
from eagle3.scaling.allocation import DomainState
from eagle3.scaling.served_accept import allocate_headroom, served_accept
from eagle3.serve.launch import reference_server
from eagle3.serve.launch_commands import speculative_args

HEADER = "x-smg-routing-key"


def _state(name: str, accept: float | None, *, left: int = 1000, share: float = 0.5) -> DomainState:
    return DomainState(name=name, pool_left=left, tokens_per_row=10.0, share=share, accept=accept)


def test_the_budget_goes_by_share_times_the_headroom_above_a_floor():
    plan = allocate_headroom(
        [_state("hard", 1.5), _state("easy", 3.5)], 100, unit="prompts", floor=0.1, ceiling=4.0
    )
    # floor 5 each; the other 90 split 2.5 : 0.5
    assert plan.rows() == {"easy": 20, "hard": 80}
    table = {row["domain"]: row for row in plan.table()}
    assert (
        table["hard"]["why"].startswith("served accept 1.50, headroom 2.50")
        and table["hard"]["bound"] == "headroom"
    )


def test_a_pool_that_runs_out_hands_its_part_to_the_neediest_and_tokens_are_priced_per_row():
    plan = allocate_headroom(
        [_state("hard", 1.0, left=10), _state("mid", 2.0), _state("easy", 3.0)],
        600,
        unit="tokens",
        floor=0.0,
        ceiling=4.0,
    )
    assert plan.rows()["hard"] == 10 and plan.rows()["mid"] > plan.rows()["easy"]
    assert plan.spent <= 600 and 600 - plan.spent < 10  # every row that fits is taken
    unmeasured = allocate_headroom(
        [_state("new", None), _state("seen", 2.0)], 100, unit="prompts", floor=0.0, ceiling=4.0
    )
    assert unmeasured.rows() == {"new": 50, "seen": 50}  # weighed as the worst measured domain


def test_the_live_drafts_accept_length_per_domain_comes_from_level_one_logs(gate_world, tmp_path):
    logs = tmp_path / "logs"
    spec = speculative_args(
        SpeculativeConfig(num_steps=3, num_draft_tokens=4), str(gate_world.export)
    )
    flags = ["--num-threads", "1", *spec, *log_flags(logs, level=1)]
    questions = {
        "chat": ["How can I sleep better?", "Give me a tip for focus."],
        "math": ["What is 12 + 30?"],
    }
    answers: dict[str, list[dict]] = {}

    async def send(url: str) -> None:
        async with aiohttp.ClientSession() as session:
            for domain, texts in questions.items():
                for text in texts:
                    ids = render_prompt(gate_world.tokenizer, [{"role": "user", "content": text}])
                    body = {
                        "input_ids": ids,
                        "sampling_params": {"max_new_tokens": 24, "temperature": 0},
                    }
                    async with session.post(
                        url + "/generate", json=body, headers={HEADER: domain}
                    ) as resp:
                        answers.setdefault(domain, []).append((await resp.json())["meta_info"])

    with reference_server(gate_world.model_dir, extra_args=flags) as server:
        asyncio.run(send(server.url))
    lines = log_files(logs)[0].read_text().splitlines()
    # level 1: no content
    assert not any("input_ids" in json.loads(line[22:]).get("obj", {}) for line in lines)
    measured = served_accept(log_files(logs), header=HEADER)
    assert set(measured) == {"chat", "math"}
    for domain, metas in answers.items():
        tokens, verify = (
            sum(m["completion_tokens"] for m in metas),
            sum(m["spec_verify_ct"] for m in metas),
        )
        assert measured[domain].accept_length == tokens / verify and measured[
            domain
        ].requests == len(metas)
