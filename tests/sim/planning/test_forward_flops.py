"""FLOPs of a transformer forward counted on the meta device, against torch's counter on real weights.

The reference is independent of the code under test: Spotlight's own pipeline policy, loaded with the
tiny folder's real (random) weights, encodes a real prompt with the folder's text encoders and runs one
conditional forward on the CPU under FlopCounterMode, with SDPA forced to its maths backend (the CPU
flash kernel is not in torch's FLOP table, so it would count no attention at all). The meta count gets
only the config, the resolution and the text-token count the family's pipeline pads to.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from spotlight.models.pipelines.family_config import DiffusersPolicyConfig
from spotlight.models.pipelines.folder import PipelineFolderError, read_pipeline_folder
from spotlight.models.rebuild import policy_from_config
from spotlight.sim.planning.forward_flops import UnknownTransformerError, count_forward_flops, text_tokens
from spotlight.sim.planning.model_folders import model_folder

RESOLUTION = (32, 48)  # not square: catches a swapped height and width
PROMPT = "a red circle left of a blue square"


def _policy_config(folder: Path, family: str) -> DiffusersPolicyConfig:
    return DiffusersPolicyConfig(family=family, pretrained=str(folder), pipeline=True, resolution=RESOLUTION,
                                 dtype="float32", lora_rank=4)


def _real_forward_flops(policy: torch.nn.Module, folder: Path, batch: int) -> tuple[float, int]:
    """(FLOPs, text tokens) of one conditional forward of the loaded ``policy`` on ``batch`` copies of PROMPT."""
    policy.eval()
    rows = policy.tokenize([PROMPT] * batch, guided=False)
    tokens = policy.prompts.embeddings(rows[:, 0]).embeds.shape[1]
    height, width = read_pipeline_folder(folder).latent_size(RESOLUTION)
    latents = torch.randn(batch, read_pipeline_folder(folder).latent_channels, height, width)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        policy(latents, torch.full((batch,), 0.5), rows)
    return float(counter.get_total_flops()), tokens


@pytest.mark.parametrize("family", ["sd3", "flux", "qwen-image"])
def test_meta_count_is_within_5_percent_of_torchs_counter_on_real_weights(family: str, tiny_pipeline) -> None:
    folder = tiny_pipeline(family)
    config = _policy_config(folder, family)
    policy = policy_from_config(config)
    real, real_tokens = _real_forward_flops(policy, folder, batch=2)
    pipeline = read_pipeline_folder(folder)
    prompt_tokens = real_tokens - 5 if family == "qwen-image" else 0  # Qwen-Image: the prompt's own length
    tokens = text_tokens(pipeline, None, prompt_tokens)
    assert tokens == real_tokens  # the padding rule each family's pipeline applies
    counted = count_forward_flops(pipeline, RESOLUTION, tokens, batch=2, lora=(4, config.target_modules))
    assert counted.flops == pytest.approx(real, rel=0.05)
    transformer = policy.transformer  # the loaded policy's own parameters (a forward changes none)
    assert counted.lora_parameters == sum(p.numel() for name, p in transformer.named_parameters() if ".lora_" in name)
    assert counted.parameters == sum(p.numel() for name, p in transformer.named_parameters() if ".lora_" not in name)


@pytest.mark.parametrize("lora", [None, (8, ("attn.to_q", "attn.add_k_proj", "attn.to_out.0"))])
def test_one_block_of_each_kind_counts_what_every_block_counts(lora, tiny_pipeline) -> None:
    """SD3.5-Medium's three kinds of block, and FLUX's two lists; forward and backward, LoRA or full."""
    for folder in (read_pipeline_folder(model_folder("sd3.5-medium")), read_pipeline_folder(tiny_pipeline("flux"))):
        one_of_each = count_forward_flops(folder, (128, 128), 100, lora=lora, backward=True)
        every = count_forward_flops(folder, (128, 128), 100, lora=lora, backward=True, every_block=True)
        assert (one_of_each.flops, one_of_each.train_flops) == (every.flops, every.train_flops)
        assert 1.9 < one_of_each.train_flops / one_of_each.flops < 3.1  # a backward costs one to two forwards


def test_sd35_medium_at_512_with_333_text_tokens_is_2_44_tflop() -> None:
    """Issue 35's anchor: torch's counter on an H200, one conditional forward at batch 1."""
    folder = read_pipeline_folder(model_folder("sd3.5-medium"))
    assert text_tokens(folder, None, 0) == 333
    count = count_forward_flops(folder, (512, 512), 333)
    assert count.flops / 1e12 == pytest.approx(2.44, abs=0.005)
    assert count.image_tokens == 1024
    assert count.parameters == pytest.approx(2.24e9, rel=0.01)  # SD3.5-Medium's published 2.5 B includes no text


def test_qwen_image_count_is_its_20b_mmdit() -> None:
    folder = read_pipeline_folder(model_folder("qwen-image"))
    count = count_forward_flops(folder, (512, 512), 37)
    assert count.parameters == pytest.approx(20.4e9, rel=0.01)
    # the matmuls of 60 dual-stream blocks of width 3072 over 1061 tokens, plus attention: 24·L·d²·n + 4·L·n²·d
    n, d = 1024 + 37, 3072
    assert count.flops == pytest.approx(24 * 60 * d * d * n + 4 * 60 * n * n * d, rel=0.05)


def test_a_transformer_class_spotlight_does_not_know_is_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "odd"
    shutil.copytree(model_folder("sd3.5-medium"), folder)
    config = json.loads((folder / "transformer" / "config.json").read_text())
    config["_class_name"] = "HunyuanDiT2DModel"
    (folder / "transformer" / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnknownTransformerError, match=r"HunyuanDiT2DModel.*SD3Transformer2DModel") as error:
        count_forward_flops(read_pipeline_folder(folder), (512, 512), 333)
    assert "\n" not in str(error.value)


def test_a_resolution_the_model_cannot_take_is_one_line() -> None:
    folder = read_pipeline_folder(model_folder("sd3.5-medium"))
    with pytest.raises(PipelineFolderError, match="divisible by 16") as error:
        count_forward_flops(folder, (500, 512), 333)
    assert "\n" not in str(error.value)
