"""The two pools a cluster rents devices from, in the names every price, bill and trace uses.

On-demand devices are never taken back; spot devices are cheaper and can be preempted. The price
table, the simulator's cost meter and the runtime's ledger all key by these names, so they are
defined once.
"""

from __future__ import annotations

from typing import Literal, get_args

__all__ = ["POOLS", "Pool"]

Pool = Literal["on_demand", "spot"]
POOLS: tuple[Pool, ...] = get_args(Pool)
