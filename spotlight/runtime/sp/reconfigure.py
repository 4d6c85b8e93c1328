"""The reconfiguration planner: which sequence-parallel (SP) groups to run on the devices alive now.

Pure functions of plain data (no Ray, no processes), so every rule is unit-tested directly; the
per-node agents (`spotlight.runtime.sp.agent`) carry the plan out and the elastic service
(`spotlight.runtime.sp.elastic`) calls the planner whenever a node or a device comes or goes.

Rules, in order:

1. Every SP degree must divide the model's head count (Ulysses gives each rank whole heads); a
   resolution that asks for another degree is refused with one line naming the allowed degrees.
2. A group whose members are all still alive, and whose degree is still wanted, is *kept* with its
   generation: its process group is untouched, so its in-flight requests never notice.
3. A group that lost a member is *dissolved*; its survivors join the free devices. Its in-flight
   requests go back through the queue from their last committed step (`requests_to_requeue`).
4. Free devices form new groups, each under a fresh generation number (so its process group lives
   under a store prefix no earlier group used): first one group for every wanted degree that has
   none (largest degree first, so the highest resolution stays servable), then as many more groups of
   the wanted degrees as fit, largest first.
5. Intra-node groups first (best fit: the node with the fewest free devices that still holds the
   group, which keeps large blocks free for large degrees); a cross-node group only when no single
   node can hold the degree and ``cross_node`` allows it, because an all-to-all inside a node rides
   shared memory / NVLink while one across nodes pays the network on every layer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from spotlight.models.ulysses import valid_sp_degrees

__all__ = [
    "PlanDiff",
    "ReconfigureError",
    "SPGroup",
    "device_id",
    "node_of",
    "plan_groups",
    "requests_to_requeue",
    "wanted_degrees",
]

Device = str  # "node/index", e.g. "spot0/1": device 1 of node spot0


class ReconfigureError(ValueError):
    """A plan that cannot be made; the message names the cause and the fix."""


def device_id(node: str, index: int) -> Device:
    """The id of device ``index`` on ``node``: ``"node/index"``."""
    if "/" in node:
        raise ReconfigureError(f"node id {node!r} contains '/': name nodes without slashes")
    return f"{node}/{index}"


def node_of(device: Device) -> str:
    """The node a device id belongs to."""
    node, _, index = device.rpartition("/")
    if not node or not index.isdigit():
        raise ReconfigureError(f"device id {device!r} is not 'node/index': build ids with device_id()")
    return node


def _device_key(device: Device) -> tuple[str, int]:
    return node_of(device), int(device.rpartition("/")[2])


@dataclass(frozen=True)
class SPGroup:
    """One SP group: ``members`` in rank order, formed under ``generation`` (unique per formation)."""

    generation: int
    members: tuple[Device, ...]

    @property
    def degree(self) -> int:
        return len(self.members)

    @property
    def name(self) -> str:
        """The group's store prefix and queue worker id: a new formation never reuses one."""
        return f"sp-gen{self.generation}"

    @property
    def nodes(self) -> tuple[str, ...]:
        """The nodes the group spans, sorted."""
        return tuple(sorted({node_of(member) for member in self.members}))

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "generation": self.generation, "members": list(self.members)}


@dataclass(frozen=True)
class PlanDiff:
    """What changes: ``old_groups`` -> ``new_groups``.

    ``kept``: groups that survive untouched (same generation); ``dissolved``: old groups that lost a
    member or whose degree is no longer wanted; ``formed``: new groups (fresh generations).
    ``idle``: alive devices in no group. ``unservable``: resolutions no group can serve now (too few
    devices); their requests wait in the queue until devices return. ``next_generation``: the number
    to pass to the next call.
    """

    kept: tuple[SPGroup, ...]
    dissolved: tuple[SPGroup, ...]
    formed: tuple[SPGroup, ...]
    idle: tuple[Device, ...]
    unservable: tuple[int, ...]
    next_generation: int
    old_groups: tuple[SPGroup, ...] = field(init=False)
    new_groups: tuple[SPGroup, ...] = field(init=False)

    def __post_init__(self) -> None:
        by_generation = lambda groups: tuple(sorted(groups, key=lambda g: g.generation))  # noqa: E731
        object.__setattr__(self, "old_groups", by_generation(self.kept + self.dissolved))
        object.__setattr__(self, "new_groups", by_generation(self.kept + self.formed))

    @property
    def changed(self) -> bool:
        return bool(self.dissolved or self.formed)

    def to_json(self) -> dict[str, object]:
        """The diff as JSON-ready data (for the reconfiguration log)."""
        groups = lambda gs: [g.to_json() for g in gs]  # noqa: E731
        return {
            "old_groups": groups(self.old_groups), "new_groups": groups(self.new_groups),
            "kept": [g.name for g in self.kept], "dissolved": [g.name for g in self.dissolved],
            "formed": [g.name for g in self.formed], "idle": list(self.idle),
            "unservable": list(self.unservable),
        }


def wanted_degrees(sp_degrees: Mapping[int, int], num_heads: int) -> list[int]:
    """The distinct SP degrees the resolutions ask for, largest first; refuses degrees Ulysses cannot run.

    ``sp_degrees`` maps a resolution (pixels per side) to the SP degree it needs.
    """
    if not sp_degrees:
        raise ReconfigureError("no resolution to serve: pass sp_degrees={resolution: sp_degree, ...}")
    allowed = valid_sp_degrees(num_heads)
    for resolution, degree in sorted(sp_degrees.items()):
        if degree not in allowed:
            raise ReconfigureError(
                f"resolution {resolution} asks for sp_degree {degree}, which does not divide the model's "
                f"{num_heads} heads: choose an SP degree among {', '.join(map(str, allowed))}"
            )
    return sorted(set(sp_degrees.values()), reverse=True)


def _take(free: dict[str, list[Device]], degree: int, cross_node: bool) -> tuple[Device, ...] | None:
    """Remove and return ``degree`` free devices: one node if any fits (best fit), else across nodes."""
    fitting = [node for node, devices in free.items() if len(devices) >= degree]
    if fitting:
        node = min(fitting, key=lambda n: (len(free[n]), n))
        members, free[node] = free[node][:degree], free[node][degree:]
        return tuple(members)
    if not cross_node or sum(len(devices) for devices in free.values()) < degree:
        return None
    members: list[Device] = []
    for node in sorted(free, key=lambda n: (-len(free[n]), n)):  # fewest nodes spanned
        count = min(degree - len(members), len(free[node]))
        members += free[node][:count]
        free[node] = free[node][count:]
    return tuple(members)


def plan_groups(
    alive: Mapping[str, Iterable[int]],
    sp_degrees: Mapping[int, int],
    num_heads: int,
    previous: Sequence[SPGroup] = (),
    next_generation: int | None = None,
    cross_node: bool = True,
) -> PlanDiff:
    """Plan the SP groups for the devices ``alive`` now (node -> device indices), given the last plan.

    ``sp_degrees``: resolution -> SP degree it needs; ``num_heads``: the model's attention heads.
    ``previous``: the groups running now; ``next_generation``: the first generation number to hand
    out (default: one past the largest in ``previous``, or 0). Returns a `PlanDiff` (module docstring
    for the rules). Raises `ReconfigureError` for a degree that does not divide ``num_heads``.
    """
    degrees = wanted_degrees(sp_degrees, num_heads)
    alive_devices = {device_id(node, index) for node, indices in alive.items() for index in indices}
    generation = next_generation if next_generation is not None else max(
        (group.generation + 1 for group in previous), default=0
    )
    if any(group.generation >= generation for group in previous):
        raise ReconfigureError(
            f"next_generation {generation} was already used by a running group: pass a number above "
            f"{max(group.generation for group in previous)} (or None)"
        )
    kept = tuple(g for g in previous if set(g.members) <= alive_devices and g.degree in degrees)
    dissolved = tuple(g for g in previous if g not in kept)
    busy = {member for group in kept for member in group.members}
    free: dict[str, list[Device]] = {}
    for device in sorted(alive_devices - busy, key=_device_key):
        free.setdefault(node_of(device), []).append(device)

    formed: list[SPGroup] = []

    def form(degree: int) -> bool:
        nonlocal generation
        members = _take(free, degree, cross_node)
        if members is None:
            return False
        formed.append(SPGroup(generation, members))
        generation += 1
        return True

    covered = {group.degree for group in kept}
    for degree in degrees:  # one group per wanted degree first: every resolution stays servable
        if degree not in covered and form(degree):
            covered.add(degree)
    for degree in degrees:  # then as many more as fit, largest degree first
        while form(degree):
            pass
    idle = tuple(device for devices in free.values() for device in devices)
    unservable = tuple(sorted(res for res, degree in sp_degrees.items() if degree not in covered))
    return PlanDiff(kept, dissolved, tuple(formed), idle, unservable, generation)


def requests_to_requeue(diff: PlanDiff, in_flight: Mapping[str, Sequence[str]]) -> list[str]:
    """The request ids (from ``in_flight``: group name -> request ids) held by dissolved groups.

    They go back through the queue from their last committed step; requests of kept groups stay put.
    """
    return [request for group in diff.dissolved for request in in_flight.get(group.name, ())]
