"""A tiny Qwen-Image-Edit folder as an edit policy, against ``QwenImageEditPipeline`` itself (issue 45).

As with Kontext, a sample is a dataset row (instruction + source image) and the source's VAE latents
ride in the row's conditioning, packed after the target's tokens (a second entry of ``img_shapes``).
Unlike Kontext, the text encoder (Qwen2.5-VL) sees the source image too: the row's text embeddings are
``encode_prompt(instruction, image=source)``. The processor is transformers' ``Qwen2VLProcessor`` without
its video slot (`spotlight.models.editing.qwen_processor`: the full one cannot be built without
torchvision), handed to the pipeline here as Spotlight builds it.

The pipeline resizes every source to ~1 MP (``calculate_dimensions(1024 * 1024, ratio)``, no argument
changes it); Spotlight's samples share the run's resolution, so the source takes the target's size, as it
does for Kontext. The reference call therefore has that one sizing rule set to the target's size
(``calculate_dimensions`` patched in the pipeline's module); everything else is the pipeline's own code:
the same resize, processor, prompt template, VAE encode, schedule and transformer calls.
``QwenImageEditPlusPipeline`` (Qwen-Image-Edit-2509) is checked alike; its text encoder's view of the source
(~384 x 384 of the source's aspect) is its own rule, left as it is.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from spotlight.data.edit_key import edit_sample_key
from spotlight.diffusion.noise import initial_latents
from spotlight.diffusion.sampler import SamplingPlan, sample
from spotlight.models.pipelines.family_config import DiffusersPolicyConfig
from spotlight.models.pipelines.folder import read_pipeline_folder
from spotlight.models.pipelines.policy import PipelinePolicy
from spotlight.models.rebuild import policy_from_config

INSTRUCTION = "make the circle blue"
STEPS = 2
SIZE = 32
LATENT = SIZE // 2  # the tiny VAE halves each side
KINDS = {"qwen-image-edit": "QwenImageEditPipeline", "qwen-image-edit-plus": "QwenImageEditPlusPipeline"}


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A 32 x 32 source image: a red disc on grey."""
    from PIL import Image, ImageDraw

    path = tmp_path_factory.mktemp("edit") / "source.png"
    image = Image.new("RGB", (SIZE, SIZE), (128, 128, 128))
    ImageDraw.Draw(image).ellipse((6, 6, 25, 25), fill=(220, 30, 30))
    image.save(path)
    return path


def edit_pipeline(folder: Path):
    """The folder's own pipeline class ``.from_pretrained(folder)``, its processor built without torchvision."""
    import json

    import diffusers

    from spotlight.models.editing.qwen_processor import load_edit_processor

    name = json.loads((folder / "model_index.json").read_text())["_class_name"]
    loaded = getattr(diffusers, name).from_pretrained(str(folder), processor=load_edit_processor(folder))
    loaded.set_progress_bar_config(disable=True)
    return loaded


@pytest.fixture(scope="module", params=list(KINDS))
def kind(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def pipe(tiny_pipeline, kind):
    return edit_pipeline(tiny_pipeline(kind))


@pytest.fixture
def at_target_size(monkeypatch):
    """The pipelines' VAE sizing of the source (~1 MP) set to the target's, as Spotlight sizes it (module doc)."""
    import diffusers.pipelines.qwenimage.pipeline_qwenimage_edit as edit
    import diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus as plus

    monkeypatch.setattr(edit, "calculate_dimensions", lambda area, ratio: (SIZE, SIZE, None))
    own = plus.calculate_dimensions  # Edit-2509's text-encoder size (CONDITION_IMAGE_SIZE) stays its own
    monkeypatch.setattr(plus, "calculate_dimensions",
                        lambda area, ratio: (SIZE, SIZE) if area == plus.VAE_IMAGE_SIZE else own(area, ratio))


def edit_policy(folder: Path, **fields) -> PipelinePolicy:
    config = DiffusersPolicyConfig(family="qwen-image", pretrained=str(folder), pipeline=True,
                                   resolution=(SIZE, SIZE), dtype="float32", guidance_scale=1.0, **fields)
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

    from spotlight.models.pipelines.inputs import pack_latents, unpack_latents

    out = pipe(image=Image.open(source).convert("RGB"), prompt=INSTRUCTION, latents=pack_latents(latents),
               true_cfg_scale=1.0, height=SIZE, width=SIZE, num_inference_steps=STEPS,
               output_type=output_type).images
    return unpack_latents(out, LATENT, LATENT) if output_type == "latent" else out


def test_a_qwen_edit_folder_reads_as_an_edit_pipeline_of_qwen_image(tiny_pipeline, kind) -> None:
    folder = read_pipeline_folder(tiny_pipeline(kind))
    assert folder.family == "qwen-image" and folder.edits
    assert folder.index["processor"] == ["transformers", "Qwen2VLProcessor"]  # as transformers' own folder names it
    saved = json.loads((folder.path / "processor" / "processor_config.json").read_text())
    assert saved["processor_class"] == "Qwen2VLProcessor" and "video_processor" in saved
    assert not read_pipeline_folder(tiny_pipeline("qwen-image")).edits


def test_an_ode_rollout_equals_qwen_edit_pipelines_own_call(tiny_pipeline, kind, pipe, source: Path,
                                                            at_target_size) -> None:
    from PIL import Image

    policy = edit_policy(tiny_pipeline(kind))
    key = edit_sample_key(INSTRUCTION, source)
    final = spotlight_ode(policy, key, seed=11)
    assert final.shape == (1, 4, LATENT, LATENT)
    expected = pipeline_call(pipe, source, initial_latents([11], policy.latent_shape))
    assert final.abs().max() > 0.5
    torch.testing.assert_close(final, expected, rtol=0, atol=1e-5)
    # the source image is an input, of the transformer and of the text encoder: another source, another edit
    other = source.with_name("other.png")
    Image.new("RGB", (SIZE, SIZE), (10, 200, 10)).save(other)
    assert (spotlight_ode(policy, edit_sample_key(INSTRUCTION, other), seed=11) - final).abs().max() > 1e-3
    first, second = (policy.prompts.row(policy.prompts.ids([edit_sample_key(INSTRUCTION, path)]).item())
                     for path in (source, other))
    assert (first.embeds - second.embeds).abs().max() > 1e-4  # the text embeddings saw the image


def test_decoded_edits_equal_the_pipelines_pt_output(tiny_pipeline, kind, pipe, source: Path,
                                                      at_target_size) -> None:
    policy = edit_policy(tiny_pipeline(kind))
    images = policy.decode_images(spotlight_ode(policy, edit_sample_key(INSTRUCTION, source), seed=5))
    expected = pipeline_call(pipe, source, initial_latents([5], policy.latent_shape), "pt")
    assert images.shape == (1, 3, SIZE, SIZE)
    torch.testing.assert_close(images, expected, rtol=0, atol=1e-5)


def test_an_exported_lora_loads_into_qwen_edit_pipeline_and_changes_its_edit(tiny_pipeline, kind, source: Path,
                                                                             tmp_path: Path, at_target_size) -> None:
    policy = edit_policy(tiny_pipeline(kind), lora_rank=2, lora_alpha=4.0)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for parameter in policy.trainable_parameters():
            parameter.normal_(0.0, 0.3)
    policy.save_for_diffusers(tmp_path)
    trained = spotlight_ode(policy, edit_sample_key(INSTRUCTION, source), seed=3)
    base = edit_pipeline(tiny_pipeline(kind))
    latents = initial_latents([3], policy.latent_shape)
    before = pipeline_call(base, source, latents)
    base.load_lora_weights(str(tmp_path))
    after = pipeline_call(base, source, latents)
    assert (after - before).abs().max() > 1e-2  # the LoRA reached the pipeline's transformer
    torch.testing.assert_close(after, trained, rtol=0, atol=1e-4)


def test_make_tiny_pipeline_qwen_image_edit_writes_an_edit_folder(tmp_path: Path, kind) -> None:
    from typer.testing import CliRunner

    from spotlight.cli import app

    result = CliRunner().invoke(app, ["make-tiny-pipeline", kind, str(tmp_path / "edit")])
    assert result.exit_code == 0, result.output
    folder = read_pipeline_folder(tmp_path / "edit")
    assert folder.edits and folder.family == "qwen-image" and folder.index["_class_name"] == KINDS[kind]


def test_a_plain_prompt_on_a_qwen_edit_folder_is_one_known_line(tiny_pipeline) -> None:
    from spotlight.errors import is_known
    from spotlight.models.editing.condition import EditRowError

    policy = edit_policy(tiny_pipeline("qwen-image-edit"))
    with pytest.raises(EditRowError, match="plain prompt .* Qwen-Image-Edit folder") as raised:
        policy.tokenize(["a red disc"])
    assert is_known(raised.value) and "\n" not in str(raised.value)


def test_the_plan_counts_the_source_images_tokens(tiny_pipeline) -> None:
    """spotlight plan and the memory estimate see an edit's sequence: the target's tokens and the source's."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from spotlight.models.pipelines.inputs import PromptEmbeddings, transformer_velocity
    from spotlight.models.pipelines.loading import load_transformer
    from spotlight.sim.planning.forward_flops import count_forward_flops

    edit, plain = (read_pipeline_folder(tiny_pipeline(kind)) for kind in ("qwen-image-edit", "qwen-image"))
    counted, alone = count_forward_flops(edit, (SIZE, SIZE), 24), count_forward_flops(plain, (SIZE, SIZE), 24)
    assert counted.image_tokens == 2 * alone.image_tokens == 2 * LATENT ** 2 // 4
    transformer = load_transformer("qwen-image", str(edit.path), torch.float32)
    latents = torch.randn(1, 4, LATENT, LATENT)
    cond = PromptEmbeddings(embeds=torch.randn(1, 24, 32), image=torch.randn_like(latents))
    with FlopCounterMode(display=False) as meter, torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        transformer_velocity(transformer, "qwen-image", latents, torch.tensor([0.5]), cond)
    assert counted.flops == pytest.approx(meter.get_total_flops(), rel=0.05)


def test_edit_2509_rows_are_encoded_one_at_a_time_as_its_pipeline_takes_them(tiny_pipeline, source: Path) -> None:
    """Its template numbers the pictures of a call ("Picture 1: ..."): two rows' sources in one call would be
    read as two pictures of each row. So an Edit-2509 policy encodes a row per call, on any device."""
    from PIL import Image

    plus, edit = edit_policy(tiny_pipeline("qwen-image-edit-plus")), edit_policy(tiny_pipeline("qwen-image-edit"))
    assert plus.prompts.encode_batch == 1 and edit.prompts.encode_batch is None  # None: 32 a call on a GPU
    other = source.with_name("other-2509.png")
    Image.new("RGB", (SIZE, SIZE), (10, 200, 10)).save(other)
    keys = [edit_sample_key(INSTRUCTION, path) for path in (source, other)]
    plus.prompts.encode_batch = 2  # what a GPU's batches would do without the setting
    with pytest.raises(ValueError, match="number of <\\|image_pad\\|> tokens"):
        plus.prompts.ids(keys)
