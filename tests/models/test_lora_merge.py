"""Sampling with the LoRA folded into the base weights: the same samples to rounding, the base restored exactly."""

from __future__ import annotations

import pytest
import torch

from spotlight.diffusion.sampler import SamplingPlan
from spotlight.models.generation import generate
from spotlight.models.lora_merge import merged_lora, sampling_weights
from spotlight.models.pipelines.family_config import DiffusersPolicyConfig
from spotlight.models.pipelines.policy import PipelinePolicy
from spotlight.models.rebuild import policy_from_config
from spotlight.models.shadow import frozen_base, frozen_copy

PROMPTS = ["a red circle", "a red circle", "a blue square", "a blue square"]
PLAN = SamplingPlan(num_steps=4, sampler="sde", noise_level=0.7)


def lora_policy(folder, merge_lora: bool | None) -> PipelinePolicy:
    config = DiffusersPolicyConfig(family="sd3", pretrained=str(folder), pipeline=True, resolution=(32, 32),
                                   dtype="float32", guidance_scale=4.5, negative_prompt="blurry",
                                   max_sequence_length=16, merge_lora=merge_lora)
    policy = policy_from_config(config)
    with torch.no_grad():  # a trained-looking adapter: B away from zero
        generator = torch.Generator().manual_seed(3)
        for parameter in policy.trainable_parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.05)
    return policy.eval()


@pytest.fixture(scope="module")
def policies(tiny_pipeline):
    folder = tiny_pipeline("sd3")
    merged, unmerged = lora_policy(folder, True), lora_policy(folder, False)
    unmerged.load_lora_state_dict(merged.lora_state_dict())
    return merged, unmerged


def base_weights(policy: PipelinePolicy) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in policy.transformer.named_parameters()
            if "lora_" not in name}


def test_merged_sampling_matches_the_adapter_math_to_float32_rounding(policies) -> None:
    merged, unmerged = policies
    adapter = generate(unmerged, PROMPTS, [0, 1, 2, 3], PLAN)
    folded = generate(merged, PROMPTS, [0, 1, 2, 3], PLAN)
    assert not torch.equal(adapter.latents, folded.latents)  # it did fold: (W + sBA)x is not Wx + sB(Ax) bit for bit
    # float32: the latents agree to ~1e-6 relative; Flow-GRPO's log-probs (recorded from the merged forwards
    # that drew each step) to the same order
    torch.testing.assert_close(folded.latents, adapter.latents, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(folded.log_probs, adapter.log_probs, rtol=1e-4, atol=1e-4)


def test_the_base_weights_come_back_bit_for_bit_and_the_adapter_is_on_again(policies) -> None:
    merged, _ = policies
    before = base_weights(merged)
    pointers = {name: t.data_ptr() for name, t in merged.transformer.named_parameters() if "lora_" not in name}
    flags = {name: t.requires_grad for name, t in merged.named_parameters()}
    tokens = merged.tokenize(PROMPTS[:1])
    x, sigma = torch.randn(1, *merged.latent_shape), torch.full((1,), 0.7)
    with torch.no_grad():
        with_adapter = merged(x, sigma, tokens)
        with merged_lora(merged):
            inside = merged(x, sigma, tokens)
            assert any(not torch.equal(before[name], tensor) for name, tensor in
                       merged.transformer.named_parameters() if name in before)  # the fold is in the weights
        after = merged(x, sigma, tokens)
    torch.testing.assert_close(inside, with_adapter, rtol=1e-4, atol=1e-5)
    assert torch.equal(after, with_adapter)  # the adapter runs again, on the untouched base
    for name, tensor in merged.transformer.named_parameters():
        if name in before:
            assert torch.equal(tensor, before[name]) and tensor.data_ptr() == pointers[name], name
    assert flags == {name: t.requires_grad for name, t in merged.named_parameters()}


def test_a_frozen_version_samples_with_its_own_lora_folded(policies) -> None:
    merged, unmerged = policies
    shadow = frozen_copy(merged)  # θ_old: its LoRA tensors over the shared base
    saved = [parameter.detach().clone() for parameter in merged.trainable_parameters()]
    with torch.no_grad():
        for parameter in merged.trainable_parameters():  # the trained policy moves on
            parameter.add_(0.1)
    try:
        tokens = merged.tokenize(PROMPTS[:2])
        x, sigma = torch.randn(2, *merged.latent_shape), torch.full((2,), 0.6)
        with torch.no_grad():
            reference = unmerged(x, sigma, unmerged.tokenize(PROMPTS[:2]))  # θ_old's weights, adapter math
            with sampling_weights(shadow):
                folded = shadow(x, sigma, tokens)
        torch.testing.assert_close(folded, reference, rtol=1e-4, atol=1e-5)
    finally:
        with torch.no_grad():
            for parameter, value in zip(merged.trainable_parameters(), saved, strict=True):
                parameter.copy_(value)


def test_merging_is_off_on_the_cpu_by_default_and_for_the_base(tiny_pipeline) -> None:
    policy = lora_policy(tiny_pipeline("sd3"), None)
    assert type(sampling_weights(policy)).__name__ == "nullcontext"  # CPU: the adapter math, bit for bit as before
    assert type(sampling_weights(frozen_base(policy))).__name__ == "nullcontext"
