"""Lossless offload and restore of the trainer's state around a trainer-assisted generation fragment.

When the trainer generates in a bubble (TAG), its devices need memory for sampling while a logical
batch may be half accumulated: the summed gradients of the groups trained so far, the optimizer's
moments and the weights must all come back exactly, or the batch's one step would differ from the
one-shot update. `offload_training_state` moves gradients and optimizer state to host memory (and
drops them from the model and optimizer, which is what frees the device) and keeps a host copy of
the weights, which generation reads in place: with FSDP or a lower-precision generation cast, the
copy is what makes the restore exact (inferred: DigenRL states lossless offload/restore, not what
it offloads). `restore_training_state` writes every byte back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class OffloadedState:
    """Host copies of a model's weights and gradients (None where a parameter had none), the optimizer's
    state dict with its tensors on the host, and the model's train/eval mode."""

    weights: list[torch.Tensor]
    gradients: list[torch.Tensor | None]
    optimizer_state: dict[str, Any]
    training: bool


def _to_host(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: _to_host(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_to_host(item) for item in value]
    return value


def offload_training_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> OffloadedState:
    """Move gradients and optimizer state off the model and optimizer to the host; copy the weights."""
    parameters = list(model.parameters())
    state = OffloadedState(
        weights=[parameter.detach().to("cpu", copy=True) for parameter in parameters],
        gradients=[None if p.grad is None else p.grad.detach().to("cpu", copy=True) for p in parameters],
        optimizer_state=_to_host(optimizer.state_dict()),
        training=model.training,
    )
    for parameter in parameters:
        parameter.grad = None
    optimizer.state.clear()
    return state


def restore_training_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: OffloadedState) -> None:
    """Put weights, gradients, optimizer state and train/eval mode back exactly as offloaded."""
    parameters = list(model.parameters())
    if len(parameters) != len(state.weights):
        raise ValueError(f"restoring {len(state.weights)} offloaded parameters into a model with {len(parameters)}: "
                         f"restore into the model that was offloaded")
    with torch.no_grad():
        for parameter, weight, gradient in zip(parameters, state.weights, state.gradients, strict=True):
            parameter.copy_(weight.to(parameter.device))
            parameter.grad = None if gradient is None else gradient.to(parameter.device)
    optimizer.load_state_dict(state.optimizer_state)
    model.train(state.training)
