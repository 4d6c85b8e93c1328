"""benchmarks/gpu/gpu_smoke.py runs anywhere: without CUDA it says so in one line and exits 0."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*`

from benchmarks.gpu import gpu_smoke  # noqa: E402  (a benchmark program)


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the benchmark runs for real")
def test_without_cuda_the_gpu_smoke_test_says_so_in_one_line_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_smoke.main([]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "no CUDA device on this machine" in out
