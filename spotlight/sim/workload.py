"""How long one denoising step, one rollout, one GRPO update and one weight broadcast take at scale.

The simulator replays the training loop for models that cannot run here (Qwen-Image, 20 B
parameters, at 512² and 1280² on hundreds of H100s), so its step times are derived from FLOPs,
bytes and link bandwidths, not measured. Every number below is a `WorkloadSection` field a user can
override with a measured one; the defaults are a Qwen-Image-class MMDiT on H100 SXM.

Architecture (defaults; Qwen-Image technical report and its diffusers config): 60 dual-stream
MMDiT blocks, hidden size d = 3072, 24 heads of 128, 20 B parameters in bf16 (2 bytes each).

Tokens. The VAE downsamples by 8 and the transformer patchifies 2×2 latents, so an image of
side `res` is (res / 16)² image tokens: 1,024 at 512², 6,400 at 1280². The text stream adds the
prompt's tokens; 128 is an assumption (short GenEval/OCR prompts plus the chat template, padded).
Total n = 1,152 at 512², 6,528 at 1280².

FLOPs of one forward. In a dual-stream block every token passes through its own stream's
QKV + output projections (4·d² weights) and MLP (ratio 4: 8·d² weights), so a matmul costs
2 · 12·d² FLOPs per token per layer; joint attention costs 2·n·d for QKᵀ plus 2·n·d for the
weighted sum per token per layer. So

    F(n) = 24·L·d²·n + 4·L·n²·d
         = 88.7 + 31.4 = 120.1 TFLOP at 1280²,   15.7 + 1.0 = 16.6 TFLOP at 512².

This is not 2·params·n: of the 20 B parameters only 24·L·d² / 2 = 6.8 B act on any one token (each
token sees one stream), and the 6.8 B adaLN modulation weights act once per sample, not per
token; 2·20 B·n would overstate the dense part by 3×.

Step time on one device. Measured utilisation (MFU) of large-DiT inference and training on H100
is about 40% of the 989 TFLOP/s bf16 dense peak (assumption; `mfu`), so a forward at 1280² takes
120.1 / (0.40 · 989) = 0.304 s, at 512² 0.042 s. Classifier-free guidance runs `guidance_forwards`
= 2 forwards a step (true CFG, as Qwen-Image samples), batched together: a step is 0.607 s at
1280² and 0.084 s at 512², a 10-step rollout sample 6.1 and 0.84 device-seconds. A forward also reads all
weights from HBM once: 40 GB / 3.35 TB/s = 11.9 ms, a floor that matters only when the per-device
compute is small (low resolution, high SP degree). So
    step = max(guidance · batch · F / (sp · mfu · peak), weight_bytes / hbm) + all-to-all time.

Sequence parallelism (Ulysses). An SP group of degree sp shards the tokens; around each
attention four all-to-alls (Q, K, V in, output back) each move (n / sp) · d · 2 bytes · (sp − 1) / sp
per device. Per forward that is 4·L of them: at 1280², sp = 4, 1.80 GB per device. Inside one
machine the link is NVLink (assumption: 300 GB/s achieved per device for all-to-all, about two
thirds of H100's 450 GB/s per direction) → 6.0 ms against 76 ms of compute a forward, 93%
efficiency; across machines it is InfiniBand/EFA (assumption: 40 GB/s, 80% of 400 Gb/s) → 45 ms,
63%. So SP buys latency, never throughput; the simulator uses it where a preemption should lose
little (a shorter request). The degree must divide the 24 heads (Ulysses shards heads), else ValueError.

GRPO update. Per sample, each trained timestep (`train_timestep_fraction` of the `rollout_steps`
= 10, Flow-GRPO's denoising reduction) recomputes the policy's guided prediction with gradients:
forward + backward ≈ 3 forwards (`train_pass_factor`; about 2 with LoRA, 4 with activation
checkpointing), plus one guided forward of the frozen reference for the KL term: 10 · 4 · 2
forwards = 24.3 device-seconds a sample at 1280², four times its rollout. Data parallel over
the on-demand devices, compute bound; then one ring all-reduce of the trainable parameters' bf16
gradients per optimiser step: 2·(n − 1)/n · bytes / link.

Weight broadcast. After the update θ_{i+1} must reach the devices that roll out but did not
train (spot): a pipelined broadcast moves the trainable parameters' bytes once per link, so
trainable · 2 bytes / link = 1.0 s for 20 B over 40 GB/s. A device that joins mid-phase copies the
full weights from a peer the same way.

Measured times. Where the devices exist (the runtime's local run), `WorkloadSection.measured`
replaces every derived time above with what the run measured (`MeasuredTimes`): the simulator then
replays the same loop with the real per-step costs, which is how it is validated against the
runtime (benchmarks/sim/sim_vs_runtime.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field

from spotlight.schema import Section

__all__ = [
    "DeviceTimes", "IterationTimes", "MeasuredTimes", "WorkloadSection", "describe", "device_times",
    "explore_cost_factor", "forward_flops", "measured_device_times", "sp_comm_bytes", "tokens",
]


class IterationTimes(Section):
    """One iteration's measured times; a field left None keeps the run's mean (`MeasuredTimes`)."""

    on_demand_sample_step_s: float | None = Field(None, gt=0)
    spot_sample_step_s: float | None = Field(None, gt=0)
    explore_sample_step_s: float | None = Field(None, gt=0)
    train_s: float | None = Field(None, gt=0)
    broadcast_s: float | None = Field(None, ge=0)


class MeasuredTimes(Section):
    """Times measured on real devices, in seconds; given, they replace the FLOP-derived ones.

    on_demand_sample_step_s / spot_sample_step_s: device-seconds per sample per denoising step of
    a rollout on one device of each pool; explore_sample_step_s: the same for exploration on a spot
    device (it runs through the queue in other batch sizes, so it may cost more or less per step;
    None: as the spot rollout); train_s: wall time of one GRPO update of the whole rollout;
    broadcast_s: handing θ_{i+1} to the spot devices, on the critical path; weight_copy_s: a
    joining device loading the weights (None: broadcast_s); score_candidate_s: on-demand seconds
    to score one explored candidate when a round closes (the runtime decodes and rewards every
    candidate on the trainer after training; the staleness monitor's re-scores are folded in).
    per_iteration: iteration i's own times (`IterationTimes`; the last entry past the end) in place
    of the means — a replay of one run whose machine changed speed while it ran, so that the loop's
    decisions can be compared without that noise. None: every iteration takes the means.
    """

    on_demand_sample_step_s: float = Field(gt=0)
    spot_sample_step_s: float = Field(gt=0)
    explore_sample_step_s: float | None = Field(None, gt=0)
    train_s: float = Field(gt=0)
    broadcast_s: float = Field(0.0, ge=0)
    weight_copy_s: float | None = Field(None, ge=0)
    score_candidate_s: float = Field(0.0, ge=0)
    per_iteration: list[IterationTimes] | None = Field(None, min_length=1)

    def at(self, iteration: int) -> MeasuredTimes:
        """Return the times of `iteration` (0-based): its `per_iteration` entry over the means."""
        if self.per_iteration is None:
            return self
        entry = self.per_iteration[min(iteration, len(self.per_iteration) - 1)]
        return self.model_copy(update=entry.model_dump(exclude_none=True))


class WorkloadSection(Section):
    """The model, resolution and hardware behind the simulator's step times (module docstring derives them)."""

    resolution: int = Field(1280, ge=16)
    vae_downsample: int = Field(8, ge=1)
    patch_size: int = Field(2, ge=1)
    text_tokens: int = Field(128, ge=0)
    num_layers: int = Field(60, ge=1)
    hidden_size: int = Field(3072, ge=1)
    num_heads: int = Field(24, ge=1)
    params: float = Field(20e9, gt=0)  # all weights: what a device holds and reads each forward
    trainable_params: float = Field(20e9, gt=0)  # what is all-reduced and broadcast (LoRA: the adapters)
    bytes_per_param: float = Field(2.0, gt=0)
    guidance_forwards: int = Field(2, ge=1)
    peak_flops: float = Field(989e12, gt=0)  # FLOP/s, H100 SXM bf16 dense
    mfu: float = Field(0.40, gt=0, le=1)
    hbm_bandwidth: float = Field(3.35e12, gt=0)  # bytes/s
    nvlink_bandwidth: float = Field(300e9, gt=0)  # bytes/s per device, achieved all-to-all
    network_bandwidth: float = Field(40e9, gt=0)  # bytes/s per device between machines
    sp_degree: int = Field(1, ge=1)
    batch_size: int = Field(1, ge=1)
    rollout_steps: int = Field(10, ge=1)
    train_timestep_fraction: float = Field(1.0, gt=0, le=1)
    train_pass_factor: float = Field(3.0, gt=0)
    kl_reference: bool = True
    optimizer_steps: int = Field(1, ge=1)
    # counted from a pipeline folder (spotlight.sim.planning.folder_workload); None: the formulas above
    flops_per_forward: float | None = Field(None, gt=0)  # one conditional forward of one sample
    train_flops_per_sample: float | None = Field(None, gt=0)  # the whole update's FLOPs per rollout sample
    train_mfu: float | None = Field(None, gt=0, le=1)  # the update's utilisation (None: mfu)
    gradient_bytes_per_param: float | None = Field(None, gt=0)  # all-reduced gradients (None: bytes_per_param)
    measured: MeasuredTimes | None = None


def tokens(config: WorkloadSection) -> int:
    """Return the sequence length of one sample: (res / (vae · patch))² image tokens + text tokens.

    The image side must be a multiple of vae_downsample · patch_size; a ValueError names the fix.
    """
    stride = config.vae_downsample * config.patch_size
    if config.resolution % stride:
        raise ValueError(
            f"workload.resolution must be a multiple of vae_downsample·patch_size = {stride} "
            f"(got {config.resolution}); round it to {stride * round(config.resolution / stride)}"
        )
    return (config.resolution // stride) ** 2 + config.text_tokens


def forward_flops(config: WorkloadSection) -> float:
    """Return the FLOPs of one forward of one sample: 24·L·d²·n (projections, MLP) + 4·L·n²·d (attention).

    A counted `flops_per_forward` (a pipeline folder's, `spotlight.sim.planning.folder_workload`) replaces the formula.
    """
    if config.flops_per_forward is not None:
        return config.flops_per_forward
    n, d, layers = tokens(config), config.hidden_size, config.num_layers
    return 24.0 * layers * d * d * n + 4.0 * layers * n * n * d


def sp_comm_bytes(config: WorkloadSection, sp_degree: int) -> float:
    """Return the bytes one device sends in the Ulysses all-to-alls of one forward of one sample.

    Four all-to-alls per layer, each sending (sp − 1)/sp of the device's (n/sp)·d activation shard.
    0 for sp = 1.
    """
    n, d = tokens(config), config.hidden_size
    shard = n / sp_degree * d * config.bytes_per_param
    return 4.0 * config.num_layers * shard * (sp_degree - 1) / sp_degree


@dataclass(frozen=True)
class DeviceTimes:
    """Derived times of one workload on one pool (one machine shape). All in seconds.

    step_s: one denoising step (all guidance forwards) of a batch of `batch_size` samples on an
    SP group of `sp_degree` devices; sample_step_device_s: device-seconds per sample per step
    (step_s · sp / batch), the unit rollout and exploration work is counted in;
    sp_efficiency: compute-only step time / step_s; train_sample_device_s: device-seconds of the
    GRPO update per sample; weight_copy_s: full weights from a peer over the network;
    broadcast_s: trainable weights to the rollout devices; uses_nvlink: whether SP groups fit in
    one machine; measured_train_s: the measured update time, which `train_s` returns as it is.
    """

    step_s: float
    sample_step_device_s: float
    sp_efficiency: float
    train_sample_device_s: float
    weight_copy_s: float
    broadcast_s: float
    uses_nvlink: bool
    measured_train_s: float | None = None

    def train_s(self, config: WorkloadSection, num_samples: int, num_devices: int) -> float:
        """Return the wall time of one GRPO update of `num_samples` samples on `num_devices` trainers.

        Compute divides evenly over the data-parallel devices (each holds whole samples); each of
        the `optimizer_steps` ends in a ring all-reduce of the bf16 gradients, 2·(n−1)/n of their
        bytes per device over the network.
        """
        if num_devices < 1:
            raise ValueError(f"train_s: num_devices must be >= 1 (got {num_devices}); training runs on on-demand")
        if self.measured_train_s is not None:
            return self.measured_train_s
        compute = num_samples * self.train_sample_device_s / num_devices
        gradient_bytes = config.trainable_params * (config.gradient_bytes_per_param or config.bytes_per_param)
        all_reduce = 2.0 * (num_devices - 1) / num_devices * gradient_bytes / config.network_bandwidth
        return compute + config.optimizer_steps * all_reduce


def device_times(config: WorkloadSection, gpus_per_machine: int = 8) -> DeviceTimes:
    """Return the DeviceTimes of `config` on machines of `gpus_per_machine` GPUs.

    SP groups stay inside one machine (NVLink) when sp_degree ≤ gpus_per_machine, else they span
    machines over the network. Raises ValueError when sp_degree does not divide the heads.
    """
    sp = config.sp_degree
    if config.num_heads % sp:
        divisors = [k for k in range(1, config.num_heads + 1) if config.num_heads % k == 0]
        raise ValueError(
            f"workload.sp_degree must divide num_heads = {config.num_heads} for Ulysses head sharding "
            f"(got {sp}); use one of {divisors}"
        )
    if gpus_per_machine < 1:
        raise ValueError(f"gpus_per_machine must be >= 1 (got {gpus_per_machine})")
    flops = forward_flops(config)
    forwards = config.guidance_forwards * config.batch_size
    compute_s = forwards * flops / (sp * config.mfu * config.peak_flops)
    weight_read_s = config.params * config.bytes_per_param / config.hbm_bandwidth
    uses_nvlink = sp <= gpus_per_machine
    link = config.nvlink_bandwidth if uses_nvlink else config.network_bandwidth
    comm_s = forwards * sp_comm_bytes(config, sp) / link
    step_s = max(compute_s, weight_read_s) + comm_s
    single_device_compute_s = forwards * flops / (config.mfu * config.peak_flops)

    train_mfu = config.train_mfu or config.mfu
    if config.train_flops_per_sample is not None:
        train_sample_device_s = config.train_flops_per_sample / (train_mfu * config.peak_flops)
    else:
        trained_steps = config.train_timestep_fraction * config.rollout_steps
        passes = config.train_pass_factor + (1.0 if config.kl_reference else 0.0)
        train_flops = trained_steps * passes * config.guidance_forwards * flops
        train_sample_device_s = train_flops / (train_mfu * config.peak_flops)
    return DeviceTimes(
        step_s=step_s,
        sample_step_device_s=step_s * sp / config.batch_size,
        sp_efficiency=single_device_compute_s / (sp * step_s),
        train_sample_device_s=train_sample_device_s,
        weight_copy_s=config.params * config.bytes_per_param / config.network_bandwidth,
        broadcast_s=config.trainable_params * config.bytes_per_param / config.network_bandwidth,
        uses_nvlink=uses_nvlink,
    )


def measured_device_times(config: WorkloadSection, sample_step_s: float) -> DeviceTimes:
    """Return DeviceTimes of one pool from `config.measured`, whose sample-step time is `sample_step_s`.

    A step of the batch on an SP group takes sample_step_s · batch / sp (the measured cost is per
    sample per device, as the simulator counts work); train_sample_device_s is 0 because the update
    time is measured whole (`MeasuredTimes.train_s`, see `DeviceTimes.train_s`). Raises ValueError
    when `config.measured` is None.
    """
    measured = config.measured
    if measured is None:
        raise ValueError("measured_device_times: workload.measured is not set")
    return DeviceTimes(
        step_s=sample_step_s * config.batch_size / config.sp_degree,
        sample_step_device_s=sample_step_s,
        sp_efficiency=1.0,
        train_sample_device_s=0.0,
        weight_copy_s=measured.broadcast_s if measured.weight_copy_s is None else measured.weight_copy_s,
        broadcast_s=measured.broadcast_s,
        uses_nvlink=True,
        measured_train_s=measured.train_s,
    )


def explore_cost_factor(config: WorkloadSection) -> float:
    """Return exploration's cost per sample-step relative to a spot rollout's (1 unless measured otherwise)."""
    measured = config.measured
    if measured is None or measured.explore_sample_step_s is None:
        return 1.0
    return measured.explore_sample_step_s / measured.spot_sample_step_s


def describe(config: WorkloadSection, gpus_per_machine: int = 8) -> dict[str, float]:
    """Return the headline derived numbers (tokens, TFLOP per forward, step and train times) for reports."""
    times = device_times(config, gpus_per_machine)
    return {
        "tokens": float(tokens(config)),
        "tflop_per_forward": forward_flops(config) / 1e12,
        "step_s": times.step_s,
        "sp_efficiency": times.sp_efficiency,
        "rollout_sample_device_s": times.sample_step_device_s * config.rollout_steps,
        "train_sample_device_s": times.train_sample_device_s,
        "broadcast_s": times.broadcast_s,
        "weight_copy_s": times.weight_copy_s,
        "uses_nvlink": float(times.uses_nvlink),
    }

