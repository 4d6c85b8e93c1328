"""Both policies (TinyDiT, diffusers + LoRA) implement the Policy protocol, and each member does its job."""

import json

import pytest
import torch
from random_models import TINY_SHAPES_CONFIG, randomised_tinydit

from spotlight.models.attention import sdpa_attention
from spotlight.models.generation import prompt_tokens
from spotlight.models.pipelines.adapter import DiffusersPolicy
from spotlight.models.pipelines.family_config import DiffusersPolicyConfig
from spotlight.models.policy import Policy
from spotlight.models.rebuild import policy_from_config, policy_from_description
from spotlight.tasks.shapes import VOCAB

torch.set_num_threads(1)

KINDS = ["tinydit", "sd3", "flux", "qwen-image"]
PROMPTS = ["a red circle", "two blue squares"]


def diffusers_config(family: str) -> DiffusersPolicyConfig:
    return DiffusersPolicyConfig(family=family, tiny=True, dtype="float32", lora_rank=4, lora_alpha=8.0, init_seed=7,
                                 task="shapes", vocab_size=len(VOCAB), max_text_len=8)


def make_policy(kind: str) -> Policy:
    if kind == "tinydit":
        return randomised_tinydit(TINY_SHAPES_CONFIG, seed=0, std=0.2)
    return DiffusersPolicy.from_config(diffusers_config(kind))


def perturb_trained(policy: Policy, seed: int) -> None:
    """Move every trainable tensor (LoRA's B starts at zero, which would hide the adapter)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in policy.trainable_parameters():
            parameter.add_(0.2 * torch.randn(parameter.shape, generator=generator))


def call(policy: Policy, seed: int = 3) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(len(PROMPTS), *policy.latent_shape, generator=generator)
    sigma = torch.tensor([0.8, 0.3])
    return policy(x, sigma, prompt_tokens(policy, PROMPTS))


@pytest.mark.parametrize("kind", KINDS)
def test_policy_is_recognised_and_predicts_a_velocity_of_the_latent_shape(kind: str) -> None:
    policy = make_policy(kind)
    assert isinstance(policy, Policy)
    tokens = prompt_tokens(policy, PROMPTS)
    assert tokens.shape == (2, policy.config.max_text_len) and tokens.dtype == torch.int64
    with torch.no_grad():
        velocity = call(policy)
    assert velocity.shape == (2, *policy.latent_shape) and torch.isfinite(velocity).all()
    assert not isinstance(torch.nn.Linear(2, 2), Policy)


@pytest.mark.parametrize("kind", KINDS)
def test_an_optimizer_step_on_the_trainable_parameters_changes_the_velocity(kind: str) -> None:
    policy = make_policy(kind)
    perturb_trained(policy, seed=1)
    trainable = policy.trainable_parameters()
    frozen = {name: p.detach().clone() for name, p in policy.named_parameters()
              if all(p is not t for t in trainable)}
    if kind == "tinydit":
        assert not frozen and len(trainable) == len(list(policy.parameters()))
    else:
        assert frozen and all("lora_" in name for name, p in policy.named_parameters() if p.requires_grad)
    with torch.no_grad():
        before = call(policy)
    optimizer = torch.optim.SGD(trainable, lr=0.1)
    call(policy).square().mean().backward()
    optimizer.step()
    with torch.no_grad():
        assert not torch.equal(call(policy), before)
    assert all(torch.equal(p, frozen[name]) for name, p in policy.named_parameters() if name in frozen)


@pytest.mark.parametrize("kind", KINDS)
def test_broadcast_state_loaded_into_a_policy_rebuilt_from_its_description_reproduces_it(kind: str) -> None:
    policy = make_policy(kind)
    perturb_trained(policy, seed=2)
    state = policy.broadcast_state()
    description = json.loads(json.dumps(policy.describe()))  # plain JSON, as model.json stores it
    rebuilt = policy_from_description(description)
    with torch.no_grad():
        expected = call(policy)
        assert not torch.equal(call(rebuilt), expected)
        rebuilt.load_broadcast_state({name: tensor.numpy() for name, tensor in state.items()})  # as Ray sends it
        assert torch.equal(call(rebuilt), expected)
    if kind == "tinydit":
        assert set(state) == set(policy.state_dict())
    else:  # only the LoRA matrices travel: the base comes from the description (init_seed)
        assert state and all(".lora_A." in name or ".lora_B." in name for name in state)
        assert sum(t.numel() for t in state.values()) < sum(p.numel() for p in policy.parameters()) / 2
        assert description["base"] == {"tiny": True, "init_seed": 7}
    with pytest.raises((ValueError, RuntimeError)):
        rebuilt.load_broadcast_state({**state, "not.a.weight": torch.zeros(1)})


@pytest.mark.parametrize("kind", ["sd3", "flux", "qwen-image"])
def test_a_diffusers_policy_built_twice_from_its_config_is_bit_identical_and_leaves_the_rng_alone(kind: str) -> None:
    torch.manual_seed(123)
    expected_draw = torch.rand(3)
    torch.manual_seed(123)
    first = policy_from_config(diffusers_config(kind))
    assert torch.equal(torch.rand(3), expected_draw)  # building did not consume the caller's random stream
    second = policy_from_config(diffusers_config(kind))
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), second.state_dict().values(),
                                                 strict=True))


def test_a_tiny_diffusers_policy_without_init_seed_cannot_describe_its_base() -> None:
    policy = DiffusersPolicy.from_config(diffusers_config("sd3").model_copy(update={"init_seed": None}))
    with pytest.raises(ValueError, match="set init_seed"):
        policy.describe()


@pytest.mark.parametrize("kind", KINDS)
def test_attention_hook_routes_every_block_and_plain_sdpa_changes_nothing(kind: str) -> None:
    policy = make_policy(kind)
    perturb_trained(policy, seed=4)
    calls: list[tuple[int, ...]] = []

    def spy(q, k, v, key_padding_mask):
        calls.append(tuple(q.shape))
        return sdpa_attention(q, k, v, key_padding_mask)

    with torch.no_grad():
        default = call(policy)
        policy.attention_fn = spy
        routed = call(policy)
    expected_calls = policy.config.depth if kind == "tinydit" else len(policy.transformer.attn_processors)
    assert len(calls) == expected_calls
    torch.testing.assert_close(routed, default, atol=1e-6, rtol=0)
