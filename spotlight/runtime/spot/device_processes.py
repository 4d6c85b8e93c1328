"""A node's persistent device processes and the pipe protocol the agent drives them with.

Each process (`spotlight.runtime.sp.process`) is a device in service or a warm spare. A command goes
to several processes at once and every reply is collected before the next, so an SP group's members
enter their collectives together; a process that dies, or hangs past the collective timeout, is
marked lost and the command fails with `GroupBroken` (for a group's command) or `AgentError`.
Kept apart from the agent (`spotlight.runtime.sp.agent`), which decides what to send: weights, groups
and requests.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

import torch.multiprocessing as mp

from spotlight.runtime.sp.process import device_process_main
from spotlight.runtime.sp.reconfigure import device_id

__all__ = ["AgentError", "DeviceProcess", "DeviceProcesses", "GroupBroken"]

START_TIMEOUT_S = 600.0  # generous: a nice-19 spawn on a busy 2-core machine took > 120 s
SETUP_COMMANDS = frozenset({"attach", "prepare"})  # build or load a policy: no collective, no collective timeout
SETUP_REPLY_TIMEOUT_S = 300.0


class AgentError(RuntimeError):
    """A command the agent cannot carry out; the message names the device or group and the fix."""


class GroupBroken(AgentError):
    """An SP group lost a member (its process died or a collective failed): re-plan and re-form it."""

    def __init__(self, group: str, lost: Sequence[int], detail: str) -> None:
        super().__init__(f"SP group {group} broke (lost devices {list(lost)}): {detail}")
        self.group, self.lost = group, list(lost)


@dataclass
class DeviceProcess:
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


class DeviceProcesses:
    """The processes of node ``node_id`` by index (in service or spare), and commands to them.

    ``num_threads``: torch threads per process. ``collective_timeout_s``: how long a command may wait
    for a reply beyond a gloo collective's own timeout before the process counts as lost.
    """

    def __init__(self, node_id: str, num_threads: int, collective_timeout_s: float) -> None:
        self.node_id, self.num_threads, self.collective_timeout_s = node_id, num_threads, collective_timeout_s
        self.devices: dict[int, DeviceProcess] = {}
        self._context = mp.get_context("spawn")
        self._next_index = 0

    def spawn(self, count: int, spare: bool) -> list[int]:
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
            self.devices[index] = DeviceProcess(index, process, parent_conn, spare)
            started.append(index)
        for index in started:
            device = self.devices[index]
            if not device.conn.poll(START_TIMEOUT_S):
                raise AgentError(f"device process {index} of {self.node_id} did not start in {START_TIMEOUT_S} s")
            device.conn.recv()
        return started

    def kill(self, index: int) -> None:
        """SIGKILL process ``index`` (how tests and benchmarks crash a group member)."""
        os.kill(self.get(index).process.pid, signal.SIGKILL)

    def alive(self) -> list[int]:
        """Indices of the processes in service and alive (spares excluded)."""
        return sorted(i for i, d in self.devices.items() if not d.spare and d.alive)

    def lost(self) -> list[int]:
        """Indices of processes in service that died and were not replaced yet."""
        return sorted(i for i, d in self.devices.items() if not d.spare and not d.alive)

    def spares(self) -> list[int]:
        """Indices of live warm spares."""
        return sorted(i for i, d in self.devices.items() if d.spare and d.alive)

    def wait_for_loss(self, timeout_s: float) -> list[int]:
        """Block until a process in service dies (or ``timeout_s`` passes); returns the lost indices."""
        in_service = {d.process.sentinel: i for i, d in self.devices.items() if not d.spare and not d.lost}
        for sentinel in wait(list(in_service), timeout=timeout_s):
            self.devices[in_service[sentinel]].mark_lost()
        return self.lost()

    def forget(self, index: int) -> None:
        """Drop a lost process from the books (its pipe closed)."""
        self.devices.pop(index).conn.close()

    def stop_all(self) -> None:
        """Stop every process: ask each to exit, then kill what lingers."""
        for device in self.devices.values():
            try:
                device.conn.send(("exit", ()))
            except (BrokenPipeError, OSError):
                pass
        for device in self.devices.values():
            device.process.join(timeout=5)
            if device.process.is_alive():
                device.process.kill()
        self.devices.clear()

    def reply_timeout_s(self, name: str) -> float:
        """How long a process may take to answer ``name`` before it counts as lost.

        A collective answers within its own timeout (plus slack). Building or loading a policy does not:
        a fresh process imports torch and diffusers first, and a real model takes minutes to load onto a
        GPU; on a loaded CPU box a tiny pipeline's ``attach`` took over 25 s and its healthy process was
        declared lost. A process that dies is seen at once either way (its sentinel).
        """
        return max(self.collective_timeout_s + 5, SETUP_REPLY_TIMEOUT_S) if name in SETUP_COMMANDS \
            else self.collective_timeout_s + 5

    def get(self, index: int) -> DeviceProcess:
        device = self.devices.get(index)
        if device is None:
            raise AgentError(f"no device {index} on {self.node_id}: choose among {sorted(self.devices)}")
        return device

    def send(self, index: int, name: str, args: tuple[Any, ...]) -> None:
        device = self.get(index)
        self._drain(device)
        try:
            device.conn.send((name, args))
        except (BrokenPipeError, OSError):
            return  # the process is gone; receive reports it as lost
        device.pending += 1

    def _drain(self, device: DeviceProcess) -> None:
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

    def receive(self, indices: Sequence[int], name: str, group: str | None = None) -> dict[int, Any]:
        """Each process's reply to command ``name``; raises `GroupBroken` / `AgentError` on failures."""
        replies: dict[int, Any] = {}
        errors: list[str] = []
        lost: list[int] = []
        waiting = {index: self.devices[index] for index in indices}
        deadline = time.monotonic() + self.reply_timeout_s(name)
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
        dead = sorted(set(lost) | {i for i in indices if not self.devices[i].alive})
        if errors or dead:
            detail = errors[0] if errors else f"devices {dead} died"
            if group is not None:
                raise GroupBroken(group, dead, detail)
            raise AgentError(f"{self.node_id}: {name} failed: {detail}")
        return replies

    def command(
        self, indices: Sequence[int], name: str, args: tuple[Any, ...], group: str | None = None
    ) -> dict[int, Any]:
        """Send ``name`` to every process in ``indices`` at once, then collect every reply."""
        dead = [i for i in indices if not self.get(i).alive]
        if dead and group is not None:
            raise GroupBroken(group, dead, "member process is not running")
        for index in indices:
            self.send(index, name, args)
        return self.receive(indices, name, group)
