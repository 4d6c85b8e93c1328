"""The ``disagg:`` config section: the switches of ``mode: disaggregated`` (the DigenRL design, issue 16).

Read only in that mode (`spotlight.backends.disaggregated`, `spotlight.disagg.loop_update`):

    gap             train each group as soon as it is complete and scored (generation-axis pipeline);
                    off: wait for the whole batch, then train it (the one-shot fallback), same loss
    tsp             pack all trained timesteps of a group into one forward/backward (timestep packing)
    tag             in a bubble, the trainer draws unstarted units itself (trainer-assisted generation),
                    as many as the bubble policy (BTS) says pay, at least ``tag_min_fragments``
    async_one_step  generators start step s+1's units with θ_s while the trainer still trains step s
                    (at most one version stale, one version per trajectory); off: strictly on-policy
    explore         Spotlight's stale-seed exploration of step s+1's prompts with θ_s in the generators'
                    idle time (while the trainer finishes step s); off: random seeds

``unit_size`` generations make a unit (what one device draws at once), cut along the generation axis;
``generators``: generator devices (one core each, after the trainer's in ``device_cores``).
"""

from __future__ import annotations

from pydantic import Field

from spotlight.schema import Section

__all__ = ["DisaggSection"]


class DisaggSection(Section):
    """Switches and sizes of the disaggregated pipeline (see the module docstring)."""

    gap: bool = True
    tsp: bool = True
    tag: bool = False
    async_one_step: bool = False
    explore: bool = False
    unit_size: int = Field(2, ge=1)
    generators: int = Field(1, ge=1)
    tag_max_fragments: int = Field(4, ge=1)  # BTS's search bound: units the trainer may take at one bubble
    tag_min_fragments: int = Field(0, ge=0)  # taken at every bubble whatever BTS says (0: BTS decides alone)
    tag_min_gain: float = Field(0.02, ge=0)  # BTS takes TAG only if it shortens the rest of the step by this share
    explore_candidates: int = Field(16, ge=2)  # candidate seeds per prompt of step s+1 (explore)
    explore_steps: int = Field(4, ge=1)  # their sampling steps (the rollout's first ones, then one ODE jump)
