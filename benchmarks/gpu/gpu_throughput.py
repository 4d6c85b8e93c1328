"""One recipe's real iteration on one GPU, phase by phase, beside diffusers' own pipeline call.

What a user runs, on a random-weight folder with the published architecture (`published_pipelines.py`
for the transformer, VAE and scheduler; `recipe_pipelines.py` for the text encoders at their published
depths, heads and MLP widths: CLIP-L 12 layers, CLIP-G 32, T5-XXL 24, Qwen2.5-VL-7B 28):

1. **Spotlight**: its `Trainer` on the shipped recipe as it stands (``configs/sd35m-ocr-lora.yaml``,
   ``configs/qwen-image-ocr-lora.yaml``): the recipe's prompt set (every iteration draws new prompts, so
   their encoding is paid as a user pays it), its reward (``ocr``: rapidocr PP-OCRv4 over each image,
   overlapped with sampling by default), NFT, LoRA, ``mode=vanilla``. Only ``rollout.prompts_per_iteration``
   is cut (``--prompts``; the recipe's group of 16 kept) so that one warm-up and ``--iterations`` (>= 3)
   timed iterations fit the time budget; ``--prompts 16`` is the SD3.5-M recipe's whole 256 images.
2. **phases**: each timed iteration split into encode (the text encoders), sample (the denoising loop),
   decode (the VAE), reward (the wait for scores once sampling has ended) and reward busy (the scoring
   done in the background, overlapped), update, hand-over (θ_old,i taken from the sampling policy), EMA,
   weight shipping (the backend's start of iteration: θ_old to the devices that sample), the rest of the
   iteration, and the bytes moved host->device and device->host (`copy_meter.py`). Timers wrap Spotlight's
   own entry points and synchronise the device at those boundaries only. Median and range over the timed
   iterations.
3. **reference**: diffusers' own ``pipe(...)`` on the same folder, the same prompts the first timed
   iteration drew, the same images per prompt, steps, guidance and size (text encoding and VAE decode
   included, ``output_type="pt"``), after a warm-up call; ``--reference-repeats`` timed calls.
4. **FLOPs, MFU and memory**: transformer FLOPs by phase (`forward_meter.py`), MFU against the device's
   dense bf16 peak, ``torch.cuda.max_memory_allocated`` against Spotlight's start-up estimate.

    python benchmarks/gpu/gpu_throughput.py --model sd35m                 # one GPU
    python benchmarks/gpu/gpu_throughput.py --model sd35m --model qwen-image --out $OUT/gpu_throughput.json
    python benchmarks/gpu/gpu_throughput.py --small                       # CPU: tiny widths, seconds

Without CUDA it exits 2 with one line, unless ``--small``: tiny widths (published depths) on the CPU,
written to ``runs/gpu_throughput_small_cpu.json`` (never the GPU results file, whose numbers it would
not be). The JSON (``--out``; default benchmarks/results/gpu_throughput.json) is written after each
model, with the commit, the machine, the versions and every number; a table is printed.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

from spotlight.config import TrainConfig, load_config
from spotlight.cores import pinned
from spotlight.models.pipelines.memory_estimate import run_memory_estimate
from spotlight.models.pipelines.prompts import PromptCache
from spotlight.models.policy_section import PolicySection
from spotlight.trainer import Trainer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports

from benchmarks.gpu.copy_meter import CopyMeter
from benchmarks.gpu.forward_meter import ForwardMeter
from benchmarks.gpu.phase_clock import PhaseClock, device_memory, device_name, peak_memory, reset_peak_memory
from benchmarks.gpu.published_pipelines import MODELS
from benchmarks.gpu.recipe_pipelines import describe, save_recipe_pipeline
from benchmarks.provenance import REPO, RESULTS, git_commit, machine

# dense (no sparsity) bf16 tensor-core peaks from NVIDIA's data sheets, matched in order against the device name
PEAK_TFLOPS = (("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H200 NVL", 835.0), ("H200", 989.0), ("H100", 989.0),
               ("A100", 312.0))
# what records before the recipe's prompt set were timed on (plan_vs_measured re-tokenises their prompts)
PROMPTS = ("a red stop sign that reads STOP", "a bakery window with the word BREAD", "a book cover titled NIGHT",
           "a street sign that says MAIN ST", "a coffee cup printed with HELLO", "a poster reading OPEN LATE",
           "a license plate reading SPOT 32", "a neon sign that says JAZZ")
RECIPES = {  # per model: the shipped recipe, and the prompts per iteration timed (the recipe's group kept)
    "sd35m": {"recipe": "configs/sd35m-ocr-lora.yaml", "prompts": 2, "overrides": []},
    "qwen-image": {"recipe": "configs/qwen-image-ocr-lora.yaml", "prompts": 1, "overrides": []},
}
# small: tiny widths on a CPU, the recipe's prompts and reward; the recipe's micro-batches, checkpointing and
# LoRA ranks (32, 64: wider than the small widths themselves) are for a GPU's 512² images
SMALL = {"resolution": 32, "steps": 2, "prompts": 1, "group": 2}
SMALL_OVERRIDES = ["train.micro_batch_size=null", "model.gradient_checkpointing=false", "train.num_minibatches=1",
                   "train.num_epochs=1", "model.lora_rank=2",
                   # OCR reads nothing in a 32-px image: every group would have zero spread and no update would
                   # run; a small brightness term beside the recipe's OCR gives the update something to train on
                   "reward.name=null",
                   "reward.weights={ocr: 1.0, 'benchmarks.gpu.gpu_throughput:mean_brightness': 0.1}"]
SMALL_OUT = REPO / "runs" / "gpu_throughput_small_cpu.json"
SHIPPED_DATASETS = REPO / "spotlight" / "assets" / "datasets"
PHASES = ("encode", "sample", "decode", "reward", "update", "hand-over", "ema", "weight shipping")
NO_CUDA = ("gpu_throughput: no CUDA device here (torch.cuda.is_available() is False); run it on a GPU, or pass "
           "--small for the tiny CPU check")


def mean_brightness(images: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]]) -> torch.Tensor:
    """The small mode's second reward term (`SMALL_OVERRIDES`): each image's mean pixel value."""
    return images.float().mean(dim=(1, 2, 3))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", choices=sorted(RECIPES), default=None,
                        help="sd35m or qwen-image (repeatable; default sd35m)")
    parser.add_argument("--small", action="store_true", help="tiny widths on the CPU, its own results file")
    parser.add_argument("--iterations", type=int, default=3, help="timed iterations after the warm-up (>= 3)")
    parser.add_argument("--prompts", type=int, default=None,
                        help="prompts per iteration (default: RECIPES' cut; 16 is the SD3.5-M recipe's)")
    parser.add_argument("--reference-repeats", type=int, default=2, help="timed diffusers pipe() calls")
    parser.add_argument("--time-budget-s", type=float, default=600.0,
                        help="per model: no iteration starts that would end past this (judged by the one before)")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the device's dense bf16 peak, TFLOP/s")
    parser.add_argument("--compile", action="store_true", help="model.compile=true (when Spotlight has it)")
    parser.add_argument("--no-reference", action="store_true", help="skip diffusers' own pipeline call")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="a Spotlight config override, e.g. reward.overlap=false (repeatable)")
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="keep the pipeline folders here between runs (default: a temporary directory)")
    parser.add_argument("--keep-folders", action="store_true", help="keep each model's folder in --work-dir")
    parser.add_argument("--out", type=Path, default=None, help="the JSON to write")
    args = parser.parse_args(argv)
    if args.iterations < 3 and not args.small:
        parser.error("--iterations must be >= 3: a median and a spread need three")
    args.models = args.model or ["sd35m"]
    args.device = "cpu" if args.small else "cuda"
    args.dtype = "float32" if args.small else "bfloat16"
    if args.out is None:
        args.out = SMALL_OUT if args.small else RESULTS / "gpu_throughput.json"
    if args.small and args.out.resolve() == (RESULTS / "gpu_throughput.json").resolve():
        parser.error(f"--small writes CPU numbers: not into the GPU results file {args.out}; pick another --out")
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


def reference_call(model: str, config: TrainConfig, prompts: list[str], steps: int) -> dict[str, Any]:
    """``pipe(...)``'s arguments for Spotlight's images, as each family's pipeline spells guidance."""
    family, rollout = MODELS[model]["family"], config.rollout
    call = {"prompt": prompts, "num_images_per_prompt": rollout.group_size, "height": rollout.resolution,
            "width": rollout.resolution, "num_inference_steps": steps, "output_type": "pt"}
    negative = config.rollout.negative_prompt
    if family == "qwen-image":  # true CFG: the negative prompt's own forward
        return {**call, "true_cfg_scale": rollout.guidance_scale, "negative_prompt": [negative or ""] * len(prompts)}
    if family == "sd3":
        return {**call, "guidance_scale": rollout.guidance_scale, "negative_prompt": [negative or ""] * len(prompts)}
    return {**call, "guidance_scale": rollout.guidance_scale}  # FLUX.1-dev: guidance-distilled


def measure_reference(model: str, folder: Path, config: TrainConfig, prompts: list[str],
                      args: argparse.Namespace) -> dict[str, Any]:
    """diffusers' own pipeline call, ``--reference-repeats`` times after a warm-up: seconds and FLOPs."""
    import diffusers

    dtype = getattr(torch, args.dtype)
    pipe = diffusers.DiffusionPipeline.from_pretrained(str(folder), dtype=dtype).to(args.device)
    pipe.set_progress_bar_config(disable=True)
    meter = ForwardMeter(pipe.transformer)
    clock = PhaseClock(args.device, meter)
    call = clock.wrap(pipe.__call__, "reference")
    steps = config.rollout.num_steps
    pipe(**reference_call(model, config, prompts, min(2, steps)))  # warm-up: kernels, allocator, cuDNN choices
    seconds, count = [], 0
    for repeat in range(max(1, args.reference_repeats)):
        clock.seconds.clear()
        generator = torch.Generator(args.device).manual_seed(repeat)
        images = call(**reference_call(model, config, prompts, steps), generator=generator).images
        seconds.append(clock.seconds["reference"])
        count = int(images.shape[0])
        del images
    flops = meter.flops().get("reference", 0.0) / len(seconds)
    calls = meter.forwards("reference")["forward"] // len(seconds)
    meter.close()
    del pipe, meter, clock, call  # the meter holds the transformer and its kept inputs
    _free(args.device)
    median = statistics.median(seconds)
    return {"seconds": median, "seconds_all": seconds, "images": count, "images_per_s": count / median,
            "prompts": prompts, "flops": flops, "transformer_calls": calls}


RECORDED = {"resolution": "rollout.resolution", "steps": "rollout.num_steps", "guidance": "rollout.guidance_scale",
            "group": "rollout.group_size", "prompts": "rollout.prompts_per_iteration"}


def spotlight_config(folder: Path, work: Path, args: argparse.Namespace, model: str | None = None) -> TrainConfig:
    """The model's shipped recipe on the benchmark's folder: its prompts, reward, steps, guidance and group;
    prompts per iteration cut (`RECIPES`), and in the small mode tiny sizes. A recorded run's setting set on
    ``args`` (``resolution``, ``steps``, ``guidance``, ``group``, ``prompts``: plan_vs_measured re-plans a record
    so) is applied over both."""
    model = model or args.models[0]
    run_dir = work / f"run-{model}"
    shutil.rmtree(run_dir, ignore_errors=True)
    recipe = RECIPES[model]
    overrides = [
        f"model.pretrained={folder}", f"run_dir={run_dir}", f"device={args.device}", f"dtype={args.dtype}",
        f"rollout.prompts_per_iteration={args.prompts or recipe['prompts']}", "mode=vanilla", "pin_devices=false",
        "iterations=1000", "checkpoint_every=1000", "eval.every=1000", *recipe["overrides"],
    ]
    # a CUDA trainer's host threads launch kernels; a CPU's small mode shares its cores with whatever else runs
    overrides.append(f"num_threads={max(1, min(8, torch.get_num_threads())) if args.device == 'cuda' else 1}")
    if args.small:  # a slice of the recipe's prompts: at start Spotlight encodes every prompt it will see, and
        # ~1,000 prompts one by one through 68 small encoder layers on a CPU would be most of the run
        dataset = work / "ocr-prompts-small"
        dataset.mkdir(parents=True, exist_ok=True)
        for split, count in (("train", 8), ("test", 2)):
            lines = (SHIPPED_DATASETS / "ocr" / f"{split}.txt").read_text().splitlines()[:count]
            (dataset / f"{split}.txt").write_text("\n".join(lines) + "\n")
        overrides += [f"data.dataset={dataset}", "eval.prompts=2"]
        overrides += [f"rollout.resolution={SMALL['resolution']}", f"rollout.num_steps={SMALL['steps']}",
                      f"rollout.group_size={SMALL['group']}", f"rollout.prompts_per_iteration={SMALL['prompts']}",
                      *SMALL_OVERRIDES]
    overrides += [f"{field}={getattr(args, key)}" for key, field in RECORDED.items()
                  if getattr(args, key, None) is not None]
    if args.compile:
        overrides.append("model.compile=true")
    return load_config(TrainConfig, REPO / recipe["recipe"], overrides + args.overrides)


class BusyTimer:
    """Seconds spent inside a function called from any thread (the reward's background scoring): no device sync,
    so timing it never stalls the overlap it measures."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._lock = threading.Lock()

    def wrap(self, function: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                with self._lock:
                    self.seconds += time.perf_counter() - started

        return timed


def instrument(trainer: Trainer, clock: PhaseClock, busy: BusyTimer, seen: list[list[str]]) -> None:
    """Wrap the entry points each phase is timed at (module docstring); ``seen`` collects each rollout's prompts."""
    rollout = trainer.backend.rollout

    def noted(iteration: int, prompts: list[str], seeds: torch.Tensor) -> Any:
        seen.append(list(prompts))
        return rollout(iteration, prompts, seeds)

    trainer.backend.rollout = clock.wrap(noted, "sample")
    trainer.backend.start_iteration = clock.wrap(trainer.backend.start_iteration, "weight shipping")
    trainer.model.decode_images = clock.wrap(trainer.model.decode_images, "decode")
    reward = trainer.reward
    for method in ("score", "collect"):  # the wait for scores once sampling has ended
        if callable(getattr(reward, method, None)):
            setattr(reward, method, clock.wrap(getattr(reward, method), "reward"))
    inner = getattr(reward, "reward", None)  # the overlapped reward's own: its background scoring, not synced
    if inner is not None:
        inner.score = busy.wrap(inner.score)
    trainer.update = clock.wrap(trainer.update, "update")
    trainer.versions.hand_over = clock.wrap(trainer.versions.hand_over, "hand-over")
    trainer.update_ema = clock.wrap(trainer.update_ema, "ema")


def reserve(row: dict[str, float], load_s: float, args: argparse.Namespace) -> float:
    """Seconds to keep for diffusers' calls after Spotlight's iterations: loading the folder (about Spotlight's
    start-up) and a warm-up plus ``--reference-repeats`` calls, each about an iteration's encode + sample + decode."""
    if args.no_reference:
        return 0.0
    one_call = row["encode"] + row["sample"] + row["decode"]
    return load_s + (1 + args.reference_repeats) * one_call


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def measure_spotlight(config: TrainConfig, args: argparse.Namespace, started: float) -> dict[str, Any]:
    """Spotlight's iterations: the phase table, transformer FLOPs per phase, peak memory and the estimate."""
    estimate = run_memory_estimate(config)
    reset_peak_memory(args.device)
    encode = PromptCache._encode
    startup = PhaseClock(args.device)
    with pinned(config.device_core(0), config.num_threads), CopyMeter() as copies:
        load_started = time.perf_counter()
        PromptCache._encode = startup.wrap(encode, "encode")  # type: ignore[method-assign]
        try:  # the recipe's own reward (reward.name), overlapped as configured
            trainer = Trainer(config)
        finally:
            PromptCache._encode = encode  # type: ignore[method-assign]
        load_s = time.perf_counter() - load_started
        startup_copies = copies.take()
        try:
            meter = ForwardMeter(trainer.model.transformer)
            clock, busy, seen = PhaseClock(args.device, meter), BusyTimer(), []
            PromptCache._encode = clock.wrap(encode, "encode")  # type: ignore[method-assign]
            instrument(trainer, clock, busy, seen)
            rows, records, warmup = [], [], None
            for iteration in range(1 + args.iterations):
                if iteration > 1 and time.perf_counter() - started + rows[-1]["iteration"] + reserve(
                        rows[-1], load_s, args) > args.time_budget_s:
                    break  # the next iteration (and then diffusers' calls) would end past the budget
                if iteration == 1:
                    warmup = rows.pop()
                    meter.reset()
                clock.seconds.clear()
                busy.seconds = 0.0
                copies.take()
                clock.sync()
                iteration_started = time.perf_counter()
                record = trainer.iteration(iteration)
                clock.sync()
                row = {"iteration": time.perf_counter() - iteration_started,
                       **{phase: clock.seconds.get(phase, 0.0) for phase in PHASES}, "reward busy": busy.seconds}
                row["rest"] = row["iteration"] - sum(row[phase] for phase in PHASES)
                moved = copies.take()
                row.update({"bytes h2d": float(moved["h2d"]), "bytes d2h": float(moved["d2h"])})
                rows.append(row)
                records.append(record)
            peak = peak_memory(args.device)
            flops = meter.flops(recomputed=config.model.gradient_checkpointing)
            calls = {phase: meter.forwards(phase) for phase in ("sample", "update")}
            meter.close()
        finally:
            PromptCache._encode = encode  # type: ignore[method-assign]
            trainer.backend.close()
            close = getattr(trainer.reward, "close", None)
            if callable(close):
                close()
    timed = len(rows)
    first_prompts = seen[1] if len(seen) > 1 else seen[0]
    del trainer, meter, clock  # the meter and the wrapped methods hold the transformer
    _free(args.device)
    table = {name: spread([row[name] for row in rows]) for name in rows[0]}
    return {
        # start-up: loading, and encoding every prompt known then (model.text_encoders resident or precompute)
        "load_s": load_s, "startup_encode_s": startup.seconds.get("encode", 0.0), "startup_bytes": startup_copies,
        "warmup": warmup, "timed_iterations": timed, "fewer_than_asked": timed < args.iterations,
        "iteration_s": [row["iteration"] for row in rows], "iteration_s_median": table["iteration"]["median"],
        "phases": table, "phase_s": {name: value["median"] for name, value in table.items()},
        "phase_s_per_iteration": rows,
        "images_per_iteration": config.rollout.prompts_per_iteration * config.rollout.group_size,
        "prompts_first_timed_iteration": first_prompts,
        "flops_per_iteration": {phase: value / timed for phase, value in flops.items()},
        "transformer_calls_per_iteration": {phase: {k: v / timed for k, v in c.items()} for phase, c in calls.items()},
        "logged": {key: value for key, value in records[-1].items() if key.startswith(("time/", "rollout/reward"))},
        "peak_memory_bytes": peak, "estimate_bytes": None if estimate is None else estimate.total,
        "estimate_parts": None if estimate is None else estimate.parts,
        "copies_note": "bytes moved by Tensor.to/.cuda/.cpu/.copy_ between host and device (copy_meter.py)",
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
        # pipe() encodes, samples and decodes; Spotlight's rollout adds the wait for its reward
        "rollout_vs_reference": None if reference is None else (
            phase["encode"] + sample_decode + phase["reward"]) / reference["seconds"],
        "mfu_sample": mfu(flops.get("sample"), phase["sample"]),
        "mfu_update": mfu(flops.get("update"), phase["update"]),
        "mfu_iteration": mfu(flops.get("sample", 0.0) + flops.get("update", 0.0), iteration_s),
        "mfu_reference": None if reference is None else mfu(reference["flops"], reference["seconds"]),
        "estimate_vs_peak_memory": None if not estimate or not measured else estimate / measured,
    }


def print_table(result: dict[str, Any]) -> None:
    """The phase table (median and range over the timed iterations), then the numbers a reader compares."""
    spot, ratios, reference = result["spotlight"], result["derived"], result["reference"]

    def show(value: Any) -> str:
        if value is None:
            return "not measured"
        return f"{value:.3g}" if isinstance(value, float) else str(value)

    print(f"{result['title']}{' (small, CPU)' if result['small'] else ''} on {result['device']}: "
          f"{spot['images_per_iteration']} images an iteration, {spot['timed_iterations']} timed iterations")
    print(f"{'phase':<16} {'median':>10} {'min':>10} {'max':>10}")
    for name, value in spot["phases"].items():
        unit, scale = ("MB", 1e6) if name.startswith("bytes") else ("s", 1.0)
        print(f"{name + ' ' + unit:<16} {value['median'] / scale:>10.3f} {value['min'] / scale:>10.3f} "
              f"{value['max'] / scale:>10.3f}")
    rows = [("start-up s (encoding of it)", f"{spot['load_s']:.1f} ({spot['startup_encode_s']:.1f})"),
            ("diffusers pipe(...) s", None if reference is None else reference["seconds"]),
            *((key.replace("_", " "), ratios[key]) for key in ratios),
            ("peak memory GiB", None if spot["peak_memory_bytes"] is None else spot["peak_memory_bytes"] / 2**30),
            ("estimate GiB", None if spot["estimate_bytes"] is None else spot["estimate_bytes"] / 2**30),
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


def commit() -> str:
    """HEAD's hash, or where the tree is not a git checkout (a copy on a lent machine) $SPOTLIGHT_COMMIT."""
    found = git_commit()
    return os.environ.get("SPOTLIGHT_COMMIT", found) if found == "unknown" else found


def _free(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.small and not torch.cuda.is_available():
        print(NO_CUDA)
        return 2
    import transformers

    transformers.logging.set_verbosity_error()  # character-level prompts longer than CLIP's 77: truncated, as released
    threads = torch.get_num_threads()
    if args.small:  # both the reference and Spotlight on one thread: a shared CPU's other work does not tip the ratio
        torch.set_num_threads(1)
    try:
        for model in args.models:
            measure(model, args)
        return 0
    finally:
        torch.set_num_threads(threads)


def measure(model: str, args: argparse.Namespace) -> None:
    """Build the folder, run Spotlight's recipe, write the JSON; then diffusers' call, the JSON again, the table.

    Written once before diffusers' call too, so that Spotlight's numbers survive a reference call the step's
    time limit cuts short (``reference_pending`` says so)."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-throughput-") as scratch:
        work = args.work_dir or Path(scratch)
        folder, built = save_recipe_pipeline(model, work / f"{model}{'-small' if args.small else ''}",
                                             args.small, args.device, getattr(torch, args.dtype))
        setup = {"setup_s": time.perf_counter() - started, "pipeline_built": built}
        config = spotlight_config(folder, work, args, model)
        spot = measure_spotlight(config, args, started)
        if not args.no_reference:
            write_result(args.out, assemble(model, config, args, spot, None, setup, started, pending=True))
        prompts = spot["prompts_first_timed_iteration"]
        reference = None if args.no_reference else measure_reference(model, folder, config, prompts, args)
        if args.work_dir is not None and not args.keep_folders:
            shutil.rmtree(folder, ignore_errors=True)  # the next model's folder needs the room (41 GB for Qwen)
    result = assemble(model, config, args, spot, reference, setup, started, pending=False)
    write_result(args.out, result)
    print_table(result)
    print(f"wrote {args.out} ({result['total_s']:.0f} s)")


def assemble(model: str, config: TrainConfig, args: argparse.Namespace, spot: dict[str, Any],
             reference: dict[str, Any] | None, setup: dict[str, Any], started: float, pending: bool) -> dict[str, Any]:
    """One model's entry of the results JSON."""
    import diffusers

    peak, peak_source = peak_flops(args)
    return {
        "benchmark": "gpu_throughput", "commit": commit(), "command": " ".join(sys.argv),
        "machine": machine(), "device": device_name(args.device), "device_memory_bytes": device_memory(args.device),
        "torch": torch.__version__, "diffusers": diffusers.__version__, "model": model,
        "title": MODELS[model]["title"], "small": args.small, "text_encoders": describe(model, args.small),
        "setting": {"recipe": RECIPES[model]["recipe"], "resolution": config.rollout.resolution,
                    "steps": config.rollout.num_steps, "guidance": config.rollout.guidance_scale,
                    "prompts": config.rollout.prompts_per_iteration, "group": config.rollout.group_size,
                    "dataset": "ocr (its first 8 prompts)" if args.small else config.data.dataset,
                    "reward": config.reward.name or config.reward.weights,
                    "reward_overlap": config.reward.overlap, "reward_device": config.reward.device,
                    "dtype": args.dtype, "overrides": RECIPES[model]["overrides"] + args.overrides,
                    "gradient_checkpointing": config.model.gradient_checkpointing,
                    "micro_batch_size": config.train.micro_batch_size, "lora_rank": config.model.lora_rank},
        "peak_flops": peak, "peak_flops_source": peak_source,
        "flops_note": "model FLOPs of the transformer calls only (text encoders and VAE not counted): a training "
                      "call is its forward and backward; gradient checkpointing's recomputed forward is not counted",
        **setup, "total_s": time.perf_counter() - started, "reference_pending": pending,
        "reference": reference, "spotlight": spot, "derived": derived(reference, spot, peak),
        "time_budget_s": args.time_budget_s,
    }


if __name__ == "__main__":
    sys.exit(main())
