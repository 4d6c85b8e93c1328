"""What a run with spot devices checks of θ's payload before any Ray process starts.

`SpotCluster` sizes the local cluster's object store from the payload (two versions in flight plus a margin),
and refuses a fully fine-tuned pipeline transformer with spot devices in one line naming the bytes each
spot device would take per iteration. ``LocalCluster`` is replaced by a recorder that stops the start-up
right there, so no Ray process starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from spotlight.errors import one_line
from spotlight.models import weight_payload
from spotlight.models.pipelines.adapter import DiffusersPolicy
from spotlight.models.pipelines.family_config import DiffusersPolicyConfig
from spotlight.models.weight_payload import payload_nbytes
from spotlight.modes import Mode
from spotlight.run_error import RunError
from spotlight.runtime.section import RuntimeSection
from spotlight.runtime.spot import cluster as cluster_module
from spotlight.runtime.spot.cluster import SpotCluster


class Started(Exception):
    """Raised by the recorder: the start-up got as far as the local cluster."""


def policy(finetune: str, dtype: str = "bfloat16", rank: int = 4) -> DiffusersPolicy:
    return DiffusersPolicy.from_config(DiffusersPolicyConfig(family="sd3", tiny=True, dtype=dtype, lora_rank=rank,
                                                             lora_alpha=8.0, init_seed=0, finetune=finetune))


def start(model: Any, mode: Mode, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Start a `SpotCluster` for ``model``; returns the local cluster's keyword arguments."""
    seen: dict[str, Any] = {}

    def recorder(**kwargs: Any) -> None:
        seen.update(kwargs)
        raise Started

    monkeypatch.setattr(cluster_module, "LocalCluster", recorder)
    with pytest.raises(Started):
        SpotCluster(RuntimeSection(num_spot_devices=2), mode, model, tmp_path, core_of=lambda k: None)
    return seen


def test_the_object_store_is_sized_from_the_payload(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    small, large = policy("lora", rank=4), policy("lora", rank=1024)
    assert payload_nbytes(large) > 2**20  # a bfloat16 payload of MBs
    store_small = start(small, Mode.SPOTLIGHT, tmp_path, monkeypatch)["object_store_mb"]
    store_large = start(large, Mode.SPOTLIGHT, tmp_path, monkeypatch)["object_store_mb"]
    grown = store_large - store_small
    expected = 2 * (payload_nbytes(large) - payload_nbytes(small)) / 2**20  # two versions in flight
    assert abs(grown - expected) <= 1, (store_small, store_large, expected)


def test_a_full_fine_tune_with_spot_devices_is_refused_in_one_line(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    model = policy("full")
    shipped = sum(parameter.numel() for parameter in model.transformer.parameters()) * 2  # bfloat16
    assert start(model, Mode.SPOTLIGHT, tmp_path, monkeypatch)  # a tiny transformer ships under the limit
    monkeypatch.setattr(weight_payload, "SPOT_PAYLOAD_LIMIT_BYTES", 1000)  # as if it were SD3.5-M's 4.9 GB
    monkeypatch.setattr(cluster_module, "LocalCluster", lambda **_: pytest.fail("Ray started before the refusal"))
    with pytest.raises(RunError) as refused:
        SpotCluster(RuntimeSection(num_spot_devices=1), Mode.SPOTLIGHT, model, tmp_path, core_of=lambda k: None)
    assert one_line(refused.value) == (f"full fine-tune ships {shipped / 1e6:.1f} MB per iteration to each "
                                       "spot device (over the 0.0 MB one takes); use LoRA (model.finetune lora) "
                                       "or mode vanilla")
    assert all(parameter.dtype == torch.float32 for parameter in model.transformer.parameters())  # trains in fp32


def test_a_full_fine_tune_without_spot_devices_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert start(policy("full"), Mode.VANILLA, tmp_path, monkeypatch)
