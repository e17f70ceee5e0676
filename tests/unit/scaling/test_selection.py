"""The aimed nights' selection (``eagle3.scaling.selection``): the held-out eval set, the rows each
night writes, the ledger, and what regen reads."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from eagle3.config.pipeline import PipelineConfig, with_overrides
from eagle3.config.target import TargetConfig
from eagle3.rundir.runroot import Manifest
from eagle3.scaling.selection import (
    FREE,
    SelectionError,
    build_pool,
    domain_of,
    pool_left,
    read_nights,
    select_dir_for,
    write_night,
)

DOMAINS = {"chat": 40, "code": 24, "math": 12}


def _config(root: Path, *overrides: str) -> PipelineConfig:
    base = PipelineConfig(
        name="t",
        root=str(root),
        target=TargetConfig(model_path="m", num_layers=8, hidden_size=8, vocab_size=64),
    )
    return with_overrides(
        base,
        ["scaling.policy=aimed", "scaling.eval_per_domain=4", "normalize.shard_size=5", *overrides],
    )


def _ids(paths: list[Path]) -> list[str]:
    return [
        sid
        for p in paths
        for sid in pq.read_table(p, columns=["sample_id"])["sample_id"].to_pylist()
    ]


@pytest.fixture
def pool(tmp_path, write_prompt_pool):
    prompts = write_prompt_pool(tmp_path / "prompts" / "p1", DOMAINS, free=3)
    config = _config(tmp_path)
    return config, build_pool(config, prompts)


def test_each_domain_holds_out_a_fixed_eval_set_that_the_pool_never_offers(pool, tmp_path):
    config, built = pool
    # at most a quarter of the domain
    assert built.eval_domains == {"chat": 4, "code": 4, "math": 3}
    assert len(built.eval_ids) == 11 and set(_ids([built.eval_path])) == built.eval_ids
    assert {d: len(r) for d, r in built.refs.items()} == {"chat": 36, "code": 20, "math": 9}
    # read back, not redrawn
    assert len(built.free) == 3 and build_pool(config, built.prompts_dir) == built
    reseeded = build_pool(_config(tmp_path, "scaling.eval_seed=1"), built.prompts_dir)
    assert reseeded.dir != built.dir and reseeded.eval_ids != built.eval_ids


def test_nights_take_each_domains_next_rows_and_never_an_eval_row(pool):
    config, built = pool
    one = write_night(
        config,
        built,
        night=1,
        rows={"chat": 7, "math": 2, FREE: 3},
        budget=9,
        unit="prompts",
        plan=[],
    )
    two = write_night(
        config, built, night=2, rows={"chat": 29, "math": 7}, budget=36, unit="prompts", plan=[]
    )
    # one domain per shard, 7 chat rows in 5 + 2
    assert one.shards == {0: FREE, 1: "chat", 2: "chat", 3: "math"}
    shards = sorted(built.dir.glob("shard-*.parquet"))
    ids = _ids(shards)
    assert len(ids) == len(set(ids)) == 3 + 7 + 2 + 29 + 7 and not set(ids) & built.eval_ids
    # night 2 appends, never rewrites night 1's shards
    assert min(two.shards) == max(one.shards) + 1
    assert pool_left(built, read_nights(built.dir)) == {"chat": 0, "code": 20, "math": 0, FREE: 0}
    for index, domain in {**one.shards, **two.shards}.items():
        table = pq.read_table(built.dir / f"shard-{index:05d}.parquet")
        assert table.schema.metadata[b"domain"].decode() == domain
        assert set(table["source"].to_pylist()) == {"pretokenized" if domain == FREE else domain}
    manifest = Manifest.read(built.dir)
    assert [f.path for f in manifest.files] == [p.name for p in shards] and manifest.verify(
        built.dir
    ) == []


def test_a_night_written_again_is_the_recorded_one_and_writes_nothing(pool):
    config, built = pool
    first = write_night(
        config,
        built,
        night=1,
        rows={"code": 6},
        budget=6,
        unit="prompts",
        plan=[{"domain": "code"}],
    )
    before = {p: p.stat().st_mtime_ns for p in built.dir.iterdir()}
    again = write_night(
        config, built, night=1, rows={"chat": 99}, budget=99, unit="prompts", plan=[]
    )
    assert again == first and {p: p.stat().st_mtime_ns for p in built.dir.iterdir()} == before


def test_more_rows_than_a_domain_has_left_or_an_earlier_night_are_refused(pool):
    config, built = pool
    with pytest.raises(SelectionError, match="more rows than are left"):
        write_night(config, built, night=1, rows={"math": 10}, budget=10, unit="prompts", plan=[])
    write_night(config, built, night=2, rows={"math": 1}, budget=1, unit="prompts", plan=[])
    with pytest.raises(SelectionError, match="lost points"):
        write_night(config, built, night=1, rows={"math": 1}, budget=1, unit="prompts", plan=[])


def test_a_domain_is_the_source_or_a_meta_field():
    assert domain_of("sharegpt", '{"category": "Math"}', "source") == "sharegpt"
    assert domain_of("sharegpt", '{"category": "Math"}', "meta.category") == "Math"
    assert domain_of("sharegpt", "{}", "meta.category") == "unknown"
    with pytest.raises(ValueError, match=r"meta\.<key>"):
        _config(Path("/tmp"), "scaling.domain_key=category")


def test_the_selection_needs_a_finished_prompts_stage(tmp_path):
    with pytest.raises(SelectionError, match="eagle3 normalize"):
        select_dir_for(_config(tmp_path), tmp_path / "prompts" / "missing")
