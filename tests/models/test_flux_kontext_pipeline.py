"""A tiny FLUX.1 Kontext folder as an edit policy, against ``FluxKontextPipeline`` itself (issue 45).

A sample is a dataset row: an instruction and the source image it edits, one string through the loop
(`spotlight.data.edit_key`). The source image's latents ride in the row's conditioning,
packed after the target's tokens with RoPE ids whose first channel is 1. Spotlight's ODE rollout equals
``FluxKontextPipeline.__call__`` from the same initial latents, steps and guidance (``max_area = H * W``
and ``_auto_resize=False``: the pipeline would otherwise resize the source to ~1 MP), and a LoRA Spotlight
exports loads with the pipeline's own ``load_lora_weights`` and changes its output as it changes Spotlight's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from spotlight.data.edit_key import edit_sample_key, split_sample_key
from spotlight.diffusion.noise import initial_latents
from spotlight.diffusion.sampler import SamplingPlan, sample
from spotlight.models.pipelines.family_config import DiffusersPolicyConfig
from spotlight.models.pipelines.folder import read_pipeline_folder
from spotlight.models.pipelines.policy import PipelinePolicy
from spotlight.models.rebuild import policy_from_config

INSTRUCTION = "make the circle blue"
STEPS = 2
SIZE = 32
LENGTH = 32
LATENT = SIZE // 2  # the tiny VAE halves each side


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A 32 x 32 source image: a red disc on grey."""
    from PIL import Image, ImageDraw

    path = tmp_path_factory.mktemp("edit") / "source.png"
    image = Image.new("RGB", (SIZE, SIZE), (128, 128, 128))
    ImageDraw.Draw(image).ellipse((6, 6, 25, 25), fill=(220, 30, 30))
    image.save(path)
    return path


@pytest.fixture(scope="module")
def pipe(tiny_pipeline):
    import diffusers

    loaded = diffusers.FluxKontextPipeline.from_pretrained(str(tiny_pipeline("flux-kontext")))
    loaded.set_progress_bar_config(disable=True)
    return loaded


def kontext_policy(folder: Path, **fields) -> PipelinePolicy:
    config = DiffusersPolicyConfig(family="flux", pretrained=str(folder), pipeline=True, resolution=(SIZE, SIZE),
                                   dtype="float32", guidance_scale=2.5, max_sequence_length=LENGTH, **fields)
    policy = policy_from_config(config)
    assert isinstance(policy, PipelinePolicy)
    return policy.eval()


def spotlight_ode(policy: PipelinePolicy, key: str, seed: int) -> torch.Tensor:
    schedule = policy.schedule()
    plan = SamplingPlan(num_steps=STEPS, shift=schedule.shift, sampler="ode", grid_end=schedule.grid_end,
                        shift_terminal=schedule.shift_terminal)
    tokens = policy.tokenize([key])
    return sample(lambda x, sigma: policy(x, sigma, tokens), [seed], plan, policy.latent_shape).final


def pipeline_call(pipe, source: Path, latents: torch.Tensor, output_type: str = "latent") -> torch.Tensor:
    from PIL import Image

    from spotlight.models.pipelines.inputs import pack_latents

    out = pipe(image=Image.open(source).convert("RGB"), prompt=INSTRUCTION, latents=pack_latents(latents),
               guidance_scale=2.5, height=SIZE, width=SIZE, num_inference_steps=STEPS, max_sequence_length=LENGTH,
               max_area=SIZE * SIZE, _auto_resize=False, output_type=output_type).images
    return out


def unpacked(tokens: torch.Tensor) -> torch.Tensor:
    from spotlight.models.pipelines.inputs import unpack_latents

    return unpack_latents(tokens, LATENT, LATENT)


def test_an_edit_key_names_the_row_not_the_instruction(tmp_path: Path) -> None:
    first, second = edit_sample_key(INSTRUCTION, tmp_path / "a.png"), edit_sample_key(INSTRUCTION, tmp_path / "b.png")
    assert first != second
    assert split_sample_key(first) == (INSTRUCTION, str((tmp_path / "a.png").resolve()))
    assert split_sample_key("a plain prompt") == ("a plain prompt", None)


def test_a_kontext_folder_reads_as_an_edit_pipeline_of_flux(tiny_pipeline) -> None:
    folder = read_pipeline_folder(tiny_pipeline("flux-kontext"))
    assert folder.family == "flux" and folder.edits
    assert not read_pipeline_folder(tiny_pipeline("flux")).edits


def test_an_ode_rollout_equals_kontext_pipelines_own_call(tiny_pipeline, pipe, source: Path) -> None:
    policy = kontext_policy(tiny_pipeline("flux-kontext"))
    key = edit_sample_key(INSTRUCTION, source)
    final = spotlight_ode(policy, key, seed=11)
    assert final.shape == (1, 4, LATENT, LATENT)
    expected = unpacked(pipeline_call(pipe, source, initial_latents([11], policy.latent_shape)))
    assert final.abs().max() > 0.5
    torch.testing.assert_close(final, expected, rtol=0, atol=1e-5)
    # the source image is an input: another source gives another edit
    from PIL import Image

    other = source.with_name("other.png")
    Image.new("RGB", (SIZE, SIZE), (10, 200, 10)).save(other)
    assert (spotlight_ode(policy, edit_sample_key(INSTRUCTION, other), seed=11) - final).abs().max() > 1e-3


def test_decoded_edits_equal_the_pipelines_pt_output(tiny_pipeline, pipe, source: Path) -> None:
    policy = kontext_policy(tiny_pipeline("flux-kontext"))
    images = policy.decode_images(spotlight_ode(policy, edit_sample_key(INSTRUCTION, source), seed=5))
    expected = pipeline_call(pipe, source, initial_latents([5], policy.latent_shape), "pt")
    assert images.shape == (1, 3, SIZE, SIZE)
    torch.testing.assert_close(images, expected, rtol=0, atol=1e-5)


def test_an_exported_lora_loads_into_kontext_pipeline_and_changes_its_edit(tiny_pipeline, source: Path,
                                                                           tmp_path: Path) -> None:
    import diffusers

    policy = kontext_policy(tiny_pipeline("flux-kontext"), lora_rank=2, lora_alpha=4.0)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for parameter in policy.trainable_parameters():
            parameter.normal_(0.0, 0.3)
    policy.save_for_diffusers(tmp_path)
    trained = spotlight_ode(policy, edit_sample_key(INSTRUCTION, source), seed=3)
    base = diffusers.FluxKontextPipeline.from_pretrained(str(tiny_pipeline("flux-kontext")))
    base.set_progress_bar_config(disable=True)
    latents = initial_latents([3], policy.latent_shape)
    before = unpacked(pipeline_call(base, source, latents))
    base.load_lora_weights(str(tmp_path))
    after = unpacked(pipeline_call(base, source, latents))
    assert (after - before).abs().max() > 1e-2  # the LoRA reached the pipeline's transformer
    torch.testing.assert_close(after, trained, rtol=0, atol=1e-4)


def test_make_tiny_pipeline_flux_kontext_writes_a_kontext_folder(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from spotlight.cli import app

    result = CliRunner().invoke(app, ["make-tiny-pipeline", "flux-kontext", str(tmp_path / "kontext")])
    assert result.exit_code == 0, result.output
    folder = read_pipeline_folder(tmp_path / "kontext")
    assert folder.edits and folder.index["_class_name"] == "FluxKontextPipeline"


def test_the_plan_counts_the_source_images_tokens(tiny_pipeline) -> None:
    """spotlight plan and the memory estimate see an edit's sequence: the target's tokens and the source's."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from spotlight.models.pipelines.inputs import PromptEmbeddings, transformer_velocity
    from spotlight.models.pipelines.loading import load_transformer
    from spotlight.sim.planning.forward_flops import count_forward_flops

    kontext, flux = read_pipeline_folder(tiny_pipeline("flux-kontext")), read_pipeline_folder(tiny_pipeline("flux"))
    counted = count_forward_flops(kontext, (SIZE, SIZE), LENGTH)
    plain = count_forward_flops(flux, (SIZE, SIZE), LENGTH)
    assert counted.image_tokens == 2 * plain.image_tokens == 2 * LATENT ** 2 // 4
    transformer = load_transformer("flux", str(kontext.path), torch.float32)
    latents = torch.randn(1, 4, LATENT, LATENT)
    cond = PromptEmbeddings(embeds=torch.randn(1, LENGTH, 32), pooled=torch.randn(1, 16),
                            image=torch.randn_like(latents))
    with FlopCounterMode(display=False) as meter, torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        transformer_velocity(transformer, "flux", latents, torch.tensor([0.5]), cond)
    assert counted.flops == pytest.approx(meter.get_total_flops(), rel=0.05)


def test_an_edit_row_on_a_text_to_image_folder_is_one_known_line(tiny_pipeline, source: Path) -> None:
    from spotlight.errors import is_known
    from spotlight.models.editing.condition import EditRowError

    policy = kontext_policy(tiny_pipeline("flux"))
    with pytest.raises(EditRowError, match="is an edit row .* holds a text-to-image pipeline") as raised:
        policy.tokenize([edit_sample_key(INSTRUCTION, source)])
    assert is_known(raised.value) and "\n" not in str(raised.value)


def test_rows_another_process_encoded_carry_their_source_latents(tiny_pipeline, source: Path) -> None:
    """K trainer ranks each encode part of an iteration's rows and hand them over (PromptCache.export / adopt)."""
    key = edit_sample_key(INSTRUCTION, source)
    encoder, receiver = (kontext_policy(tiny_pipeline("flux-kontext")) for _ in range(2))
    receiver.prompts.adopt(encoder.prompts.export([key]))
    row = receiver.prompts.row(encoder.prompts.ids([key]).item())
    assert row.image is not None and row.image.shape == (1, 4, LATENT, LATENT)
    torch.testing.assert_close(row.image, encoder.prompts.row(encoder.prompts.ids([key]).item()).image)
    tokens = torch.tensor([[encoder.prompts.ids([key]).item(), 0]])  # [prompt id, guided]: bound, not encoded
    assert receiver.bind_prompts(tokens).forward_embeddings(0).image.shape == (1, 4, LATENT, LATENT)
