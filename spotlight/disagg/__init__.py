"""Disaggregated diffusion RL (the DigenRL design, issue 16): the pieces a disaggregated loop calls.

Generation, reward scoring and training run on separate device pools. Each module here does one job
and is a pure function or a small state machine of tensors, so a test drives it directly:

- ``samples``: a generation's identity (prompt, sample, policy version) and the scored sample;
  the logical batch cut into units along the generation axis.
- ``groups``: the group assembler (scored samples in any order in, complete groups with their
  group-relative advantages out).
- ``group_loss``: the NFT and Flow-GRPO losses of one group, as sums over rows, per timestep or packed.
- ``timestep_packing``: several timesteps of a sample in one forward/backward (TSP).
- ``accumulate``: the generation-axis pipeline's gradient accumulator (GAP): one optimizer step per
  logical batch, equal to the one-shot update.
- ``versions``: one-step-constrained asynchrony (TCSS): the version gate and the staleness check.
- ``offload`` and ``assisted``: trainer-assisted generation (TAG) with lossless offload/restore.
- ``bubble``: the bubble policy (BTS) deciding how many fragments TAG generates.
- ``ladder``: a discrete-event model of the throughput ladder at DigenRL's settings.

What is known of DigenRL comes from its abstract and an open design RFC (verl-omni #321); it has no
public code. Everything below that goes beyond those facts (the unit size, the bubble policy's
search, how versions are pinned, the simulator's cost model) is this project's design, marked
"inferred" where it stands in for a DigenRL detail.
"""
