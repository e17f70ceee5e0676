"""Tonight's plan end to end (``eagle3.scaling.night``): the aimed night over a prompts stage, with
and without a champion measured per domain, explicit shard ids, and the per-domain point an aimed
night leaves on the curve."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from eagle3.config.pipeline import PipelineConfig, with_overrides
from eagle3.config.target import TargetConfig
from eagle3.gate.report import Decision, GateReport, write_report
from eagle3.registry import Registry
from eagle3.scaling import domain_eval
from eagle3.scaling.curve import ScalingPoint, read_curve, record_point
from eagle3.scaling.night import plan_tonight
from eagle3.scaling.selection import FREE, read_nights, read_pool
from eagle3.scaling.stage import ScalingStage
from eagle3.stage import run_stage

DOMAINS = {"chat": 40, "code": 40, "math": 40}


def _config(root: Path, *overrides: str, base: PipelineConfig | None = None) -> PipelineConfig:
    base = base or PipelineConfig(
        name="t",
        root=str(root),
        target=TargetConfig(model_path="m", num_layers=8, hidden_size=8, vocab_size=64),
    )
    return with_overrides(
        base,
        [
            f"root={root}",
            "scaling.policy=aimed",
            "scaling.eval_per_domain=2",
            "scaling.eval_max_new_tokens=16",
            "normalize.shard_size=10",
            *overrides,
        ],
    )


def _gate_report(root: Path) -> Path:
    out = root / "gate" / "g"
    thresholds = {
        "decision_concurrency": 1,
        "min_speedup": 1.05,
        "min_accept": 1.5,
        "min_gain_over_champion": 1.0,
    }
    write_report(
        GateReport(
            fingerprint="g",
            target="tiny",
            thresholds=thresholds,
            prompts={},
            arms=[],
            decisions=[Decision("d", True, "spec", 1.3, 2.2, None)],
            passed=True,
        ),
        out,
    )
    return out


def test_the_first_aimed_night_splits_the_budget_evenly_and_selects_the_rows(
    tmp_path, write_prompt_pool
):
    prompts = write_prompt_pool(tmp_path / "prompts" / "p", DOMAINS, free=4)
    config = _config(tmp_path)
    night = plan_tonight(config, prompts, 30)
    assert night.policy == "aimed" and Path(night.prompts_dir).parent.name == "selection"
    assert {row["domain"]: row["allocation"] for row in night.plan} == {
        "chat": 10,
        "code": 10,
        "math": 10,
        FREE: 4,
    }
    assert all("nothing measured yet" in row["why"] for row in night.plan if row["domain"] != FREE)
    assert night.total_prompts == 34 and night.new_shard_ids == night.shard_ids == [0, 1, 2, 3]
    header = "| domain | pool left | current accept | traffic share | allocation | bound by | why |"
    # nothing measured: by share
    assert header in night.plan_markdown and "| share |" in night.plan_markdown
    # what `eagle3 plan` prints: the same, nothing written
    preview = plan_tonight(config, prompts, 30, write=False)
    assert preview.plan == night.plan and len(read_nights(Path(night.prompts_dir))) == 1


def test_without_a_champion_the_plan_uses_the_last_aimed_nights_measurements(
    tmp_path, write_prompt_pool
):
    prompts = write_prompt_pool(tmp_path / "prompts" / "p", DOMAINS)
    config = _config(tmp_path)
    plan_tonight(config, prompts, 30)
    measured = {"chat": 3.5, "code": 1.5, "math": 2.5}
    record_point(
        tmp_path,
        ScalingPoint(
            total_prompts=30,
            train_samples=30,
            accept_length=2.5,
            speedup=1.0,
            passed=False,
            draft_fingerprint="d1",
            report="r1",
            policy="aimed",
            domains={d: {"rows": 10, "tokens": 300, "accept": a} for d, a in measured.items()},
        ),
    )
    # night 2: the gate refused night 1, nothing was promoted
    night = plan_tonight(config, prompts, 30)
    assert {row["domain"]: row["current_accept"] for row in night.plan} == measured
    allocation = {row["domain"]: row["allocation"] for row in night.plan}
    # one point each, no slope yet: rows by share
    assert allocation == {"chat": 10, "code": 10, "math": 10}
    assert "no champion yet: the draft of r1" in night.plan_markdown


def test_uniform_keeps_the_prompt_shards_and_their_order(tmp_path, write_prompt_pool):
    prompts = write_prompt_pool(tmp_path / "prompts" / "p", DOMAINS)
    night = plan_tonight(_config(tmp_path, "scaling.policy=uniform"), prompts, 30)
    assert night.prompts_dir == str(prompts) and night.select_dir is None
    assert night.shard_ids == [0, 1] and night.total_prompts == 32  # whole shards of 16, as before
    assert not (tmp_path / "selection").exists()


def test_explicit_shard_ids_name_the_selections_shards_and_select_nothing_new(
    tmp_path, write_prompt_pool
):
    prompts = write_prompt_pool(tmp_path / "prompts" / "p", DOMAINS)
    config = _config(tmp_path)
    with pytest.raises(ValueError, match="none yet"):
        plan_tonight(config, prompts, None, [0])
    first = plan_tonight(config, prompts, 30)
    again = plan_tonight(config, prompts, None, [2, 0])
    assert again.shard_ids == [0, 2] and again.total_prompts == 20
    assert again.prompts_dir == first.prompts_dir
    assert len(read_nights(Path(first.prompts_dir))) == 1
    with pytest.raises(ValueError, match=r"\[9\] do not exist.*shards 0\.\.2"):
        plan_tonight(config, prompts, None, [9])


@pytest.fixture
def champion_world(tmp_path, write_prompt_pool, gate_world):
    """The tiny target, its trained draft promoted as the champion, an aimed config over a small
    prompt pool."""
    prompts = write_prompt_pool(tmp_path / "prompts" / "p", DOMAINS)
    config = _config(tmp_path, base=gate_world.config)
    Registry(config.root_path).promote(gate_world.export, report=str(tmp_path / "report.json"))
    return config, prompts


def test_the_plan_measures_the_champion_per_domain_once_and_shows_it(champion_world, monkeypatch):
    config, prompts = champion_world
    night = plan_tonight(config, prompts, 24, write=False)
    accepts = {row["domain"]: row["current_accept"] for row in night.plan}
    assert set(accepts) == set(DOMAINS) and all(1.0 <= a <= 4.0 for a in accepts.values()), accepts
    # one point each: no slope yet
    assert all("nothing measured yet" in row["why"] for row in night.plan)
    (cache,) = (Path(night.prompts_dir) / "eval").glob("*.json")
    by_set = json.loads(cache.read_text())["by_set"]
    assert {d: s["prompts"] for d, s in by_set.items()} == {"chat": 2, "code": 2, "math": 2}
    monkeypatch.setattr(
        domain_eval, "measure_offline", lambda *a: pytest.fail("measured the same draft twice")
    )
    assert plan_tonight(config, prompts, 24, write=False).plan == night.plan


def test_an_aimed_nights_point_keeps_its_policy_and_per_domain_rows_and_accept(champion_world):
    config, prompts = champion_world
    night = plan_tonight(config, prompts, 24)
    champion = Registry(config.root_path).champion()
    run_stage(
        ScalingStage(),
        config,
        gate_dir=_gate_report(config.root_path),
        total_prompts=24,
        train_samples=24,
        draft_fingerprint="d1",
        policy="aimed",
        select_dir=night.select_dir,
        draft_dir=champion.draft_dir,
    )
    (point,) = read_curve(config.root_path)
    assert point.policy == "aimed" and set(point.domains) == set(DOMAINS)
    assert sum(row["rows"] for row in point.domains.values()) == 24
    assert all(
        row["accept"] == pytest.approx(r["current_accept"], abs=1e-3)
        for r in night.plan
        for d, row in point.domains.items()
        if d == r["domain"]
    )
    eval_ids = read_pool(Path(night.select_dir)).eval_ids
    selected = [
        sid
        for p in Path(night.select_dir).glob("shard-*.parquet")
        for sid in pq.read_table(p, columns=["sample_id"])["sample_id"].to_pylist()
    ]
    assert len(selected) == 24 and not eval_ids & set(selected)


def test_a_night_aimed_by_served_acceptance_sends_the_budget_where_the_live_draft_fails(
    tmp_path, write_prompt_pool, monkeypatch
):
    from eagle3.scaling import night as night_module
    from eagle3.scaling.domain_eval import DomainAccept

    prompts = write_prompt_pool(tmp_path / "prompts" / "p", DOMAINS)
    # math: not served; the reading of the logs is tested in test_served_accept.py
    served = {"chat": DomainAccept(3.5, 70, 20, 5), "code": DomainAccept(1.5, 30, 20, 5)}
    monkeypatch.setattr(night_module, "served_domain_accept", lambda config: served)
    night = plan_tonight(_config(tmp_path, "scaling.aim=served", "scaling.floor=0"), prompts, 30)
    rows = {row["domain"]: row["allocation"] for row in night.plan}
    assert min(rows["code"], rows["math"]) > rows["chat"] and sum(rows.values()) == 30
    assert abs(rows["code"] - rows["math"]) <= 1  # math, not served, weighs as the worst measured
    assert "Aimed by served acceptance" in night.plan_markdown
    chat = next(r for r in night.plan if r["domain"] == "chat")
    assert chat["why"].startswith("served accept 3.50")
