"""The per-node agent: weights once in shared memory, persistent device processes, SP groups by generation.

A node agent outlives every SP group on its node. It

- holds the current weights once, in shared memory (pinned as well when CUDA is present), and
  replaces them in place, so every device process that mapped them sees the new ones. The weights
  are the policy's broadcast state: every weight of a TinyDiT; only the LoRA matrices of a diffusers
  policy, whose frozen base each device process rebuilds from the config (`spotlight.models.spec`);
- keeps one persistent process per device (`spotlight.runtime.spot.device_processes`), plus optional warm
  spares: processes that have imported torch but hold no group, ready to stand in for a device
  process that crashed — the spare maps the shared weights instead of loading a checkpoint;
- forms the SP groups the planner (`spotlight.runtime.sp.reconfigure`) asks for. Each group's gloo
  process group lives on the agent's own TCPStore under the group's name, which carries a fresh
  generation number, so a re-formed group never meets a dead formation's keys and the store never
  dies with a rank (re-initialising on a rank-0-owned ``tcp://`` port after a failure can hang for
  minutes);
- serves requests from the queue with a group, one denoising step at a time, checkpointing
  (latent, step) after each step so a broken group's request resumes where it was.

`NodeAgent` is a plain class (tests and benchmarks drive it in-process); `NodeAgentActor` is the
same class as a threaded Ray actor pinned to its node.
"""

from __future__ import annotations

import datetime
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import ray
import torch
import torch.distributed as dist

from spotlight.diffusion.noise import initial_latents
from spotlight.models.rebuild import ModelConfig, config_from_description, describe_config
from spotlight.models.spec import latent_shape_of
from spotlight.runtime.queue.remote import QueueClient, RemoteQueue
from spotlight.runtime.queue.request_queue import Request
from spotlight.runtime.sp.reconfigure import SPGroup, device_id, node_of
from spotlight.runtime.spot.device_processes import AgentError, DeviceProcesses, GroupBroken

__all__ = ["AgentError", "GroupBroken", "NodeAgent", "NodeAgentActor", "ServeReport"]

def listening_store(host: str, timeout_s: float) -> dist.TCPStore:
    """A master TCPStore that listens on ``host`` only (127.0.0.1 for a single machine).

    ``dist.TCPStore(host, 0, is_master=True)`` listens on every interface whatever ``host`` says, and
    anyone who reaches the store can steer the gloo groups of the node; so the listening socket is
    bound here and handed over (``master_listen_fd``).
    """
    listener = socket.create_server((host, 0))
    port = listener.getsockname()[1]
    return dist.TCPStore(host, port, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=timeout_s), master_listen_fd=listener.detach())


@dataclass
class ServeReport:
    """What one ``serve`` call did: why it stopped, request-steps taken, completions and hand-backs."""

    group: str
    stopped_by: Literal["drained", "preempted", "broken", "stopped"] = "drained"
    steps: int = 0
    completed: int = 0
    handed_back: int = 0
    lost_devices: tuple[int, ...] = ()


def _pin(tensor: torch.Tensor) -> None:
    """Page-lock a shared-memory tensor so host-to-device copies run at full speed (GPU nodes only)."""
    if torch.cuda.is_available():
        result = torch.cuda.cudart().cudaHostRegister(tensor.data_ptr(), tensor.numel() * tensor.element_size(), 0)
        if int(result) != 0:
            raise AgentError(f"cudaHostRegister failed ({result}): raise the node's locked-memory limit (ulimit -l)")


class NodeAgent:
    """The agent of node ``node_id`` with ``num_devices`` device processes and ``num_spares`` warm spares.

    ``num_threads``: torch threads per device process (1 = one CPU "device"). ``copy_weights``: device
    processes copy the shared weights into private memory instead of mapping them (what a GPU worker
    does when it moves them to its device). ``collective_timeout_s``: how long a gloo collective may
    wait for a peer before the group counts as broken.
    """

    def __init__(
        self,
        node_id: str,
        num_devices: int,
        num_spares: int = 0,
        num_threads: int = 1,
        host: str = "127.0.0.1",
        copy_weights: bool = False,
        collective_timeout_s: float = 30.0,
    ) -> None:
        if num_devices < 1 or num_spares < 0:
            raise AgentError(f"agent {node_id} needs ≥ 1 device and ≥ 0 spares (got {num_devices}, {num_spares})")
        torch.set_num_threads(1)
        device_id(node_id, 0)  # refuses a node name the planner could not parse
        self.node_id, self.host, self.num_threads = node_id, host, num_threads
        self.copy_weights, self.collective_timeout_s = copy_weights, collective_timeout_s
        self.store = listening_store(host, collective_timeout_s)
        self._processes = DeviceProcesses(node_id, num_threads, collective_timeout_s)
        self._groups: dict[str, SPGroup] = {}
        self._config: dict[str, Any] | None = None  # the policy's description (architecture + config)
        self._model_config: ModelConfig | None = None
        self._weights: dict[str, torch.Tensor] = {}
        self._stop: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self._processes.spawn(num_devices, spare=False)
        self._processes.spawn(num_spares, spare=True)

    # -- processes -----------------------------------------------------------------------------
    def add_spares(self, count: int) -> list[int]:
        """Start ``count`` more warm spares (off the recovery path: after a spare was promoted)."""
        with self._lock:
            return self._processes.spawn(count, spare=True)

    def kill_device(self, index: int) -> None:
        """SIGKILL device ``index``'s process: how tests and benchmarks crash a group member."""
        self._processes.kill(index)

    def alive_devices(self) -> list[int]:
        """Indices of the device processes in service and alive (spares excluded)."""
        return self._processes.alive()

    def lost_devices(self) -> list[int]:
        """Indices of device processes that died and were not replaced yet."""
        return self._processes.lost()

    def wait_for_loss(self, timeout_s: float) -> list[int]:
        """Block until a device process in service dies (or ``timeout_s`` passes); returns the lost indices.

        Watches the processes' sentinels, so a crash is seen within milliseconds rather than at the
        next collective (which would first compute up to the all-to-all, then wait for gloo to notice).
        """
        return self._processes.wait_for_loss(timeout_s)

    def spares(self) -> list[int]:
        """Indices of live warm spares."""
        return self._processes.spares()

    def replace_lost_devices(self) -> dict[int, int]:
        """Promote a warm spare for each lost device; returns {lost index: spare index}.

        The spare maps (or copies) the shared weights: the intra-node weight copy that replaces a
        checkpoint load. Lost devices are forgotten. Devices without a spare stay lost.
        """
        with self._lock:
            replaced = {}
            for lost, spare in zip(self.lost_devices(), self.spares(), strict=False):
                device = self._processes.devices[spare]
                device.spare = False
                if self._config is not None and not device.attached:
                    self._processes.command([spare], "attach", (self._config, self._weights, self.copy_weights))
                    device.attached = True
                replaced[lost] = spare
            for lost in self.lost_devices():
                self._processes.forget(lost)
            return replaced

    # -- weights -------------------------------------------------------------------------------
    def load_weights(self, config: ModelConfig | Mapping[str, Any], weights: Mapping[str, Any]) -> float:
        """Put ``weights`` (the policy's broadcast state: name -> array or tensor) into shared memory; returns seconds.

        ``config``: the policy's ``.config``, a ``describe()`` mapping, or a TinyDiT config as a dict.
        Same policy, names and shapes as the weights held now: copied in place, so processes that mapped
        them see the new weights without a message (call between requests, not during a step).
        Otherwise new shared tensors are made, every device process (not the spares) re-attaches, and
        the spares build the new policy's base, so that standing in stays an attach.
        """
        started = time.perf_counter()
        config_dict = _description(config)
        tensors = {name: torch.as_tensor(np.asarray(value)) if not isinstance(value, torch.Tensor) else value
                   for name, value in weights.items()}
        # a payload ships in the sampling dtype (bfloat16); the policies' trained tensors, mapped as these, are float32
        tensors = {name: tensor.float() if tensor.dtype in (torch.bfloat16, torch.float16) else tensor
                   for name, tensor in tensors.items()}
        with self._lock:
            same = config_dict == self._config and tensors.keys() == self._weights.keys() and all(
                self._weights[n].shape == t.shape and self._weights[n].dtype == t.dtype for n, t in tensors.items()
            )
            if same and not self.copy_weights:
                for name, tensor in tensors.items():
                    self._weights[name].copy_(tensor)
                return time.perf_counter() - started
            shared = {}
            for name, tensor in tensors.items():
                shared[name] = torch.empty_like(tensor, device="cpu").copy_(tensor).share_memory_()
                _pin(shared[name])
            new_policy = config_dict != self._config
            self._config, self._weights = config_dict, shared
            self._model_config = config_from_description(config_dict)
            if new_policy and self.spares():
                self._processes.command(self.spares(), "prepare", (self._config,))
            for device in self._processes.devices.values():
                device.attached = False
            in_service = self._processes.alive()
            self._processes.command(in_service, "attach", (self._config, self._weights, self.copy_weights))
            for index in in_service:
                self._processes.devices[index].attached = True
        return time.perf_counter() - started

    # -- groups --------------------------------------------------------------------------------
    def form_groups(self, groups: Sequence[SPGroup]) -> dict[str, float]:
        """Form each of ``groups`` (all members on this node) as a gloo group; returns seconds per group.

        All members of all groups join at once (one rendezvous each, concurrently).
        """
        with self._lock:
            indices: list[int] = []
            for group in groups:
                if group.name in self._groups:
                    raise AgentError(f"group {group.name} is already formed on {self.node_id}: dissolve it first")
                for member in group.members:
                    if node_of(member) != self.node_id:
                        raise AgentError(
                            f"group {group.name} has member {member} outside node {self.node_id}: "
                            "plan with cross_node=False for agent-local groups"
                        )
                    indices.append(int(member.rpartition("/")[2]))
            devices = self._processes.devices
            not_ready = [i for i in indices if i not in devices or not devices[i].alive or not devices[i].attached
                         or devices[i].spare]
            if not_ready:
                raise AgentError(
                    f"devices {not_ready} of {self.node_id} are dead, spares or without weights: plan groups "
                    "from alive_devices() after load_weights()"
                )
            started = time.perf_counter()
            for group in groups:
                for rank, member in enumerate(group.members):
                    args = (group.name, rank, group.degree, self.host, self.store.port, self.collective_timeout_s)
                    self._processes.send(int(member.rpartition("/")[2]), "join", args)
            seconds = {}
            for group in groups:
                self._processes.receive([int(m.rpartition("/")[2]) for m in group.members], "join", group.name)
                seconds[group.name] = time.perf_counter() - started
                self._groups[group.name] = group
                self._stop[group.name] = threading.Event()
            return seconds

    def dissolve(self, names: Sequence[str]) -> None:
        """Stop using the named groups; their live members leave (destroy) their process groups."""
        with self._lock:
            for name in names:
                group = self._groups.pop(name, None)
                self._stop.pop(name, None)
                if group is None:
                    continue
                devices = self._processes.devices
                members = [i for i in self._member_indices(group) if i in devices and devices[i].alive]
                try:
                    self._processes.command(members, "leave", ())
                except AgentError:
                    pass  # a member that dies while leaving is a lost device; the planner sees it next

    def groups(self) -> list[SPGroup]:
        """The groups formed on this node now."""
        return list(self._groups.values())

    # -- serving -------------------------------------------------------------------------------
    def run_step(
        self, group_name: str, request: Request, latent: torch.Tensor, step: int
    ) -> torch.Tensor:
        """One SP denoising step of ``request``: ``latent`` (C, H, W) (a video's (C, f, h, w)) at ``step`` -> latent
        at ``step + 1``.

        The prompt travels as text: each device process's policy tokenizes it (a task's token ids, or a
        pipeline folder's prompt ids of that process's own cache of its text encoders' embeddings).
        Raises `GroupBroken` if a member is dead or the step's collectives failed.
        """
        group = self._groups.get(group_name)
        if group is None:
            raise AgentError(f"no group {group_name} on {self.node_id}: form it with form_groups() first")
        members = self._member_indices(group)
        if self._model_config is None:
            raise AgentError(f"no weights on {self.node_id}: call load_weights() before serving")
        args = ([request.prompt], [request.seed], request.plan, latent[None], step)
        replies = self._processes.command(members, "step", args, group=group_name)
        return replies[members[0]][0]

    def serve(
        self, queue: QueueClient | Any, group_name: str, weights_version: int, min_step_s: float = 0.0,
        idle_wait_s: float = 0.05,
    ) -> ServeReport:
        """Serve ``queue``'s requests for θ_weights_version (the weights loaded last) with one group until
        none is left, preempted, stopped or broken.

        One request at a time per group, one step at a time; after each step the (latent, step)
        is committed with the lease kept, so a node lost without notice costs at most one step once
        its lease expires. On a notice (`notify_preemption`) or `stop_group` the step in progress
        finishes and the request goes back to the front of the queue; on `GroupBroken` it goes back
        from its last step. ``queue`` is a `QueueClient` or a queue actor handle. ``min_step_s``: lower
        bound on a step's wall time, so a CPU can emulate a slower accelerator in local runs.
        """
        if isinstance(queue, ray.actor.ActorHandle):
            queue = RemoteQueue(queue)
        stop = self._stop.get(group_name)
        if stop is None:
            raise AgentError(f"no group {group_name} on {self.node_id}: form it with form_groups() first")
        worker_id, report = f"{self.node_id}:{group_name}", ServeReport(group_name)
        if self._model_config is None:
            raise AgentError(f"no weights on {self.node_id}: call load_weights() before serving")
        shape = latent_shape_of(self._model_config)
        while not stop.is_set():
            leases = queue.pull(worker_id, 1, weights_version, holding=())  # nothing in flight between requests
            if not leases:
                if queue.remaining(weights_version) == 0:
                    return report
                stop.wait(idle_wait_s)
                continue
            request, step = leases[0].request, leases[0].step
            latent = leases[0].latent if leases[0].latent is not None else initial_latents([request.seed], shape)[0]
            while step < request.plan.num_steps:
                step_started = time.perf_counter()
                try:
                    latent, step = self.run_step(group_name, request, latent, step), step + 1
                except GroupBroken as broken:
                    report.handed_back += queue.commit(worker_id, request.request_id, latent, step, weights_version)
                    report.stopped_by, report.lost_devices = "broken", tuple(broken.lost)
                    return report
                report.steps += 1
                stop.wait(max(0.0, min_step_s - (time.perf_counter() - step_started)))
                if step < request.plan.num_steps:
                    if stop.is_set():
                        report.handed_back += queue.commit(worker_id, request.request_id, latent, step,
                                                           weights_version)
                        report.stopped_by = "stopped"
                        return report
                    if not queue.commit(worker_id, request.request_id, latent, step, weights_version, keep_lease=True):
                        break  # the lease lapsed: the request belongs to someone else now
            else:
                report.completed += queue.complete(worker_id, request.request_id, latent, weights_version)
        report.stopped_by = "stopped"
        return report

    def stop_group(self, group_name: str) -> None:
        """Ask ``serve`` of that group to finish its step, hand its request back and return."""
        if group_name in self._stop:
            self._stop[group_name].set()

    def notify_preemption(self) -> None:
        """A notice for this node: every group finishes its step and hands its request back."""
        for event in list(self._stop.values()):
            event.set()

    def shutdown(self) -> None:
        """Stop every device process (a node leaving on purpose)."""
        self._processes.stop_all()

    def ready(self) -> str:
        """The node id, once the constructor (process start) is done."""
        return self.node_id

    # -- plumbing ------------------------------------------------------------------------------
    def _member_indices(self, group: SPGroup) -> list[int]:
        return [int(member.rpartition("/")[2]) for member in group.members]


def _description(config: ModelConfig | Mapping[str, Any]) -> dict[str, Any]:
    """The ``describe()``-style mapping (architecture + config) of a policy config, a description or a TinyDiT dict."""
    if isinstance(config, Mapping):
        if "architecture" in config:
            return dict(config)
        return describe_config(config_from_description({"config": config}))
    return describe_config(config)


NodeAgentActor = ray.remote(max_concurrency=8)(NodeAgent)
