"""The exploration planner's config section (``explore.planner``): apart from the planner so the run config reads it.

A section module imports only the schema (`tests/test_layout.py`), so `spotlight.config` gathers it
without the configuration and the exploration maths importing each other.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from spotlight.schema import Section

__all__ = ["PlannerSection", "Sampler"]

Sampler = Literal["sde", "ode"]


class PlannerSection(Section):
    """The bandit's arms and rule. Defaults run; see ExplorationPlanner for what each knob does."""

    num_candidates: tuple[int, ...] = (8, 16, 32, 64)
    num_steps: tuple[int, ...] = (4, 7, 10)
    sampler: Sampler = "sde"
    cost_weight: float = Field(0.0, ge=0, le=1)  # λ
    discount: float = Field(0.95, gt=0, le=1)  # γ
    exploration: float = Field(0.15, ge=0)  # c
    cost_smoothing: float = Field(0.3, gt=0, le=1)
    budget_fraction: float = Field(0.95, gt=0, le=1)
    monotone: bool = True
    prior_cost_per_candidate_step_s: float | None = Field(None, gt=0)
    min_fidelity_ratio: float = Field(0.5, ge=0, le=1)  # drop a preview depth below this × the best's fidelity
    seed: int = 0

    @field_validator("num_candidates", "num_steps")
    @classmethod
    def _positive_distinct(cls, values: tuple[int, ...]) -> tuple[int, ...]:
        if not values:
            raise ValueError("must list at least one value")
        if min(values) < 1:
            raise ValueError(f"every value must be >= 1 (got {min(values)})")
        if len(set(values)) != len(values):
            raise ValueError(f"values must be distinct (got {list(values)})")
        return values
