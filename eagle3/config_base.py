"""``StrictModel``, the base of every config section: unknown keys are errors, assignments are validated.

A module of its own, below every config module (``config_gate``, ``config_regen``, ``config_scaling``,
``config_capture``, ``config``), so each section inherits the one rule instead of repeating it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)
