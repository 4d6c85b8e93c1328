"""Ulysses token sharding inside the diffusers transformers (Qwen-Image, FLUX) over real gloo groups.

Two spawned ranks run the tiny transformers with `sequence_parallel` over a group of 2 (SP-2) and
save the velocity and the parameter gradients summed over the group. The golden numbers come from
the test process: the same policy (rebuilt from the same init_seed) called plainly, through
diffusers' own attention processors and its own rotary tables, a path that shares no code with
the sharding hooks and the all-to-alls under test (SP-1).
"""

from __future__ import annotations

import datetime
import os

import pytest
import torch
import torch.distributed as dist
from gloo_ranks import run_ranks

from spotlight.models.pipelines.adapter import DiffusersPolicy
from spotlight.models.pipelines.family_config import DiffusersPolicyConfig
from spotlight.models.pipelines.inputs import PromptEmbeddings
from spotlight.models.pipelines.sequence_parallel import sequence_parallel

WORLD = 2
TOLERANCE = 1e-5
FAMILIES = ("qwen-image", "flux")
BATCH, TEXT_TOKENS = 2, 6  # 8x8 latents: 16 image tokens; 6 prompt tokens, the last 2 of row 1 padding


def make_case(family: str, text_tokens: int = TEXT_TOKENS) -> tuple[DiffusersPolicy, dict]:
    """A tiny policy with a live adapter and every weight trainable, and its inputs; identical in every process."""
    config = DiffusersPolicyConfig(family=family, tiny=True, dtype="float32", lora_rank=4, lora_alpha=8.0,
                                   init_seed=11)
    policy = DiffusersPolicy.from_config(config)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for parameter in policy.trainable_parameters():  # LoRA's B starts at zero: make the adapter count
            parameter.copy_(0.2 * torch.randn(parameter.shape, generator=generator))
    policy.requires_grad_(True)  # base weights too: every parameter's gradient is checked
    width, pooled_width = policy.prompt_dims
    mask = torch.ones(BATCH, text_tokens, dtype=torch.bool)
    mask[1, -2:] = False
    embeddings = PromptEmbeddings(
        embeds=torch.randn(BATCH, text_tokens, width, generator=generator),
        pooled=None if pooled_width is None else torch.randn(BATCH, pooled_width, generator=generator),
        mask=mask if family == "qwen-image" else None,
    )
    x = torch.randn(BATCH, *policy.latent_shape, generator=generator)
    inputs = {"x": x, "sigma": torch.tensor([0.9, 0.4]), "cond": embeddings,
              "weight": torch.randn(x.shape, generator=generator) / x.numel()}
    return policy, inputs


def forward_backward(policy: DiffusersPolicy, inputs: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The velocity and every parameter's gradient of the loss sum(weight * velocity)."""
    velocity = policy(inputs["x"], inputs["sigma"], inputs["cond"])
    (inputs["weight"] * velocity).sum().backward()
    grads = {name: p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
             for name, p in policy.named_parameters()}
    return velocity.detach(), grads


def _spawned_rank(rank: int, store_path: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    store = dist.FileStore(store_path, WORLD)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))
    results: dict = {}
    for family in FAMILIES:
        policy, inputs = make_case(family)
        with sequence_parallel(policy, dist.group.WORLD):
            velocity, grads = forward_backward(policy, inputs)
        for grad in grads.values():
            dist.all_reduce(grad)  # sum over the group: each rank holds its tokens' share
        results[family] = {"velocity": velocity, "grads": grads,
                           "routing_restored": policy.attention_fn is None}
    policy, inputs = make_case("qwen-image", text_tokens=5)
    try:
        with sequence_parallel(policy, dist.group.WORLD):
            policy(inputs["x"], inputs["sigma"], inputs["cond"])
        results["odd_prompt_error"] = None
    except ValueError as error:
        results["odd_prompt_error"] = str(error)
    dist.barrier()
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def rank_results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Spawn the two gloo ranks once for the module; returns each rank's saved results."""
    folder = tmp_path_factory.mktemp("diffusers_sp")
    run_ranks(_spawned_rank, (str(folder / "store"), str(folder)), WORLD, timeout_s=180,
              preload=("peft", "diffusers.models.transformers"))
    return [torch.load(folder / f"rank{rank}.pt") for rank in range(WORLD)]


@pytest.fixture(scope="module")
def single_device() -> dict[str, tuple[torch.Tensor, dict[str, torch.Tensor]]]:
    torch.set_num_threads(1)
    out = {}
    for family in FAMILIES:
        policy, inputs = make_case(family)
        out[family] = forward_backward(policy, inputs)
    return out


def _last_block(grads: dict[str, torch.Tensor]) -> int:
    return max(int(name.split(".")[2]) for name in grads if name.startswith("transformer.transformer_blocks."))


def _max_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual - expected).abs().max())


@pytest.mark.parametrize("family", FAMILIES)
def test_sp2_velocity_equals_one_device_on_every_rank(family: str, rank_results: list[dict],
                                                      single_device: dict) -> None:
    expected, _ = single_device[family]
    assert expected.abs().max() > 0.1  # a live model, not the adaLN-Zero identity
    for result in rank_results:
        assert _max_error(result[family]["velocity"], expected) <= TOLERANCE


@pytest.mark.parametrize("family", FAMILIES)
def test_sp2_parameter_gradients_summed_over_the_group_equal_one_device(family: str, rank_results: list[dict],
                                                                         single_device: dict) -> None:
    _, expected = single_device[family]
    nonzero = [name for name, grad in expected.items() if grad.abs().max() > 0]
    # The loss reaches every weight but the last double-stream block's text-query and text-output path,
    # whose text output the model drops (Qwen-Image; FLUX's single-stream blocks use every weight).
    last = f"transformer.transformer_blocks.{_last_block(expected)}."
    unused = ("attn.add_q_proj", "attn.to_add_out", "attn.norm_added_q", "txt_mlp")
    assert all(name.startswith(last) and any(part in name for part in unused)
               for name in set(expected) - set(nonzero))
    assert any(".lora_A." in name for name in nonzero) and any(".lora_B." in name for name in nonzero)
    for result in rank_results:
        grads = result[family]["grads"]
        assert set(grads) == set(expected)
        worst = max(expected, key=lambda name: _max_error(grads[name], expected[name]))
        assert _max_error(grads[worst], expected[worst]) <= TOLERANCE, worst


def test_both_ranks_hold_the_same_velocity_and_summed_gradients(rank_results: list[dict]) -> None:
    first, second = rank_results
    for family in FAMILIES:
        assert torch.equal(first[family]["velocity"], second[family]["velocity"])
        assert all(torch.equal(first[family]["grads"][n], second[family]["grads"][n]) for n in first[family]["grads"])


def test_attention_routing_is_restored_after_the_block(rank_results: list[dict]) -> None:
    assert all(result[family]["routing_restored"] for result in rank_results for family in FAMILIES)


def test_a_prompt_length_the_degree_does_not_divide_is_refused_naming_it(rank_results: list[dict]) -> None:
    for result in rank_results:
        assert result["odd_prompt_error"] is not None and "does not divide the 5 prompt tokens" in \
            result["odd_prompt_error"]


def test_sd3_is_refused_for_token_sharding() -> None:
    policy = DiffusersPolicy.from_config(DiffusersPolicyConfig(family="sd3", tiny=True, dtype="float32",
                                                               lora_rank=4, lora_alpha=8.0, init_seed=1))
    with pytest.raises(ValueError, match="token sharding covers flux, qwen-image"):
        with sequence_parallel(policy, None):
            pass
