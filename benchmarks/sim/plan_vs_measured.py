"""`spotlight plan`'s predictions against measured iterations: FLOPs per phase, and seconds per phase.

The measurements are `gpu_throughput.py`'s (Spotlight's real `Trainer` on a random-weight pipeline folder,
each transformer call metered by phase and its FLOPs counted by replaying it under torch's counter):

- **on this CPU** (``--cpu``): `gpu_throughput.py --small` runs now for each model (small widths, a few
  seconds each, one thread), into ``runs/``;
- **on a GPU**: ``benchmarks/results/gpu_throughput.json`` when it exists (one entry per model, each with
  its own commit and device); where it does not, every GPU row says "not measured: no GPU lent".

For each run the plan is rebuilt from the run's own recorded command (`gpu_throughput.spotlight_config`
makes the same TrainConfig), so it prices what ran: its recipe, resolution, steps, guidance, LoRA rank and
passes. Predicted FLOPs come from `spotlight.sim.planning.folder_workload` (meta-device counts x the forwards
and passes per algorithm); predicted seconds are FLOPs / (efficiency x peak):

- a GPU: the GPU profile of its device name (`spotlight/market/gpus.yaml`, or ``--profiles``) as shipped;
- this CPU: no spec-sheet peak, so its "peak" is a measured single-thread float32 matmul rate (the run's
  thread count) and the efficiency is fitted on one model's rollout (the first ``--models``): the other
  phases and models are then predictions. The implied efficiency of every phase is printed too.

The FLOPs are compared on a GPU only: the meter replays each call under torch's counter, and on a CPU
SDPA runs its flash kernel, for which torch's counter has no formula, so the CPU meter counts no
attention at all (the plan counts it: the test suite checks the plan's count against torch's counter
with SDPA's maths backend on real weights).

Prints a table of ratios (predicted / measured) and writes JSON with the commit and the machine.

    python benchmarks/sim/plan_vs_measured.py --cpu                  # the small CPU runs (about a minute)
    python benchmarks/sim/plan_vs_measured.py                        # GPU results only, when they exist
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from spotlight.models.pipelines.family_config import DiffusersPolicyConfig
from spotlight.models.rebuild import policy_from_config
from spotlight.plan_config import PlanConfig
from spotlight.sim.planning.device_profiles import DeviceProfile, load_profiles, write_measured_efficiency
from spotlight.sim.planning.folder_sim import PlanSection
from spotlight.sim.planning.folder_workload import FolderWorkload, derive_workload
from spotlight.sim.planning.model_folders import model_folder

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports

from benchmarks.gpu.gpu_throughput import PROMPTS, spotlight_config
from benchmarks.gpu.gpu_throughput import parse_args as gpu_throughput_args
from benchmarks.gpu.published_pipelines import save_pipeline
from benchmarks.provenance import REPO, RESULTS, git_commit, machine

SHIPPED = {"sd35m": "sd3.5-medium", "qwen-image": "qwen-image"}  # full-size runs: the plan's config-only folders
GPU_PROFILES = (("H200", "H200"), ("H100", "H100-SXM"))  # device-name substring -> profile


def cpu_matmul_flops(threads: int, size: int = 512, repeats: int = 20) -> float:
    """Sustained float32 matmul FLOP/s of this CPU on ``threads`` threads (the CPU's stand-in for a peak)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(size, size), torch.randn(size, size)
        for _ in range(3):
            a @ b
        started = time.perf_counter()
        for _ in range(repeats):
            a @ b
        return 2 * size**3 * repeats / (time.perf_counter() - started)
    finally:
        torch.set_num_threads(previous)


def _qwen_prompt_tokens(model: str, run_args: argparse.Namespace, work: Path) -> int:
    """Qwen-Image's text tokens are the prompts' own: encode the run's prompts with the small folder's
    encoders (the character tokenizer is the same at every width) and take the longest (the batch's padding)."""
    folder, _ = save_pipeline(model, work / f"{model}-small", True, "cpu", torch.float32)
    policy = policy_from_config(DiffusersPolicyConfig(family="qwen-image", pretrained=str(folder), pipeline=True,
                                                      resolution=(32, 32), dtype="float32"))
    prompts = list(PROMPTS[:run_args.prompts])
    return int(policy.prompts.embeddings(policy.prompts.ids(prompts)).embeds.shape[1]) - 5  # the template's 5


def plan_of(run: dict[str, Any], work: Path, profile: DeviceProfile) -> FolderWorkload:
    """The plan's workload for a recorded gpu_throughput run: the same TrainConfig, on a folder of its configs."""
    run_args = gpu_throughput_args(shlex.split(run["command"])[1:])
    # parse_args picks the small setting on a machine without CUDA: the run's recorded setting is what ran
    setting = run["setting"]
    for key in ("resolution", "steps", "guidance", "prompts", "group", "dtype"):
        setattr(run_args, key, setting[key])
    run_args.small, run_args.device = run["small"], "cpu"  # the device only names where a Trainer would run
    model = run["model"]
    if run["small"]:
        folder, _ = save_pipeline(model, work / f"{model}-small", True, "cpu", torch.float32)
    elif model in SHIPPED:
        folder = model_folder(SHIPPED[model])
    else:
        raise KeyError(f"no config-only folder for {model}: ship one under spotlight/sim/planning/model_configs")
    train = spotlight_config(folder, work / "config", run_args)
    prompt_tokens = _qwen_prompt_tokens(model, run_args, work) if model == "qwen-image" else 32
    plan = PlanConfig(model=train.model, rollout=train.rollout, train=train.train, dtype=train.dtype,
                      plan=PlanSection(gpu=profile.name, prompt_tokens=prompt_tokens))
    return derive_workload(plan, profile.model_copy(update={"memory_gb": 1e6}))  # the fit is not what is checked


def predicted_flops(work: FolderWorkload, images: int) -> dict[str, float]:
    """Model FLOPs per iteration by phase, as the meter counts them (no checkpoint recompute)."""
    passes = work.update_passes
    update = (passes["forward and backward"] * work.train_pass_flops
              + (passes.get("sampling-policy forward", 0) + passes.get("reference forward", 0)) * work.forward_flops)
    return {"sample": images * work.rollout_flops_per_image, "update": images * update}


def compare(run: dict[str, Any], work: Path, profiles: dict[str, DeviceProfile],
            cpu_peak: float | None) -> dict[str, Any]:
    """One run's predicted and measured FLOPs and seconds per phase, with their ratios."""
    device = run["device"]
    profile = next((profiles[name] for key, name in GPU_PROFILES if key in device), None)
    stand_in = profile or profiles["H100-SXM"]  # a CPU run still needs a profile to build the plan with
    workload = plan_of(run, work, stand_in)
    spot = run["spotlight"]
    images = spot["images_per_iteration"]
    flops = predicted_flops(workload, images)
    # what the plan divides by efficiency x peak: the hardware's work, checkpointing's recompute included
    work_flops = {"sample": images * workload.rollout_flops_per_image,
                  "update": images * workload.update_flops_per_sample}
    row: dict[str, Any] = {"model": run["model"], "small": run["small"], "device": device, "commit": run["commit"],
                           "text_tokens": workload.text_tokens, "phases": {}}
    for phase, efficiency in (("sample", stand_in.rollout_efficiency), ("update", stand_in.update_efficiency)):
        measured_flops = spot["flops_per_iteration"].get(phase)
        measured_s = spot["phase_s"][phase]
        peak = profile.peak_bf16_dense_tflops * 1e12 if profile else cpu_peak
        comparable = measured_flops and profile is not None  # the CPU meter misses attention (module docstring)
        entry = {"predicted_flops": flops[phase], "measured_flops": measured_flops,
                 "flops_ratio": flops[phase] / measured_flops if comparable else None,
                 "work_flops": work_flops[phase], "measured_s": measured_s,
                 "implied_efficiency": work_flops[phase] / measured_s / peak if peak else None}
        if profile is not None:
            entry["predicted_s"] = work_flops[phase] / (efficiency * peak)
            entry["time_ratio"] = entry["predicted_s"] / measured_s
        row["phases"][phase] = entry
    return row


def _runs(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    data = json.loads(path.read_text())
    return list(data["runs"].values()) if "runs" in data else [data]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="measure the small CPU runs now and compare them")
    parser.add_argument("--models", nargs="+", default=["sd35m", "qwen-image", "flux"])
    parser.add_argument("--gpu-results", type=Path, default=RESULTS / "gpu_throughput.json")
    parser.add_argument("--profiles", type=Path, default=None, help="a GPU profile file over the shipped ones")
    parser.add_argument("--out", type=Path, default=RESULTS / "plan_vs_measured.json")
    parser.add_argument("--write-profile", type=Path, default=None, metavar="PATH",
                        help="write the GPU runs' implied efficiencies into this profile file (plan.profiles=PATH)")
    args = parser.parse_args(argv)
    profiles = load_profiles(args.profiles)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="plan-vs-measured-") as scratch:
        work = Path(scratch)
        cpu_peak = None
        if args.cpu:
            cpu_peak = cpu_matmul_flops(threads=1)  # gpu_throughput's small mode runs on one thread
            for model in args.models:
                out = REPO / "runs" / f"plan_vs_measured_{model}_small.json"
                script = REPO / "benchmarks" / "gpu" / "gpu_throughput.py"
                subprocess.run([sys.executable, str(script), "--model", model, "--small", "--no-reference",
                                "--out", str(out), "--work-dir", str(work)], check=True)
                rows += [compare(run, work, profiles, cpu_peak) for run in _runs(out)]
            _fit_cpu(rows)
        gpu_runs = [run for run in _runs(args.gpu_results) if not run["small"] and run["model"] in SHIPPED]
        rows += [compare(run, work, profiles, None) for run in gpu_runs]
    if args.write_profile is not None:
        _write_profiles(args.write_profile, [row for row in rows if not row["small"]], args.gpu_results, profiles)
    result = {"benchmark": "plan_vs_measured", "commit": git_commit(), "machine": machine(),
              "command": " ".join(sys.argv), "cpu_matmul_flops_1_thread": cpu_peak, "rows": rows,
              "gpu": "compared" if gpu_runs else f"not measured: no GPU lent ({args.gpu_results} has no full-size run)"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    _print(result)
    print(f"wrote {args.out}")
    return 0


def _write_profiles(path: Path, rows: list[dict[str, Any]], source: Path, profiles: dict[str, DeviceProfile]) -> None:
    """Each GPU's mean implied rollout and update efficiency over its runs, into the user profile file."""
    for key, name in GPU_PROFILES:
        mine = [row for row in rows if key in row["device"]]
        if not mine:
            continue
        rollout = sum(row["phases"]["sample"]["implied_efficiency"] for row in mine) / len(mine)
        update = sum(row["phases"]["update"]["implied_efficiency"] for row in mine) / len(mine)
        runs = ", ".join(f"{row['model']} at {row['commit']}" for row in mine)
        write_measured_efficiency(path, name, rollout_efficiency=rollout, update_efficiency=update,
                                  source=f"measured: {source} ({runs}), via benchmarks/sim/plan_vs_measured.py",
                                  base=profiles[name])
        print(f"wrote {name}'s measured efficiency (rollout {rollout:.3f}, update {update:.3f}) to {path}")


def _fit_cpu(rows: list[dict[str, Any]]) -> None:
    """The CPU's efficiency from the first model's rollout; every other CPU phase is then predicted with it."""
    cpu_rows = [row for row in rows if row["small"]]
    if not cpu_rows:
        return
    efficiency = cpu_rows[0]["phases"]["sample"]["implied_efficiency"]
    for row in cpu_rows:
        for entry in row["phases"].values():
            entry["predicted_s"] = entry["measured_s"] * entry["implied_efficiency"] / efficiency
            entry["time_ratio"] = entry["predicted_s"] / entry["measured_s"]
            entry["efficiency_fitted_on"] = f"{cpu_rows[0]['model']} sample"


def _print(result: dict[str, Any]) -> None:
    header = f"{'model':<11}{'device':<28}{'phase':<8}{'FLOPs pred/meas':>16}{'s measured':>12}{'s pred/meas':>13}" \
             f"{'efficiency':>12}"
    print(header)
    for row in result["rows"]:
        for phase, entry in row["phases"].items():
            def show(value: float | None, spec: str) -> str:
                return "n/a" if value is None else format(value, spec)

            print(f"{row['model']:<11}{row['device'][:27]:<28}{phase:<8}{show(entry['flops_ratio'], '.3f'):>16}"
                  f"{entry['measured_s']:>12.3f}{show(entry.get('time_ratio'), '.2f'):>13}"
                  f"{show(entry['implied_efficiency'], '.3f'):>12}")
    print(f"GPU: {result['gpu']}")


if __name__ == "__main__":
    sys.exit(main())
