"""Count a transformer's forwards by phase, and their FLOPs, for model FLOPs utilisation (MFU).

MFU = FLOPs the model needs / seconds / the device's peak. The FLOPs come from
``torch.utils.flop_counter.FlopCounterMode`` on one real call of each distinct shape, times the number
of calls of that shape the timed run actually made, so nothing is guessed from a formula:

- a forward hook records every call of the transformer: its phase (``sample``, ``update``, ...), whether
  autograd was on (a training forward is followed by its backward), and a signature of its inputs (the
  shapes of its tensors and the values of its other arguments). The first call of each signature keeps
  detached copies of its inputs;
- after the timed run, `flops` replays each kept call once under the counter: a no-grad call as a
  forward, a training call as forward + backward of its output. Gradient checkpointing's recomputed
  forward is work the hardware does but not model FLOPs (MFU, not HFU): with ``recomputed=True`` one
  no-grad forward of the same inputs is counted too and taken off each training call. (Replaying with
  checkpointing off instead would need the activations the run saved memory on.)

The hook adds a few microseconds per call and no device synchronisation.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

__all__ = ["ForwardMeter"]

Signature = tuple[Any, ...]


def _describe(value: Any) -> Any:
    """A hashable description of one argument: a tensor's shape and dtype, else the value (lists as tuples)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), str(value.dtype))
    if isinstance(value, (list, tuple)):
        return tuple(_describe(item) for item in value)
    if isinstance(value, dict):
        return tuple(sorted((key, _describe(item)) for key, item in value.items()))
    return repr(value)


def _detached(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, list):
        return [_detached(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_detached(item) for item in value)
    if isinstance(value, dict):
        return {key: _detached(item) for key, item in value.items()}
    return value


def _first_tensor(output: Any) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)):
        return _first_tensor(output[0])
    return output.sample  # a diffusers output dataclass


class ForwardMeter:
    """Calls of one transformer, by phase and signature, and their FLOPs (module docstring)."""

    def __init__(self, transformer: torch.nn.Module) -> None:
        self.transformer = transformer
        self.phase = "other"
        self.counting = False
        self.calls: Counter[tuple[str, Signature]] = Counter()
        self._kept: dict[Signature, tuple[tuple[Any, ...], dict[str, Any], bool]] = {}
        self._handle = transformer.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not self.counting:
            return
        training = torch.is_grad_enabled()
        signature = (training, _describe(args), _describe(kwargs))
        self.calls[(self.phase, signature)] += 1
        if signature not in self._kept:
            self._kept[signature] = (_detached(args), _detached(kwargs), training)

    @contextmanager
    def counted(self, phase: str) -> Iterator[None]:
        """Count the calls inside the block under ``phase`` (restored after: phases nest)."""
        outer, was_counting = self.phase, self.counting
        self.phase, self.counting = phase, True
        try:
            yield
        finally:
            self.phase, self.counting = outer, was_counting

    def reset(self) -> None:
        """Forget the calls counted so far (the warm-up's); the kept inputs stay for the replay."""
        self.calls.clear()

    def forwards(self, phase: str) -> dict[str, int]:
        """Calls in ``phase``: ``{"forward": no-grad calls, "training": calls with autograd}``."""
        counts = {"forward": 0, "training": 0}
        for (call_phase, signature), count in self.calls.items():
            if call_phase == phase:
                counts["training" if signature[0] else "forward"] += count
        return counts

    def flops(self, recomputed: bool = False) -> dict[str, float]:
        """FLOPs of every phase's counted calls: one counted replay per signature times its calls.

        ``recomputed``: the transformer runs with gradient checkpointing, whose recomputed forward is
        taken off each training call (module docstring).

        Run it after the timed work: a training replay leaves gradients on the trained parameters,
        which are cleared again (set to None).
        """
        per_signature: dict[Signature, float] = {}
        for signature in {signature for _, signature in self.calls}:
            args, kwargs, training = self._kept[signature]
            per_signature[signature] = self._replay(args, kwargs, training)
            if training and recomputed:
                per_signature[signature] -= self._replay(args, kwargs, False)
        for parameter in self.transformer.parameters():
            parameter.grad = None
        totals: dict[str, float] = {}
        for (phase, signature), count in self.calls.items():
            totals[phase] = totals.get(phase, 0.0) + count * per_signature[signature]
        return totals

    def _replay(self, args: tuple[Any, ...], kwargs: dict[str, Any], training: bool) -> float:
        """FLOPs of one call (forward, and with ``training`` its backward), counted by torch's flop counter."""
        counter = FlopCounterMode(display=False)
        with counter, torch.set_grad_enabled(training):
            output = _first_tensor(self.transformer(*args, **kwargs))
            if training and output.requires_grad:
                output.float().square().mean().backward()
        return float(counter.get_total_flops())

    def close(self) -> None:
        """Remove the hook."""
        self._handle.remove()
