"""The persistent device process of a node agent: imports torch once, outlives every SP group.

The agent (`spotlight.runtime.sp.agent`) spawns one such process per device and drives it over a pipe
with small commands; a reply is ``("ok", value)`` or ``("error", one-line message)``:

    prepare(description)           build a diffusers base ahead of its weights (warm spares)
    attach(description, weights, copy)
                                   build the policy around the agent's shared-memory weights
                                   (`spotlight.models.spec`)
    join(group, rank, world, host, port, timeout_s)
                                   join an SP group: a gloo process group on the agent's TCPStore
                                   under the prefix ``group`` (a new name per generation), so a
                                   re-formation never meets keys of a dead formation
    leave()                        destroy the process group (a dead peer does not block this)
    step(prompts, seeds, plan, latents, step)
                                   one SP denoising step; rank 0 replies with the latents (the
                                   policy tokenizes the prompts here: a pipeline folder's prompt
                                   ids index this process's own cache of its embeddings)
    exit()

Why processes and not threads in the agent: each device needs its own torch.distributed state
(one default group per process), and a device that crashes must not take the agent with it.
The process exits by itself when the agent dies (it polls its parent), so no orphan holds memory.
"""

from __future__ import annotations

import datetime
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from spotlight.diffusion.sampler import SamplingPlan
from spotlight.models.policy import Policy
from spotlight.models.spec import PolicyCache, policy_on_weights, prepare_policy, sp_denoise_step, warm_up

__all__ = ["device_process_main"]

PARENT_POLL_S = 0.5


@dataclass
class _DeviceState:
    """What one device process holds between commands."""

    model: Policy | None = None
    built: PolicyCache = field(default_factory=dict)  # diffusers bases built so far, kept across attaches
    store: Any = None  # the TCPStore client; kept alive as long as the group
    group_name: str | None = None
    rank: int = 0
    world: int = 1


def _prepare(state: _DeviceState, description: dict[str, Any]) -> None:
    prepare_policy(description, state.built)


def _attach(state: _DeviceState, description: dict[str, Any], weights: dict[str, torch.Tensor], copy: bool) -> float:
    started = time.perf_counter()
    state.model = policy_on_weights(description, weights, copy, state.built)
    return time.perf_counter() - started


def _join(
    state: _DeviceState, group_name: str, rank: int, world: int, host: str, port: int, timeout_s: float
) -> float:
    started = time.perf_counter()
    _leave(state)
    if world > 1:
        timeout = datetime.timedelta(seconds=timeout_s)
        state.store = dist.TCPStore(host, port, is_master=False, timeout=timeout)
        prefixed = dist.PrefixStore(group_name, state.store)
        dist.init_process_group("gloo", store=prefixed, rank=rank, world_size=world, timeout=timeout)
    state.group_name, state.rank, state.world = group_name, rank, world
    return time.perf_counter() - started


def _leave(state: _DeviceState) -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
    state.store, state.group_name, state.rank, state.world = None, None, 0, 1


def _step(
    state: _DeviceState, prompts: list[str], seeds: list[int], plan: SamplingPlan, latents: torch.Tensor, step: int
) -> torch.Tensor | None:
    if state.model is None:
        raise RuntimeError("step before attach: load weights into the agent before serving")
    if state.group_name is None:
        raise RuntimeError("step outside a group: form the device's SP group first")
    group = dist.group.WORLD if state.world > 1 else None
    latents = sp_denoise_step(state.model, group, state.model.tokenize(prompts), seeds, plan, latents, step)
    return latents if state.rank == 0 else None


def _warm_up() -> None:
    """Pay every first-call cost (lazy imports, meta-device and kernel set-up) before reporting ready.

    A spare is only warm if standing in costs it no more than a second attach: measured here, a
    process's first model build takes ~1.4 s and the second ~15 ms.
    """
    warm_up()


_COMMANDS: dict[str, Callable[..., Any]] = {
    "prepare": _prepare, "attach": _attach, "join": _join, "leave": _leave, "step": _step,
}


def device_process_main(conn: Connection, device: str, num_threads: int) -> None:
    """Serve the agent's commands until ``exit``, a closed pipe, or the agent's death."""
    torch.set_num_threads(num_threads)
    state = _DeviceState()
    parent = mp.parent_process()
    _warm_up()
    conn.send(("ready", os.getpid()))
    while True:
        if not conn.poll(PARENT_POLL_S):
            if parent is not None and not parent.is_alive():
                break
            continue
        try:
            name, args = conn.recv()
        except (EOFError, OSError):
            break
        if name == "exit":
            break
        try:
            reply: tuple[str, Any] = ("ok", _COMMANDS[name](state, *args))
        except Exception as error:  # noqa: BLE001 - every failure goes back to the agent as one line
            reply = ("error", f"{device}: {name} failed: {type(error).__name__}: {error}".splitlines()[0])
        try:
            conn.send(reply)
        except (BrokenPipeError, OSError):
            break
    _leave_quietly(state)
    _exit_now()


def _exit_now() -> None:
    """End the process without the interpreter's finalization, which has nothing left to do here.

    Tearing down torch, gloo and the policy's modules took 2-4 s per process on a loaded 2-core machine
    (over 10 s for an SP group's rank 0), longer than the agent waits before it kills the process
    (`DeviceProcesses.stop_all`); the kernel frees the memory, pipes and sockets at once either way.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _leave_quietly(state: _DeviceState) -> None:
    try:
        _leave(state)
    except Exception:  # noqa: BLE001 - exiting anyway
        pass
