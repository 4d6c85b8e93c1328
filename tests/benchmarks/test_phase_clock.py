"""benchmarks/gpu/phase_clock.py: each phase is charged its own time, a nested phase's is not charged twice."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*`

from benchmarks.gpu.phase_clock import PhaseClock  # noqa: E402  (a benchmark helper)


def test_a_nested_phase_is_charged_to_itself_and_not_to_the_phase_around_it() -> None:
    clock = PhaseClock("cpu")
    decode = clock.wrap(lambda: time.sleep(0.1), "decode")

    def sample() -> str:
        time.sleep(0.01)
        decode()
        return "latents"

    started = time.perf_counter()
    assert clock.wrap(sample, "sample")() == "latents"
    total = time.perf_counter() - started
    assert clock.seconds["decode"] >= 0.1
    assert clock.seconds["sample"] < 0.1  # its own 0.01 s; with the decode's 0.1 s counted twice it would be more
    assert clock.seconds["sample"] + clock.seconds["decode"] == pytest.approx(total, abs=0.01)


def test_time_is_charged_even_when_the_phase_raises() -> None:
    clock = PhaseClock("cpu")

    def fail() -> None:
        time.sleep(0.01)
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError):
        clock.wrap(fail, "update")()
    assert clock.seconds["update"] >= 0.01
    assert clock.wrap(lambda: 1, "reward")() == 1 and clock.seconds["reward"] < 0.01
