"""Counts from config.json numbers (spotlight.sim.planning.analytic) against the meta-device count, exactly.

The reference is independent of the walks: the family's diffusers class (and peft's LoRA) built on the
meta device and run under torch's FlopCounterMode (`spotlight.sim.planning.meta_flops`), and the text
encoders and VAEs built on the meta device from their config classes. Every count must be equal, not
close: FLOPs of the forward and of the forward and backward, parameters, LoRA parameters, LoRA input
features and targeted weights, and the parameter names and shapes themselves. Cases: every shipped
config-only folder, the tiny pipelines of every family (SD3, FLUX, FLUX Kontext, Qwen-Image, Wan), and each
recipe in configs/ at its own resolution, frames, text length and LoRA (on the published transformer
configs of the models the recipes name). `spotlight plan` then must import no diffusers, peft or
transformers, and print what it printed when every count was taken on the meta device.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from spotlight.cli import app
from spotlight.models.pipelines.family_config import lora_targets
from spotlight.models.pipelines.folder import read_pipeline_folder
from spotlight.sim.planning import folder_workload, forward_flops
from spotlight.sim.planning.analytic.part_parameters import DEFAULTS, part_parameters
from spotlight.sim.planning.analytic.trace import NotAnalytic
from spotlight.sim.planning.analytic.transformer_count import count_transformer
from spotlight.sim.planning.forward_flops import count_forward_flops, text_tokens
from spotlight.sim.planning.meta_flops import count_built, count_on_meta, meta_transformer
from spotlight.sim.planning.model_folders import model_folder, shipped

REPO = Path(__file__).resolve().parents[3]
PARTIAL = {"wan": (8, ("attn1.to_q", "attn2.to_k", "ffn.net.2")),  # a few targets, some outside attention
           "qwen-image": (8, ("attn.to_q", "attn.add_k_proj", "attn.to_add_out", "txt_mlp.net.2"))}
PARTIAL_MMDIT = (8, ("attn.to_q", "attn.add_k_proj", "attn.to_out.0", "ff_context.net.2"))
# adapters on the embeddings and modulations: gradients then reach the timestep stream and the inputs' first layers
OUTSIDE_BLOCKS = {"sd3": ("linear", "context_embedder", "net.0.proj"), "flux": ("linear", "proj_mlp", "x_embedder"),
                  "qwen-image": ("img_mod.1", "txt_in", "linear_1"), "wan": ("time_proj", "linear_1", "proj_out")}
FLUX_DEV = {"_class_name": "FluxTransformer2DModel", "attention_head_dim": 128, "axes_dims_rope": [16, 56, 56],
            "guidance_embeds": True, "in_channels": 64, "joint_attention_dim": 4096, "num_attention_heads": 24,
            "num_layers": 19, "num_single_layers": 38, "patch_size": 1, "pooled_projection_dim": 768}
FLUX_VAE = {"_class_name": "AutoencoderKL", "block_out_channels": [128, 256, 512, 512],
            "down_block_types": ["DownEncoderBlock2D"] * 4, "up_block_types": ["UpDecoderBlock2D"] * 4,
            "latent_channels": 16, "layers_per_block": 2, "use_post_quant_conv": False, "use_quant_conv": False}
WAN_1_3B = {"_class_name": "WanTransformer3DModel", "attention_head_dim": 128, "cross_attn_norm": True,
            "eps": 1e-06, "ffn_dim": 8960, "freq_dim": 256, "in_channels": 16, "num_attention_heads": 12,
            "num_layers": 30, "out_channels": 16, "patch_size": [1, 2, 2], "qk_norm": "rms_norm_across_heads",
            "rope_max_seq_len": 1024, "text_dim": 4096}


def _assert_equal(folder, resolution, tokens, lora, num_frames=None, names=False) -> None:
    """The walk's counts for ``folder`` equal the meta-device count, forward and backward (module docstring).

    ``names``: the parameter names and shapes too, of the very model the meta device counts (built once).
    """
    if names:
        model = meta_transformer(folder, lora)
        built = {name: tuple(p.shape) for name, p in model.named_parameters()}
        meta = count_built(model, folder, resolution, tokens, 1, lora, True, False, num_frames)
    else:
        meta = count_on_meta(folder.path, resolution, tokens, 1, lora, True, False, num_frames)
    walked = count_transformer(folder.family, folder.transformer, folder.image_tokens(resolution, num_frames),
                               tokens, 1, lora)
    assert (walked.flops, walked.train_flops) == (meta.flops, meta.train_flops)
    assert (walked.parameters, walked.lora_parameters) == (meta.parameters, meta.lora_parameters)
    assert (walked.lora_inputs, walked.lora_weights) == (meta.lora_inputs, meta.lora_weights)
    if names:
        assert walked.shapes == built


@pytest.mark.parametrize("name", shipped())
@pytest.mark.parametrize("finetune", ["full", "lora"])
def test_shipped_configs_count_what_the_meta_device_counts(name: str, finetune: str) -> None:
    folder = read_pipeline_folder(model_folder(name))
    video = folder.is_video
    resolution, frames = ((240, 416), 9) if video else ((256, 384), None)
    lora = (32, lora_targets(folder.family)) if finetune == "lora" else None
    _assert_equal(folder, resolution, text_tokens(folder, None, 32), lora, frames, names=finetune == "lora")


@pytest.mark.parametrize("family", ["sd3", "flux", "flux-kontext", "qwen-image", "qwen-image-edit", "wan", "wan22"])
def test_tiny_pipelines_count_what_the_meta_device_counts(family: str, tiny_pipeline) -> None:
    folder = read_pipeline_folder(tiny_pipeline(family))
    frames = 5 if folder.is_video else None
    partial = PARTIAL.get(folder.family, PARTIAL_MMDIT)
    for lora in (None, (4, lora_targets(folder.family)), partial, (2, OUTSIDE_BLOCKS[folder.family])):
        _assert_equal(folder, (32, 48), 24, lora, frames, names=True)


def _published(tmp_path: Path, base: Path, name: str, transformer: dict, vae: dict | None) -> Path:
    """``base``'s configs with a published model's transformer (and VAE) config."""
    out = tmp_path / name
    for path in base.rglob("*.json"):
        (out / path.relative_to(base)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, out / path.relative_to(base))
    (out / "transformer" / "config.json").write_text(json.dumps(transformer))
    if vae is not None:
        (out / "vae" / "config.json").write_text(json.dumps(vae))
    return out


RECIPES = sorted(path.name for path in (REPO / "configs").glob("*.yaml")
                 if (yaml.safe_load(path.read_text()).get("model") or {}).get("lora_rank")
                 and path.name != "default.yaml")


@pytest.mark.parametrize("recipe", RECIPES)
def test_each_recipe_counts_what_the_meta_device_counts(recipe: str, tiny_pipeline, tmp_path: Path) -> None:
    """At the recipe's own resolution, frames, text length and LoRA, on the model it names (published configs)."""
    data = yaml.safe_load((REPO / "configs" / recipe).read_text())
    model, rollout = data.get("model") or {}, data.get("rollout") or {}
    wan_vae = json.loads((model_folder("wan2.1-t2v-14b") / "vae" / "config.json").read_text())
    folders = {"sd35m": lambda: model_folder("sd3.5-medium"), "qwen-image-ocr": lambda: model_folder("qwen-image"),
               "flux-dev": lambda: _published(tmp_path, tiny_pipeline("flux"), "dev", FLUX_DEV, FLUX_VAE),
               "flux-kontext": lambda: _published(tmp_path, tiny_pipeline("flux-kontext"), "kontext", FLUX_DEV,
                                                  FLUX_VAE),
               "qwen-image-edit": lambda: _published(tmp_path, tiny_pipeline("qwen-image-edit"), "qwen-edit",
                                                     *qwen_image_configs()),  # Qwen-Image-Edit: Qwen-Image's configs
               "wan21": lambda: _published(tmp_path, tiny_pipeline("wan"), "wan", WAN_1_3B, wan_vae)}
    prefix = next((key for key in folders if recipe.startswith(key)), None)
    if prefix is None:  # a tiny recipe: its family's tiny pipeline
        folder = read_pipeline_folder(tiny_pipeline(model["family"]))
        resolution = (32, 32)
    else:
        folder = read_pipeline_folder(folders[prefix]())
        size = rollout.get("resolution") or folder.default_resolution
        resolution = tuple(size) if isinstance(size, list) else (size, size)
    lora = None
    if model.get("finetune", "lora") == "lora":
        lora = (int(model["lora_rank"]), lora_targets(folder.family, model.get("lora_target_modules")))
    tokens = text_tokens(folder, model.get("max_sequence_length"), 32)
    _assert_equal(folder, resolution, tokens, lora, rollout.get("num_frames") if folder.is_video else None)


def qwen_image_configs() -> tuple[dict, dict]:
    """The published Qwen-Image transformer and VAE configs (Qwen-Image-Edit's are the same)."""
    return tuple(json.loads((model_folder("qwen-image") / part / "config.json").read_text())
                 for part in ("transformer", "vae"))


def _part_folders(tiny_pipeline) -> list[Path]:
    return [model_folder(name) for name in shipped()] + [tiny_pipeline(family) for family in
                                                         ("sd3", "flux", "qwen-image", "wan")]


def test_text_encoders_and_vaes_count_what_the_meta_device_counts(tiny_pipeline) -> None:
    checked = set()
    for path in _part_folders(tiny_pipeline):
        folder = read_pipeline_folder(path)
        for part in folder.components:
            if part.startswith("text_encoder") or part == "vae":
                library, name = folder.class_name(part)
                config = json.loads((folder.path / part / "config.json").read_text())
                assert part_parameters(library, name, config) == folder_workload._meta_parameters(folder, part), \
                    (path, part)
                checked.add(name)
    assert {"CLIPTextModel", "CLIPTextModelWithProjection", "T5EncoderModel", "UMT5EncoderModel",
            "Qwen2_5_VLForConditionalGeneration", "AutoencoderKL", "AutoencoderKLWan",
            "AutoencoderKLQwenImage"} <= checked


def test_a_key_a_part_config_leaves_out_reads_as_the_installed_class_default() -> None:
    """DEFAULTS are the installed transformers config classes' and diffusers VAE signatures' own."""
    import inspect

    import diffusers
    import transformers

    configs = {"CLIPTextModel": transformers.CLIPTextConfig, "T5EncoderModel": transformers.T5Config,
               "UMT5EncoderModel": transformers.UMT5Config,
               "Qwen2_5_VLForConditionalGeneration": transformers.Qwen2_5_VLConfig,
               "Qwen2_5_VLTextModel": transformers.Qwen2_5_VLTextConfig,
               "Qwen2_5_VLVisionModel": transformers.models.qwen2_5_vl.configuration_qwen2_5_vl.Qwen2_5_VLVisionConfig}
    for cls, config_class in configs.items():
        instance = config_class()
        for key, value in DEFAULTS[cls].items():
            assert getattr(instance, key) == value, (cls, key)
    for cls in ("AutoencoderKL", "AutoencoderKLWan", "AutoencoderKLQwenImage"):
        signature = inspect.signature(getattr(diffusers, cls).__init__).parameters
        for key, value in DEFAULTS[cls].items():
            default = signature[key].default
            assert (list(default) if isinstance(default, tuple) else default) == value, (cls, key)


def test_a_transformer_config_without_its_default_keys_counts_the_same(tiny_pipeline, tmp_path: Path) -> None:
    """The walks read a key the config leaves out as the diffusers class's default, as from_config does."""
    import inspect

    import diffusers

    for family in ("sd3", "flux", "qwen-image", "wan"):
        base = tiny_pipeline(family)
        config = json.loads((base / "transformer" / "config.json").read_text())
        signature = inspect.signature(getattr(diffusers, config["_class_name"]).__init__).parameters
        sparse = {key: value for key, value in config.items() if key not in signature
                  or json.dumps(signature[key].default) != json.dumps(value)}
        assert len(sparse) < len(config), family
        folder = read_pipeline_folder(_published(tmp_path, base, family, sparse, None))
        frames = 5 if folder.is_video else None
        _assert_equal(folder, (32, 48), 24, (4, lora_targets(folder.family)), frames)


def test_a_config_the_walks_do_not_model_is_counted_on_the_meta_device(tmp_path: Path) -> None:
    """LoRA on a convolution (peft wraps it; the walks do not): the plan's count is the meta device's."""
    folder = read_pipeline_folder(model_folder("sd3.5-medium"))
    lora = (4, ("pos_embed.proj", "attn.to_q"))
    for targets in (lora[1], ("ff.net.0",), ("attn",)):  # a convolution, a GELU, an attention module
        with pytest.raises(NotAnalytic):
            count_transformer("sd3", folder.transformer, 256, 333, 1, (4, targets))
    counted = count_forward_flops(folder, (256, 256), 333, lora=lora, backward=True)
    assert counted == count_on_meta(folder.path, (256, 256), 333, 1, lora, True, False, None)
    assert counted.lora_parameters > 0


def test_plan_imports_no_diffusers_peft_or_transformers(tmp_path: Path) -> None:
    """The sd3.5-medium plan from an empty count cache: the model libraries stay unimported (they cost seconds)."""
    program = ("import sys\nfrom typer.testing import CliRunner\nfrom spotlight.cli import app\n"
               "result = CliRunner().invoke(app, ['plan', '24', '--json', '-s', 'model.pretrained=sd3.5-medium',"
               " '-s', 'rollout.resolution=512'])\nassert result.exit_code == 0, result.output\n"
               "print(sorted({m.split('.')[0] for m in sys.modules} & {'diffusers', 'peft', 'transformers'}))")
    env = {"SPOTLIGHT_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, cwd=REPO,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


PLANS = {"sd3.5-medium": ["-s", "rollout.resolution=512"],
         "qwen-image": ["-s", "rollout.resolution=512", "-s", "model.gradient_checkpointing=true",
                        "-s", "model.lora_target_modules=[attn.to_q,attn.to_add_out,img_mlp.net.2]"],
         "wan2.1-t2v-14b": ["-s", "rollout.resolution=[240,416]", "-s", "rollout.num_frames=9",
                            "-s", "model.gradient_checkpointing=true", "-s", "rollout.prompts_per_iteration=8"]}


@pytest.mark.parametrize("name", sorted(PLANS))
def test_plan_json_is_what_the_meta_device_counts_give(name: str, tmp_path: Path, monkeypatch) -> None:
    """Every number `plan --json` prints, with the walks and with every count taken on the meta device."""
    monkeypatch.setenv("SPOTLIGHT_CACHE_DIR", str(tmp_path / "cache"))
    # a 20-iteration target: each of the plan's ~30 simulated mixes is 5x shorter, and every number is still printed
    arguments = ["plan", "24", "--json", "-s", f"model.pretrained={name}", "-s", "convergence.vanilla_iterations=20",
                 *PLANS[name]]
    walked = CliRunner().invoke(app, arguments)
    assert walked.exit_code == 0, walked.output

    def not_analytic(*args, **kwargs):
        raise NotAnalytic("the test's reference")

    monkeypatch.setattr(forward_flops, "count_transformer", not_analytic)
    monkeypatch.setattr(folder_workload, "analytic_part_parameters", not_analytic)
    on_meta = CliRunner().invoke(app, arguments)
    assert on_meta.exit_code == 0, on_meta.output
    assert json.loads(walked.stdout) == json.loads(on_meta.stdout)
