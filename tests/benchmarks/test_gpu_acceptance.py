"""benchmarks/gpu/gpu_acceptance.sh on a machine without CUDA: one line, a non-zero exit, nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the acceptance run is for real")
def test_without_cuda_it_exits_non_zero_with_one_line_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    results = REPO / "benchmarks" / "results"
    before = sorted(results.iterdir())
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "TMPDIR": str(tmp_path / "tmp")}
    script = REPO / "benchmarks" / "gpu" / "gpu_acceptance.sh"
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True,
                          env=env, timeout=120, cwd=tmp_path)
    assert done.returncode != 0
    assert done.stdout.count("\n") == 1 and "no CUDA device" in done.stdout and not done.stderr
    assert not out.exists() and not (tmp_path / "tmp").exists()
    assert sorted(results.iterdir()) == before
