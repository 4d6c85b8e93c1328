"""The assumptions behind the simulated ladder (`spotlight.disagg.ladder`), as a typed config.

Every number that turns FLOPs and bytes into seconds is a field here, with its reason; the shipped
values are in ``configs/simulate-digenrl.yaml``. None of them is DigenRL's: it publishes no timings,
so the cost model is this project's (FLOPs of an MMDiT forward from `spotlight.sim.workload`,
utilisations and link speeds as stated), and the simulated ratios are what THESE assumptions give.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from spotlight.schema import Section


class DiTModel(Section):
    """An MMDiT-class transformer: what one forward costs (FLOPs from `spotlight.sim.workload.forward_flops`)."""

    num_layers: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    params: float = Field(gt=0)
    text_tokens: int = Field(ge=0)
    resolution: int = Field(1024, ge=16)
    guidance_forwards: int = Field(1, ge=1)  # forwards per denoising step (2: true CFG)


class Hardware(Section):
    """H100 SXM machines of 8 GPUs."""

    peak_flops: float = Field(989e12, gt=0)  # bf16 dense
    generate_mfu: float = Field(0.40, gt=0, le=1)
    train_mfu: float = Field(0.35, gt=0, le=1)
    devices_per_machine: int = Field(8, ge=1)
    nvlink_bandwidth: float = Field(300e9, gt=0)  # bytes/s per device, collectives inside a machine
    network_bandwidth: float = Field(40e9, gt=0)  # bytes/s per device between machines
    pcie_bandwidth: float = Field(25e9, gt=0)  # bytes/s per device, device <-> host


class Costs(Section):
    """What a step does besides the transformer's forwards, in the units the model needs."""

    bytes_per_param: float = Field(2.0, gt=0)  # bf16 weights and gradients
    optimizer_bytes_per_param: float = Field(12.0, ge=0)  # fp32 master weights + Adam moments
    train_pass_factor: float = Field(3.0, gt=0)  # forward + backward ≈ 3 forwards
    reference_forwards: int = Field(1, ge=0)  # frozen KL reference (GRPO) or sampling policy (NFT) per timestep
    fsdp_exposed_fraction: float = Field(0.5, ge=0, le=1)  # of the per-pass all-gathers / reduce-scatter
    tsp_max_pack: int = Field(4, ge=1)  # timesteps one packed pass holds (activation memory)
    reward_latency_s: float = Field(1.0, ge=0)  # a unit's scores from the separate reward pool
    colocated_reward_device_s: float = Field(0.05, ge=0)  # per sample, on the training devices when colocated
    tag_slowdown: float = Field(1.25, ge=1)  # a fragment drawn in the training framework vs the generators' engine
    colocated_generation_efficiency: float = Field(1.0, gt=0, le=1)  # 1: colocated generation as fast as disaggregated


class Batch(Section):
    """The logical batch and how it is cut (units along the generation axis)."""

    prompts: int = Field(32, ge=1)
    group_size: int = Field(8, ge=1)
    unit_size: int = Field(2, ge=1)
    num_batches: int = Field(8, ge=2)
    warmup_batches: int = Field(2, ge=1)


class Exploration(Section):
    """Spotlight's exploration for batch i+1 on spot generators while batch i runs."""

    spot_devices_per_device: float = Field(0.5, ge=0)  # spot devices per on-demand device
    explore_steps: int = Field(4, ge=1)  # cheap denoising steps per candidate
    candidates_per_prompt: int = Field(16, ge=1)  # what seed selection needs


class Grid(Section):
    """The settings the ladder is simulated at (DigenRL's testbeds)."""

    models: list[str] = Field(min_length=1)
    devices: list[int] = Field(min_length=1)
    sampling_steps: list[int] = Field(min_length=1)
    trained_fraction: list[float] = Field(min_length=1)


class LadderConfig(Section):
    """Everything `benchmarks/runtime/disaggregated.py --simulate` needs."""

    models: dict[str, DiTModel]
    hardware: Hardware = Hardware()
    costs: Costs = Costs()
    batch: Batch = Batch()
    bts_max_rounds: int = Field(2, ge=1)  # BTS searches k up to this many rounds of one unit per trainer device
    bts_min_gain: float = Field(0.02, ge=0, lt=1)  # TAG must shorten the rest of the step by this fraction
    exploration: Exploration = Exploration()
    grid: Grid

    @model_validator(mode="after")
    def _consistent(self) -> LadderConfig:
        unknown = sorted(set(self.grid.models) - set(self.models))
        if unknown:
            raise ValueError(f"grid.models names {unknown}, which `models` does not define "
                             f"(defined: {sorted(self.models)})")
        if self.batch.warmup_batches >= self.batch.num_batches:
            raise ValueError(f"batch.warmup_batches ({self.batch.warmup_batches}) must be < batch.num_batches "
                             f"({self.batch.num_batches}): the steady state is measured after the warm-up")
        if any(not 0 < f <= 1 for f in self.grid.trained_fraction):
            raise ValueError(f"grid.trained_fraction must lie in (0, 1] (got {self.grid.trained_fraction})")
        return self
