"""Frozen copies of the policy for the loop (EMA, θ_old, θ_{i-1}, the KL reference) with one copy of the base.

The loop keeps several frozen versions of the policy beside the trained one. For a TinyDiT, trained in
full, each is a deep copy. For a LoRA policy over a multi-billion-parameter base, deep copies would
hold the base three or four times; here each version is only its own LoRA tensors (`LoraShadow`), and
its forward runs the one shared base with those tensors swapped into the LoRA layers for the call (a
pointer swap per LoRA matrix, no copy). The KL reference, the base itself, is the same modules with
the adapter disabled. So a process holds one base whatever the number of versions; a test compares
the base weights' ``data_ptr`` across them.

A shadow is frozen: its forward runs without autograd (nothing back-propagates through the EMA, the
sampling policy or the reference; and a graph through swapped-in tensors would be wrong once they are
swapped back). Shadows and the policy must be called from one thread at a time, as the loop does.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.nn as nn

from spotlight.models.pipelines.adapter import DiffusersPolicy
from spotlight.models.policy import Policy
from spotlight.models.weight_payload import WeightPayload, unpack_into

__all__ = ["LoraShadow", "frozen_base", "frozen_copy", "is_lora"]


def is_lora(policy: Policy) -> bool:
    """Whether ``policy`` trains LoRA over a frozen base (a diffusers policy with ``finetune: lora``)."""
    return isinstance(policy, DiffusersPolicy) and policy.config.finetune == "lora"


def frozen_copy(policy: Policy) -> Policy:
    """A frozen copy of ``policy``'s current weights: a `LoraShadow` of a LoRA policy, else a deep copy
    (a TinyDiT, a fully fine-tuned transformer: every weight is trained, so every weight is copied)."""
    if isinstance(policy, LoraShadow):  # cloned where the tensors are (the device), never through the host
        return LoraShadow(policy.policy, policy.lora_parameters())
    if is_lora(policy):
        return LoraShadow(policy, policy.lora_parameters())
    return copy.deepcopy(policy).requires_grad_(False)


def frozen_base(policy: Policy) -> Policy:
    """The policy's frozen base, the KL reference: a LoRA policy with its adapter disabled, else a deep copy.

    Called on the policy a run starts from (a TinyDiT base checkpoint, LoRA B = 0, a transformer not yet
    fine-tuned), it is that start.
    """
    if is_lora(policy):
        return LoraShadow(policy, None)
    return copy.deepcopy(policy).requires_grad_(False)


class LoraShadow(nn.Module):
    """Another set of LoRA tensors over a `DiffusersPolicy`'s base modules (``lora`` None: the adapter disabled).

    Its parameters are its own LoRA tensors, in the order of the policy's ``trainable_parameters()``,
    so an EMA or a soft update steps them like any frozen copy's. Any other member is the policy's,
    and a method of the policy runs with this shadow's tensors swapped in (``broadcast_state``,
    ``save_lora``, ``save_for_diffusers`` ... read and write the shadow's LoRA, not the policy's).
    """

    def __init__(self, policy: DiffusersPolicy, lora: Mapping[str, torch.Tensor] | None) -> None:
        super().__init__()
        object.__setattr__(self, "policy", policy)  # not a submodule: the base is not this shadow's parameters
        targets = policy.lora_parameters()
        object.__setattr__(self, "_targets", tuple(targets.values()))
        object.__setattr__(self, "_names", tuple(targets))
        # every module of the policy, for the mode switch of each swap (nn.Module.train walks them recursively:
        # ~250 generator frames per call on a tiny SD3, thousands on SD3.5-M, twice per θ_old or reference forward)
        object.__setattr__(self, "_policy_modules", tuple(policy.modules()))
        self.lora = None if lora is None else nn.ParameterList(
            [nn.Parameter(lora[name].detach().clone().to(targets[name]), requires_grad=False) for name in targets])

    # --- what differs from the policy ----------------------------------------------------------------

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """Inside the block the policy's LoRA layers hold this shadow's tensors (or are disabled), and its mode."""
        policy = self.policy
        was_training = policy.training
        self._set_mode(self.training)
        if self.lora is None:
            try:
                with policy.adapter_disabled():
                    yield
            finally:
                self._set_mode(was_training)
            return
        originals = [target.data for target in self._targets]
        for target, mine in zip(self._targets, self.lora, strict=True):
            target.data = mine.data
        try:
            yield
        finally:
            for target, original in zip(self._targets, originals, strict=True):
                target.data = original
            self._set_mode(was_training)

    def _set_mode(self, training: bool) -> None:
        """``policy.train(training)`` as a flat loop over its modules (what ``train`` sets, without its recursion)."""
        for module in self._policy_modules:
            module.training = training

    def forward(self, x: torch.Tensor, sigma: torch.Tensor, cond: Any) -> torch.Tensor:
        """The velocity (B, C, H, W) of the base with this shadow's LoRA, without autograd."""
        with torch.no_grad(), self.swapped_in():
            return self.policy(x, sigma, cond)

    def trainable_parameters(self) -> list[nn.Parameter]:
        """This shadow's LoRA tensors, matching the policy's ``trainable_parameters()`` one for one."""
        return [] if self.lora is None else list(self.lora)

    def lora_parameters(self) -> dict[str, nn.Parameter]:
        """This shadow's LoRA tensors under the policy's LoRA keys."""
        return {} if self.lora is None else dict(zip(self._names, self.lora, strict=True))

    def trained_tensors(self) -> dict[str, torch.Tensor]:
        """This shadow's LoRA tensors, live, under the policy's LoRA keys (`spotlight.models.weight_payload`)."""
        if self.lora is None:
            raise ValueError("the frozen base has no trained tensors: it is the base itself")
        return dict(self.lora_parameters())

    def broadcast_state(self) -> dict[str, torch.Tensor]:
        """This shadow's LoRA tensors (detached CPU copies), as the policy's ``broadcast_state`` gives its own."""
        if self.lora is None:
            raise ValueError("the frozen base has no LoRA state to broadcast or checkpoint")
        with self.swapped_in():
            return self.policy.broadcast_state()

    def load_broadcast_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """Take LoRA tensors (keys and shapes checked by the policy) or a `WeightPayload` into this shadow."""
        if self.lora is None:
            raise ValueError("the frozen base takes no LoRA state")
        if isinstance(state, WeightPayload):
            unpack_into(self, state)
            return
        with torch.no_grad(), self.swapped_in():
            self.policy.load_broadcast_state(state)

    # --- everything else is the policy's -----------------------------------------------------------

    @property
    def attention_fn(self) -> Any:
        """The shared base's attention routing (one set of modules, so one kernel for every version)."""
        return self.policy.attention_fn

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            pass
        policy = self.__dict__.get("policy")
        if policy is None:
            raise AttributeError(name)
        value = getattr(policy, name)
        if inspect.ismethod(value):  # a method of the policy runs on this shadow's weights
            return self._bound(value)
        return value

    def _bound(self, method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            with self.swapped_in():
                return method(*args, **kwargs)

        call.__doc__ = method.__doc__
        return call
