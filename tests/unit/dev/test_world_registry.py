"""The dev worlds by name: one registry that the tiny-world task and ``eagle3 dev build-tiny`` both read."""

from __future__ import annotations

from typing import get_args

from eagle3.config import DevConfig
from eagle3.dev.world import world_builders


def test_every_world_a_config_can_name_has_a_builder_and_no_other():
    assert set(world_builders()) == set(get_args(DevConfig.model_fields["world"].annotation))


def test_the_tiny_world_by_name_is_the_cached_tiny_world(tiny_world):
    world, hit = world_builders()["tiny"](tiny_world.root.parent)
    assert hit and world.root == tiny_world.root
