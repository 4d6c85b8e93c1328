"""Device pools on Ray: the on-demand node (driver = trainer, the queue) and the spot devices.

Where the cluster comes from:
- `LocalCluster`: logical nodes on this machine (``ray.cluster_utils.Cluster``): a head node with
  the custom resource ``on_demand`` (the driver, hence the trainer, and the queue live there) and
  spot nodes with the resource ``spot``, one single-threaded device each. A preemption really
  removes a node (its raylet and worker processes are killed) and a return really adds one.
- `attach_cluster`: an existing Ray cluster (``--address auto``). Node roles come from custom
  resources: nodes offering ``spot`` are spot nodes (``spot: k`` = k devices), the node the driver
  runs on must offer ``on_demand`` (the trainer is the driver). Spot nodes come and go with the
  autoscaler / KubeRay; see docs/runtime.md and configs/ray-cluster-spotlight.yaml.

`SpotPool` is the driver's view of the spot devices: it starts a `SpotDevice` on every live spot
node, hands each the current weights (an ``ObjectRef``: the object store, never a file), tracks
every call in flight without blocking, and turns a lost node into lost calls instead of a crash.
"""

from __future__ import annotations

import atexit
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import ray
import ray._private.ray_constants as ray_constants
from ray.exceptions import AuthenticationError, GetTimeoutError, RayActorError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from spotlight.cores import spawning_on
from spotlight.market.billing import DeviceLedger
from spotlight.runtime.out_of_memory import actor_out_of_memory
from spotlight.runtime.spot.device import DeviceCall, SpotDevice
from spotlight.runtime.spot.events import EventLog
from spotlight.runtime.spot.ray_auth import TOKEN_FIX, LocalTokenAuth, unauthenticated_cluster
from spotlight.runtime.spot.ray_nodes import NodeStartError, start_node
from spotlight.runtime.spot.reaper import Reaper
from spotlight.runtime.spot.worker import WorkerSettings

if TYPE_CHECKING:
    from spotlight.runtime.gpus import GpuLayout

__all__ = ["CallResult", "LocalCluster", "PoolError", "SpotPool", "attach_cluster", "spot_nodes"]

logger = logging.getLogger(__name__)


class PoolError(RuntimeError):
    """The cluster cannot host the pools; the message names the cause and the fix."""


def _init_kwargs() -> dict[str, Any]:
    # Ray starts worker processes at niceness 15, so a spot device (and the queue actor) lost its core
    # to any background job: measured 9.6 ms per sample-step against 3.3 ms in-process. A device is a
    # device: the nodes this process starts run their workers at the caller's priority.
    os.environ.setdefault("RAY_worker_niceness", "0")
    return {"include_dashboard": False, "logging_level": "ERROR", "log_to_driver": False}


# Ray's own helpers that a LocalCluster has no use for: the autoscaler's monitor (nothing autoscales here: spot
# nodes come and go by the run's own hand) and each node's log monitor (it forwards worker output to the driver,
# and the driver takes none: log_to_driver=False). Each is a Python process per start (~0.3-0.4 CPU-s apiece)
# that a run, and a test suite starting dozens of runs, paid for nothing.
_LEAN_NODE: dict[str, Any] = {"include_log_monitor": False}
_LEAN_HEAD: dict[str, Any] = {**_LEAN_NODE, "no_monitor": True}


def _loopback_only() -> Callable[[], None]:
    """Make the nodes started from now on (and this driver) use 127.0.0.1 only; returns the undo.

    Every node of a `LocalCluster` is on this machine, yet Ray resolves a node's address to the machine's
    outward IP and its GCS, raylets and workers then listen on all interfaces, open to anyone who reaches
    the ports. Ray treats a machine as single-node (as it does on macOS and Windows) when
    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER is 0: node addresses are 127.0.0.1 and every gRPC server binds it
    alone (tests/runtime/test_ray_listening.py checks each socket). Ray read the variable at import, so
    its constant is set too; the environment carries it to the node processes. An attached cluster
    (--address) spans machines and keeps Ray's default.
    """
    saved_env, saved_flag = os.environ.get(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False

    def undo() -> None:
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        if saved_env is None:
            os.environ.pop(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, None)
        else:
            os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = saved_env

    return undo


class LocalCluster:
    """Logical Ray nodes on this machine: an on-demand head and spot nodes that come and go."""

    def __init__(self, object_store_mb: int = 200, node_timeout_s: float = 120.0,
                 system_config: dict[str, Any] | None = None, spot_gpus: int = 0,
                 control_cores: Sequence[int] | None = None, gpus: GpuLayout | None = None) -> None:
        """``control_cores``: where Ray's own processes run (`spawning_on`); None: wherever the caller runs.
        ``gpus``: the physical GPUs of the head (the ranks') and of each spot node (one each, whatever
        ``spot_gpus``); None: Ray's logical GPUs only, ``spot_gpus`` a spot node, none on the head."""
        from ray.cluster_utils import Cluster

        kwargs = _init_kwargs()  # system_config: Ray's cluster-wide settings (e.g. a tolerant health check)
        self._loopback_only = _loopback_only()
        self._auth = LocalTokenAuth()  # every node and worker of the cluster asks for the run's token (ray_auth.py)
        self._object_store = object_store_mb * 1024 * 1024
        self._node_timeout_s = node_timeout_s
        self._spot_gpus = spot_gpus  # GPUs each spot node offers (device: cuda), for its device's num_gpus
        self._control_cores = control_cores
        self._gpus = gpus
        # The head is started without Ray's fixed 30 s wait and awaited for node_timeout_s (ray_nodes.py).
        self.cluster = Cluster(initialize_head=False)
        try:
            with spawning_on(control_cores):
                start_node(self.cluster, node_timeout_s, "the on-demand head node", num_cpus=1,
                           resources={"on_demand": 1}, include_dashboard=False, **_LEAN_HEAD,
                           object_store_memory=self._object_store, **(gpus.head_args() if gpus else {}),
                           **({"_system_config": system_config} if system_config else {}))
        except NodeStartError as error:
            self._loopback_only()
            self._auth.undo()
            load = os.getloadavg()[0]
            raise PoolError(f"{error} (load average {load:.1f} on {os.cpu_count()} cores)") from None
        # Spot nodes are added by the controller thread, and Ray's per-node exit hooks install a SIGTERM
        # handler, which only the main thread may do: they go without, and atexit stops them instead.
        self.cluster._shutdown_at_exit = False
        self._closed = False
        atexit.register(self.shutdown)
        # atexit does not run on SIGKILL, and spot nodes lack the head's parent-death signal: the reaper
        # process kills the session's processes when this one ends, however (runtime/spot/reaper.py)
        with spawning_on(control_cores):  # the reaper and the driver's Ray threads (gRPC, object transfers) too
            self._reaper = Reaper(self.cluster.head_node.session_name, self._auth.directory)
            ray.init(address=self.cluster.address, **{k: v for k, v in kwargs.items() if k != "include_dashboard"})
        self._nodes: dict[str, Any] = {}

    def add_spot_node(self, name: str) -> str:
        """Start a spot node called ``name`` (one device); returns its Ray node id."""
        if name in self._nodes:
            raise PoolError(f"spot node {name} is already live; remove it before adding it again")
        try:
            with spawning_on(self._control_cores):
                node = start_node(self.cluster, self._node_timeout_s, f"spot node {name}", num_cpus=1,
                                  resources={"spot": 1}, **_LEAN_NODE, object_store_memory=self._object_store,
                                  **(self._gpus.spot_args(name) if self._gpus else {"num_gpus": self._spot_gpus}))
        except NodeStartError as error:
            raise PoolError(str(error)) from None
        self._nodes[name] = node
        return node.node_id

    def is_live(self, name: str) -> bool:
        """Whether spot node ``name`` was added and not removed since."""
        return name in self._nodes

    def remove_spot_node(self, name: str) -> None:
        """Kill spot node ``name`` and every process on it (a preemption); a no-op if it is gone."""
        node = self._nodes.pop(name, None)
        if node is not None:
            self.cluster.remove_node(node, allow_graceful=False)

    def shutdown(self) -> None:
        """Disconnect and stop this cluster's processes only (never ``ray stop``: others' clusters live here)."""
        if self._closed:
            return
        self._closed = True
        ray.shutdown()
        self.cluster.shutdown()
        self._reaper.finish()  # and whatever the shutdown left of the session
        self._loopback_only()
        self._auth.undo()


def attach_cluster(address: str) -> dict[str, tuple[str, int]]:
    """Connect to a running Ray cluster; returns its live spot nodes {name: (node id, devices)}.

    Raises PoolError when the address is unusable or refuses the driver's token, when the driver is not
    on an on-demand node or when no node offers ``spot``. A cluster that lets in callers without a token
    is used, with one warning line that names the fix.
    """
    if address.startswith("ray://"):
        raise PoolError(f"--address {address}: a Ray Client driver runs off the cluster, but the Spotlight driver is "
                        "the trainer and must run on the on-demand node: submit it there with `ray job submit "
                        "--entrypoint-resources '{\"on_demand\": 1}' -- spotlight train --address auto`")
    try:
        ray.init(address=address, **_init_kwargs())
    except (ConnectionError, ValueError, RuntimeError, AuthenticationError) as error:
        if isinstance(error, AuthenticationError) or "InvalidAuthToken" in str(error.__cause__):
            raise PoolError(f"--address {address}: the cluster requires Ray's token authentication and refused this "
                            "driver: run it with RAY_AUTH_MODE=token and the cluster's token in RAY_AUTH_TOKEN_PATH "
                            "or RAY_AUTH_TOKEN") from None
        raise PoolError(f"--address {address}: cannot connect to a Ray cluster ({error}); start one with "
                        "`ray start --head` or pass the head's address") from None
    if unauthenticated_cluster(ray.get_runtime_context().gcs_address):
        logger.warning("--address %s: the cluster runs without Ray's token authentication, so anyone who reaches "
                       "its ports runs code as you; %s", address, TOKEN_FIX)
    here = ray.get_runtime_context().get_node_id()
    nodes = [node for node in ray.nodes() if node["Alive"]]
    if not any(node["NodeID"] == here and node["Resources"].get("on_demand", 0) > 0 for node in nodes):
        ray.shutdown()
        raise PoolError(f"--address {address}: the driver's node offers no 'on_demand' resource; run spotlight train "
                        "on the on-demand node (start it with --resources='{\"on_demand\": 1}')")
    spot = spot_nodes()
    if not spot:
        ray.shutdown()
        raise PoolError(f"--address {address}: no live node offers the 'spot' resource; start spot nodes with "
                        "--resources='{\"spot\": <devices>}' (see configs/ray-cluster-spotlight.yaml)")
    return spot


def spot_nodes() -> dict[str, tuple[str, int]]:
    """The live nodes offering ``spot``: {name: (Ray node id, devices)}; a name is host/node-id prefix."""
    return {node["NodeManagerHostname"] + "/" + node["NodeID"][:8]: (node["NodeID"], int(node["Resources"]["spot"]))
            for node in ray.nodes() if node["Alive"] and node["Resources"].get("spot", 0) >= 1}


State = Literal["starting", "loading", "idle", "busy"]


@dataclass
class _DeviceSlot:
    device_id: str
    node: str
    handle: Any
    state: State = "starting"
    version: int = -1
    ref: Any = None  # the call in flight
    phase: str = ""
    notified: bool = False  # a preemption notice came: the device takes no more work


@dataclass(frozen=True)
class CallResult:
    """A finished call: ``call`` is None when the device was lost before it answered."""

    device_id: str
    phase: str
    call: DeviceCall | None


@dataclass
class SpotPool:
    """The driver's bookkeeping of spot devices and the calls they run (see the module docstring).

    ``clock`` gives the run's time (seconds since the run started) and ``epoch0`` the wall clock at
    that moment, so device-side timestamps (wall clock) land on the same timeline.
    """

    queue: Any
    model_config: Any
    settings: WorkerSettings
    ledger: DeviceLedger
    events: EventLog
    clock: Callable[[], float]
    epoch0: float
    core_of: Callable[[int], int | None] | None = None  # spot device k's core (None: unpinned); cores.py
    _devices: dict[str, _DeviceSlot] = field(default_factory=dict)
    lost_nodes: set[str] = field(default_factory=set)  # nodes whose devices died without a notice (reported once)
    _weights: tuple[int, Any] | None = None
    _started: int = 0

    # -- membership ------------------------------------------------------------------------------
    def node_added(self, node: str, node_id: str, devices: int = 1) -> None:
        """Start ``devices`` spot devices on a node that just joined (each is billed from now)."""
        now = self.clock()
        self.events.write(now, "node_added", node=node)
        for _ in range(devices):
            device_id = f"spot-{self._started}"
            core = self.core_of(self._started) if self.core_of is not None else None
            self._started += 1
            handle = SpotDevice.options(  # device: cuda asks Ray for a GPU, which the device's policy uses
                num_cpus=1, num_gpus=1 if self.settings.device == "cuda" else 0, resources={"spot": 1}, max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            ).remote(device_id, self.queue, self.model_config, self.settings, core=core)
            slot = _DeviceSlot(device_id, node, handle, ref=handle.ready.remote(), phase="start")
            self._devices[device_id] = slot
            self.ledger.hold(device_id, "spot", now)

    def notify(self, node: str, deadline_s: float) -> None:
        """A preemption notice for ``node``: its devices commit their work and take no more."""
        self.events.write(self.clock(), "preemption_notice", node=node, deadline_s=round(deadline_s, 3))
        for slot in self._on(node):
            slot.notified = True
            slot.handle.notify_preemption.remote()

    def node_removed(self, node: str) -> list[CallResult]:
        """Forget ``node``'s devices (their node is gone); returns their calls in flight as lost."""
        now = self.clock()
        self.events.write(now, "node_removed", node=node)
        lost = []
        for slot in self._on(node):
            if slot.state == "busy":
                lost.append(CallResult(slot.device_id, slot.phase, None))
            self.ledger.release(slot.device_id, now)
            ray.kill(slot.handle, no_restart=True)
            del self._devices[slot.device_id]
        return lost

    def release_all(self) -> None:
        """End of the run: stop billing every device."""
        now = self.clock()
        for slot in self._devices.values():
            self.ledger.release(slot.device_id, now)

    # -- weights and calls ------------------------------------------------------------------------
    def set_weights(self, version: int, weights_ref: Any) -> None:
        """θ_version for every device: idle ones load it now, the others as soon as they are free."""
        self._weights = (version, weights_ref)
        for slot in self._devices.values():
            if slot.state == "idle":
                self._load(slot)

    @property
    def weights(self) -> tuple[int, Any] | None:
        """(version, object-store ref) of the weights the devices are given, None before the first."""
        return self._weights

    def devices(self, version: int | None = None, state: State | None = None) -> list[str]:
        """Ids of the live devices without a notice (holding ``version`` and in ``state`` when given)."""
        return [slot.device_id for slot in self._devices.values() if not slot.notified
                and (version is None or slot.version == version) and (state is None or slot.state == state)]

    def node_busy(self, node: str) -> bool:
        """Whether a device of ``node`` still runs a call: a noticed node is drained once none does."""
        return any(slot.state == "busy" for slot in self._on(node))

    def is_notified(self, device_id: str) -> bool:
        return self._devices[device_id].notified

    def call(self, device_id: str, phase: str, method: str, *args: Any) -> None:
        """Start ``method(*args)`` on an idle device; its result comes back from `poll`."""
        slot = self._devices[device_id]
        if slot.state != "idle":
            raise PoolError(f"device {device_id} is {slot.state}, not idle: wait for its call to finish")
        slot.state, slot.phase, slot.ref = "busy", phase, getattr(slot.handle, method).remote(*args)

    def poll(self, timeout_s: float = 0.0) -> list[CallResult]:
        """Finished work calls since the last poll (waiting up to ``timeout_s`` for one); start-ups and
        weight loads are handled here and not returned."""
        pending = {slot.ref: slot for slot in self._devices.values() if slot.ref is not None}
        if not pending:
            time.sleep(timeout_s)
            return []
        done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=timeout_s)
        results = []
        for ref in done:
            slot = pending[ref]
            slot.ref = None
            try:
                answer = ray.get(ref, timeout=5.0)
            except (RayActorError, GetTimeoutError) as error:
                results += self._lose(slot, error)
                continue
            except RayTaskError as error:
                out_of_memory = actor_out_of_memory(error, f"spot device {slot.device_id} in {slot.phase}")
                if out_of_memory is not None:  # the run's one line that names the knobs (`spotlight.trainer.train`)
                    raise out_of_memory from None
                raise PoolError(f"spot device {slot.device_id} failed in {slot.phase}: {error}") from error
            if slot.state == "starting":
                slot.state = "idle"
                self.ledger.started(slot.device_id, self.clock())  # held since node_added: it was starting
                if self._weights is not None:
                    self._load(slot)
            elif slot.state == "loading":
                slot.state, slot.version = "idle", answer.result
                self._book(slot, answer, "broadcast")
                if self._weights is not None and slot.version != self._weights[0]:
                    self._load(slot)
            else:
                slot.state = "idle"
                self._book(slot, answer, slot.phase)
                results.append(CallResult(slot.device_id, slot.phase, answer))
                if self._weights is not None and slot.version != self._weights[0]:
                    self._load(slot)
        return results

    def _load(self, slot: _DeviceSlot) -> None:
        version, weights_ref = self._weights
        slot.state, slot.phase, slot.ref = "loading", "broadcast", slot.handle.load_weights.remote(version, weights_ref)

    def _book(self, slot: _DeviceSlot, call: DeviceCall, phase: str) -> None:
        start, end = call.start - self.epoch0, call.end - self.epoch0
        self.ledger.busy(slot.device_id, start, end, phase, call.compute_s)
        self.events.write(end, "busy", node=slot.node, device=slot.device_id, start=round(start, 4),
                          end=round(end, 4), phase=phase)

    def _lose(self, slot: _DeviceSlot, error: Exception) -> list[CallResult]:
        """A call failed: the device (or its node) is gone; drop it so its node's return restarts one.

        Planned removals never come here (`node_removed` forgets their devices first), so this is a
        node or process that died without a notice: one line for the person, Ray's dump stays in the log.
        """
        lost = [CallResult(slot.device_id, slot.phase, None)] if slot.state == "busy" else []
        if not slot.notified and slot.node not in self.lost_nodes:  # one line per unannounced node
            self.lost_nodes.add(slot.node)
            logger.warning("spot node %s died without a preemption notice (%s); its work is redone elsewhere",
                           slot.node, type(error).__name__)
        self.ledger.release(slot.device_id, self.clock())
        self.events.write(self.clock(), "device_lost", node=slot.node, device=slot.device_id,
                          error=type(error).__name__)
        del self._devices[slot.device_id]
        return lost

    def _on(self, node: str) -> list[_DeviceSlot]:
        return [slot for slot in self._devices.values() if slot.node == node]
