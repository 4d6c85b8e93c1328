"""Which cores a time-to-target run gets: one per device, the trainer's alone, Ray's control plane apart.

A "device" on a CPU box is one pinned core with one thread (`spotlight/cores.py`). A run of a
one-device mode takes one core. A run of a spot mode at 1 + N takes 1 + N + C cores, in order: the
trainer's (alone), the N spot devices' (one each), and C for Ray's control plane (GCS, raylets, the
queue actor), on which no device runs. With C = 0 the control plane shares the spot devices' cores,
as on a 2-core machine where no core is left (the rule of the 1 + 1 table).

Why apart: at 1 + 8 there are nine raylets and a GCS; on the devices' cores they would take time
from exploration and make "eight spot devices" mean less than eight cores.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

SPOT_MODES = ("spot-rollout", "spotlight")  # the modes that rent spot devices (a Ray cluster beside the trainer)


@dataclass(frozen=True)
class CorePlan:
    """How many cores each run takes: ``spot_devices`` N behind the trainer, ``control_cores`` C for Ray."""

    spot_devices: int
    control_cores: int

    def cores_needed(self, mode: str) -> int:
        """Cores one run of ``mode`` is pinned to: 1, or 1 + N + C for a spot mode."""
        return 1 + self.spot_devices + self.control_cores if mode in SPOT_MODES else 1

    def overrides(self, mode: str, cores: Sequence[int]) -> list[str]:
        """The `spotlight train` overrides that place a run of ``mode`` on ``cores`` (``cores_needed`` of them).

        The trainer on the first core, spot device k on the (k+2)-th, the control plane on the last C
        (``control_cores``; none: the spot devices' cores, `TrainConfig.control_plane_cores`).
        """
        if len(cores) != self.cores_needed(mode):
            raise ValueError(f"a {mode} run takes {self.cores_needed(mode)} cores, got {list(cores)}")
        if mode not in SPOT_MODES:
            return [f"device_cores={_text(cores)}"]
        devices, control = cores[:1 + self.spot_devices], cores[1 + self.spot_devices:]
        return [f"device_cores={_text(devices)}", f"runtime.num_spot_devices={self.spot_devices}",
                f"control_cores={_text(control) if control else 'null'}"]


def plan_cores(modes: Sequence[str], cores: Sequence[int], spot_devices: int, control_cores: int | None,
               pair: bool, available: Sequence[int]) -> CorePlan:
    """The plan for these modes on ``cores``, or SystemExit with one line naming the cause and the fix.

    ``control_cores`` None: every core a spot run leaves (less one for a one-device run beside it with
    ``pair``), so Ray gets what no device needs. Refused: a core twice or not in ``available`` (this
    process's cores), and 1 + N + C > the cores given.
    """
    if len(set(cores)) != len(cores) or not set(cores) <= set(available):
        raise SystemExit(f"--cores {_text(cores)}: give distinct cores of this process's {_text(available)}")
    if spot_devices < 1:
        raise SystemExit(f"--spot-devices {spot_devices}: a spot mode needs at least one spot device; give 1 or more")
    if control_cores is not None and control_cores < 0:
        raise SystemExit(f"--control-cores {control_cores}: give 0 (Ray on the spot devices' cores) or more")
    spot = [mode for mode in modes if mode in SPOT_MODES]
    if control_cores is None:
        beside = 1 if pair and len(spot) < len(modes) else 0  # a one-device run's core, left free to pair
        control_cores = max(0, len(cores) - 1 - spot_devices - beside)
    plan = CorePlan(spot_devices, control_cores)
    if spot and plan.cores_needed(spot[0]) > len(cores):
        raise SystemExit(f"{', '.join(spot)} at 1 + {spot_devices} needs 1 + {spot_devices} + {control_cores} "
                         f"control-plane = {plan.cores_needed(spot[0])} cores, but only {len(cores)} are given "
                         f"({_text(cores)}): lower --spot-devices or --control-cores, or give more --cores")
    return plan


def _text(cores: Sequence[int]) -> str:
    return "[" + ",".join(str(core) for core in cores) + "]"
