"""Paper-scale simulation: Qwen-Image at 1280² on 32 on-demand + 32 spot H100s, all four modes.

The workload comes from a pipeline folder, as `spotlight simulate -s model.pretrained=...` derives it
(`spotlight.plan_config.PlanConfig`, `spotlight.sim.planning.folder_sim.simulation`): FLOPs per forward
counted on the meta device from the shipped config-only `qwen-image` folder, the update's FLOPs from
the run's own training fields (NFT, LoRA 64, gradient checkpointing, micro-batch 4, true CFG 4, 32 × 16
images) and the H100 profile's efficiency, over `configs/simulate-paper.yaml`'s cluster, loop, signal
and convergence sections. `--typed` reproduces the earlier run on that file's hand-typed ``workload``
section instead (20 B parameters, 60 layers, MFU 0.40, Flow-GRPO's 3 passes + a KL reference).

Replays the AWS p3 spot trace (Bamboo) through `spotlight.sim.simulate` and reports, per mode, the
iterations, hours and dollars to the target and the utilisation of each pool; then the ratios of
`spotlight` to each baseline beside the assumptions that produce them (the published claim is 4×
faster to the target and 1.4–6.4× cheaper), the same ratios at each cloud's prices, how they move
when one assumption moves, the cheapest cluster mix for a deadline, and the speed check: one
100-iteration simulation of a 1,024-GPU cluster over a 12-hour trace (target: under 5 s). The JSON
records the command, the folder and overrides that produced the workload, and its counted FLOPs.

    python benchmarks/sim/simulate_paper_scale.py [--config configs/simulate-paper.yaml] [-s FIELD=VALUE ...] [--typed]
"""

from __future__ import annotations

import argparse
import atexit
import json
import math
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from functools import cache
from pathlib import Path
from typing import Any

from spotlight.config import load_config
from spotlight.market.prices import load_prices
from spotlight.market.traces import Availability, default_trace_dir, load_trace
from spotlight.models.pipelines.memory_estimate import GIB
from spotlight.plan_config import PlanConfig
from spotlight.sim.cluster_mix import cheapest_mix, price_sources
from spotlight.sim.convergence import fit_convergence, load_measured_points
from spotlight.sim.planning.device_profiles import DeviceProfile, profile
from spotlight.sim.planning.folder_sim import simulation
from spotlight.sim.planning.folder_workload import DoesNotFitError, FolderWorkload
from spotlight.sim.results import SimResult
from spotlight.sim.sim_config import SIMULATED_MODES, SimConfig
from spotlight.sim.simulator import simulate
from spotlight.sim.workload import describe

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports

from benchmarks.provenance import REPO, RESULTS, git_commit, machine

MEASURED = RESULTS / "time_to_target.json"  # when the config names no convergence.measured
PROVIDERS = {  # (on-demand, spot) machine of each cloud in the packaged price table
    "aws p5.48xlarge": ("p5.48xlarge", "p5.48xlarge"),
    "gcp a3-highgpu-8g": ("a3-highgpu-8g", "a3-highgpu-8g"),
    "azure ND96isr_H100_v5": ("Standard_ND96isr_H100_v5", "Standard_ND96isr_H100_v5"),
}
# The run the paper-scale table prices (docs/planning.md's command): Qwen-Image's shipped config-only
# folder, Spotlight's NFT recipe with LoRA 64 and gradient checkpointing, true CFG 4, 32 prompts × 16 images.
QWEN_IMAGE = ("model.pretrained=qwen-image", "rollout.resolution=1280", "rollout.guidance_scale=4",
              "rollout.prompts_per_iteration=32", "rollout.group_size=16", "model.lora_rank=64",
              "model.gradient_checkpointing=true", "train.micro_batch_size=4")


def with_measured_convergence(config: SimConfig) -> tuple[SimConfig, Path]:
    """`config` set to fit α from the measured runs (when it fixes none and the file exists), and that file."""
    measured = Path(config.convergence.measured) if config.convergence.measured else MEASURED
    measured = measured if measured.is_absolute() else REPO / measured
    if config.convergence.alpha is None and measured.is_file():  # the simulation runs on the fitted α
        config = with_fields(config, convergence={"measured": str(measured)})
    return config, measured


def workload_source(path: str, overrides: list[str], work: FolderWorkload | None,
                    device: DeviceProfile | None, plan: PlanConfig) -> dict[str, Any]:
    """What produced the simulator's workload: the config file and overrides, and from a folder its counts,
    so that the results page can say where each number came from."""
    source: dict[str, Any] = {"kind": "typed" if work is None else "folder", "config": _relative(Path(path)),
                              "overrides": list(overrides)}
    if work is None or device is None:
        return source
    return {**source, "folder": _relative(work.folder), "pretrained": plan.model.pretrained,
            "family": work.family, "resolution": list(work.resolution), "algorithm": plan.train.algorithm,
            "finetune": plan.model.finetune, "lora_rank": plan.model.lora_rank,
            "gradient_checkpointing": plan.model.gradient_checkpointing,
            "text_tokens": work.text_tokens, "text_tokens_source": work.text_tokens_source,
            "image_tokens": work.image_tokens, "parameters": work.parameters,
            "trainable_parameters": work.trainable_parameters, "flops_per_forward": work.forward_flops,
            "flops_per_forward_backward": work.train_pass_flops,
            "rollout_forwards_per_image": work.rollout_forwards_per_image,
            "update_passes_per_sample": work.update_passes, "update_flops_per_sample": work.update_flops_per_sample,
            "optimizer_steps": work.optimizer_steps, "micro_batch": work.micro_batch,
            "trainer_memory_gib": work.memory.total / GIB,
            "gpu_profile": {"name": device.name, "rollout_efficiency": device.rollout_efficiency,
                            "update_efficiency": device.update_efficiency,
                            "peak_bf16_dense_tflops": device.peak_bf16_dense_tflops,
                            "efficiency_source": device.efficiency_source}}


def _relative(path: Path) -> str:
    """``path`` relative to the repository when it lies inside it (the JSON then names no machine's paths)."""
    resolved = (path if path.is_absolute() else REPO / path).resolve()
    return str(resolved.relative_to(REPO)) if resolved.is_relative_to(REPO) else str(path)


@cache
def _unbounded_profiles(gpu: str, profiles: str | None) -> str:
    """A profile file holding ``gpu``'s profile with room for any trainer: seconds, not memory, are simulated."""
    entry = {**profile(gpu, profiles).model_dump(), "memory_gb": 1e6}
    folder = tempfile.mkdtemp(prefix="simulate-paper-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    path = Path(folder) / "gpus.yaml"
    path.write_text(json.dumps({"gpus": [entry]}))  # JSON is YAML
    return str(path)


def load_simulation(path: str, overrides: list[str]) -> tuple[SimConfig, Path, dict[str, Any]]:
    """The SimConfig to run (workload from ``model.pretrained``'s folder when the overrides name one, else the
    file's typed section), the measured-runs file its α comes from, and `workload_source`'s record.

    The plan's memory check prices one trainer sampling up to 256 images in one batch; the simulated
    cluster spreads the rollout over its devices (16 a device at 32 × 16 on 32), so when that one-trainer
    estimate does not fit, the workload is counted without the check (as plan_vs_measured.py does) and the
    JSON keeps the plan's one-line verdict.
    """
    plan: PlanConfig = load_config(PlanConfig, path, overrides)
    verdict = None
    try:
        config, work, device = simulation(plan)
    except DoesNotFitError as error:
        verdict = str(error)
        unbounded = _unbounded_profiles(plan.plan.gpu, plan.plan.profiles)
        config, work, device = simulation(plan.model_copy(update={
            "plan": plan.plan.model_copy(update={"profiles": unbounded})}))
    config, measured = with_measured_convergence(config)
    source = workload_source(path, overrides, work, device, plan)
    if work is not None:
        source["one_trainer_memory_fit"] = verdict or "fits"
    return config, measured, source


def with_fields(config: SimConfig, **sections: dict[str, Any]) -> SimConfig:
    """Return `config` with the given fields of each section replaced (e.g. cluster={"notice_s": 0})."""
    update: dict[str, Any] = {}
    for name, fields in sections.items():
        if name in ("mode", "seed"):
            update[name] = fields
        else:
            update[name] = getattr(config, name).model_copy(update=fields)
    return config.model_copy(update=update)


def run_modes(config: SimConfig, trace: Availability) -> dict[str, SimResult]:
    return {mode: simulate(with_fields(config, mode=mode), trace=trace) for mode in SIMULATED_MODES}


def ratios(results: dict[str, SimResult]) -> dict[str, dict[str, float]]:
    """Per baseline: baseline time / spotlight time and baseline dollars / spotlight dollars."""
    spotlight = results["spotlight"]
    return {
        mode: {
            "faster": result.time_to_target_s / spotlight.time_to_target_s,
            "cheaper": result.dollars_to_target / spotlight.dollars_to_target,
        }
        for mode, result in results.items()
        if mode != "spotlight"
    }


def what_drives(results: dict[str, SimResult]) -> dict[str, float]:
    """Split spotlight's speed-up over vanilla into shorter iterations × fewer iterations, and the α
    that the published 4× would need at the simulated σ ratio and iteration times."""
    vanilla, spotlight = results["vanilla"].summary(), results["spotlight"].summary()
    iteration_time_ratio = vanilla["mean_iteration_s"] / spotlight["mean_iteration_s"]
    iteration_ratio = vanilla["iterations_to_target"] / spotlight["iterations_to_target"]
    sigma_ratio = spotlight["mean_group_std"] / spotlight["mean_random_std"]
    train_share = results["vanilla"].timeline[0].train_s / vanilla["mean_iteration_s"]
    return {
        "iteration_time_ratio": iteration_time_ratio,
        "iteration_ratio": iteration_ratio,
        "sigma_ratio": sigma_ratio,
        "alpha": spotlight["alpha"],
        "train_share_of_vanilla_iteration": train_share,
        "alpha_for_4x": math.log(4.0 / iteration_time_ratio) / math.log(sigma_ratio),
    }


def print_modes(results: dict[str, SimResult]) -> None:
    print(f"{'mode':<14}{'iters':>6}{'hours':>8}{'dollars':>10}{'iter s':>8}{'σ/σ_rand':>10}"
          f"{'util OD':>9}{'util spot':>10}{'spot idle':>10}{'preempted':>10}")
    for mode, result in results.items():
        s = result.summary()
        spot_idle = s["phase_shares"]["spot"]["idle"]
        print(f"{mode:<14}{s['iterations_to_target'] or math.inf:>6}{s['time_to_target_h']:>8.2f}"
              f"{s['dollars_to_target']:>10.0f}{s['mean_iteration_s']:>8.0f}"
              f"{s['mean_group_std'] / s['mean_random_std']:>10.2f}{s['utilisation']['on_demand']:>9.2f}"
              f"{s['utilisation']['spot']:>10.2f}{spot_idle:>10.2f}{s['spot_removed']:>10}")


def speed_check(trace: Availability, repeats: int) -> dict[str, Any]:
    """Time one 100-iteration simulation of 512 on-demand + 512 spot GPUs over the trace scaled to 12 h."""
    config = SimConfig(mode="spotlight")
    config = with_fields(
        config,
        cluster={"on_demand_devices": 512, "spot_devices": 512, "trace_time_scale": 12 * 3600.0 / trace.duration_s},
        loop={"prompts_per_iteration": 256, "max_iterations": 100, "stop_at_target": False},
    )
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        result = simulate(config, trace=trace)
        seconds.append(time.perf_counter() - started)
        assert result.iterations_run == 100
    return {"gpus": 1024, "iterations": 100, "trace_hours": 12.0, "prompts_per_iteration": 256,
            "seconds": seconds, "median_s": statistics.median(seconds), "target_s": 5.0,
            "simulated_hours": result.simulated_s / 3600.0}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "configs" / "simulate-paper.yaml"))
    parser.add_argument("-s", "--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="a PlanConfig field, after the Qwen-Image run's (QWEN_IMAGE; the later one wins), "
                             "e.g. -s model.pretrained=sd3.5-medium -s rollout.resolution=512")
    parser.add_argument("--typed", action="store_true",
                        help="the config's hand-typed workload section (the earlier run), not a folder's")
    parser.add_argument("--repeats", type=int, default=3, help="timings of the 1,024-GPU speed check")
    parser.add_argument("--out", default=str(RESULTS / "simulate_paper_scale.json"))
    return parser.parse_args()


def variations(config: SimConfig, path: str, overrides: list[str], typed: bool) -> dict[str, SimConfig]:
    """One assumption changed at a time. From a folder, a change of the run (resolution, algorithm) is
    re-derived from the folder, as `spotlight simulate -s` would; the typed run changes its typed fields."""
    def rederived(*extra: str) -> SimConfig:
        return load_simulation(path, [*overrides, *extra])[0]

    if typed:
        workload: dict[str, SimConfig] = {
            "512² resolution": with_fields(config, workload={"resolution": 512}),
            "LoRA-like training (fwd+bwd 2×, no KL ref)": with_fields(
                config, workload={"train_pass_factor": 2.0, "kl_reference": False}),
        }
    else:
        workload = {
            "512² resolution (re-derived)": rederived("rollout.resolution=512"),
            "Flow-GRPO update (train.algorithm=flow-grpo)": rederived("train.algorithm=flow-grpo"),
        }
    return {
        "α = 2 (progress ∝ σ²)": with_fields(config, convergence={"alpha": 2.0}),
        "near-binary rewards (sharpness 4)": with_fields(config, signal={"reward_sharpness": 4.0}),
        "stale τ 0.5 (faster drift)": with_fields(config, signal={"stale_kendall_tau": 0.5}),
        **workload,
        "SP degree 4": with_fields(config, workload={"sp_degree": 4}),
        "4× churn (trace time ×0.25)": with_fields(config, cluster={"trace_time_scale": 0.25}),
        "no preemption notice": with_fields(config, cluster={"notice_s": 0.0}),
        "cold recovery (120 s restarts)": with_fields(config, cluster={"recovery": "cold"}),
        "16 on-demand + 48 spot": with_fields(config, cluster={"on_demand_devices": 16, "spot_devices": 48}),
    }


def print_workload(config: SimConfig, workload: dict[str, float], source: dict[str, Any]) -> None:
    """One line on where the workload came from, one on what the simulator makes of it."""
    w = config.workload
    if source["kind"] == "folder":
        gpu = source["gpu_profile"]
        print(f"workload from {source['folder']} ({source['family']}, {source['parameters'] / 1e9:.1f} B, "
              f"{source['algorithm']} {source['finetune']}, {' '.join(source['overrides'])}): "
              f"{source['flops_per_forward'] / 1e12:.1f} TFLOP/forward counted on meta at "
              f"{'×'.join(map(str, source['resolution']))} ({source['image_tokens']} image + {source['text_tokens']} "
              f"text tokens), {source['update_flops_per_sample'] / 1e12:.0f} TFLOP of update per sample, "
              f"micro-batch {source['micro_batch']} ({source['trainer_memory_gib']:.0f} GiB); {gpu['name']} "
              f"efficiency rollout {gpu['rollout_efficiency']:.2f} / update {gpu['update_efficiency']:.2f}")
    else:
        print(f"workload typed in {source['config']}: {w.params / 1e9:.0f} B at {w.resolution}², MFU {w.mfu:.0%}, "
              f"train pass factor {w.train_pass_factor:g}{' + KL reference' if w.kl_reference else ''}")
    print(f"  {workload['tokens']:.0f} tokens, {workload['tflop_per_forward']:.1f} TFLOP/forward → "
          f"{workload['step_s']:.3f} s/step (CFG ×{w.guidance_forwards}, SP {w.sp_degree}), rollout "
          f"{workload['rollout_sample_device_s']:.1f} and train {workload['train_sample_device_s']:.1f} device-s "
          f"per sample, broadcast {workload['broadcast_s']:.1f} s")


def main() -> None:
    args = parse_args()
    started = time.perf_counter()
    overrides = list(args.overrides) if args.typed else [*QWEN_IMAGE, *args.overrides]
    config, measured, source = load_simulation(args.config, overrides)
    trace = load_trace(default_trace_dir() / config.cluster.trace)
    prices = load_prices()

    # --- assumptions ---------------------------------------------------------------------------
    workload = describe(config.workload)
    measured_alpha = None
    unfitted = None  # why the measured runs give no alpha, when they don't
    if measured.is_file():
        try:
            model = fit_convergence(load_measured_points(measured))
            measured_alpha = {"alpha": model.alpha, "assumed": model.alpha_assumed, "points": model.num_points,
                              "r_squared": model.r_squared}
        except ValueError as error:  # no measured run reached its target: nothing to fit
            unfitted = str(error)
    od_offering, spot_offering = prices[config.cluster.on_demand_instance], prices[config.cluster.spot_instance]
    trace_hours = trace.duration_s / 3600.0
    assumptions = {
        "workload": workload,
        "prices_per_gpu_hour": {"on_demand": od_offering.per_gpu_hour("on_demand"),
                                "spot": spot_offering.per_gpu_hour("spot")},
        "trace": {"file": config.cluster.trace, "hours": trace_hours, "mean_live": trace.mean_count,
                  "peak": int(trace.counts.max()), "preemptions_per_hour": trace.preemption_count / trace_hours},
        "measured_convergence": measured_alpha,
        "measured_convergence_unfitted": unfitted,
    }
    print_workload(config, workload, source)
    print(f"loop: {config.loop.prompts_per_iteration} prompts × {config.loop.group_size} samples, "
          f"{config.workload.rollout_steps} steps; vanilla needs {config.convergence.vanilla_iterations:.0f} "
          f"iterations (assumed); planner N {list(config.planner.num_candidates)} × S {list(config.planner.num_steps)}")
    print(f"prices ($/GPU-h): on-demand {assumptions['prices_per_gpu_hour']['on_demand']:.2f}, spot "
          f"{assumptions['prices_per_gpu_hour']['spot']:.2f} ({config.cluster.on_demand_instance})")
    print(f"trace: {config.cluster.trace}, {trace_hours:.1f} h, mean {trace.mean_count:.1f} of peak "
          f"{assumptions['trace']['peak']} nodes live, {assumptions['trace']['preemptions_per_hour']:.1f} "
          f"preemptions/h, scaled onto {config.cluster.spot_devices} spot GPUs; "
          f"notice {config.cluster.notice_s:.0f} s, {config.cluster.recovery} recovery")
    if unfitted is not None:
        print(f"convergence: {measured.name} gives no α ({unfitted}); α = 1 assumed (progress ∝ group reward std)")
    elif measured_alpha is None:
        print(f"convergence: no {measured.name}; α = 1 assumed (progress ∝ group reward std)")
    else:
        print(f"convergence: {measured.name} gives α = {measured_alpha['alpha']:.2f} "
              f"({measured_alpha['points']} runs{', assumed' if measured_alpha['assumed'] else ''})")

    # --- the four modes --------------------------------------------------------------------------
    headline = run_modes(config, trace)
    print(f"\n{config.cluster.on_demand_devices} on-demand + {config.cluster.spot_devices} spot H100s, "
          f"{config.workload.resolution}²:")
    print_modes(headline)
    headline_ratios = ratios(headline)
    print("\nspotlight vs     faster   cheaper   (published: 4× faster, 1.4–6.4× cheaper)")
    for mode, ratio in headline_ratios.items():
        print(f"  {mode:<14}{ratio['faster']:>7.2f}×{ratio['cheaper']:>9.2f}×")
    drivers = what_drives(headline)
    print(f"  = {drivers['iteration_time_ratio']:.2f}× shorter iterations (training is "
          f"{drivers['train_share_of_vanilla_iteration']:.0%} of a vanilla iteration and runs on on-demand only) × "
          f"{drivers['iteration_ratio']:.2f}× fewer iterations (σ/σ_random {drivers['sigma_ratio']:.2f}, α "
          f"{drivers['alpha']:g}); 4× would need α ≈ {drivers['alpha_for_4x']:.1f} at this σ ratio")

    # --- other clouds' prices ------------------------------------------------------------------------
    by_provider: dict[str, dict[str, dict[str, float]]] = {}
    print("\nat each cloud's prices    vs vanilla: faster  cheaper   vs spot-rollout: cheaper   vs sync: cheaper")
    for provider, (od_instance, spot_instance) in PROVIDERS.items():
        results = run_modes(with_fields(config, cluster={"on_demand_instance": od_instance,
                                                         "spot_instance": spot_instance}), trace)
        by_provider[provider] = ratios(results)
        r = by_provider[provider]
        print(f"  {provider:<24}{r['vanilla']['faster']:>17.2f}×{r['vanilla']['cheaper']:>8.2f}×"
              f"{r['spot-rollout']['cheaper']:>25.2f}×{r['sync-explore']['cheaper']:>17.2f}×")

    # --- one assumption at a time ------------------------------------------------------------------
    sensitivity: dict[str, Any] = {}
    print("\none change at a time                          spotlight h   vs vanilla: faster cheaper"
          "   vs spot-rollout: faster cheaper")
    for name, variant in variations(config, args.config, overrides, args.typed).items():
        results = run_modes(variant, trace)
        r = ratios(results)
        sensitivity[name] = {"ratios": r, "summaries": {mode: res.summary() for mode, res in results.items()}}
        print(f"  {name:<44}{results['spotlight'].time_to_target_s / 3600:>9.2f}"
              f"{r['vanilla']['faster']:>15.2f}×{r['vanilla']['cheaper']:>7.2f}×"
              f"{r['spot-rollout']['faster']:>20.2f}×{r['spot-rollout']['cheaper']:>7.2f}×")

    # --- cheapest mix for a deadline -------------------------------------------------------------------
    deadline_s = headline["vanilla"].time_to_target_s
    sweep = cheapest_mix(deadline_s, config, (8, 16, 32, 64), (0, 16, 32, 64), price_sources(prices),
                         prices=prices, trace=trace)
    best = sweep.best
    print(f"\ncheapest mix reaching the target within vanilla's {deadline_s / 3600:.1f} h "
          f"({len(sweep.rows)} mixes simulated):")
    if best is None:
        print("  none")
    else:
        print(f"  {best.on_demand_devices} on-demand {best.on_demand_instance} + {best.spot_devices} spot "
              f"{best.spot_instance}: {best.time_to_target_s / 3600:.2f} h, ${best.dollars_to_target:.0f} "
              f"(vanilla: ${headline['vanilla'].dollars_to_target:.0f})")

    # --- speed --------------------------------------------------------------------------------------------
    speed = speed_check(trace, args.repeats)
    print(f"\nspeed: 100 iterations of {speed['gpus']} GPUs over a {speed['trace_hours']:.0f} h trace: "
          f"median {speed['median_s']:.2f} s of {len(speed['seconds'])} (target < {speed['target_s']:.0f} s)")

    payload = {
        "benchmark": "simulate_paper_scale", "commit": git_commit(), "machine": machine(),
        "command": " ".join(["python benchmarks/sim/simulate_paper_scale.py", *map(shlex.quote, sys.argv[1:])]),
        "workload_source": source, "config": config.model_dump(mode="json"), "assumptions": assumptions,
        "published_claim": {"faster": 4.0, "cheaper": [1.4, 6.4]},
        "modes": {mode: result.summary() for mode, result in headline.items()},
        "ratios": headline_ratios, "drivers": what_drives(headline), "ratios_by_provider": by_provider,
        "sensitivity": sensitivity,
        "cheapest_mix": {"deadline_s": deadline_s, "best": None if best is None else asdict(best),
                         "rows": [asdict(row) for row in sweep.rows]},
        "speed": speed,
        "timelines": {mode: result.timeline_dicts() for mode, result in headline.items()},
        "wall_s": time.perf_counter() - started,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(payload, indent=1, default=float))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
