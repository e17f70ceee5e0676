"""Nightly data scaling: stable shard selection as the cumulative total grows, and the scaling-curve
ledger."""

from __future__ import annotations

import pytest

from eagle3.rundir.runroot import FileEntry
from eagle3.scaling.curve import (
    ScalingPoint,
    curve_markdown,
    curve_path,
    data_limited_verdict,
    plan_night,
    plot_curve,
    previous_total,
    read_curve,
    record_point,
    shard_rows,
)


def _point(
    samples: int, accept: float, *, fp: str | None = None, total: int | None = None
) -> ScalingPoint:
    return ScalingPoint(
        total_prompts=total or samples,
        train_samples=samples,
        accept_length=accept,
        speedup=1.1,
        passed=True,
        draft_fingerprint=fp or f"fp{samples}",
        report=f"/r/{samples}/report.json",
    )


def test_growing_total_keeps_earlier_shards_and_adds_only_new_ones():
    rows = [100, 100, 100, 100, 37]
    night1 = plan_night(rows, scale=150, previous_total=0)
    night2 = plan_night(rows, scale=150, previous_total=night1.total_prompts)
    assert night1.shard_ids == [0, 1] and night1.total_prompts == 200
    assert night2.shard_ids == [0, 1, 2, 3] and night2.new_shard_ids == [2, 3]
    assert night2.total_prompts == 400 and not night2.exhausted


def test_scale_beyond_the_pool_selects_everything_and_says_exhausted():
    plan = plan_night([10, 10, 5], scale=1000, previous_total=20)
    assert plan.shard_ids == [0, 1, 2] and plan.new_shard_ids == [2]
    assert plan.total_prompts == 25 and plan.exhausted


def test_no_scale_selects_the_whole_pool():
    plan = plan_night([10, 10], scale=None, previous_total=0)
    assert plan.shard_ids == [0, 1] and plan.total_prompts == 20


def test_non_positive_scale_is_rejected_with_the_fix():
    with pytest.raises(ValueError, match="positive number"):
        plan_night([10], scale=0, previous_total=0)


def test_shard_rows_reads_prompt_shards_in_order_and_skips_quarantine():
    files = [
        FileEntry("shard-00001.parquet", 7, 1, "x"),
        FileEntry("quarantine.parquet", 3, 1, "y"),
        FileEntry("shard-00000.parquet", 5, 1, "z"),
    ]
    assert shard_rows(files) == [5, 7]


def test_shard_rows_refuses_a_gap_that_would_shift_later_shards():
    with pytest.raises(ValueError, match="without gaps"):
        shard_rows(
            [
                FileEntry("shard-00000.parquet", 5, 1, "z"),
                FileEntry("shard-00002.parquet", 5, 1, "z"),
            ]
        )


def test_rerunning_a_night_replaces_its_point_instead_of_appending(tmp_path):
    record_point(tmp_path, _point(100, 1.5))
    record_point(tmp_path, _point(200, 1.8))
    points = record_point(tmp_path, _point(200, 1.9))
    assert [(p.train_samples, p.accept_length) for p in points] == [(100, 1.5), (200, 1.9)]
    assert read_curve(tmp_path) == points
    assert previous_total(points) == 200


def test_a_corrupt_curve_line_names_the_file_and_line(tmp_path):
    curve_path(tmp_path).parent.mkdir(parents=True)
    curve_path(tmp_path).write_text('{"total_prompts": 1}\n')
    with pytest.raises(ValueError, match=r"curve\.jsonl:1"):
        read_curve(tmp_path)


def test_verdict_says_data_limited_while_accept_length_grows_per_doubling():
    assert data_limited_verdict([_point(100, 1.5)]).startswith("not enough nights")
    growing = [_point(100, 1.5), _point(200, 1.7), _point(400, 1.9)]
    flat = [_point(100, 2.0), _point(200, 2.01), _point(400, 2.0)]
    assert data_limited_verdict(growing).startswith("still data-limited: +0.200")
    assert data_limited_verdict(flat).startswith("flattening")


def test_curve_renders_a_table_and_a_png(tmp_path):
    points = [_point(100, 1.5), _point(200, 1.7)]
    png = plot_curve(points, tmp_path / "curve.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = curve_markdown(points, png=png)
    assert "| 2 | uniform | 200 | 200 | 1.700 | 1.100 | pass |" in md and "still data-limited" in md
    # uniform nights have no held-out eval set, hence no per-domain points
    assert "Per domain" not in md


def test_an_aimed_night_keeps_its_policy_and_per_domain_points_and_older_lines_read_as_uniform(
    tmp_path,
):
    import dataclasses
    import json

    aimed = dataclasses.replace(
        _point(300, 1.8),
        policy="aimed",
        domains={"chat": {"rows": 120, "tokens": 9000, "accept": 2.25}},
    )
    record_point(tmp_path, aimed)
    old = {
        k: v
        for k, v in dataclasses.asdict(_point(100, 1.5)).items()
        if k not in ("policy", "domains")
    }
    lines = curve_path(tmp_path).read_text()
    # a line written before policies existed
    curve_path(tmp_path).write_text(json.dumps(old) + "\n" + lines)
    first, second = read_curve(tmp_path)
    assert (first.policy, first.domains) == ("uniform", {}) and second == aimed
    md = curve_markdown([first, second])
    assert "| 2 | aimed | 300 |" in md and "| 2 | chat | 120 | 9,000 | 2.250 |" in md


def test_feature_set_fingerprint_follows_the_listed_shards_not_the_directory(tmp_path):
    from eagle3.rundir.layout import feature_set_fingerprint
    from eagle3.rundir.runroot import Manifest

    features = tmp_path / "features" / "abc"
    features.mkdir(parents=True)
    shard0 = FileEntry("shard-00000.parquet", 5, 10, "s0")
    Manifest("features", "abc", files=[shard0]).write(features)
    night1 = feature_set_fingerprint(features)
    Manifest("features", "abc", files=[shard0]).write(features)  # the same night again
    assert feature_set_fingerprint(features) == night1
    Manifest(
        "features", "abc", files=[shard0, FileEntry("shard-00001.parquet", 5, 10, "s1")]
    ).write(features)
    assert feature_set_fingerprint(features) != night1
    with pytest.raises(FileNotFoundError, match="eagle3 capture"):
        feature_set_fingerprint(tmp_path / "features" / "missing")
