"""A pipeline folder as a policy, against the family's own diffusers pipeline as the independent reference.

Parity: prompt embeddings equal ``pipe.encode_prompt``; Spotlight's ODE rollout of a prompt and seed
(its sampler, schedule, CFG and VAE decode) equals ``pipe(prompt, latents=same, ...)`` with guidance 1
and > 1. Then what the loop relies on: CFG-free rows, mixed batches, shared frozen parts, full
fine-tuning, any device in.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from spotlight.diffusion.noise import initial_latents
from spotlight.diffusion.sampler import SamplingPlan, sample
from spotlight.models.pipelines.family_config import DiffusersPolicyConfig
from spotlight.models.pipelines.inputs import pack_latents, unpack_latents
from spotlight.models.pipelines.policy import PipelinePolicy
from spotlight.models.rebuild import policy_from_config

FAMILIES = ("sd3", "flux", "qwen-image")
PROMPT = "a red circle left of a blue square"
NEGATIVE = "blurry"
STEPS = 3
# long enough that no test prompt is truncated (character tokens); Qwen-Image's includes its chat template
MAX_SEQUENCE_LENGTH = {"sd3": 64, "flux": 64, "qwen-image": 512}


def pipeline_policy(folder: Path, family: str, guidance_scale: float = 1.0, **fields) -> PipelinePolicy:
    config = DiffusersPolicyConfig(family=family, pretrained=str(folder), pipeline=True, resolution=(32, 32),
                                   dtype="float32", guidance_scale=guidance_scale, negative_prompt=NEGATIVE,
                                   max_sequence_length=MAX_SEQUENCE_LENGTH[family], **fields)
    policy = policy_from_config(config)
    assert isinstance(policy, PipelinePolicy)
    return policy.eval()


@pytest.fixture(scope="module")
def pipelines(tiny_pipeline) -> dict:
    """Each family's diffusers pipeline, loaded once (the reference)."""
    import diffusers

    loaded = {}
    for family in FAMILIES:
        pipe = diffusers.DiffusionPipeline.from_pretrained(str(tiny_pipeline(family)))
        pipe.set_progress_bar_config(disable=True)
        loaded[family] = pipe
    return loaded


def spotlight_ode(policy: PipelinePolicy, prompt: str, seed: int) -> torch.Tensor:
    schedule = policy.schedule()
    plan = SamplingPlan(num_steps=STEPS, shift=schedule.shift, sampler="ode", grid_end=schedule.grid_end,
                        shift_terminal=schedule.shift_terminal)
    tokens = policy.tokenize([prompt])
    return sample(lambda x, sigma: policy(x, sigma, tokens), [seed], plan, policy.latent_shape).final


def pipeline_call(pipe, family: str, latents: torch.Tensor, guidance_scale: float, output_type: str) -> torch.Tensor:
    """The family pipeline's own call, from the same initial latents."""
    common = dict(num_inference_steps=STEPS, height=32, width=32, output_type=output_type,
                  max_sequence_length=MAX_SEQUENCE_LENGTH[family])
    if family == "sd3":
        return pipe(PROMPT, latents=latents, guidance_scale=guidance_scale, negative_prompt=NEGATIVE, **common).images
    if family == "flux":  # the tiny FLUX is guidance-distilled: the scale is its guidance input
        out = pipe(PROMPT, latents=pack_latents(latents), guidance_scale=guidance_scale, **common).images
    else:
        out = pipe(PROMPT, latents=pack_latents(latents), true_cfg_scale=guidance_scale, negative_prompt=NEGATIVE,
                   **common).images
    return out if output_type == "pt" else unpack_latents(out, *latents.shape[-2:])


@pytest.mark.parametrize("family", FAMILIES)
def test_prompt_embeddings_equal_the_pipelines_encode_prompt(family: str, tiny_pipeline, pipelines) -> None:
    policy = pipeline_policy(tiny_pipeline(family), family)
    ids = policy.tokenize([PROMPT, "two green triangles"])[:, 0]
    mine = policy.prompts.embeddings(ids[:1])
    pipe, length = pipelines[family], MAX_SEQUENCE_LENGTH[family]
    with torch.no_grad():  # as the pipeline's __call__ runs it
        if family == "sd3":
            embeds, _, pooled, _ = pipe.encode_prompt(PROMPT, None, None, do_classifier_free_guidance=False,
                                                      max_sequence_length=length)
        elif family == "flux":
            embeds, pooled, _ = pipe.encode_prompt(PROMPT, None, max_sequence_length=length)
        else:
            (embeds, _), pooled = pipe.encode_prompt(PROMPT, max_sequence_length=length), None
    assert torch.equal(mine.embeds, embeds)
    assert pooled is None or torch.equal(mine.pooled, pooled)
    other = policy.prompts.embeddings(ids[1:]).embeds
    assert other.shape != mine.embeds.shape or not torch.equal(other, mine.embeds)


@pytest.mark.parametrize("guidance_scale", [1.0, 4.0])
@pytest.mark.parametrize("family", FAMILIES)
def test_an_ode_rollout_equals_the_family_pipelines_own_call(family: str, guidance_scale: float, tiny_pipeline,
                                                             pipelines) -> None:
    policy = pipeline_policy(tiny_pipeline(family), family, guidance_scale)
    final = spotlight_ode(policy, PROMPT, seed=11)
    expected = pipeline_call(pipelines[family], family, initial_latents([11], policy.latent_shape), guidance_scale,
                             "latent")
    assert final.abs().max() > 0.5  # a real sample, not zeros
    torch.testing.assert_close(final, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_decoded_images_equal_the_pipelines_pt_output(family: str, tiny_pipeline, pipelines) -> None:
    """The VAE step: the family's scaling / shift (SD3, FLUX) or latents mean / std (Qwen-Image), [0, 1]."""
    policy = pipeline_policy(tiny_pipeline(family), family, 2.0)
    images = policy.decode_images(spotlight_ode(policy, PROMPT, seed=5))
    expected = pipeline_call(pipelines[family], family, initial_latents([5], policy.latent_shape), 2.0, "pt")
    assert images.shape == (1, 3, 32, 32)
    torch.testing.assert_close(images, expected, rtol=0, atol=1e-5)


def test_guidance_changes_the_sample_and_unguided_rows_are_the_conditional_velocity(tiny_pipeline) -> None:
    folder = tiny_pipeline("sd3")
    guided, plain = pipeline_policy(folder, "sd3", 4.0), pipeline_policy(folder, "sd3", 1.0)
    x = initial_latents([1, 2], plain.latent_shape)
    sigma = torch.full((2,), 0.7)
    conditional = plain(x, sigma, plain.tokenize([PROMPT, PROMPT]))
    assert not torch.allclose(guided(x, sigma, guided.tokenize([PROMPT, PROMPT])), conditional, atol=1e-4)
    torch.testing.assert_close(guided(x, sigma, guided.tokenize([PROMPT, PROMPT], guided=False)), conditional)


@pytest.mark.parametrize("family", ["sd3", "qwen-image"])
def test_a_batch_of_guided_and_unguided_rows_equals_each_row_alone(family: str, tiny_pipeline) -> None:
    policy = pipeline_policy(tiny_pipeline(family), family, 3.0)
    x = initial_latents([1, 2, 3], policy.latent_shape)
    sigma = torch.tensor([0.9, 0.5, 0.2])
    guided = policy.tokenize([PROMPT, "a blue square", "three red circles"])
    mixed = guided.clone()
    mixed[1, 1] = 0
    together = policy(x, sigma, mixed)
    for row in range(3):
        alone = policy(x[row:row + 1], sigma[row:row + 1], mixed[row:row + 1])
        torch.testing.assert_close(together[row:row + 1], alone, rtol=0, atol=2e-5)


def test_prompt_ids_are_the_same_in_every_process_and_unknown_ids_are_refused(tiny_pipeline) -> None:
    folder = tiny_pipeline("flux")
    first, second = pipeline_policy(folder, "flux"), pipeline_policy(folder, "flux")
    assert torch.equal(first.tokenize([PROMPT, "x"]), second.tokenize([PROMPT, "x"]))
    fresh = pipeline_policy(folder, "flux")
    with pytest.raises(KeyError, match="never encoded in this process"):
        fresh(initial_latents([0], fresh.latent_shape), torch.ones(1), first.tokenize(["not seen here"]))


def test_copies_of_a_policy_share_the_text_encoders_and_the_vae(tiny_pipeline) -> None:
    policy = pipeline_policy(tiny_pipeline("qwen-image"), "qwen-image")
    twin = copy.deepcopy(policy)
    assert twin.prompts is policy.prompts and twin.decoder is policy.decoder
    assert twin.transformer is not policy.transformer
    assert not any("text_encoder" in name or "vae" in name for name in policy.state_dict())


def test_full_fine_tuning_trains_and_broadcasts_every_transformer_weight(tiny_pipeline) -> None:
    folder = tiny_pipeline("sd3")
    policy = pipeline_policy(folder, "sd3", finetune="full")
    assert len(policy.trainable_parameters()) == len(list(policy.transformer.parameters()))
    tokens = policy.tokenize([PROMPT])
    x = initial_latents([3], policy.latent_shape)
    policy(x, torch.full((1,), 0.5), tokens).square().mean().backward()
    assert all(parameter.grad is not None for parameter in policy.trainable_parameters())
    with torch.no_grad():
        for parameter in policy.trainable_parameters():
            parameter.add_(0.01 * torch.randn_like(parameter))
    rebuilt = pipeline_policy(folder, "sd3", finetune="full")
    rebuilt.load_broadcast_state(policy.broadcast_state())
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(x, torch.full((1,), 0.5), rebuilt.tokenize([PROMPT])),
                                   policy(x, torch.full((1,), 0.5), tokens))


def test_the_forward_answers_on_the_callers_device_and_dtype(tiny_pipeline) -> None:
    policy = pipeline_policy(tiny_pipeline("flux"), "flux")
    x = initial_latents([0], policy.latent_shape).double()
    velocity = policy(x, torch.ones(1), policy.tokenize([PROMPT]))
    assert velocity.dtype == torch.float64 and velocity.device == x.device


def test_a_process_conditions_on_prompts_another_encoded_without_encoding_them(tiny_pipeline) -> None:
    """K trainer ranks each encode their share of an iteration's prompts and adopt the others' embeddings: the
    adopting process's forward equals the encoding one's, with its text encoders never loaded."""
    folder = tiny_pipeline("sd3")
    encoder, adopter = pipeline_policy(folder, "sd3"), pipeline_policy(folder, "sd3")
    prompts = [PROMPT, "a blue square"]
    adopter.adopt_prompt_conditioning(encoder.prompt_conditioning(prompts))
    adopter.load_broadcast_state(encoder.broadcast_state())
    adopter.prompts.release()  # any encoding would now raise
    x = initial_latents([0, 1], encoder.latent_shape)
    sigma = torch.full((2,), 0.7)
    with torch.no_grad():
        assert torch.equal(adopter(x, sigma, adopter.tokenize(prompts, guided=False)),
                           encoder(x, sigma, encoder.tokenize(prompts, guided=False)))


def test_released_text_encoders_serve_cached_prompts_and_refuse_new_ones(tiny_pipeline) -> None:
    policy = pipeline_policy(tiny_pipeline("flux"), "flux")
    rows = policy.tokenize([PROMPT, "a blue square", PROMPT])  # warm the cache (one encoding pass)
    assert rows[0, 0] == rows[2, 0] and rows[0, 0] != rows[1, 0]
    policy.prompts.release()
    assert torch.equal(policy.tokenize([PROMPT]), rows[:1])
    with pytest.raises(RuntimeError, match="text encoders were released"):
        policy.tokenize(["a prompt never seen"])


def test_validation_samples_a_pipeline_checkpoint_on_its_own_schedule(tiny_pipeline) -> None:
    """`spotlight eval` passes no schedule: evaluate() takes the policy's, so its images are the pipeline's."""
    from brightness_reward import Brightness

    from spotlight.loop.evaluation import evaluate, validation_seeds

    policy = pipeline_policy(tiny_pipeline("flux"), "flux")
    result = evaluate(policy, [PROMPT], Brightness(), seeds_per_prompt=1, num_steps=STEPS, shift=1.0)
    expected = policy.decode_images(spotlight_ode(policy, PROMPT, validation_seeds(1, 1)[0]))
    torch.testing.assert_close(result.images, expected)


def test_a_flux_without_guidance_embedding_takes_true_cfg_like_its_pipeline(tiny_pipeline, tmp_path: Path) -> None:
    """FLUX.1-schnell-like (guidance_embeds false): guidance is true CFG against the negative prompt, as
    FluxPipeline's true_cfg_scale does it."""
    import json
    import shutil

    import diffusers

    folder = tmp_path / "flux-cfg"
    shutil.copytree(tiny_pipeline("flux"), folder)
    config_file = folder / "transformer" / "config.json"
    config_file.write_text(json.dumps(json.loads(config_file.read_text()) | {"guidance_embeds": False}))
    policy = pipeline_policy(folder, "flux", 3.0)
    assert policy.true_cfg
    pipe = diffusers.DiffusionPipeline.from_pretrained(str(folder))
    pipe.set_progress_bar_config(disable=True)
    latents = initial_latents([9], policy.latent_shape)
    expected = pipe(PROMPT, latents=pack_latents(latents), true_cfg_scale=3.0, negative_prompt=NEGATIVE,
                    num_inference_steps=STEPS, height=32, width=32, output_type="latent",
                    max_sequence_length=MAX_SEQUENCE_LENGTH["flux"]).images
    torch.testing.assert_close(spotlight_ode(policy, PROMPT, seed=9), unpack_latents(expected, *latents.shape[-2:]),
                               rtol=0, atol=1e-5)
