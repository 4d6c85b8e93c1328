"""Images per second of the learned rewards (aesthetic, hps, imagereward, vlm-judge) at a recipe's batch size.

Each reward is built at its release's real size (CLIP ViT-L/14 + the LAION predictor; OpenCLIP ViT-H-14 for
HPSv2.1; BLIP ViT-L/16 + BERT-base for ImageReward) with random weights, saved in the release's layout in a
temporary folder, loaded through the reward's own loader and timed on policy-sized images (512 x 512 by
default, resized on the device). Random weights cost the same time as trained ones. Nothing is downloaded.
`--size tiny` runs the test-sized models. `vlm-judge` runs at tiny size only: Qwen2.5-VL-7B (8.3B parameters,
33 GB in float32) does not fit a 24 GB CPU machine, and its real throughput belongs to a GPU.

    .venv/bin/python benchmarks/rewards/model_throughput.py --batch 32 --device cpu

Writes benchmarks/results/reward_model_throughput.json with the commit and the machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "rewards"))  # tiny_models' savers

from benchmarks.provenance import RESULTS, git_commit, machine
from spotlight.rewards.base import guarded_score
from spotlight.rewards.models.aesthetic import AestheticReward
from spotlight.rewards.models.hps import VIT_H_14, HPSReward, clip_config


def save_real_clip_l14(folder: Path) -> Path:
    """A CLIP ViT-L/14 image tower (openai/clip-vit-large-patch14's shape), random, with its processor settings."""
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    config = CLIPVisionConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                              image_size=224, patch_size=14, projection_dim=768, hidden_act="quick_gelu")
    CLIPVisionModelWithProjection(config).save_pretrained(folder)
    return folder


def save_real_hps(folder: Path) -> tuple[Path, Path]:
    """ViT-H-14 weights in open_clip's names (from a random CLIPModel of that shape, renamed back), and a tokenizer."""
    from tiny_models import save_tiny_clip_tokenizer
    from transformers import CLIPModel

    model = CLIPModel(clip_config(VIT_H_14))
    state = {}
    for name, tensor in model.state_dict().items():  # transformers -> open_clip names (hps.py renames them back)
        if "position_ids" in name:
            continue
        state[_open_clip_name(name)] = tensor
    for projection in ("visual.proj", "text_projection"):  # open_clip multiplies by them: x @ proj
        state[projection] = state[projection].t().contiguous()
    for prefix in ("visual.transformer", "transformer"):
        for index in range(64):
            q = state.pop(f"{prefix}.resblocks.{index}.q_proj.weight", None)
            if q is None:
                break
            for kind in ("weight", "bias"):
                parts = [state.pop(f"{prefix}.resblocks.{index}.{p}_proj.{kind}", q) for p in "qkv"]
                state[f"{prefix}.resblocks.{index}.attn.in_proj_{kind}"] = torch.cat(parts)
    folder.mkdir(parents=True, exist_ok=True)
    checkpoint = folder / "HPS_v2.1_compressed.pt"
    torch.save({"state_dict": state}, checkpoint)
    tokenizer, _ = save_tiny_clip_tokenizer(folder / "processor")  # tokenising is not what is timed
    return checkpoint, tokenizer


def _open_clip_name(name: str) -> str:
    from spotlight.rewards.models.hps import _BLOCK_PARTS, _TOP

    inverse = {target: source for source, (target, _) in _TOP.items()}
    if name in inverse:
        return inverse[name]
    tower = "visual.transformer" if name.startswith("vision_model") else "transformer"
    index, rest = name.split(".encoder.layers.")[1].split(".", 1)
    for source, target in _BLOCK_PARTS.items():
        if rest.startswith(target + "."):
            return f"{tower}.resblocks.{index}.{source}.{rest[len(target) + 1:]}"
    return f"{tower}.resblocks.{index}.{rest.replace('self_attn.', '')}"  # q/k/v, fused by the caller


def save_real_imagereward(folder: Path) -> tuple[Path, Path]:
    """ImageReward v1.0's shapes (BLIP ViT-L/16 at 224, BERT-base with cross-attention) in the release's names."""
    from tiny_models import save_tiny_bert_tokenizer

    from spotlight.rewards.models.imagereward import _VISION_BLOCK, _VISION_TOP, ImageRewardModel, _configs

    med = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
           "max_position_embeddings": 512, "vocab_size": 30524, "layer_norm_eps": 1e-12, "hidden_act": "gelu"}
    shape = {"blip.visual_encoder.patch_embed.proj.weight": torch.zeros(1024, 3, 16, 16),
             "blip.visual_encoder.pos_embed": torch.zeros(1, 197, 1024),
             "blip.visual_encoder.blocks.0.mlp.fc1.weight": torch.zeros(4096, 1024),
             **{f"blip.visual_encoder.blocks.{i}.x": torch.zeros(1) for i in range(24)}}
    model = ImageRewardModel(*_configs(shape, med))
    vision_top = {target: source for source, target in _VISION_TOP.items()}
    vision_block = {target: source for source, target in _VISION_BLOCK.items()}
    state = {}
    for name, tensor in model.state_dict().items():
        if name.startswith("text."):
            state["blip.text_encoder." + name.removeprefix("text.")] = tensor
        elif name.startswith("mlp."):
            state[name] = tensor
        elif not name.endswith("position_ids"):
            part = name.removeprefix("vision.")
            if part in vision_top:
                state["blip.visual_encoder." + vision_top[part]] = tensor
            else:
                index, rest = part.removeprefix("encoder.layers.").split(".", 1)
                module, kind = rest.rsplit(".", 1)
                state[f"blip.visual_encoder.blocks.{index}.{vision_block[module]}.{kind}"] = tensor
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(state, folder / "ImageReward.pt")
    (folder / "med_config.json").write_text(json.dumps(med))
    tokenizer, _ = save_tiny_bert_tokenizer(folder / "tokenizer")  # tokenising is not what is timed
    return folder / "ImageReward.pt", tokenizer


def timed(reward, images: torch.Tensor, prompts: list[str], repeats: int) -> float:
    guarded_score(reward, images[:2], prompts[:2])  # warm-up
    started = time.perf_counter()
    for _ in range(repeats):
        guarded_score(reward, images, prompts)
    return repeats * len(prompts) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32, help="images per score call (reward.batch_size)")
    parser.add_argument("--image-size", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rewards", nargs="+", default=["aesthetic", "hps", "imagereward", "vlm-judge"])
    parser.add_argument("--size", choices=["real", "tiny"], default="real")
    parser.add_argument("--out", default=str(RESULTS / "reward_model_throughput.json"))
    args = parser.parse_args()
    torch.manual_seed(0)
    images = torch.rand(args.batch, 3, args.image_size, args.image_size)
    prompts = ["a photo of a red clock on the bench"] * args.batch
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        for name in args.rewards:
            if name == "aesthetic":
                from tiny_models import save_tiny_aesthetic_predictor, save_tiny_clip

                clip = save_real_clip_l14(root / "clip") if args.size == "real" else save_tiny_clip(root / "clip")
                predictor = save_tiny_aesthetic_predictor(root / "aesthetic.pth", 768 if args.size == "real" else 16)
                reward = AestheticReward.from_files(str(predictor), str(clip), args.device, args.batch)
            elif name == "imagereward":
                from spotlight.rewards.models.imagereward import ImageRewardReward

                if args.size == "real":
                    checkpoint, tokenizer = save_real_imagereward(root / "imagereward")
                else:
                    from tiny_models import save_tiny_imagereward

                    checkpoint, tokenizer, _ = save_tiny_imagereward(root / "imagereward")
                reward = ImageRewardReward.from_files(str(checkpoint), str(tokenizer), args.device, args.batch)
            elif name == "vlm-judge":
                from tiny_models import save_tiny_qwen_vl

                from spotlight.rewards.models.vlm_judge import VLMJudgeReward

                question = "Does this image show {prompt} ? Answer yes or no ."
                reward = VLMJudgeReward.from_folder(str(save_tiny_qwen_vl(root / "qwen")), question, args.device,
                                                    args.batch)
            else:
                if args.size == "real":
                    checkpoint, tokenizer = save_real_hps(root / "hps")
                else:
                    from tiny_models import save_tiny_hps

                    checkpoint, tokenizer, _ = save_tiny_hps(root / "hps")
                reward = HPSReward.from_files(str(checkpoint), str(tokenizer), args.device, args.batch)
            rate = timed(reward, images, prompts, args.repeats)
            counted = reward.throughput.images_per_s  # the reward's own count, warm-up included
            results[name] = {"images_per_s": round(rate, 3), "counted_images_per_s": round(counted, 3)}
            size = "tiny" if name == "vlm-judge" else args.size
            results[name]["size"] = size
            print(f"{name:11s} {size} {args.device} batch {args.batch} {args.image_size}px: {rate:.2f} images/s",
                  flush=True)
    record = {"benchmark": "reward_model_throughput", "commit": git_commit(), "machine": machine(),
              "settings": vars(args), "results": results,
              "gpu": "not measured: no GPU" if not args.device.startswith("cuda") else "measured"}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
