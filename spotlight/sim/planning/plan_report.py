"""`spotlight plan`'s answer: what one iteration costs, what a GPU holds, and the cheapest cluster for a deadline.

Everything is derived, nothing measured here: the per-image costs come from the counted FLOPs and the
GPU profile's efficiencies (`spotlight.sim.planning.folder_workload`, `spotlight.sim.planning.device_profiles`), the
iteration's split and the cheapest mixes from simulations of the loop (`spotlight.sim.simulator`,
`spotlight.sim.cluster_mix`). With and without exploration are the same devices in mode spotlight and
in mode spot-rollout (spot devices roll out, nobody explores), so the difference is exploration's.
Every assumption is listed with where it came from.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from spotlight.market.prices import load_prices, price_override
from spotlight.modes import Mode
from spotlight.sim.cluster_mix import MixRow, cheapest_mix, price_sources
from spotlight.sim.planning.device_profiles import DeviceProfile, profile
from spotlight.sim.planning.folder_sim import PlanInputs, from_folder, simulation
from spotlight.sim.planning.folder_workload import FolderWorkload
from spotlight.sim.simulator import simulate
from spotlight.sim.workload import device_times

__all__ = ["PlanReport", "make_plan"]

GIB = 1024**3


@dataclass(frozen=True)
class PlanReport:
    """`make_plan`'s answer; `to_json` is what ``spotlight plan --json`` prints."""

    deadline_h: float
    workload: dict[str, Any]
    iteration_s: dict[str, float]
    per_gpu: dict[str, Any]
    with_exploration: MixRow | None
    without_exploration: MixRow | None
    fastest_h: float
    assumptions: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        mix = {"with_exploration": self.with_exploration, "without_exploration": self.without_exploration}
        return {"deadline_h": self.deadline_h, "fastest_h": self.fastest_h, "workload": self.workload,
                "iteration_s": self.iteration_s, "per_gpu": self.per_gpu,
                "cheapest_mix": {name: None if row is None else asdict(row) for name, row in mix.items()},
                "assumptions": self.assumptions}


def _sources(config: PlanInputs, device: DeviceProfile | None) -> list[tuple[str, str]]:
    """(on-demand, spot) machine pairs to sweep: the GPU profile's machines (every one for a typed workload)."""
    prices = price_override(load_prices(), config.cluster.price_overrides, "cluster.price_overrides")
    if device is not None:
        prices = {name: offering for name, offering in prices.items() if offering.gpu == device.price_gpu}
    sources = price_sources(prices)
    if not sources:
        raise ValueError(
            f"no machine with {device.price_gpu if device else 'any'} GPUs in the price table has both an on-demand "
            "and a spot price: add one, e.g. -s 'cluster.price_overrides={\"NAME\": {provider: aws, gpus_per_machine: "
            f"8, gpu: {device.price_gpu if device else 'H100'}, on_demand_per_hour: ..., spot_per_hour: ...}}}}'")
    return sources


def _workload_json(work: FolderWorkload | None, device: DeviceProfile | None) -> dict[str, Any]:
    if work is None or device is None:
        return {"from": "the config's workload section (typed numbers)"}
    return {
        "from": str(work.folder), "family": work.family, "gpu": device.name, "resolution": list(work.resolution),
        "image_tokens": work.image_tokens, "text_tokens": work.text_tokens,
        "tflop_per_forward": work.forward_flops / 1e12, "tflop_per_forward_backward": work.train_pass_flops / 1e12,
        "rollout_forwards_per_image": work.rollout_forwards_per_image, "update_passes_per_sample": work.update_passes,
        "update_tflop_per_sample": work.update_flops_per_sample / 1e12, "optimizer_steps": work.optimizer_steps,
        "parameters": work.parameters, "trainable_parameters": work.trainable_parameters,
        "text_encoder_parameters": work.text_encoder_parameters, "vae_parameters": work.vae_parameters,
        "gradient_bytes_per_step": work.gradient_bytes, "broadcast_bytes": work.broadcast_bytes,
    }


def _assumptions(config: PlanInputs, sim_alpha: tuple[float, str], work: FolderWorkload | None,
                 device: DeviceProfile | None) -> list[dict[str, Any]]:
    signal = config.signal
    given = signal.model_fields_set

    def tau(name: str) -> dict[str, Any]:
        source = (
            "given in the config" if name in given else "assumed (SignalSection default, spotlight/sim/convergence.py)")
        return {"name": f"τ {name}", "value": getattr(signal, name), "source": source}

    rows = [{"name": "α (convergence exponent)", "value": sim_alpha[0], "source": sim_alpha[1]},
            tau("one_step_kendall_tau"), tau("stale_kendall_tau"),
            {"name": "vanilla iterations to target", "value": config.convergence.vanilla_iterations,
             "source": "given in the config" if "vanilla_iterations" in config.convergence.model_fields_set
             else "assumed (ConvergenceSection default)"}]
    if work is not None and device is not None:
        rows += [
            {"name": "rollout efficiency", "value": device.rollout_efficiency, "source": device.efficiency_source},
            {"name": "update efficiency", "value": device.update_efficiency, "source": device.efficiency_source},
            {"name": "peak bf16 dense TFLOP/s", "value": device.peak_bf16_dense_tflops, "source": device.peak_source},
            {"name": "text tokens", "value": work.text_tokens, "source": work.text_tokens_source},
            {"name": "update samples", "value": "all", "source": "no sample has a zero advantage (an upper bound)"},
        ]
    return rows


def mean(values: list[float]) -> float:
    """The mean of ``values``; NaN for none (a simulation that ran no iteration)."""
    return sum(values) / len(values) if values else math.nan


def make_plan(config: PlanInputs, deadline_h: float, on_demand_options: tuple[int, ...] = (8, 16, 32, 64),
              spot_options: tuple[int, ...] = (0, 16, 32, 64)) -> PlanReport:
    """The plan for ``config`` and a deadline of ``deadline_h`` hours (module docstring).

    Raises the folder's, the profile's, the fit's and the simulator's one-line errors (ValueError).
    """
    if not (deadline_h > 0 and math.isfinite(deadline_h)):
        raise ValueError(f"DEADLINE must be a positive number of hours (got {deadline_h})")
    named = profile(config.plan.gpu, config.plan.profiles) if from_folder(config) else None
    sources = _sources(config, named)  # a missing price fails before the folder is counted
    sim, work, device = simulation(config)
    if device is not None and (sim.cluster.on_demand_instance, sim.cluster.spot_instance) not in sources:
        on_demand, spot = sources[0]  # the configured machines carry another GPU: split the iteration on this one's
        sim = sim.model_copy(update={"cluster": sim.cluster.model_copy(update={
            "on_demand_instance": on_demand, "spot_instance": spot})})
    spotlight = sim.model_copy(update={"mode": Mode.SPOTLIGHT})
    at_config = simulate(spotlight)
    records = at_config.timeline
    iteration = {
        "rollout": mean([r.rollout_s for r in records]), "update": mean([r.train_s for r in records]),
        "exploration_wait": mean([r.explore_wait_s for r in records]),
        "weight_broadcast": mean([r.broadcast_s for r in records]),
        "total": mean([r.end_s - r.start_s for r in records]),
        "exploration_spot_device_s": mean([r.spot_explore_train_s for r in records]),
    }
    times = device_times(sim.workload)
    rollout_device_s = times.sample_step_device_s * sim.workload.rollout_steps
    per_gpu: dict[str, Any] = {
        "rollout_device_s_per_image": rollout_device_s, "update_device_s_per_sample": times.train_sample_device_s,
        "images_per_gpu_s": 1.0 / (rollout_device_s + times.train_sample_device_s),
        "cluster": f"{sim.cluster.on_demand_devices} on-demand + {sim.cluster.spot_devices} spot "
                   f"({sim.cluster.on_demand_instance} / {sim.cluster.spot_instance})",
    }
    if work is not None and device is not None:
        per_gpu.update(memory_gib=work.memory.total / GIB,
                       memory_parts_gib={k: v / GIB for k, v in work.memory.parts.items()},
                       memory_phases_gib={k: v / GIB for k, v in work.memory.phases.items()},
                       memory_peak_phase=work.memory.peak_phase,
                       device_memory_gib=device.memory_bytes / GIB, micro_batch=work.micro_batch,
                       minibatch_rows=work.minibatch_rows)
    deadline_s = deadline_h * 3600.0
    with_explore = cheapest_mix(deadline_s, spotlight, on_demand_options, spot_options, sources)
    without = cheapest_mix(deadline_s, sim.model_copy(update={"mode": Mode.SPOT_ROLLOUT}), on_demand_options,
                           spot_options, sources)
    return PlanReport(deadline_h=deadline_h, workload=_workload_json(work, device), iteration_s=iteration,
                      per_gpu=per_gpu, with_exploration=with_explore.best, without_exploration=without.best,
                      fastest_h=min(row.time_to_target_s for row in with_explore.rows) / 3600.0,
                      assumptions=_assumptions(config, (at_config.alpha, at_config.alpha_source), work, device))
