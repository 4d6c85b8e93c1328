"""A simulation whose workload comes from a pipeline folder: `spotlight plan`'s and `spotlight simulate`'s input.

What they load is `spotlight.plan_config.PlanConfig`: a `SimConfig` with the training config's own
``model``, ``rollout``, ``train`` and ``dtype`` sections and the ``plan`` section here (the GPU). It is
defined above both the simulator and the training config (the simulator imports no training config);
here it is read through the fields it has (`PlanInputs`). With ``model.pretrained`` set, `simulation`
derives the simulator's workload and loop shape from the folder (`spotlight.sim.planning.folder_workload`);
without it the typed ``workload`` section is used as before (configs/simulate-paper.yaml).
"""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import Field

from spotlight.schema import Section
from spotlight.sim.convergence import ConvergenceSection, SignalSection
from spotlight.sim.planning.device_profiles import DeviceProfile, profile
from spotlight.sim.planning.folder_workload import DEFAULT_PROMPT_TOKENS, FolderWorkload, RunFields, derive_workload
from spotlight.sim.sim_config import ClusterSection, LoopSection, SimConfig
from spotlight.sim.workload import WorkloadSection

__all__ = ["PlanInputs", "PlanSection", "simulation"]

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class PlanSection(Section):
    """The GPU a plan prices, and the one assumption a folder cannot answer.

    gpu: a profile name (`spotlight.sim.planning.device_profiles`; shipped: H100-SXM, H200); profiles: a user
    profile file over the shipped ones (None: ~/.config/spotlight/gpus.yaml when it exists);
    prompt_tokens: Qwen-Image only, the tokens of a prompt (its pipeline pads no further than the
    longest prompt): 32 assumes GenEval/OCR-length prompts.
    """

    gpu: str = "H100-SXM"
    profiles: str | None = None
    prompt_tokens: int = Field(DEFAULT_PROMPT_TOKENS, ge=1)


class PlanInputs(RunFields, Protocol):
    """What `simulation` and `spotlight.sim.planning.plan_report` read of a `spotlight.plan_config.PlanConfig`."""

    cluster: ClusterSection
    workload: WorkloadSection
    loop: LoopSection
    signal: SignalSection
    convergence: ConvergenceSection
    plan: PlanSection

    def model_dump(self, **kwargs: Any) -> dict[str, Any]: ...


def from_folder(config: PlanInputs) -> bool:
    """Whether the workload comes from a pipeline folder (``model.pretrained``) rather than ``workload``."""
    return config.model.pretrained is not None


def _workload_section(config: PlanInputs, work: FolderWorkload, device: DeviceProfile) -> WorkloadSection:
    """The simulator's workload: counted FLOPs and the GPU's profile over the typed section's other fields."""
    return config.workload.model_copy(update={  # a non-square image's SP traffic is priced as its height's square
        "resolution": work.resolution[0], "vae_downsample": work.vae_scale_factor, "patch_size": 2,
        "text_tokens": work.text_tokens, "num_layers": work.blocks, "hidden_size": work.hidden,
        "num_heads": work.heads, "params": float(work.parameters), "trainable_params": float(work.trainable_parameters),
        "bytes_per_param": float(DTYPE_BYTES[config.dtype]), "gradient_bytes_per_param": 4.0,
        "guidance_forwards": work.guidance_forwards, "peak_flops": device.peak_bf16_dense_tflops * 1e12,
        "mfu": device.rollout_efficiency, "train_mfu": device.update_efficiency,
        "hbm_bandwidth": device.hbm_tb_per_s * 1e12, "nvlink_bandwidth": device.nvlink_achieved_gb_per_s * 1e9,
        "network_bandwidth": device.network_achieved_gb_per_s * 1e9, "rollout_steps": config.rollout.num_steps,
        "flops_per_forward": work.forward_flops, "train_flops_per_sample": work.update_flops_per_sample,
        "optimizer_steps": work.optimizer_steps, "batch_size": 1,
    })


def simulation(config: PlanInputs) -> tuple[SimConfig, FolderWorkload | None, DeviceProfile | None]:
    """The SimConfig to run, and the folder's workload and GPU profile when it comes from a folder.

    From a folder, the loop's prompts and group size are ``rollout``'s, and every workload number the
    folder or the profile answers replaces the typed one. Raises the folder's, the profile's and the
    fit's one-line errors.
    """
    if not from_folder(config):
        return SimConfig.model_validate(config.model_dump(include=set(SimConfig.model_fields))), None, None
    device = profile(config.plan.gpu, config.plan.profiles)
    work = derive_workload(config, device, config.plan.prompt_tokens)
    loop: LoopSection = config.loop.model_copy(update={
        "prompts_per_iteration": config.rollout.prompts_per_iteration, "group_size": config.rollout.group_size})
    data = config.model_dump(include=set(SimConfig.model_fields))
    data.update(loop=loop.model_dump(), workload=_workload_section(config, work, device).model_dump())
    return SimConfig.model_validate(data), work, device
