"""``StrictModel``, the base of every config section: unknown keys are errors, assignments and
``replace`` are validated; and ``ConfigError``, what a configuration that cannot run raises.

A module of its own, below every config module (one per section, and ``eagle3.config.pipeline``, the
whole), so each section inherits the one rule instead of repeating it.
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)

    def replace(self, **changes: Any) -> Self:
        """A validated copy with ``changes`` (typed values: sections, lists, scalars): how code
        derives a config (a recipe's variant); ``a.b=value`` strings are for what a user types
        (``with_overrides``)."""
        return type(self).model_validate({**self.model_dump(), **changes})


class ConfigError(ValueError):
    """A configuration that cannot run; the message says how to fix it."""
