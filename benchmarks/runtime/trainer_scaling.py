"""Trainer ranks (`trainer.devices`): the loop's rollout and update time for K = 1 and 2 on this machine, the
update and one all-reduce in isolated processes, and what the all-reduce moves per step for LoRA and for
full weights of each family's real transformer.

Measured in the loop (`Trainer.iteration`, mode vanilla, no spot device, one rank per core with one
thread, gloo; K = 2: rank 1 a Ray actor): ``time/rollout_s`` (sampling, decoding and scoring, each rank
its share of the groups, gathered on rank 0) and ``time/train_s`` (the update, DDP) of ``--repeats``
iterations after a warm-up one, as median, min and max, for

    toy    the shipped shapes base model (TinyDiT, 2.9 M parameters) on the default rollout (16 prompts x 8
           samples, 10 steps) and update (NFT, 2 epochs x 4 minibatches), the shapes reward
    sd3    a tiny SD3 pipeline folder (`spotlight make-tiny-pipeline sd3`, LoRA rank 4) at 32 px, 8 prompts x
           4 samples, 4 steps, the same update, a brightness reward (a Python function reward)
    sd3-fsdp  the same folder's transformer fine-tuned in full: K = 1 one plain process, K = 2 FSDP2 inside the
           loop (`trainer.sharding: fsdp`: every version sharded, θ_old gathered into each rank's sampler)

Measured apart: the default NFT update of the toy model on random clean samples, one process per rank
(mp, gloo), and one gloo all-reduce of the TinyDiT's float32 gradient between the two cores.

Computed: the parameter counts of SD3.5-Medium, FLUX.1-dev and Qwen-Image's transformers, built on the
meta device from their published configs (no weights), and their LoRA at the default targets and rank
(`spotlight.models.pipelines.family_config`); the gradient bytes one step all-reduces (float32 gradients, one
all-reduce per micro-batch backward: 1 without ``train.micro_batch_size``) and each rank's ring traffic,
2 (K-1)/K of it.

The K = 1 and K = 2 trainers take turns, one iteration each, and the ratio is taken pair by pair. Beside the
wall times, each phase's CPU seconds on its busiest rank's process (/proc: every thread, Ray's and gloo's
included): on a machine other jobs load, wall time stretches with their share of the cores and CPU time
does not, so its ratio is what K = 2 would give on idle cores, less the waits the load added.

    python benchmarks/runtime/trainer_scaling.py        (~10 min on two idle cores; --repeats 3)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from spotlight.components.checkpoint import load_model
from spotlight.config import TrainConfig, TrainSection, parse_config
from spotlight.cores import pinned
from spotlight.models.pipelines.family_config import DEFAULT_LORA_TARGETS
from spotlight.models.pipelines.memory_estimate import lora_parameter_count
from spotlight.ranks.data_parallel import RankShare, data_parallel
from spotlight.rl.grpo import RolloutBatch
from spotlight.rl.nft import nft_update
from spotlight.rl.rollout_update import build_optimizer
from spotlight.trainer import Trainer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports

from benchmarks.provenance import RESULTS, git_commit, machine

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


def brightness(images: torch.Tensor, prompts, metadata) -> list[float]:
    """The sd3 case's reward (``reward.name: trainer_scaling:brightness``): each image's mean pixel value."""
    return images.float().mean(dim=(1, 2, 3)).tolist()


def loop_settings(case: str, folder: Path) -> dict:
    """The config of one case (module docstring); ``folder``: the tiny SD3 pipeline (sd3 only)."""
    settings = {"mode": "vanilla", "iterations": 100, "device_cores": [0, 1], "runtime": {"node_timeout_s": 600}}
    if case == "toy":
        return settings
    model = {"pretrained": str(folder), **({"finetune": "full"} if case == "sd3-fsdp" else {})}
    return {**settings, "model": model, "reward": {"name": "trainer_scaling:brightness"},
            "rollout": {"prompts_per_iteration": 8, "group_size": 4, "num_steps": 4, "resolution": 32,
                        "sde_steps": None, "guidance_scale": 2.0}}


def open_trainer(case: str, devices: int, root: Path) -> Trainer:
    """A trainer of one case (module docstring) on ``devices`` ranks, rank 0 pinned to core 0."""
    settings = loop_settings(case, root / "sd3")
    sharding = "fsdp" if case == "sd3-fsdp" and devices > 1 else "ddp"
    config = parse_config(TrainConfig, {**settings, "run_dir": str(root / f"{case}-{devices}"),
                                        "trainer": {"devices": devices, "sharding": sharding}})
    shutil.rmtree(config.run_dir, ignore_errors=True)
    return Trainer(config)


def close_trainer(trainer: Trainer) -> None:
    if trainer.ranks is not None:
        trainer.ranks.close()
    trainer.backend.close()
    trainer._lock.release()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far, every thread (/proc/PID/stat, clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def time_phases(trainer: Trainer, phases: dict[str, list[float]]) -> None:
    """Wrap ``trainer.rollout`` and ``trainer.update`` so that each call appends the most CPU seconds any of its
    ranks' processes spent in it to ``phases[name]``: the phase's critical path in compute, which a machine's
    other load stretches in wall time but not in CPU time."""
    pids = [os.getpid()]
    if trainer.ranks is not None:
        pids += [int(pid) for rank, pid in json.loads((trainer.run_dir / "trainer-ranks.json").read_text()).items()
                 if rank != "0"]
    for name in ("rollout", "update"):
        phase = getattr(trainer, name)

        def timed(*args, phase=phase, name=name):
            before = [cpu_seconds(pid) for pid in pids]
            result = phase(*args)
            phases[name].append(max(cpu_seconds(pid) - b for pid, b in zip(pids, before, strict=True)))
            return result

        setattr(trainer, name, timed)


def loop_timing(case: str, repeats: int, root: Path) -> list[dict]:
    """``time/rollout_s`` and ``time/train_s`` of ``repeats`` loop iterations after a warm-up, K = 1 and K = 2.

    The two trainers are open together and take turns, one iteration each: on a machine others load, a
    pair of iterations sees about the same load, so the ratio of a pair is fairer than the ratio of two
    runs minutes apart.
    """
    with pinned(0, 1):
        trainers = {devices: open_trainer(case, devices, root) for devices in (1, 2)}
        cpu = {devices: {"rollout": [], "update": []} for devices in (1, 2)}
        for devices, trainer in trainers.items():
            time_phases(trainer, cpu[devices])
        try:
            records: dict[int, list[dict]] = {1: [], 2: []}
            for iteration in range(repeats + 1):
                for devices, trainer in trainers.items():
                    records[devices].append(trainer.iteration(iteration))
        finally:
            for trainer in trainers.values():
                close_trainer(trainer)
    samples = trainers[1].config.rollout.prompts_per_iteration * trainers[1].config.rollout.group_size
    rows = []
    for devices in (1, 2):
        row = {"case": case, "devices": devices, "samples": samples}
        for phase in ("rollout", "train"):
            seconds = [record[f"time/{phase}_s"] for record in records[devices][1:]]
            row[phase] = {"median_s": statistics.median(seconds), "min_s": min(seconds), "max_s": max(seconds),
                          "repeats_s": seconds}
            busiest = cpu[devices]["rollout" if phase == "rollout" else "update"][1:]
            row[phase]["cpu_critical_path_s"] = {"median_s": statistics.median(busiest), "repeats_s": busiest}
        rows.append(row)
    return rows


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


def ratio(rows: list[dict], case: str, phase: str) -> dict:
    """K = 2 over K = 1 of a phase, pair by pair (the iterations that ran in turn): median, min and max."""
    one, two = (next(r for r in rows if r["case"] == case and r["devices"] == k)[phase]["repeats_s"] for k in (1, 2))
    pairs = [b / a for a, b in zip(one, two, strict=True)]
    one_cpu, two_cpu = (next(r for r in rows if r["case"] == case and r["devices"] == k)[phase]["cpu_critical_path_s"]
                        ["repeats_s"] for k in (1, 2))
    cpu_pairs = [b / a for a, b in zip(one_cpu, two_cpu, strict=True)]
    return {"median": statistics.median(pairs), "best": min(pairs), "worst": max(pairs), "pairs": pairs,
            "cpu_critical_path_median": statistics.median(cpu_pairs), "cpu_critical_path_pairs": cpu_pairs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cases", nargs="+", default=["toy", "sd3", "sd3-fsdp"], choices=["toy", "sd3", "sd3-fsdp"])
    args = parser.parse_args()
    load = os.getloadavg()[0]
    root = Path(tempfile.mkdtemp(prefix="trainer-scaling-"))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent),
                                                             os.environ.get("PYTHONPATH")]))  # the ranks' reward
    if {"sd3", "sd3-fsdp"} & set(args.cases):
        from spotlight.models.pipelines.tiny import save_tiny_pipeline

        save_tiny_pipeline("sd3", root / "sd3")
    loop = [row for case in args.cases for row in loop_timing(case, args.repeats, root)]
    ratios = {case: {phase: ratio(loop, case, phase) for phase in ("rollout", "train")} for case in args.cases}
    scaling = [measure(1, args.repeats), measure(2, args.repeats)]
    volumes = family_volumes()
    load_after = os.getloadavg()[0]
    shutil.rmtree(root, ignore_errors=True)
    print(f"the loop, mode vanilla, no spot device; load average {load:.1f} before, {load_after:.1f} after "
          f"(2 cores: a shared machine's numbers are indicative)")
    print(f"{'case':<8} {'K':>2} {'rollout s (min-max)':>22} {'update s (min-max)':>22}")
    for row in loop:
        cells = [f"{row[p]['median_s']:>6.2f} ({row[p]['min_s']:.2f}-{row[p]['max_s']:.2f})"
                 for p in ("rollout", "train")]
        print(f"{row['case']:<8} {row['devices']:>2} {cells[0]:>22} {cells[1]:>22}")
    for case, phases in ratios.items():
        print(f"{case}: K=2/K=1 (median of pairs, min-max) rollout {phases['rollout']['median']:.2f}x "
              f"({phases['rollout']['best']:.2f}-"
              f"{phases['rollout']['worst']:.2f}), update {phases['train']['median']:.2f}x "
              f"({phases['train']['best']:.2f}-{phases['train']['worst']:.2f}); in CPU seconds of the busiest rank: "
              f"rollout {phases['rollout']['cpu_critical_path_median']:.2f}x, "
              f"update {phases['train']['cpu_critical_path_median']:.2f}x")
    print(f"\nupdate alone (toy, {PROMPTS}x{GROUP} samples, one process per rank)")
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
    config = {"prompts": PROMPTS, "group_size": GROUP, "train": TrainSection().model_dump(),
              "loop_cases": {case: loop_settings(case, Path("<tiny sd3 folder>")) for case in args.cases},
              "repeats": args.repeats}
    path.write_text(json.dumps({"commit": git_commit(), "machine": machine(), "load_average": load,
                                "load_average_after": load_after, "config": config, "loop": loop,
                                "loop_ratio_k2_over_k1": ratios, "scaling": scaling, "families": volumes,
                                "gpu": "not measured: no GPU lent"}, indent=2))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
