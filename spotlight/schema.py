"""The base of every config section: typed, frozen, unknown fields refused, and the config error type.

Kept apart from ``spotlight.config`` so that any module (the planner, the simulator, a model adapter)
can define its own section without importing the whole run configuration.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """A config that cannot run; the message is one line naming the field and the fix."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
