"""The ``dev`` section of the pipeline config: the offline worlds (``eagle3.worlds``)."""

from __future__ import annotations

from typing import Literal

from eagle3.config.base import StrictModel


class DevConfig(StrictModel):
    """The cached worlds (``eagle3 dev build-tiny``); the ``tiny`` recipes and ``smollm2`` enable
    one. ``world``: the tiny chat world, ``think``, the thinking, tool-calling one
    (``eagle3.worlds.think_world``), ``served``, the tiny world with the request logs of traffic
    served to its target (``eagle3.worlds.served_traffic``), or ``smollm2``, the real one: a
    registry's model and datasets (``eagle3.worlds.smollm2_world``). ``tiny_world`` builds the
    world (or reuses it) in the run's first task."""

    tiny_world: bool = False
    world: Literal["tiny", "think", "served", "smollm2"] = "tiny"
    cache_dir: str | None = None
