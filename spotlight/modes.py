"""The training modes, one enum for the config, the CLI, the runtime and the simulator.

A mode says two things about an iteration: where its seeds come from (random, or explored with the
current weights θ_i, or with the previous weights θ_{i-1} while θ_i trains) and whether spot devices
take part. Every place that branches on the mode asks one of the properties below, so a new mode is
one line here plus the properties it answers differently.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Mode"]


class Mode(StrEnum):
    """How an iteration chooses its seeds and which devices run it (a ``str``: ``Mode("spotlight") == "spotlight"``)."""

    VANILLA = "vanilla"  # random seeds, one device
    SYNC_EXPLORE = "sync-explore"  # explore P_i with θ_i, on the critical path
    STALE_EXPLORE = "stale-explore"  # explore P_i with θ_{i-1}, in one process (measures staleness alone)
    SPOT_ROLLOUT = "spot-rollout"  # random seeds, the rollout spread over spot devices
    SPOTLIGHT = "spotlight"  # explore P_{i+1} with θ_i on spot devices while θ_i trains
    DISAGGREGATED = "disaggregated"  # generator and trainer devices apart (DigenRL): groups train as they arrive

    @property
    def explores(self) -> bool:
        """Whether the seeds are chosen by exploring candidates (otherwise they are random)."""
        return self in (Mode.SYNC_EXPLORE, Mode.STALE_EXPLORE, Mode.SPOTLIGHT)

    @property
    def stale(self) -> bool:
        """Whether exploration ranks candidates with θ_{i-1}, the weights before the last update."""
        return self in (Mode.STALE_EXPLORE, Mode.SPOTLIGHT)

    @property
    def on_ray(self) -> bool:
        """Whether the mode always runs on the Ray runtime (the others do with ``runtime.use_ray``)."""
        return self in (Mode.SPOT_ROLLOUT, Mode.SPOTLIGHT, Mode.DISAGGREGATED)

    @property
    def streams_groups(self) -> bool:
        """Whether the update trains groups as the backend delivers them (disaggregated), not one whole batch."""
        return self is Mode.DISAGGREGATED

    @property
    def rents_spot(self) -> bool:
        """Whether the mode rents spot devices on the Ray runtime (vanilla runs on on-demand alone)."""
        return self in (Mode.SYNC_EXPLORE, Mode.SPOT_ROLLOUT, Mode.SPOTLIGHT)

    @property
    def single_process_only(self) -> bool:
        """Whether the mode cannot run on Ray: stale-explore is spotlight's seeds without its devices."""
        return self is Mode.STALE_EXPLORE
