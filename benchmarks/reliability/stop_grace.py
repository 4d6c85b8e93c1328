"""How much of ``runtime.stop_grace_s`` a stop's checkpoint takes: measured on tiny models, estimated for 20 B.

A SIGTERM'd run writes one checkpoint before it exits (`spotlight.components.stop_signals`); the
scheduler's grace (Kubernetes: 30 s) must cover it. This program

1. times `Trainer.checkpoint` (the call a stop makes: atomic, fsync'd, with the optimizer, EMA and
   loop state) for the shipped TinyDiT and a tiny SD3 pipeline folder with LoRA, and the bytes it
   wrote; the ratio bytes / trainable parameters is what a checkpoint costs per trainable parameter
   (weights, Adam's two moments, the EMA, the sampling and previous versions);
2. measures this disk's durable write rate (a safetensors file of ``--probe-mb`` MiB, fsync'd);
3. counts the trainable parameters of Qwen-Image's 20 B transformer (built on the meta device from
   benchmarks/model_configs, no weights) for LoRA at Spotlight's default targets and rank, and for
   a full fine-tune, and estimates each checkpoint as bytes per trainable parameter (measured on the
   tiny LoRA folder) x parameters / the disk rate.

    .venv/bin/python benchmarks/reliability/stop_grace.py [--out benchmarks/results/stop_grace.json]

The estimate scales the tiny folder's bytes per parameter; a real run writes the LoRA export and
the base's fingerprint besides (both small), and a network disk is slower than a local NVMe.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports

from benchmarks.provenance import cpu_model, git_commit  # noqa: E402
from spotlight.config import TrainConfig, parse_config  # noqa: E402
from spotlight.trainer import Trainer  # noqa: E402

QWEN = Path(__file__).resolve().parents[1] / "model_configs" / "qwen-image" / "transformer.json"


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def time_checkpoint(settings: dict, repeats: int = 3) -> dict[str, float]:
    """Median seconds of Trainer.checkpoint, the bytes of one checkpoint and the trainable parameters."""
    trainer = Trainer(parse_config(TrainConfig, settings))
    try:
        seconds = []
        for k in range(repeats):
            started = time.perf_counter()
            trainer.checkpoint(k + 1)
            seconds.append(time.perf_counter() - started)
        written = folder_bytes(Path(settings["run_dir"]) / "checkpoints" / "iter-000001")
        trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    finally:
        trainer.backend.close()
        trainer._lock.release()
    return {"checkpoint_s": sorted(seconds)[len(seconds) // 2], "bytes": written, "trainable": trainable}


def disk_rate(folder: Path, megabytes: int) -> float:
    """Bytes per second of a durable safetensors write (the format and fsync a checkpoint uses)."""
    from safetensors.torch import save_file

    tensor = torch.ones(megabytes * 1024 * 1024 // 4)
    path = folder / "probe.safetensors"
    started = time.perf_counter()
    save_file({"probe": tensor}, str(path))
    with path.open("rb+") as file:
        os.fsync(file.fileno())
    rate = path.stat().st_size / (time.perf_counter() - started)
    path.unlink()
    return rate


def qwen_trainable(rank: int) -> tuple[int, int]:
    """(LoRA parameters at Spotlight's default targets and ``rank``, all parameters) of Qwen-Image's transformer."""
    import diffusers

    from spotlight.models.pipelines.family_config import DEFAULT_LORA_TARGETS

    config = {k: v for k, v in json.loads(QWEN.read_text()).items() if not k.startswith("_")}
    with torch.device("meta"):
        transformer = diffusers.QwenImageTransformer2DModel(**config)
    lora = sum(rank * (module.in_features + module.out_features) for name, module in transformer.named_modules()
               if isinstance(module, torch.nn.Linear) and name.endswith(DEFAULT_LORA_TARGETS))
    return lora, sum(p.numel() for p in transformer.parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--probe-mb", type=int, default=256)
    args = parser.parse_args()
    from spotlight.models.pipelines.tiny import save_tiny_pipeline

    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        tiny = {"mode": "vanilla", "num_threads": 1, "eval": {"every": 100}}
        rows = {"tinydit (shapes-base, full)": time_checkpoint({**tiny, "run_dir": str(root / "tinydit")}),
                "tiny sd3 folder, LoRA": time_checkpoint(
                    {**tiny, "run_dir": str(root / "sd3"),
                     "model": {"pretrained": str(save_tiny_pipeline("sd3", root / "sd3-folder"))}})}
        rate = disk_rate(root, args.probe_mb)
    per_parameter = rows["tiny sd3 folder, LoRA"]["bytes"] / rows["tiny sd3 folder, LoRA"]["trainable"]
    rank = parse_config(TrainConfig, {}).model.lora_rank
    lora, total = qwen_trainable(rank)
    # full fine-tune: bf16 weights (2 B) + fp32 Adam moments (8 B) + EMA in bf16 (2 B) per parameter
    estimates = {f"Qwen-Image 20 B, LoRA rank {rank}": (lora, lora * per_parameter),
                 "Qwen-Image 20 B, full fine-tune": (total, total * 12.0)}
    print(f"{'checkpoint':40} {'trainable':>14} {'bytes':>14} {'seconds':>9}")
    for name, row in rows.items():
        print(f"{name:40} {row['trainable']:>14,} {row['bytes']:>14,} {row['checkpoint_s']:>9.3f}")
    for name, (parameters, size) in estimates.items():
        print(f"{name + ' (estimate)':40} {parameters:>14,} {int(size):>14,} {size / rate:>9.1f}")
    print(f"disk: {rate / 1e6:.0f} MB/s durable safetensors write; {per_parameter:.1f} bytes per trainable parameter "
          "(tiny LoRA folder)")
    if args.out is not None:
        args.out.write_text(json.dumps({
            "commit": git_commit(), "cpu": cpu_model(), "disk_bytes_per_s": rate,
            "bytes_per_trainable_parameter": per_parameter, "measured": rows,
            "estimated": {name: {"trainable": p, "bytes": s, "seconds": s / rate}
                          for name, (p, s) in estimates.items()},
        }, indent=1))


if __name__ == "__main__":
    main()
