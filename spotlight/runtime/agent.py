"""The per-node agent: weights once in shared memory, persistent device processes, SP groups by generation.

A node agent outlives every SP group on its node. It

- holds the current weights once, in shared memory (pinned as well when CUDA is present), and
  replaces them in place, so every device process that mapped them sees the new ones;
- keeps one persistent process per device (`spotlight.runtime.sp_process`), plus optional warm
  spares: processes that have imported torch but hold no group, ready to stand in for a device
  process that crashed — the spare maps the shared weights instead of loading a checkpoint;
- forms the SP groups the planner (`spotlight.runtime.reconfigure`) asks for. Each group's gloo
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
import os
import signal
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Literal

import numpy as np
import ray
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from spotlight.diffusion.noise import initial_latents
from spotlight.models.tinydit import TinyDiTConfig
from spotlight.runtime.queue import QueueClient, RemoteQueue, Request
from spotlight.runtime.reconfigure import SPGroup, device_id, node_of
from spotlight.runtime.sp_process import device_process_main
from spotlight.tasks.registry import get_task

__all__ = ["AgentError", "GroupBroken", "NodeAgent", "NodeAgentActor", "ServeReport"]

START_TIMEOUT_S = 600.0  # generous: a nice-19 spawn on a busy 2-core machine took > 120 s


class AgentError(RuntimeError):
    """A command the agent cannot carry out; the message names the device or group and the fix."""


class GroupBroken(AgentError):
    """An SP group lost a member (its process died or a collective failed): re-plan and re-form it."""

    def __init__(self, group: str, lost: Sequence[int], detail: str) -> None:
        super().__init__(f"SP group {group} broke (lost devices {list(lost)}): {detail}")
        self.group, self.lost = group, list(lost)


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
class _Device:
    """One persistent process: a device (in service) or a warm spare."""

    index: int
    process: Any  # multiprocessing.Process (spawn context)
    conn: Connection
    spare: bool
    attached: bool = False
    pending: int = 0  # replies owed by the process (a command sent, its answer not read yet)
    lost: bool = False

    @property
    def alive(self) -> bool:
        return not self.lost and self.process.is_alive()

    def mark_lost(self) -> None:
        """Count the process as gone for good; kill it if it lingers (e.g. hung in a collective)."""
        self.lost, self.pending = True, 0
        if self.process.is_alive():
            self.process.kill()


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
        self._context = mp.get_context("spawn")
        self._devices: dict[int, _Device] = {}
        self._groups: dict[str, SPGroup] = {}
        self._config: dict[str, Any] | None = None
        self._weights: dict[str, torch.Tensor] = {}
        self._stop: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self._next_index = 0
        self._spawn(num_devices, spare=False)
        self._spawn(num_spares, spare=True)

    # -- processes -----------------------------------------------------------------------------
    def _spawn(self, count: int, spare: bool) -> list[int]:
        """Start ``count`` processes and wait until each has imported torch; returns their indices."""
        started = []
        for _ in range(count):
            index, self._next_index = self._next_index, self._next_index + 1
            parent_conn, child_conn = self._context.Pipe()
            process = self._context.Process(
                target=device_process_main, args=(child_conn, device_id(self.node_id, index), self.num_threads),
                daemon=True, name=f"spotlight-device-{self.node_id}-{index}",
            )
            process.start()
            child_conn.close()
            self._devices[index] = _Device(index, process, parent_conn, spare)
            started.append(index)
        for index in started:
            device = self._devices[index]
            if not device.conn.poll(START_TIMEOUT_S):
                raise AgentError(f"device process {index} of {self.node_id} did not start in {START_TIMEOUT_S} s")
            device.conn.recv()
        return started

    def add_spares(self, count: int) -> list[int]:
        """Start ``count`` more warm spares (off the recovery path: after a spare was promoted)."""
        with self._lock:
            return self._spawn(count, spare=True)

    def kill_device(self, index: int) -> None:
        """SIGKILL device ``index``'s process: how tests and benchmarks crash a group member."""
        os.kill(self._device(index).process.pid, signal.SIGKILL)

    def alive_devices(self) -> list[int]:
        """Indices of the device processes in service and alive (spares excluded)."""
        return sorted(i for i, d in self._devices.items() if not d.spare and d.alive)

    def lost_devices(self) -> list[int]:
        """Indices of device processes that died and were not replaced yet."""
        return sorted(i for i, d in self._devices.items() if not d.spare and not d.alive)

    def wait_for_loss(self, timeout_s: float) -> list[int]:
        """Block until a device process in service dies (or ``timeout_s`` passes); returns the lost indices.

        Watches the processes' sentinels, so a crash is seen within milliseconds rather than at the
        next collective (which would first compute up to the all-to-all, then wait for gloo to notice).
        """
        in_service = {d.process.sentinel: i for i, d in self._devices.items() if not d.spare and not d.lost}
        for sentinel in wait(list(in_service), timeout=timeout_s):
            self._devices[in_service[sentinel]].mark_lost()
        return self.lost_devices()

    def spares(self) -> list[int]:
        """Indices of live warm spares."""
        return sorted(i for i, d in self._devices.items() if d.spare and d.alive)

    def replace_lost_devices(self) -> dict[int, int]:
        """Promote a warm spare for each lost device; returns {lost index: spare index}.

        The spare maps (or copies) the shared weights: the intra-node weight copy that replaces a
        checkpoint load. Lost devices are forgotten. Devices without a spare stay lost.
        """
        with self._lock:
            replaced = {}
            for lost, spare in zip(self.lost_devices(), self.spares(), strict=False):
                device = self._devices[spare]
                device.spare = False
                if self._config is not None and not device.attached:
                    self._command([spare], "attach", (self._config, self._weights, self.copy_weights))
                    device.attached = True
                replaced[lost] = spare
            for lost in self.lost_devices():
                self._devices.pop(lost).conn.close()
            return replaced

    # -- weights -------------------------------------------------------------------------------
    def load_weights(self, config: TinyDiTConfig | Mapping[str, Any], weights: Mapping[str, Any]) -> float:
        """Put ``weights`` (name -> array or tensor) into the node's shared memory; returns seconds.

        Same names and shapes as the weights held now: copied in place, so processes that mapped them
        see the new weights without a message (call between requests, not during a step). Otherwise
        new shared tensors are made and every device process (not the spares) re-attaches.
        """
        started = time.perf_counter()
        config_dict = config.to_dict() if isinstance(config, TinyDiTConfig) else dict(config)
        tensors = {name: torch.as_tensor(np.asarray(value)) if not isinstance(value, torch.Tensor) else value
                   for name, value in weights.items()}
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
            self._config, self._weights = config_dict, shared
            for device in self._devices.values():
                device.attached = False
            in_service = [i for i, d in self._devices.items() if not d.spare and d.alive]
            self._command(in_service, "attach", (self._config, self._weights, self.copy_weights))
            for index in in_service:
                self._devices[index].attached = True
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
            not_ready = [i for i in indices if i not in self._devices or not self._devices[i].alive
                         or not self._devices[i].attached or self._devices[i].spare]
            if not_ready:
                raise AgentError(
                    f"devices {not_ready} of {self.node_id} are dead, spares or without weights: plan groups "
                    "from alive_devices() after load_weights()"
                )
            started = time.perf_counter()
            for group in groups:
                for rank, member in enumerate(group.members):
                    args = (group.name, rank, group.degree, self.host, self.store.port, self.collective_timeout_s)
                    self._send(int(member.rpartition("/")[2]), "join", args)
            seconds = {}
            for group in groups:
                self._receive([int(m.rpartition("/")[2]) for m in group.members], "join", group.name)
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
                members = [i for i in self._member_indices(group) if i in self._devices and self._devices[i].alive]
                try:
                    self._command(members, "leave", ())
                except AgentError:
                    pass  # a member that dies while leaving is a lost device; the planner sees it next

    def groups(self) -> list[SPGroup]:
        """The groups formed on this node now."""
        return list(self._groups.values())

    # -- serving -------------------------------------------------------------------------------
    def run_step(
        self, group_name: str, request: Request, latent: torch.Tensor, step: int
    ) -> torch.Tensor:
        """One SP denoising step of ``request``: ``latent`` (C, H, W) at ``step`` -> latent at ``step + 1``.

        Raises `GroupBroken` if a member is dead or the step's collectives failed.
        """
        group = self._groups.get(group_name)
        if group is None:
            raise AgentError(f"no group {group_name} on {self.node_id}: form it with form_groups() first")
        members = self._member_indices(group)
        config = TinyDiTConfig(**self._config)  # type: ignore[arg-type]
        tokens = get_task(config.task).tokenize([request.prompt], config.max_text_len)  # the weights' task
        args = (tokens, [request.seed], request.plan, latent[None], step)
        replies = self._command(members, "step", args, group=group_name)
        return replies[members[0]][0]

    def serve(
        self, queue: QueueClient | Any, group_name: str, min_step_s: float = 0.0, idle_wait_s: float = 0.05
    ) -> ServeReport:
        """Serve requests from ``queue`` with one group until drained, preempted, stopped or broken.

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
        shape = TinyDiTConfig(**self._config).latent_shape  # type: ignore[arg-type]
        while not stop.is_set():
            leases = queue.pull(worker_id, 1)
            if not leases:
                if queue.remaining() == 0:
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
                    report.handed_back += queue.commit(worker_id, request.request_id, latent, step)
                    report.stopped_by, report.lost_devices = "broken", tuple(broken.lost)
                    return report
                report.steps += 1
                stop.wait(max(0.0, min_step_s - (time.perf_counter() - step_started)))
                if step < request.plan.num_steps:
                    if stop.is_set():
                        report.handed_back += queue.commit(worker_id, request.request_id, latent, step)
                        report.stopped_by = "stopped"
                        return report
                    if not queue.commit(worker_id, request.request_id, latent, step, keep_lease=True):
                        break  # the lease lapsed: the request belongs to someone else now
            else:
                report.completed += queue.complete(worker_id, request.request_id, latent)
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
        for device in self._devices.values():
            try:
                device.conn.send(("exit", ()))
            except (BrokenPipeError, OSError):
                pass
        for device in self._devices.values():
            device.process.join(timeout=5)
            if device.process.is_alive():
                device.process.kill()
        self._devices.clear()

    def ready(self) -> str:
        """The node id, once the constructor (process start) is done."""
        return self.node_id

    # -- plumbing ------------------------------------------------------------------------------
    def _device(self, index: int) -> _Device:
        device = self._devices.get(index)
        if device is None:
            raise AgentError(f"no device {index} on {self.node_id}: choose among {sorted(self._devices)}")
        return device

    def _member_indices(self, group: SPGroup) -> list[int]:
        return [int(member.rpartition("/")[2]) for member in group.members]

    def _send(self, index: int, name: str, args: tuple[Any, ...]) -> None:
        device = self._device(index)
        self._drain(device)
        try:
            device.conn.send((name, args))
        except (BrokenPipeError, OSError):
            return  # the process is gone; _receive reports it as lost
        device.pending += 1

    def _drain(self, device: _Device) -> None:
        """Read replies still owed by the process (e.g. a survivor's error after a broken step)."""
        while device.pending and device.alive:
            try:
                if not device.conn.poll(self.collective_timeout_s + 5):
                    device.mark_lost()  # hung in a collective beyond its own timeout
                    break
                device.conn.recv()
                device.pending -= 1
            except (EOFError, OSError):
                device.mark_lost()
        if not device.alive:
            device.pending = 0

    def _receive(self, indices: Sequence[int], name: str, group: str | None = None) -> dict[int, Any]:
        """Each process's reply to command ``name``; raises `GroupBroken` / `AgentError` on failures."""
        replies: dict[int, Any] = {}
        errors: list[str] = []
        lost: list[int] = []
        waiting = {index: self._devices[index] for index in indices}
        deadline = time.monotonic() + self.collective_timeout_s + 5
        while waiting:
            handles = {d.conn: i for i, d in waiting.items()} | {d.process.sentinel: i for i, d in waiting.items()}
            ready = wait(list(handles), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                for index, device in waiting.items():
                    errors.append(f"device {index} did not answer {name} in time")
                    device.mark_lost()
                    lost.append(index)
                break
            for handle in ready:
                index = handles[handle]
                device = waiting.pop(index, None)
                if device is None:
                    continue
                try:
                    status, value = device.conn.recv() if device.conn.poll() else ("dead", None)
                except (EOFError, OSError):
                    status = "dead"
                if status == "dead":
                    device.mark_lost()
                    lost.append(index)
                    errors.append(f"device {index} died during {name}")
                    continue
                device.pending -= 1
                if status == "ok":
                    replies[index] = value
                else:
                    errors.append(value)
        dead = sorted(set(lost) | {i for i in indices if not self._devices[i].alive})
        if errors or dead:
            detail = errors[0] if errors else f"devices {dead} died"
            if group is not None:
                raise GroupBroken(group, dead, detail)
            raise AgentError(f"{self.node_id}: {name} failed: {detail}")
        return replies

    def _command(
        self, indices: Sequence[int], name: str, args: tuple[Any, ...], group: str | None = None
    ) -> dict[int, Any]:
        """Send ``name`` to every process in ``indices`` at once, then collect every reply."""
        dead = [i for i in indices if not self._device(i).alive]
        if dead and group is not None:
            raise GroupBroken(group, dead, "member process is not running")
        for index in indices:
            self._send(index, name, args)
        return self._receive(indices, name, group)


NodeAgentActor = ray.remote(max_concurrency=8)(NodeAgent)
