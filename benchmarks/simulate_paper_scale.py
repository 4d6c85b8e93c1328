"""Paper-scale simulation: Qwen-Image GRPO at 1280² on 32 on-demand + 32 spot H100s, all four modes.

Replays the AWS p3 spot trace (Bamboo) through `spotlight.sim.simulate` and reports, per mode, the
iterations, hours and dollars to the target and the utilisation of each pool; then the ratios of
`spotlight` to each baseline beside the assumptions that produce them (the published claim is 4×
faster to the target and 1.4–6.4× cheaper), the same ratios at each cloud's prices, how they move
when one assumption moves, the cheapest cluster mix for a deadline, and the speed check: one
100-iteration simulation of a 1,024-GPU cluster over a 12-hour trace (target: under 5 s).

    python benchmarks/simulate_paper_scale.py [--config configs/simulate-paper.yaml]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from provenance import REPO, RESULTS, git_commit, machine

from spotlight.config import load_config
from spotlight.market.prices import load_prices
from spotlight.market.traces import Availability, default_trace_dir, load_trace
from spotlight.sim.cluster_mix import cheapest_mix, price_sources
from spotlight.sim.convergence import fit_convergence, load_measured_points
from spotlight.sim.results import SimResult
from spotlight.sim.sim_config import SIMULATED_MODES, SimConfig
from spotlight.sim.simulator import simulate
from spotlight.sim.workload import describe

MEASURED = RESULTS / "time_to_target.json"  # when the config names no convergence.measured
PROVIDERS = {  # (on-demand, spot) machine of each cloud in the packaged price table
    "aws p5.48xlarge": ("p5.48xlarge", "p5.48xlarge"),
    "gcp a3-highgpu-8g": ("a3-highgpu-8g", "a3-highgpu-8g"),
    "azure ND96isr_H100_v5": ("Standard_ND96isr_H100_v5", "Standard_ND96isr_H100_v5"),
}


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "configs" / "simulate-paper.yaml"))
    parser.add_argument("--repeats", type=int, default=3, help="timings of the 1,024-GPU speed check")
    parser.add_argument("--out", default=str(RESULTS / "simulate_paper_scale.json"))
    args = parser.parse_args()
    started = time.perf_counter()

    config: SimConfig = load_config(SimConfig, args.config)
    measured = Path(config.convergence.measured) if config.convergence.measured else MEASURED
    measured = measured if measured.is_absolute() else REPO / measured
    if config.convergence.alpha is None and measured.is_file():  # the simulation runs on the fitted α
        config = with_fields(config, convergence={"measured": str(measured)})
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
    print(f"workload: Qwen-Image-class {config.workload.params / 1e9:.0f} B at {config.workload.resolution}², "
          f"{workload['tokens']:.0f} tokens, {workload['tflop_per_forward']:.1f} TFLOP/forward at "
          f"{config.workload.mfu:.0%} MFU → {workload['step_s']:.3f} s/step (CFG ×{config.workload.guidance_forwards},"
          f" SP {config.workload.sp_degree}), rollout {workload['rollout_sample_device_s']:.1f} and train "
          f"{workload['train_sample_device_s']:.1f} device-s per sample, broadcast {workload['broadcast_s']:.1f} s")
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
    variations: dict[str, SimConfig] = {
        "α = 2 (progress ∝ σ²)": with_fields(config, convergence={"alpha": 2.0}),
        "near-binary rewards (sharpness 4)": with_fields(config, signal={"reward_sharpness": 4.0}),
        "stale τ 0.5 (faster drift)": with_fields(config, signal={"stale_kendall_tau": 0.5}),
        "512² resolution": with_fields(config, workload={"resolution": 512}),
        "LoRA-like training (fwd+bwd 2×, no KL ref)": with_fields(
            config, workload={"train_pass_factor": 2.0, "kl_reference": False}),
        "SP degree 4": with_fields(config, workload={"sp_degree": 4}),
        "4× churn (trace time ×0.25)": with_fields(config, cluster={"trace_time_scale": 0.25}),
        "no preemption notice": with_fields(config, cluster={"notice_s": 0.0}),
        "cold recovery (120 s restarts)": with_fields(config, cluster={"recovery": "cold"}),
        "16 on-demand + 48 spot": with_fields(config, cluster={"on_demand_devices": 16, "spot_devices": 48}),
    }
    sensitivity: dict[str, Any] = {}
    print("\none change at a time                          spotlight h   vs vanilla: faster cheaper"
          "   vs spot-rollout: faster cheaper")
    for name, variant in variations.items():
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
        "config": config.model_dump(mode="json"), "assumptions": assumptions,
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
