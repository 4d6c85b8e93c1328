"""The diffusers adapter: SD3, FLUX and Qwen-Image from tiny random configs (no download), on CPU."""

import copy
import math

import pytest
import torch

from spotlight.config import ConfigError, TrainSection, parse_config
from spotlight.diffusion.sampler import SamplingPlan, sample
from spotlight.models.attention import sdpa_attention
from spotlight.models.pipelines.adapter import DiffusersPolicy
from spotlight.models.pipelines.family_config import DEFAULT_LORA_TARGETS, DiffusersPolicyConfig
from spotlight.models.pipelines.inputs import (
    PromptEmbeddings,
    latent_image_ids,
    pack_latents,
    transformer_velocity,
    unpack_latents,
)
from spotlight.models.pipelines.loading import DiffusersLoadError, build_tiny_transformer, load_transformer
from spotlight.rl.grpo import RolloutBatch, grpo_update

torch.set_num_threads(1)

FAMILIES = ["sd3", "flux", "qwen-image"]
TEXT_TOKENS = 6
NOISE_LEVEL = 0.7


def tiny_config(family: str, **fields) -> DiffusersPolicyConfig:
    return DiffusersPolicyConfig(family=family, tiny=True, dtype="float32", lora_rank=4, lora_alpha=8.0, **fields)


def tiny_policy(family: str, seed: int = 0) -> DiffusersPolicy:
    torch.manual_seed(seed)
    return DiffusersPolicy.from_config(tiny_config(family))


def randomise_lora(policy: DiffusersPolicy, seed: int, scale: float = 0.2) -> None:
    """Give every LoRA matrix random values, so the adapter changes the output (B is zero at init)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in policy.trainable_parameters():
            parameter.copy_(scale * torch.randn(parameter.shape, generator=generator))


def prompt_embeddings(policy: DiffusersPolicy, batch: int, seed: int = 1) -> PromptEmbeddings:
    """Random embeddings of the policy's widths; Qwen-Image gets a mask with padding in every other row."""
    generator = torch.Generator().manual_seed(seed)
    width, pooled_width = policy.prompt_dims
    pooled = None if pooled_width is None else torch.randn(batch, pooled_width, generator=generator)
    mask = None
    if policy.family == "qwen-image":
        mask = torch.ones(batch, TEXT_TOKENS, dtype=torch.bool)
        mask[1::2, -2:] = False
    return PromptEmbeddings(torch.randn(batch, TEXT_TOKENS, width, generator=generator), pooled, mask)


def latents_and_sigmas(policy: DiffusersPolicy, batch: int, seed: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, *policy.latent_shape, generator=generator), torch.rand(batch, generator=generator)


# --- latent packing: the pipelines' layout, written out by hand ---------------------------------------------------

def test_pack_latents_makes_one_channel_major_token_per_2x2_patch() -> None:
    c, h, w = torch.meshgrid(torch.arange(2), torch.arange(2), torch.arange(4), indexing="ij")
    x = (100 * c + 10 * h + w).float()[None]  # value = 100 * channel + 10 * row + column
    packed = pack_latents(x)
    assert packed.shape == (1, 2, 8)
    assert packed[0, 0].tolist() == [0, 1, 10, 11, 100, 101, 110, 111]
    assert packed[0, 1].tolist() == [2, 3, 12, 13, 102, 103, 112, 113]
    x = torch.randn(3, 4, 6, 8)
    assert torch.equal(unpack_latents(pack_latents(x), 6, 8), x)


def test_latent_image_ids_are_row_and_column_of_the_packed_grid() -> None:
    expected = [[0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 1, 0], [0, 1, 1], [0, 1, 2]]
    assert latent_image_ids(2, 3).tolist() == expected


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_embeds_sigma_as_timestep_1000_sigma(family: str) -> None:
    """The sinusoidal timestep features equal [cos, sin](1000 sigma * 10000^(-i/128)), whatever each
    family's own timestep argument is (SD3 takes 1000 sigma, FLUX and Qwen-Image sigma)."""
    policy = tiny_policy(family)
    x, _ = latents_and_sigmas(policy, 2)
    sigma = torch.tensor([0.9, 0.25])
    seen: list[torch.Tensor] = []
    hook = policy.transformer.time_text_embed.time_proj.register_forward_hook(
        lambda module, args, out: seen.append(out.detach()))
    with torch.no_grad():
        policy(x, sigma, prompt_embeddings(policy, 2))
    hook.remove()
    frequencies = torch.exp(-math.log(10000.0) * torch.arange(128, dtype=torch.float64) / 128)

    def features(t: torch.Tensor) -> torch.Tensor:
        angles = t.double()[:, None] * frequencies[None]
        return torch.cat([angles.cos(), angles.sin()], dim=1).float()

    torch.testing.assert_close(seen[0], features(1000 * sigma), atol=2e-3, rtol=0)
    if family == "flux":  # the guidance-distilled embedding: the same features of 1000 * guidance_scale
        torch.testing.assert_close(seen[1], features(torch.full((2,), 1000 * 3.5)), atol=2e-3, rtol=0)


# --- LoRA, the reference policy --------------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_only_lora_weights_are_trainable(family: str) -> None:
    policy = tiny_policy(family)
    trainable = {name for name, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in name or ".lora_B." in name for name in trainable)
    assert {id(p) for p in policy.trainable_parameters()} == {id(p) for p in policy.parameters() if p.requires_grad}
    adapted = {name.split(".lora_")[0] for name in trainable}
    assert all(name.endswith(DEFAULT_LORA_TARGETS) for name in adapted)


@pytest.mark.parametrize("family", FAMILIES)
def test_zero_initialised_lora_policy_equals_its_reference(family: str) -> None:
    policy = tiny_policy(family)
    assert all(torch.count_nonzero(p) == 0 for n, p in policy.named_parameters() if ".lora_B." in n)
    x, sigma = latents_and_sigmas(policy, 2)
    cond = prompt_embeddings(policy, 2)
    with torch.no_grad():
        assert torch.equal(policy(x, sigma, cond), policy.reference()(x, sigma, cond))


@pytest.mark.parametrize("family", FAMILIES)
def test_disabled_adapter_reproduces_the_base_model_before_injection(family: str) -> None:
    torch.manual_seed(0)
    transformer = build_tiny_transformer(family)
    before_injection = copy.deepcopy(transformer)
    policy = DiffusersPolicy(transformer, tiny_config(family))
    randomise_lora(policy, seed=3)
    x, sigma = latents_and_sigmas(policy, 2)
    cond = prompt_embeddings(policy, 2)
    with torch.no_grad():
        base = transformer_velocity(before_injection, family, x, sigma, cond)
        assert not torch.allclose(policy(x, sigma, cond), base)  # the adapter is live
        assert torch.equal(policy.reference()(x, sigma, cond), base)
    assert all(p.requires_grad for p in policy.trainable_parameters())  # the reference left training on
    policy.requires_grad_(False)  # e.g. a frozen copy for rollouts: peft's re-enable must not unfreeze it
    with torch.no_grad():
        policy.reference()(x, sigma, cond)
    assert not any(p.requires_grad for p in policy.parameters())


def test_lora_trains_in_float32_over_a_bfloat16_base() -> None:
    torch.manual_seed(0)
    policy = DiffusersPolicy.from_config(tiny_config("sd3").model_copy(update={"dtype": "bfloat16"}))
    assert {p.dtype for p in policy.trainable_parameters()} == {torch.float32}
    assert {p.dtype for n, p in policy.named_parameters() if "lora_" not in n} == {torch.bfloat16}
    x, sigma = latents_and_sigmas(policy, 2)
    velocity = policy(x, sigma, prompt_embeddings(policy, 2))
    assert velocity.dtype == torch.float32 and torch.isfinite(velocity).all()
    velocity.square().mean().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in policy.trainable_parameters())


# --- rollout and GRPO -------------------------------------------------------------------------------------------

def rollout(policy: DiffusersPolicy, cond: PromptEmbeddings, num_steps: int) -> RolloutBatch:
    plan = SamplingPlan(num_steps=num_steps, shift=3.0, sampler="sde", noise_level=NOISE_LEVEL)
    seeds = list(range(10, 10 + len(cond)))
    trajectory = sample(lambda x, sigma: policy(x, sigma, cond), seeds, plan, policy.latent_shape)
    advantages = torch.tensor([1.0, -1.0] * (len(cond) // 2))
    return RolloutBatch(latents=trajectory.latents, log_probs=trajectory.log_probs, tokens=cond,
                        advantages=advantages, sigmas=plan.sigmas(), noise_level=NOISE_LEVEL)


@pytest.mark.parametrize("family", FAMILIES)
def test_sde_rollout_gives_finite_latents_and_log_probs(family: str) -> None:
    policy = tiny_policy(family)
    batch = rollout(policy, prompt_embeddings(policy, 2), num_steps=2)
    assert batch.latents.shape == (2, 3, *policy.latent_shape)
    assert batch.log_probs.shape == (2, 2)
    assert torch.isfinite(batch.latents).all() and torch.isfinite(batch.log_probs).all()
    assert not torch.equal(batch.latents[:, -1], batch.latents[:, 0])


@pytest.mark.parametrize("family", FAMILIES)
def test_grpo_step_trains_lora_and_leaves_every_base_weight_bit_equal(family: str) -> None:
    policy = tiny_policy(family)
    cond = prompt_embeddings(policy, 4)[torch.tensor([0, 0, 1, 1])]  # two prompts, groups of two
    batch = rollout(policy, cond, num_steps=2)
    lora_before = policy.lora_state_dict()
    base_before = {n: t.clone() for n, t in policy.state_dict().items() if "lora_" not in n}
    x, sigma = batch.latents[:, 1], torch.full((4,), float(batch.sigmas[1]))
    with torch.no_grad():
        velocity_before = policy(x, sigma, cond)

    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-2, weight_decay=0.0)
    config = TrainSection(learning_rate=1e-2, kl_beta=0.1, num_minibatches=1)  # one minibatch: on-policy
    metrics = grpo_update(policy, policy.reference(), optimizer, batch, config, torch.Generator().manual_seed(0))

    assert metrics["train/ratio"] == pytest.approx(1.0, abs=1e-5)  # the rollout's own policy: on-policy
    assert all(torch.equal(t, base_before[n]) for n, t in policy.state_dict().items() if "lora_" not in n)
    assert all(p.grad is None for n, p in policy.named_parameters() if "lora_" not in n)
    lora_after = policy.lora_state_dict()
    # With B = 0 the gradient reaching A (through B) is exactly zero: only the B matrices move.
    assert all(torch.equal(lora_after[n], t) for n, t in lora_before.items() if ".lora_A." in n)
    assert any(not torch.equal(lora_after[n], t) for n, t in lora_before.items() if ".lora_B." in n)
    with torch.no_grad():
        assert not torch.equal(policy(x, sigma, cond), velocity_before)
        assert torch.equal(policy.reference()(x, sigma, cond), velocity_before)


# --- checkpoints and loading -------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_lora_saved_and_loaded_into_a_fresh_policy_reproduces_outputs_exactly(family: str, tmp_path) -> None:
    torch.manual_seed(0)
    build_tiny_transformer(family).save_pretrained(tmp_path / "pipeline" / "transformer")
    fields = dict(dtype="float32", latent_size=8, lora_rank=4, lora_alpha=8.0)
    trained = DiffusersPolicy.from_pretrained(str(tmp_path / "pipeline"), family, **fields)
    randomise_lora(trained, seed=4)
    path = trained.save_lora(tmp_path / "lora" / "policy.safetensors")
    fresh = DiffusersPolicy.from_pretrained(str(tmp_path / "pipeline"), family, **fields)
    x, sigma = latents_and_sigmas(trained, 2)
    cond = prompt_embeddings(trained, 2)
    with torch.no_grad():
        assert not torch.equal(fresh(x, sigma, cond), trained(x, sigma, cond))
        fresh.load_lora(path)
        assert torch.equal(fresh(x, sigma, cond), trained(x, sigma, cond))
    assert [p.name for p in path.parent.iterdir()] == ["policy.safetensors"]  # no staging file left


def test_lora_file_of_another_rank_is_refused_naming_the_rank(tmp_path) -> None:
    torch.manual_seed(0)
    path = DiffusersPolicy.from_config(tiny_config("sd3")).save_lora(tmp_path / "lora.safetensors")
    torch.manual_seed(0)
    other = DiffusersPolicy.from_config(tiny_config("sd3").model_copy(update={"lora_rank": 2}))
    with pytest.raises(ValueError, match="lora_rank=4"):
        other.load_lora(path)
    with pytest.raises(DiffusersLoadError, match="does not exist"):
        other.load_lora(tmp_path / "missing.safetensors")


def test_missing_local_folder_is_named_in_the_error(tmp_path) -> None:
    with pytest.raises(DiffusersLoadError, match="no such folder"):
        load_transformer("sd3", str(tmp_path / "absent"))
    with pytest.raises(DiffusersLoadError, match="transformer/config.json"):
        load_transformer("sd3", str(tmp_path))


def test_folder_of_another_family_is_refused_naming_its_family(tmp_path) -> None:
    torch.manual_seed(0)
    build_tiny_transformer("flux").save_pretrained(tmp_path / "transformer")
    with pytest.raises(DiffusersLoadError, match="set family: flux"):
        load_transformer("sd3", str(tmp_path))
    assert type(load_transformer("flux", str(tmp_path / "transformer"), torch.float32)).__name__ == (
        "FluxTransformer2DModel")


@pytest.mark.filterwarnings("ignore:The `local_dir_use_symlinks` argument is deprecated")
def test_hub_id_without_hub_access_says_to_download_elsewhere(monkeypatch) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(DiffusersLoadError, match="download it on a machine with access and pass the local folder"):
        load_transformer("flux", "no-such-org/no-such-model")


def test_config_needs_exactly_one_of_pretrained_and_tiny() -> None:
    with pytest.raises(ConfigError, match="exactly one of pretrained"):
        parse_config(DiffusersPolicyConfig, {"family": "sd3"})
    with pytest.raises(ConfigError, match="exactly one of pretrained"):
        parse_config(DiffusersPolicyConfig, {"family": "sd3", "tiny": True, "pretrained": "x/y"})
    with pytest.raises(ConfigError, match="family"):
        parse_config(DiffusersPolicyConfig, {"family": "sdxl", "tiny": True})
    config = parse_config(DiffusersPolicyConfig, {"family": "qwen-image", "pretrained": "Qwen/Qwen-Image"})
    assert config.target_modules == DEFAULT_LORA_TARGETS and config.resolved_latent_size == 128


# --- attention routing (the hook for sequence parallelism) -------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_joint_attention_routed_through_sdpa_reproduces_diffusers_processors(family: str) -> None:
    policy = tiny_policy(family)
    randomise_lora(policy, seed=5)
    x, sigma = latents_and_sigmas(policy, 2)
    cond = prompt_embeddings(policy, 2)
    calls: list[tuple[tuple[int, ...], torch.Tensor | None]] = []

    def spy(q, k, v, key_padding_mask):
        calls.append((tuple(q.shape), key_padding_mask))
        return sdpa_attention(q, k, v, key_padding_mask)

    with torch.no_grad():
        default = policy(x, sigma, cond)
        policy.attention_fn = spy
        routed = policy(x, sigma, cond)
        policy.attention_fn = None
        restored = policy(x, sigma, cond)
    assert torch.equal(routed, default) and torch.equal(restored, default)
    assert len(calls) == len(policy.transformer.attn_processors)
    image_tokens = x.shape[-1] * x.shape[-2] // 4  # 2x2 patches (SD3's patch_size 2, the others' packing)
    config = policy.transformer.config
    joint = [shape for shape, _ in calls if shape[2] == TEXT_TOKENS + image_tokens]
    assert joint and all(shape[:2] == (2, config.num_attention_heads) for shape, _ in calls)
    if family == "qwen-image":
        mask = calls[0][1]
        assert mask is not None and mask.sum() == mask.numel() - 2
        assert not mask[1, TEXT_TOKENS - 2:TEXT_TOKENS].any()  # [text; image] order, row 1's padding


def test_qwen_image_ignores_masked_prompt_tokens() -> None:
    policy = tiny_policy("qwen-image")
    randomise_lora(policy, seed=6)
    x, sigma = latents_and_sigmas(policy, 2)
    cond = prompt_embeddings(policy, 2)
    changed = cond.embeds.clone()
    changed[1, -2:] += 5.0  # only the padding of row 1
    with torch.no_grad():
        velocity = policy(x, sigma, cond)
        other = policy(x, sigma, PromptEmbeddings(changed, None, cond.mask))
    torch.testing.assert_close(other, velocity, atol=1e-6, rtol=0)
    with torch.no_grad():
        assert not torch.equal(policy(x, sigma, PromptEmbeddings(changed, None, None)), velocity)
