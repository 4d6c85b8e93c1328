"""Seconds per phase of a run, measured around the entry points it already calls, and the device's memory.

`PhaseClock.wrap` returns a function that runs the original and adds its wall time to
``seconds[phase]``. Phases may nest (a decode inside the sampling call, should a backend decode as it
samples): a phase's seconds are its own, without the nested phases' (which are charged to those), so
the phases add up to the time they cover. On CUDA it synchronises the device before and after, so
queued kernels are charged to the phase that launched them; those are phase boundaries, where the loop
waits anyway, not points inside a denoising loop. It also tags the transformer calls made inside with
the phase (`forward_meter.ForwardMeter.counted`).
"""

from __future__ import annotations

import functools
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports

from benchmarks.gpu.forward_meter import ForwardMeter

__all__ = ["PhaseClock", "device_memory", "device_name", "peak_memory", "reset_peak_memory"]


class PhaseClock:
    """Wall seconds by phase on ``device`` (module docstring)."""

    def __init__(self, device: str, meter: ForwardMeter | None = None) -> None:
        self.device = device
        self.meter = meter
        self.seconds: Counter[str] = Counter()
        self._nested: list[float] = []  # per open phase: seconds of the phases nested in it so far

    def sync(self) -> None:
        """Wait for the device's queued work (nothing to wait for on a CPU)."""
        if self.device == "cuda":
            torch.cuda.synchronize()

    def wrap(self, function: Callable[..., Any], phase: str) -> Callable[..., Any]:
        """``function`` timed under ``phase``; its transformer calls counted under ``phase`` too."""

        @functools.wraps(function)
        def timed(*args: Any, **kwargs: Any) -> Any:
            self.sync()
            started = time.perf_counter()
            self._nested.append(0.0)
            try:
                if self.meter is None:
                    return function(*args, **kwargs)
                with self.meter.counted(phase):
                    return function(*args, **kwargs)
            finally:
                self.sync()
                elapsed = time.perf_counter() - started
                self.seconds[phase] += elapsed - self._nested.pop()
                if self._nested:
                    self._nested[-1] += elapsed

        return timed


def device_name(device: str) -> str:
    """The GPU's name (``torch.cuda.get_device_name``), or ``cpu (N threads)``."""
    if device == "cuda":
        return torch.cuda.get_device_name(0)
    return f"cpu ({torch.get_num_threads()} threads)"


def device_memory(device: str) -> int | None:
    """The GPU's memory in bytes; None on a CPU."""
    return int(torch.cuda.get_device_properties(0).total_memory) if device == "cuda" else None


def reset_peak_memory(device: str) -> None:
    """Start a new peak for `peak_memory` (CUDA only)."""
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_memory(device: str) -> int | None:
    """``torch.cuda.max_memory_allocated`` since `reset_peak_memory`; None on a CPU (no allocator to ask)."""
    return int(torch.cuda.max_memory_allocated()) if device == "cuda" else None
