"""Trainer ranks (`trainer.devices`): samples/s of the update for K = 1 and 2 on this machine, and what
the all-reduce moves per step for LoRA and for full weights of each family's real transformer.

Measured: the default NFT update (`train:` defaults: 2 epochs x 4 minibatches, 2 noise levels per
sample) of the shipped shapes base model (TinyDiT, 2.9 M parameters, every weight trained with DDP) on
a rollout of the default size (16 prompts x 8 samples, random clean samples and advantages), one rank
per core with one thread (K = 1: core 0; K = 2: cores 0 and 1, gloo), repeated and the median taken.
Also measured: one gloo all-reduce of the TinyDiT's float32 gradient between the two cores.

Computed: the parameter counts of SD3.5-Medium, FLUX.1-dev and Qwen-Image's transformers, built on the
meta device from their published configs (no weights), and their LoRA at the default targets and rank
(`spotlight.models.pipelines.family_config`); the gradient bytes one step all-reduces (float32 gradients, one
all-reduce per micro-batch backward: 1 without ``train.micro_batch_size``) and each rank's ring traffic,
2 (K-1)/K of it.

    python benchmarks/trainer_scaling.py        (~2 min on two idle cores)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from provenance import RESULTS, git_commit, machine

from spotlight.config import TrainSection
from spotlight.models.pipelines.family_config import DEFAULT_LORA_TARGETS
from spotlight.models.pipelines.memory_estimate import lora_parameter_count
from spotlight.ranks.data_parallel import RankShare, data_parallel
from spotlight.components.checkpoint import load_model
from spotlight.rl.grpo import RolloutBatch
from spotlight.rl.nft import nft_update
from spotlight.rl.rollout_update import build_optimizer

PROMPTS, GROUP = 16, 8
LORA_RANK = 32  # Flow-GRPO's SD3.5 rank (the tiny configs use 4)
# The transformers' published configs (diffusers' config.json of each model; sizes only)
REAL_CONFIGS = {
    "SD3.5-Medium": ("SD3Transformer2DModel", dict(
        sample_size=128, patch_size=2, in_channels=16, out_channels=16, num_layers=24, attention_head_dim=64,
        num_attention_heads=24, joint_attention_dim=4096, caption_projection_dim=1536, pooled_projection_dim=2048,
        pos_embed_max_size=384, qk_norm="rms_norm", dual_attention_layers=tuple(range(13)))),
    "FLUX.1-dev": ("FluxTransformer2DModel", dict(
        patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
        num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
        axes_dims_rope=(16, 56, 56))),
    "Qwen-Image": ("QwenImageTransformer2DModel", dict(
        patch_size=2, in_channels=64, out_channels=16, num_layers=60, attention_head_dim=128, num_attention_heads=24,
        joint_attention_dim=3584, guidance_embeds=False, axes_dims_rope=(16, 56, 56))),
}


def rollout_batch(model) -> RolloutBatch:
    generator = torch.Generator().manual_seed(0)
    rows = PROMPTS * GROUP
    c, h, w = model.latent_shape
    tokens = torch.randint(1, model.config.vocab_size, (rows, model.config.max_text_len), generator=generator)
    return RolloutBatch(latents=torch.rand(rows, 2, c, h, w, generator=generator), log_probs=torch.zeros(rows, 1),
                        tokens=tokens, advantages=torch.randn(rows, generator=generator),
                        sigmas=torch.tensor([1.0, 0.0]), noise_level=0.0, stochastic_steps=1)


def timed_updates(rank: int, world_size: int, repeats: int, port: int, out: dict) -> None:
    """Pin to core ``rank`` with one thread, join the group (K > 1) and time ``repeats`` updates."""
    os.sched_setaffinity(0, {rank})
    torch.set_num_threads(1)
    section = TrainSection()
    model = load_model("shapes-base")
    old = load_model("shapes-base").requires_grad_(False)  # θ_old and the base (the trust term's reference)
    optimizer = build_optimizer(model, section)
    trained, share = model, section
    if world_size > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
        trained, share = data_parallel(model, world_size), RankShare(section, rank, world_size)
    batch = rollout_batch(model)
    seconds = []
    for repeat in range(repeats + 1):  # the first is a warm-up
        started = time.perf_counter()
        nft_update(trained, old, optimizer, batch, share, torch.Generator().manual_seed(repeat), old)  # + trust term
        seconds.append(time.perf_counter() - started)
    if world_size > 1:
        gradient = torch.randn(sum(p.numel() for p in model.parameters()))
        reduce_s = []
        for _ in range(10):
            dist.barrier()
            started = time.perf_counter()
            dist.all_reduce(gradient)
            reduce_s.append(time.perf_counter() - started)
        out[f"all_reduce_s_{rank}"] = statistics.median(reduce_s)
        dist.destroy_process_group()
    out[f"update_s_{rank}"] = statistics.median(seconds[1:])


def measure(world_size: int, repeats: int) -> dict:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with mp.Manager() as manager:
        out = manager.dict()
        mp.start_processes(timed_updates, args=(world_size, repeats, port, out), nprocs=world_size,
                           start_method="spawn")
        out = dict(out)
    update_s = max(out[f"update_s_{rank}"] for rank in range(world_size))
    section = TrainSection()
    samples = PROMPTS * GROUP * section.num_epochs  # samples passed through the update
    result = {"devices": world_size, "update_s": update_s, "samples_per_s": samples / update_s}
    if world_size > 1:
        result["all_reduce_s"] = max(out[f"all_reduce_s_{rank}"] for rank in range(world_size))
    return result


def family_volumes() -> list[dict]:
    import diffusers

    rows = []
    for name, (class_name, config) in REAL_CONFIGS.items():
        with torch.device("meta"):
            transformer = getattr(diffusers, class_name)(**config)
        shapes = {key: tuple(value.shape) for key, value in transformer.state_dict().items()}
        full = sum(value.numel() for value in transformer.parameters())
        lora = lora_parameter_count(shapes, DEFAULT_LORA_TARGETS, LORA_RANK)
        rows.append({"model": name, "parameters": full, "lora_parameters": lora, "lora_rank": LORA_RANK,
                     "lora_allreduce_bytes": 4 * lora, "full_allreduce_bytes": 4 * full,
                     "ring_traffic_per_rank_bytes": {str(k): {"lora": 2 * (k - 1) / k * 4 * lora,
                                                              "full": 2 * (k - 1) / k * 4 * full}
                                                     for k in (2, 8, 32)}})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    scaling = [measure(1, args.repeats), measure(2, args.repeats)]
    volumes = family_volumes()
    print(f"update of the shapes base model (NFT defaults, {PROMPTS}x{GROUP} samples), load average {load:.1f}")
    print(f"{'K':>3} {'update s':>9} {'samples/s':>10} {'all-reduce s':>13}")
    for row in scaling:
        print(f"{row['devices']:>3} {row['update_s']:>9.2f} {row['samples_per_s']:>10.1f} "
              f"{row.get('all_reduce_s', 0.0):>13.4f}")
    print(f"speed-up K=2 over K=1: {scaling[1]['samples_per_s'] / scaling[0]['samples_per_s']:.2f}x")
    print(f"\n{'model':<14} {'params':>8} {'LoRA r' + str(LORA_RANK):>9} {'LoRA all-reduce':>16} "
          f"{'full all-reduce':>16} {'ring/rank K=32 full':>20}")
    for row in volumes:
        print(f"{row['model']:<14} {row['parameters'] / 1e9:>7.2f}B {row['lora_parameters'] / 1e6:>8.1f}M "
              f"{row['lora_allreduce_bytes'] / 2**20:>13.1f}MiB {row['full_allreduce_bytes'] / 2**30:>13.1f}GiB "
              f"{row['ring_traffic_per_rank_bytes']['32']['full'] / 2**30:>17.1f}GiB")
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "trainer_scaling.json"
    config = {"prompts": PROMPTS, "group_size": GROUP, "train": TrainSection().model_dump()}
    path.write_text(json.dumps({"commit": git_commit(), "machine": machine(), "load_average": load, "config": config,
                                "scaling": scaling, "families": volumes}, indent=2))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
