"""The dev worlds by name (one registry that the tiny-world task and ``eagle3 dev build-tiny`` both
read) and the one cache every world is built through (``build_cached``)."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

from eagle3.config.dev import DevConfig
from eagle3.worlds.domains_world import DomainsWorldSpec, build_domains_world
from eagle3.worlds.world import WORLD_FILE, build_cached, world_builders


def test_every_world_a_config_can_name_has_a_builder_and_no_other():
    assert set(world_builders()) == set(get_args(DevConfig.model_fields["world"].annotation))


def test_the_tiny_world_by_name_is_the_cached_tiny_world(tiny_world):
    world, hit = world_builders()["tiny"](tiny_world.root.parent)
    assert hit and world.root == tiny_world.root


def _write(text: str):
    def build(tmp: Path) -> str:
        tmp.mkdir()
        (tmp / WORLD_FILE).write_text(text)
        return text

    return build


def test_a_world_is_built_once_and_a_builder_that_lost_the_race_keeps_the_winners(tmp_path):
    final = tmp_path / "cache" / "w-1"
    assert build_cached(final, _write("first")) == "first"
    assert build_cached(final, _write("second")) is None  # a cache hit builds nothing
    assert (final / WORLD_FILE).read_text() == "first"

    def finishes_second(tmp: Path) -> str:
        # a concurrent builder renames its world into place first
        _write("winner")(final.parent / "w-2")
        return _write("loser")(tmp)

    said = []
    assert build_cached(final.parent / "w-2", finishes_second, say=said.append) == "loser"
    assert (final.parent / "w-2" / WORLD_FILE).read_text() == "winner" and said
    # no temporary directory left
    assert sorted(p.name for p in final.parent.iterdir()) == ["w-1", "w-2"]


def test_an_unfinished_world_directory_is_replaced(tmp_path):
    final = tmp_path / "w"
    (final / "model").mkdir(parents=True)  # a leftover without world.json
    assert build_cached(final, _write("built")) == "built"
    assert sorted(p.name for p in final.iterdir()) == [WORLD_FILE]


def test_the_domains_world_is_built_through_the_same_cache(tmp_path):
    spec = DomainsWorldSpec(
        vocab_size=300,
        num_layers=2,
        hidden_size=32,
        train_conversations=40,
        train_steps=2,
        train_seq_len=32,
    )
    model = build_domains_world(tmp_path, spec)
    assert (
        model == tmp_path / f"domains-world-{spec.fingerprint()}" / "model"
        and (model / "config.json").exists()
    )
    stamp = (model.parent / WORLD_FILE).stat().st_mtime_ns
    assert (
        build_domains_world(tmp_path, spec) == model
        and (model.parent / WORLD_FILE).stat().st_mtime_ns == stamp
    )
