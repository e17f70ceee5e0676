"""The ``dev`` section of the pipeline config: the offline worlds (``eagle3.worlds``)."""

from __future__ import annotations

from typing import Literal

from eagle3.config.base import StrictModel


class DevConfig(StrictModel):
    """The offline worlds (``eagle3 dev build-tiny``); only the ``tiny`` recipes enable one. ``world``: the tiny chat
    world, ``think``, the thinking, tool-calling one (``eagle3.worlds.think_world``), or
    ``served``, the tiny world with the request logs of traffic served to its target
    (``eagle3.worlds.served_traffic``)."""

    tiny_world: bool = False
    world: Literal["tiny", "think", "served"] = "tiny"
    cache_dir: str | None = None
