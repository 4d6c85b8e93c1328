"""Bytes a run moves between the host and the device, counted at the tensor methods that move them.

CUDA's allocator counters say how much memory a run holds, not how much crossed the PCIe bus, and the
profiler's memcpy records cost a trace per iteration. A run's host<->device traffic in Spotlight (and in
diffusers) is started from Python by ``Tensor.to``, ``.cuda``, ``.cpu`` and ``.copy_``, so `CopyMeter`
wraps those four while it is open and adds each call's bytes whose source and result sit on different
device kinds: ``h2d`` (host to device) and ``d2h`` (device to host). Copies made inside C++ or CUDA code
(a kernel's own transfers, NCCL) are not seen; what is counted is what a Python caller asked for. On a
CPU-only run nothing crosses, and the counters stay 0.
"""

from __future__ import annotations

import functools
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["CopyMeter"]


def _direction(source: torch.device, target: torch.device) -> str | None:
    if source.type == target.type:
        return None
    return "h2d" if source.type == "cpu" else "d2h" if target.type == "cpu" else "d2d"


class CopyMeter:
    """Counts host<->device bytes between `open` and `close` (module docstring); ``bytes`` by direction."""

    METHODS = ("to", "cuda", "cpu", "copy_")

    def __init__(self) -> None:
        self.bytes: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._originals: dict[str, Callable[..., Any]] = {}

    def _add(self, direction: str | None, tensor: torch.Tensor) -> None:
        if direction is not None:
            with self._lock:
                self.bytes[direction] += tensor.numel() * tensor.element_size()

    def _wrapped(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        meter = self

        @functools.wraps(original)
        def moved(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            result = original(tensor, *args, **kwargs)
            if name == "copy_":
                source = args[0] if args else kwargs.get("src")
                if isinstance(source, torch.Tensor):
                    meter._add(_direction(source.device, tensor.device), source)
            elif isinstance(result, torch.Tensor) and result is not tensor:
                meter._add(_direction(tensor.device, result.device), result)
            return result

        return moved

    def open(self) -> CopyMeter:
        for name in self.METHODS:
            original = getattr(torch.Tensor, name)
            self._originals[name] = original
            setattr(torch.Tensor, name, self._wrapped(name, original))
        return self

    def close(self) -> None:
        for name, original in self._originals.items():
            setattr(torch.Tensor, name, original)
        self._originals.clear()

    def take(self) -> dict[str, int]:
        """The bytes counted since the last `take`, by direction (h2d, d2h), and reset."""
        with self._lock:
            counted = {"h2d": self.bytes["h2d"], "d2h": self.bytes["d2h"]}
            self.bytes.clear()
        return counted

    def __enter__(self) -> CopyMeter:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()
