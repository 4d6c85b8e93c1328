"""benchmarks/gpu/forward_meter.py: calls counted by phase and autograd, FLOPs from one replay per shape
(closed forms)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*`

from benchmarks.gpu.forward_meter import ForwardMeter  # noqa: E402  (a benchmark helper)

ROWS, IN, OUT = 5, 8, 3


def linear() -> torch.nn.Linear:
    return torch.nn.Linear(IN, OUT, bias=False)


def test_calls_are_counted_by_phase_and_autograd_only_inside_a_counted_block() -> None:
    layer = linear()
    meter = ForwardMeter(layer)
    x = torch.randn(ROWS, IN)
    layer(x)  # outside any phase: not counted
    with meter.counted("sample"), torch.no_grad():
        layer(x)
        layer(x)
    with meter.counted("update"):
        layer(x)
        with torch.no_grad():
            layer(x)
    assert meter.forwards("sample") == {"forward": 2, "training": 0}
    assert meter.forwards("update") == {"forward": 1, "training": 1}
    meter.reset()
    assert meter.forwards("sample") == {"forward": 0, "training": 0}


def test_flops_are_a_matmuls_closed_form_times_the_calls_and_the_recomputed_forward_comes_off() -> None:
    layer = linear()
    meter = ForwardMeter(layer)
    forward = 2 * ROWS * IN * OUT  # one (ROWS, IN) x (IN, OUT) product
    with meter.counted("sample"), torch.no_grad():
        for _ in range(3):
            layer(torch.randn(ROWS, IN))
    with meter.counted("update"):
        layer(torch.randn(ROWS, IN))
    flops = meter.flops()
    assert flops["sample"] == pytest.approx(3 * forward)
    # the input needs no gradient: the backward is the weight's gradient alone, one more product
    assert flops["update"] == pytest.approx(2 * forward)
    assert meter.flops(recomputed=True)["update"] == pytest.approx(forward)
    assert layer.weight.grad is None  # the replay's gradient is cleared


def test_a_new_shape_is_replayed_with_its_own_inputs() -> None:
    layer = linear()
    meter = ForwardMeter(layer)
    with meter.counted("sample"), torch.no_grad():
        layer(torch.randn(ROWS, IN))
        layer(torch.randn(2 * ROWS, IN))
    assert meter.flops()["sample"] == pytest.approx(3 * 2 * ROWS * IN * OUT)
