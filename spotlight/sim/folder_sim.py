"""What `spotlight plan` and `spotlight simulate` read: a simulation, plus the training fields of the run to price.

`PlanConfig` is a `SimConfig` with the training config's own ``model``, ``rollout``, ``train`` and
``dtype`` sections (the same classes `spotlight train` validates, so ``-s model.pretrained=DIR -s
rollout.resolution=1280 -s train.algorithm=nft`` mean what they mean there) and a ``plan`` section for
the GPU. With ``model.pretrained`` set, `simulation` derives the simulator's workload and loop shape
from the folder (`spotlight.sim.folder_workload`); without it the typed ``workload`` section is used
as before (configs/simulate-paper.yaml).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from spotlight.config import RolloutSection, TrainSection
from spotlight.models.policy_section import PolicySection
from spotlight.schema import Section
from spotlight.sim.device_profiles import DeviceProfile, profile
from spotlight.sim.folder_workload import FolderWorkload, derive_workload
from spotlight.sim.sim_config import LoopSection, SimConfig
from spotlight.sim.workload import WorkloadSection

__all__ = ["PlanConfig", "PlanSection", "simulation"]

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class PlanSection(Section):
    """The GPU a plan prices, and the one assumption a folder cannot answer.

    gpu: a profile name (`spotlight.sim.device_profiles`; shipped: H100-SXM, H200); profiles: a user
    profile file over the shipped ones (None: ~/.config/spotlight/gpus.yaml when it exists);
    prompt_tokens: Qwen-Image only, the tokens of a prompt (its pipeline pads no further than the
    longest prompt): 32 assumes GenEval/OCR-length prompts.
    """

    gpu: str = "H100-SXM"
    profiles: str | None = None
    prompt_tokens: int = Field(32, ge=1)


class PlanConfig(SimConfig):
    """A simulation and the training fields of the run it prices (module docstring)."""

    model: PolicySection = PolicySection()
    rollout: RolloutSection = RolloutSection()
    train: TrainSection = TrainSection()
    dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16"
    plan: PlanSection = PlanSection()

    @property
    def from_folder(self) -> bool:
        """Whether the workload comes from a pipeline folder (``model.pretrained``) rather than ``workload``."""
        return self.model.pretrained is not None


def _workload_section(config: PlanConfig, work: FolderWorkload, device: DeviceProfile) -> WorkloadSection:
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


def simulation(config: PlanConfig) -> tuple[SimConfig, FolderWorkload | None, DeviceProfile | None]:
    """The SimConfig to run, and the folder's workload and GPU profile when it comes from a folder.

    From a folder, the loop's prompts and group size are ``rollout``'s, and every workload number the
    folder or the profile answers replaces the typed one. Raises the folder's, the profile's and the
    fit's one-line errors.
    """
    if not config.from_folder:
        return SimConfig.model_validate(config.model_dump(include=set(SimConfig.model_fields))), None, None
    device = profile(config.plan.gpu, config.plan.profiles)
    work = derive_workload(config, device)
    loop: LoopSection = config.loop.model_copy(update={
        "prompts_per_iteration": config.rollout.prompts_per_iteration, "group_size": config.rollout.group_size})
    data = config.model_dump(include=set(SimConfig.model_fields))
    data.update(loop=loop.model_dump(), workload=_workload_section(config, work, device).model_dump())
    return SimConfig.model_validate(data), work, device
