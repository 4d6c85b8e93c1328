"""Policy versions move on the device; spot devices get one contiguous payload of the trained tensors.

There is no GPU here, so a hand-over's host traffic is counted the way tests/models/test_host_syncs.py counts
syncs: every call of a host read (``.cpu()``, ``.item()``, ``.numpy()`` ...) and every ``.to()`` is wrapped
and counted while the real code runs on a tiny SD3 LoRA policy. A hand-over that stays on the device makes
none of them; the former one (``broadcast_state`` -> ``load_broadcast_state``) made a ``.cpu()`` per LoRA
tensor and another round of them for the shape check.
"""

from __future__ import annotations

import collections
import contextlib
import pickle
from collections.abc import Iterator

import pytest
import torch

from spotlight.loop.policy_versions import PolicyVersions
from spotlight.models.pipelines.adapter import DiffusersPolicy
from spotlight.models.pipelines.family_config import DiffusersPolicyConfig
from spotlight.models.shadow import frozen_copy
from spotlight.models.tinydit import TinyDiT, TinyDiTConfig
from spotlight.models.weight_payload import (
    WeightPayload,
    object_store_mb,
    pack_weights,
    payload_nbytes,
    trained_tensors,
)

HOST_READS = ("item", "tolist", "cpu", "numpy", "nonzero", "__bool__", "__float__", "__int__", "__index__", "to")


@contextlib.contextmanager
def counting_host_traffic(monkeypatch: pytest.MonkeyPatch) -> Iterator[collections.Counter]:
    """Count every call of a host read or a ``.to()`` while the block runs (the calls still happen)."""
    counts: collections.Counter = collections.Counter()

    def counted(name: str, original):
        def call(*args, **kwargs):
            counts[name] += 1
            return original(*args, **kwargs)
        return call

    with monkeypatch.context() as patch:
        for name in HOST_READS:
            patch.setattr(torch.Tensor, name, counted(name, getattr(torch.Tensor, name)))
        patch.setattr(torch.cuda, "synchronize", counted("cuda.synchronize", torch.cuda.synchronize))
        yield counts


def lora_policy(dtype: str = "float32", seed: int = 3) -> DiffusersPolicy:
    """A tiny SD3 with rank-4 LoRA whose B matrices are away from zero (so versions differ)."""
    policy = DiffusersPolicy.from_config(DiffusersPolicyConfig(family="sd3", tiny=True, dtype=dtype, lora_rank=4,
                                                               lora_alpha=8.0, init_seed=0))
    with torch.no_grad():
        for parameter in policy.trainable_parameters():
            parameter.normal_(0.0, 0.02, generator=torch.Generator().manual_seed(seed))
            seed += 1
    return policy


def test_hand_over_is_a_device_copy_without_host_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    policy = lora_policy()
    sampler, previous = frozen_copy(policy), frozen_copy(policy)
    with torch.no_grad():  # θ_old moves away from θ_{i-1}
        for parameter in sampler.trainable_parameters():
            parameter.add_(1.0)
    versions = PolicyVersions(model=policy, sampler=sampler, previous=previous, reference=None, ema=None)
    where = [tensor.data_ptr() for tensor in trained_tensors(previous).values()]
    with counting_host_traffic(monkeypatch) as counts:
        versions.hand_over()
    assert sum(counts.values()) == 0, f"the hand-over read the device back or moved tensors: {dict(counts)}"
    for name, tensor in trained_tensors(sampler).items():
        assert torch.equal(trained_tensors(previous)[name], tensor), name
    assert [tensor.data_ptr() for tensor in trained_tensors(previous).values()] == where  # in place


def test_loading_lora_weights_checks_shapes_without_copying_the_adapter(monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint's (or a rollback's) LoRA tensors go straight into the adapter: no CPU copy to compare shapes."""
    source, target = lora_policy(seed=3), lora_policy(seed=50)
    state = {name: tensor.detach().clone() for name, tensor in source.lora_parameters().items()}
    with counting_host_traffic(monkeypatch) as counts:
        target.load_broadcast_state(state)
    assert counts["cpu"] == 0 and counts["to"] == 0, dict(counts)
    for name, tensor in target.lora_parameters().items():
        assert torch.equal(tensor, state[name]), name
    wrong = {name: tensor[..., :1] for name, tensor in state.items()}
    with pytest.raises(ValueError, match="LoRA weights do not fit this policy"):
        target.load_broadcast_state(wrong)


def test_the_payload_is_one_buffer_in_the_sampling_dtype_holding_only_the_trained_tensors() -> None:
    policy = lora_policy(dtype="bfloat16")
    lora = policy.lora_parameters()
    payload = pack_weights(policy)
    assert isinstance(payload, WeightPayload)
    assert payload.buffer.dim() == 1 and payload.buffer.is_contiguous()
    assert payload.buffer.dtype == torch.bfloat16  # the model samples in bfloat16; its LoRA trains in float32
    assert all(tensor.dtype == torch.float32 for tensor in lora.values())
    assert list(payload) == list(lora) and all(".lora_A." in name or ".lora_B." in name for name in payload)
    assert payload.buffer.numel() == sum(tensor.numel() for tensor in lora.values())
    assert payload.nbytes == payload_nbytes(policy) == payload.buffer.numel() * 2
    for name, tensor in lora.items():  # each entry is a view of the one buffer
        assert payload[name].untyped_storage().data_ptr() == payload.buffer.untyped_storage().data_ptr()
        assert torch.equal(payload[name], tensor.detach().to(torch.bfloat16)), name
    shipped = pickle.dumps(payload, protocol=5)
    assert len(shipped) < payload.nbytes + 64 * 1024  # the bytes once, plus a small index


def test_the_receiver_reproduces_the_senders_weights_exactly() -> None:
    sender, receiver = lora_policy(dtype="bfloat16", seed=3), lora_policy(dtype="bfloat16", seed=90)
    payload = pickle.loads(pickle.dumps(pack_weights(sender), protocol=5))
    where = [tensor.data_ptr() for tensor in receiver.lora_parameters().values()]
    receiver.load_broadcast_state(payload)
    assert [tensor.data_ptr() for tensor in receiver.lora_parameters().values()] == where  # its own parameters
    assert torch.equal(pack_weights(receiver).buffer, pack_weights(sender).buffer)
    for name, tensor in sender.lora_parameters().items():  # exactly what the sender samples with in bfloat16
        assert torch.equal(receiver.lora_parameters()[name], tensor.detach().to(torch.bfloat16).float()), name

    shadow = frozen_copy(lora_policy(dtype="bfloat16", seed=7))  # a frozen version takes it as well
    shadow.load_broadcast_state(payload)
    assert torch.equal(pack_weights(shadow).buffer, payload.buffer)

    config = TinyDiTConfig(dim=32, depth=1, num_heads=2)  # trained in full, in float32: every parameter, bit for bit
    tiny_sender, tiny_receiver = TinyDiT(config), TinyDiT(config)
    tiny_payload = pickle.loads(pickle.dumps(pack_weights(tiny_sender), protocol=5))
    assert tiny_payload.buffer.dtype == torch.float32
    from spotlight.runtime.spot.worker import load_weights

    load_weights(tiny_receiver, tiny_payload)
    sent, held = tiny_sender.state_dict(), tiny_receiver.state_dict()
    assert sent.keys() == held.keys() and all(torch.equal(sent[name], held[name]) for name in sent)


def test_a_payload_for_another_policy_shape_is_refused_in_one_line() -> None:
    other = DiffusersPolicy.from_config(DiffusersPolicyConfig(family="sd3", tiny=True, dtype="float32", lora_rank=8,
                                                              lora_alpha=8.0, init_seed=0))
    with pytest.raises(ValueError, match=r"the shipped weights do not fit this policy \(0 missing, 0 unexpected, \d+ "
                                         r"of another shape"):
        lora_policy().load_broadcast_state(pack_weights(other))


def test_the_object_store_is_sized_from_the_payload() -> None:
    qwen_lora_bf16 = 377_487_360  # Qwen-Image's rank-64 LoRA: ~755 MB in float32, half in bfloat16
    assert object_store_mb(qwen_lora_bf16) == 2 * 360 + 200  # two versions in flight, plus the margin
    assert object_store_mb(payload_nbytes(lora_policy())) == 201  # a toy's payload: the margin carries it


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_payload_leaves_through_pinned_memory_once_and_lands_on_the_device() -> None:
    sender, receiver = lora_policy(dtype="bfloat16", seed=3).cuda(), lora_policy(dtype="bfloat16", seed=90).cuda()
    payload = pack_weights(sender)
    assert payload.buffer.device.type == "cpu" and payload.buffer.is_pinned()
    receiver.load_broadcast_state(pickle.loads(pickle.dumps(payload, protocol=5)))
    assert all(tensor.device.type == "cuda" for tensor in receiver.lora_parameters().values())
    for name, tensor in sender.lora_parameters().items():
        assert torch.equal(receiver.lora_parameters()[name], tensor.detach().to(torch.bfloat16).float()), name
    versions = PolicyVersions(model=sender, sampler=sender, previous=frozen_copy(receiver), reference=None, ema=None)
    versions.hand_over()
    assert all(torch.equal(trained_tensors(versions.previous)[name], tensor)
               for name, tensor in sender.lora_parameters().items())
