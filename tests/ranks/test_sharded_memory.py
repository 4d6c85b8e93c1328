"""FSDP2's start-up and refresh hold what the memory estimate says: no whole float32 copy beside the loaded model.

Two gloo ranks (`sharded_memory_probe.py`, each a fresh process) build a tiny SD3 transformer scaled to ~220 MB
in float32, shard θ, θ_old, the reference and the EMA (`ShardedVersions.start`) and gather θ_old into the bf16
sampler (`refresh`); each rank's peak resident set above its start is compared with the estimate's start-up
and refresh figures (`estimate_training_memory`'s ``peaks``) for the same transformer on two ranks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spotlight.models.pipelines.memory_estimate import CUDA_CONTEXT_BYTES, ModelSizes, estimate_training_memory

TESTS = Path(__file__).parents[1]
PROBE = Path(__file__).with_name("sharded_memory_probe.py")
RANKS, LAYERS, HEADS = 2, 6, 8


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Each rank's peaks (bytes) and the transformer's sizes, from two probe processes run together."""
    folder = tmp_path_factory.mktemp("sharded_memory")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)]),
           # every block above 64 KiB mapped and unmapped on its own: the resident set follows the live bytes
           "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0", "OMP_NUM_THREADS": "1"}
    ranks = [subprocess.Popen([sys.executable, str(PROBE), str(rank), str(RANKS), str(folder / "rendezvous"),
                               str(folder / f"rank{rank}.json"), str(LAYERS), str(HEADS)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in range(RANKS)]
    for process in ranks:
        output, _ = process.communicate(timeout=300)
        assert process.returncode == 0, output[-3000:]
    return [json.loads((folder / f"rank{rank}.json").read_text()) for rank in range(RANKS)]


def estimate(run: dict):
    sizes = ModelSizes(transformer=run["parameters"], text_encoders=0, vae=0, lora=0, blocks=run["blocks"],
                       hidden=run["hidden"])
    # θ_old,i and the EMA (frozen_copies 2) and the trust term's reference, as `ShardedVersions` keeps them
    return estimate_training_memory(sizes, dtype="bfloat16", finetune="full", optimizer="adamw", frozen_copies=2,
                                    reference=True, tokens=1, rows=1, gradient_checkpointing=False, shards=RANKS,
                                    whole_bytes=2)


def test_the_start_up_peaks_where_the_estimate_says(measured: list[dict]) -> None:
    """The loaded float32 transformer becomes four versions' shards and a bf16 sampler with no whole float32 copy
    beside it: each rank's peak is the estimate's start-up figure (less the CUDA context) within 20%."""
    for run in measured:
        expected = estimate(run).peaks["start-up"] - CUDA_CONTEXT_BYTES
        assert run["parameters"] * 4 > 2 * 10**8  # hundreds of MB in float32: Python's own noise is small beside it
        assert run["startup"] == pytest.approx(expected, rel=0.2), (run["startup"] / 2**20, expected / 2**20)


def test_a_refresh_gathers_one_block_at_a_time_in_the_sampling_dtype(measured: list[dict]) -> None:
    """``refresh`` all-gathers only bf16 and makes no float32 tensor: its peak above the held state is what the
    estimate adds for it (one block's shard, gathered output and unsharded tensors), far below a whole copy."""
    for run in measured:
        estimated = estimate(run)
        parts = estimated.parts
        extra = estimated.peaks["refresh"] - (sum(parts.values()) - parts["gathered blocks"])
        assert run["gathered"] == ["torch.bfloat16"] and run["largest_float32"] == 0
        assert run["sampler"] == ["torch.bfloat16"]
        assert run["refresh"] == pytest.approx(extra, rel=0.2), (run["refresh"] / 2**20, extra / 2**20)
        assert run["refresh"] < 3 * run["block_parameters"] * 2 < run["parameters"] * 4 / 2
