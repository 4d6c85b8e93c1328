"""Throughput on one device: Spotlight's rollout and update against diffusers' own pipeline call, with MFU and memory.

The measurement issue 32 is judged by. In one process on one device, on a random-weight pipeline
folder with a published architecture (`published_pipelines.py`: SD3.5-Medium, Qwen-Image, FLUX.1-dev):

1. **reference**: diffusers' own ``pipe(...)`` for the same prompts, images, steps, guidance and size
   (text encoding and VAE decode included, ``output_type="pt"``), after a 2-step warm-up call;
2. **Spotlight**: its `Trainer` on the shipped recipe (``configs/<model>-ocr-lora.yaml``: NFT, LoRA,
   ``mode=vanilla``) with a reward that needs no model (mean brightness), one warm-up iteration, then
   timed ``Trainer.iteration`` calls, each split into sampling (the backend's rollout), decode (the
   policy's VAE), reward, and the update. Only Spotlight's own entry points are called; the split comes
   from timers wrapped around them, which synchronise the device at phase boundaries only;
3. **FLOPs and MFU**: every transformer call is counted by phase and shape, and each shape's FLOPs
   counted once by ``torch.utils.flop_counter`` (`forward_meter.py`); MFU = FLOPs / seconds / the
   device's dense bf16 peak (`PEAK_TFLOPS`, or ``--peak-tflops``);
4. **memory**: ``torch.cuda.max_memory_allocated`` over Spotlight's run against its start-up estimate
   (`spotlight.models.pipelines.memory_estimate`).

    python benchmarks/gpu_throughput.py --model sd35m            # one GPU: 512², CFG 4.5, 10 steps, 32 images
    python benchmarks/gpu_throughput.py --model qwen-image       # 512², true CFG 4, 10 steps, 32 images, LoRA 64
    python benchmarks/gpu_throughput.py --small                  # CPU: tiny widths, seconds (what the suite runs)

Writes JSON (``--out``; default benchmarks/results/gpu_throughput.json, or runs/gpu_throughput_small.json in
the small mode, whose numbers describe the plumbing, not a GPU) with the commit, the device, the versions
and every number, and prints a table.
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from forward_meter import ForwardMeter
from gpu_smoke import Brightness
from phase_clock import PhaseClock, device_memory, device_name, peak_memory, reset_peak_memory
from provenance import REPO, RESULTS, git_commit, machine
from published_pipelines import MODELS, describe_text_encoders, save_pipeline

from spotlight.config import TrainConfig, load_config
from spotlight.cores import pinned
from spotlight.models.pipelines.memory_estimate import run_memory_estimate
from spotlight.models.policy_section import PolicySection
from spotlight.trainer import Trainer

# dense (no sparsity) bf16 tensor-core peaks from NVIDIA's data sheets, matched in order against the device name
PEAK_TFLOPS = (("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H200 NVL", 835.0), ("H200", 989.0), ("H100", 989.0),
               ("A100", 312.0))
PROMPTS = ("a red stop sign that reads STOP", "a bakery window with the word BREAD", "a book cover titled NIGHT",
           "a street sign that says MAIN ST", "a coffee cup printed with HELLO", "a poster reading OPEN LATE",
           "a license plate reading SPOT 32", "a neon sign that says JAZZ")
FULL = {  # per model: the recipe and the setting (images = prompts x group)
    "sd35m": {"recipe": "configs/sd35m-ocr-lora.yaml", "resolution": 512, "steps": 10, "guidance": 4.5,
              "prompts": 4, "group": 8, "overrides": []},
    "qwen-image": {"recipe": "configs/qwen-image-ocr-lora.yaml", "resolution": 512, "steps": 10, "guidance": 4.0,
                   "prompts": 2, "group": 16, "overrides": ["train.num_minibatches=1"]},  # 32 images a step
    "flux": {"recipe": "configs/flux-dev-geneval-lora.yaml", "resolution": 512, "steps": 10, "guidance": 3.5,
             "prompts": 4, "group": 8, "overrides": []},
}
SMALL = {"resolution": 32, "steps": 2, "prompts": 2, "group": 2}
# the recipes' micro-batches and passes are for a GPU's 512² images, and their LoRA ranks (32, 64) are wider than
# the small widths themselves: a CPU checks the plumbing
SMALL_OVERRIDES = ["train.micro_batch_size=null", "model.gradient_checkpointing=false", "train.num_minibatches=1",
                   "train.num_epochs=1", "model.lora_rank=2"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="sd35m")
    parser.add_argument("--small", action="store_true", help="tiny widths and few steps (automatic without CUDA)")
    parser.add_argument("--iterations", type=int, default=1, help="timed Spotlight iterations after the warm-up")
    parser.add_argument("--time-budget-s", type=float, default=480.0,
                        help="no iteration starts that would end past this wall time (judged by the one before); "
                             "if only the warm-up fits, it is the measurement (measured_cold: true)")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the device's dense bf16 peak, TFLOP/s")
    parser.add_argument("--compile", action="store_true", help="model.compile=true (when Spotlight has it)")
    parser.add_argument("--no-reference", action="store_true", help="skip diffusers' own pipeline call")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="a Spotlight config override, e.g. train.micro_batch_size=16 (repeatable)")
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="keep the pipeline folder here between runs (default: a temporary directory)")
    parser.add_argument("--out", type=Path, default=None, help="the JSON to write")
    args = parser.parse_args(argv)
    args.small = args.small or not torch.cuda.is_available()
    args.device = "cuda" if torch.cuda.is_available() else "cpu"
    args.dtype = "bfloat16" if args.device == "cuda" else "float32"
    setting = {**FULL[args.model], **(SMALL if args.small else {})}
    for key, value in setting.items():
        setattr(args, key, value)
    if args.out is None:
        args.out = REPO / "runs" / "gpu_throughput_small.json" if args.small else RESULTS / "gpu_throughput.json"
    if args.compile and "compile" not in PolicySection.model_fields:
        parser.error("--compile: model.compile is not a Spotlight option at this commit; run without --compile")
    return args


def peak_flops(args: argparse.Namespace) -> tuple[float | None, str]:
    """The device's dense bf16 peak in FLOP/s and where it came from (None: unknown, so no MFU)."""
    if args.peak_tflops is not None:
        return args.peak_tflops * 1e12, "--peak-tflops"
    name = device_name(args.device)
    for key, tflops in PEAK_TFLOPS:
        if key in name:
            return tflops * 1e12, f"table: {key} {tflops:g} TFLOP/s dense bf16"
    return None, f"unknown for {name!r}: pass --peak-tflops"


def reference_call(args: argparse.Namespace, prompts: list[str], steps: int) -> dict[str, Any]:
    """``pipe(...)``'s arguments for the benchmark's images, as each family's pipeline spells guidance."""
    family = MODELS[args.model]["family"]
    call = {"prompt": prompts, "num_images_per_prompt": args.group, "height": args.resolution,
            "width": args.resolution, "num_inference_steps": steps, "output_type": "pt"}
    if family == "qwen-image":  # true CFG: the negative prompt's own forward
        return {**call, "true_cfg_scale": args.guidance, "negative_prompt": [""] * len(prompts)}
    if family == "sd3":
        return {**call, "guidance_scale": args.guidance, "negative_prompt": [""] * len(prompts)}
    return {**call, "guidance_scale": args.guidance}  # FLUX.1-dev: guidance-distilled, the scale is an input


def measure_reference(folder: Path, prompts: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """diffusers' own pipeline call: seconds, images per second and the transformer's FLOPs."""
    import diffusers

    dtype = getattr(torch, args.dtype)
    pipe = diffusers.DiffusionPipeline.from_pretrained(str(folder), dtype=dtype).to(args.device)
    pipe.set_progress_bar_config(disable=True)
    meter = ForwardMeter(pipe.transformer)
    clock = PhaseClock(args.device, meter)
    call = clock.wrap(pipe.__call__, "reference")
    pipe(**reference_call(args, prompts, 1 if args.small else 2))  # warm-up: kernels, allocator, cuDNN choices
    generator = torch.Generator(args.device).manual_seed(0)
    images = call(**reference_call(args, prompts, args.steps), generator=generator).images
    seconds = clock.seconds["reference"]
    flops = meter.flops().get("reference", 0.0)
    calls = meter.forwards("reference")["forward"]
    meter.close()
    count = int(images.shape[0])
    del pipe, images, meter, clock, call  # the meter holds the transformer and its kept inputs
    _free(args.device)
    return {"seconds": seconds, "images": count, "images_per_s": count / seconds, "flops": flops,
            "transformer_calls": calls}


def spotlight_config(folder: Path, work: Path, args: argparse.Namespace) -> TrainConfig:
    """The model's shipped recipe, on the benchmark's folder, prompts, images and steps."""
    dataset = work / "prompts"
    dataset.mkdir(parents=True, exist_ok=True)
    (dataset / "train.txt").write_text("\n".join(PROMPTS[:args.prompts]) + "\n")  # every iteration: these prompts
    (dataset / "test.txt").write_text(PROMPTS[0] + "\n")
    run_dir = work / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    overrides = [
        f"model.pretrained={folder}", f"data.dataset={dataset}", f"run_dir={run_dir}", f"device={args.device}",
        f"dtype={args.dtype}", f"rollout.resolution={args.resolution}", f"rollout.num_steps={args.steps}",
        f"rollout.guidance_scale={args.guidance}", f"rollout.prompts_per_iteration={args.prompts}",
        f"rollout.group_size={args.group}", "mode=vanilla", "pin_devices=false", "iterations=1000",
        "checkpoint_every=1000", "eval.every=1000", "train.algorithm=nft", *FULL[args.model]["overrides"],
    ]
    # a CUDA trainer's host threads launch kernels; a CPU's small mode shares its cores with whatever else runs
    overrides.append(f"num_threads={max(1, min(8, torch.get_num_threads())) if args.device == 'cuda' else 1}")
    if args.small:
        overrides += SMALL_OVERRIDES
    if args.compile:
        overrides.append("model.compile=true")
    return load_config(TrainConfig, REPO / FULL[args.model]["recipe"], overrides + args.overrides)


def measure_spotlight(config: TrainConfig, args: argparse.Namespace, started: float) -> dict[str, Any]:
    """Spotlight's iterations: per-phase seconds, transformer FLOPs per phase, peak memory and the estimate."""
    estimate = run_memory_estimate(config)
    reset_peak_memory(args.device)
    reward = Brightness()
    with pinned(config.device_core(0), config.num_threads):
        load_started = time.perf_counter()
        trainer = Trainer(config, reward=reward)
        load_s = time.perf_counter() - load_started
        try:
            meter = ForwardMeter(trainer.model.transformer)
            clock = PhaseClock(args.device, meter)
            trainer.backend.rollout = clock.wrap(trainer.backend.rollout, "sample")
            trainer.model.decode_images = clock.wrap(trainer.model.decode_images, "decode")
            reward.score = clock.wrap(reward.score, "reward")
            trainer.update = clock.wrap(trainer.update, "update")
            iteration_s, phases, records, warmup = [], [], [], None
            for iteration in range(1 + args.iterations):
                if iteration and time.perf_counter() - started + iteration_s[-1] > args.time_budget_s:
                    break  # the next iteration would end past the budget: with none timed, the warm-up is measured
                if iteration == 1:
                    warmup = {"iteration_s": iteration_s.pop(), "phases": phases.pop()}
                    meter.reset()
                clock.seconds.clear()
                clock.sync()
                iteration_started = time.perf_counter()
                record = trainer.iteration(iteration)
                clock.sync()
                iteration_s.append(time.perf_counter() - iteration_started)
                phases.append(dict(clock.seconds))
                records.append(record)
            peak = peak_memory(args.device)
            flops = meter.flops(recomputed=config.model.gradient_checkpointing)
            calls = {phase: meter.forwards(phase) for phase in ("sample", "update")}
            meter.close()
        finally:
            trainer.backend.close()
    del trainer, meter, clock, reward  # the meter and the wrapped methods hold the transformer
    _free(args.device)
    timed = len(iteration_s)
    mean = {phase: sum(p.get(phase, 0.0) for p in phases) / timed for phase in ("sample", "decode", "reward", "update")}
    return {
        "load_s": load_s, "warmup": warmup, "measured_cold": warmup is None, "timed_iterations": timed,
        "iteration_s": iteration_s,
        "iteration_s_median": statistics.median(iteration_s), "phase_s": mean, "phase_s_per_iteration": phases,
        "images_per_iteration": args.prompts * args.group,
        "flops_per_iteration": {phase: value / timed for phase, value in flops.items()},
        "transformer_calls_per_iteration": {phase: {k: v / timed for k, v in c.items()} for phase, c in calls.items()},
        "logged": {key: value for key, value in records[-1].items() if key.startswith("time/")},
        "peak_memory_bytes": peak, "estimate_bytes": None if estimate is None else estimate.total,
        "estimate_parts": None if estimate is None else estimate.parts,
    }


def derived(reference: dict[str, Any] | None, spot: dict[str, Any], peak: float | None) -> dict[str, Any]:
    """The ratios the issue's targets are stated in; None where an input is missing."""
    phase, flops = spot["phase_s"], spot["flops_per_iteration"]
    iteration_s = spot["iteration_s_median"]
    sample_decode = phase["sample"] + phase["decode"]

    def mfu(work: float | None, seconds: float) -> float | None:
        return None if peak is None or not work or seconds <= 0 else work / seconds / peak

    estimate, measured = spot["estimate_bytes"], spot["peak_memory_bytes"]
    return {
        "images_per_gpu_s": spot["images_per_iteration"] / iteration_s,
        "sample_plus_decode_s": sample_decode,
        "sample_plus_decode_vs_reference": None if reference is None else sample_decode / reference["seconds"],
        "rollout_vs_reference": None if reference is None else (
            sample_decode + phase["reward"]) / reference["seconds"],
        "mfu_sample": mfu(flops.get("sample"), phase["sample"]),
        "mfu_update": mfu(flops.get("update"), phase["update"]),
        "mfu_iteration": mfu(flops.get("sample", 0.0) + flops.get("update", 0.0), iteration_s),
        "mfu_reference": None if reference is None else mfu(reference["flops"], reference["seconds"]),
        "estimate_vs_peak_memory": None if not estimate or not measured else estimate / measured,
    }


def print_table(result: dict[str, Any]) -> None:
    """The numbers a reader compares, one a line."""
    spot, ratios, reference = result["spotlight"], result["derived"], result["reference"]

    def show(value: Any, unit: str = "") -> str:
        if value is None:
            return "not measured"
        return f"{value:.3g}{unit}" if isinstance(value, float) else f"{value}{unit}"

    rows = [("device", result["device"]), ("model", result["title"] + (" (small)" if result["small"] else "")),
            ("images per iteration", spot["images_per_iteration"]),
            ("diffusers pipe(...) s", None if reference is None else reference["seconds"])]
    rows += [(f"spotlight {phase} s", spot["phase_s"][phase]) for phase in ("sample", "decode", "reward", "update")]
    rows += [("spotlight iteration s", spot["iteration_s_median"]),
             *((key.replace("_", " "), ratios[key]) for key in ratios),
             ("peak memory GiB", None if spot["peak_memory_bytes"] is None else spot["peak_memory_bytes"] / 2**30),
             ("estimate GiB", None if spot["estimate_bytes"] is None else spot["estimate_bytes"] / 2**30),
             ("timed iterations", f"{spot['timed_iterations']}" + (" (the warm-up: no other fit the time budget)"
                                                                   if spot["measured_cold"] else "")),
             ("total s", f"{result['total_s']:.0f} (budget {result['time_budget_s']:.0f})")]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {show(value)}")
    print(result["text_encoders"])


def write_result(path: Path, result: dict[str, Any]) -> None:
    """Put ``result`` under its model in the JSON at ``path``, keeping the other models' runs already there
    (each names its own commit and device), so one file holds every architecture measured."""
    runs: dict[str, Any] = {}
    if path.is_file():
        try:
            runs = json.loads(path.read_text()).get("runs", {})
        except (json.JSONDecodeError, AttributeError):
            runs = {}  # not this benchmark's file: replaced
    runs[result["model"]] = result
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"benchmark": "gpu_throughput", "runs": runs}, indent=1, default=str) + "\n")


def _free(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    threads = torch.get_num_threads()
    if args.small:  # both the reference and Spotlight on one thread: a shared CPU's other work does not tip the ratio
        torch.set_num_threads(1)
    try:
        return measure(args)
    finally:
        torch.set_num_threads(threads)


def measure(args: argparse.Namespace) -> int:
    """Build the folder, measure the reference and Spotlight, write the JSON and print the table."""
    started = time.perf_counter()
    prompts = list(PROMPTS[:args.prompts])
    peak, peak_source = peak_flops(args)
    with tempfile.TemporaryDirectory(prefix="gpu-throughput-") as scratch:
        work = args.work_dir or Path(scratch)
        folder, built = save_pipeline(args.model, work / f"{args.model}{'-small' if args.small else ''}",
                                      args.small, args.device, getattr(torch, args.dtype))
        setup_s = time.perf_counter() - started
        reference = None if args.no_reference else measure_reference(folder, prompts, args)
        config = spotlight_config(folder, work, args)
        spot = measure_spotlight(config, args, started)
    import diffusers

    result = {
        "benchmark": "gpu_throughput", "commit": git_commit(), "command": " ".join(sys.argv),
        "machine": machine(), "device": device_name(args.device), "device_memory_bytes": device_memory(args.device),
        "torch": torch.__version__,
        "diffusers": diffusers.__version__, "model": args.model, "title": MODELS[args.model]["title"],
        "small": args.small, "text_encoders": describe_text_encoders(args.model, args.small),
        "setting": {"resolution": args.resolution, "steps": args.steps, "guidance": args.guidance,
                    "prompts": args.prompts, "group": args.group, "dtype": args.dtype,
                    "recipe": FULL[args.model]["recipe"],
                    "overrides": FULL[args.model]["overrides"] + args.overrides,
                    "gradient_checkpointing": config.model.gradient_checkpointing,
                    "micro_batch_size": config.train.micro_batch_size, "lora_rank": config.model.lora_rank},
        "peak_flops": peak, "peak_flops_source": peak_source,
        "flops_note": "model FLOPs of the transformer calls only (text encoders and VAE not counted): a training "
                      "call is its forward and backward; gradient checkpointing's recomputed forward is not counted",
        "setup_s": setup_s, "pipeline_built": built, "total_s": time.perf_counter() - started,
        "reference": reference, "spotlight": spot, "derived": derived(reference, spot, peak),
    }
    result["time_budget_s"] = args.time_budget_s
    result["within_time_budget"] = result["total_s"] <= args.time_budget_s
    write_result(args.out, result)
    print_table(result)
    print(f"wrote {args.out} ({result['total_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
