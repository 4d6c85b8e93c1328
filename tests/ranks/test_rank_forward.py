"""What the ranks' wrappers do to a forward: DDP sends no buffers, FSDP2's θ computes as the whole sampling copy.

- DDP (`data_parallel`): the policies' buffers are constants (SD3's 453 MB ``pos_embed``); two gloo ranks whose
  buffers differ keep their own through a forward and backward, so nothing was broadcast.
- FSDP2 in bf16 (`sharded(..., param_dtype=bfloat16)`, ``trainer.whole_dtype: bfloat16``): a tiny SD3's update
  forward hands the transformer the float32 timestep that sampling with the whole bf16 copy hands it (FSDP2's
  ``cast_forward_inputs`` rounded it to bf16 in the update only).
"""

from __future__ import annotations

import copy
import socket
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from gloo_ranks import run_ranks

from spotlight.ranks.data_parallel import data_parallel, sharded


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class WithConstant(nn.Module):
    """A layer plus a constant buffer, as a transformer's positional table."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.register_buffer("table", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + self.table


def ddp_rank(rank: int, port: int, out: Path) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        model = WithConstant()
        model.table.fill_(float(rank))  # differs by rank: a broadcast would show as rank 0's values on rank 1
        trained = data_parallel(model, 2)
        trained(torch.ones(2, 4)).sum().backward()
        torch.save({"table": model.table.clone(), "grad": model.linear.bias.grad.clone()}, out / f"rank-{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_ddp_sends_no_buffers_each_rank_keeps_its_constant_tables(tmp_path: Path) -> None:
    run_ranks(ddp_rank, (free_port(), tmp_path), nprocs=2, timeout_s=240)
    ranks = [torch.load(tmp_path / f"rank-{rank}.pt") for rank in range(2)]
    assert ranks[1]["table"].tolist() == [1.0] * 4 and ranks[0]["table"].tolist() == [0.0] * 4
    assert ranks[0]["grad"].tolist() == ranks[1]["grad"].tolist() == [4.0] * 4  # still summed: 2 rows x 2 ranks


def test_fsdp_bf16_update_forward_sees_the_float32_timestep_sampling_sees(tiny_pipeline) -> None:
    from spotlight.models.pipelines.family_config import DiffusersPolicyConfig
    from spotlight.models.rebuild import policy_from_config

    torch.manual_seed(0)
    config = DiffusersPolicyConfig(family="sd3", pretrained=str(tiny_pipeline("sd3")), pipeline=True,
                                   resolution=(16, 16), dtype="float32", max_sequence_length=32, finetune="full")
    policy = policy_from_config(config).eval()
    whole = copy.deepcopy(policy)  # the sampler: the whole transformer in trainer.whole_dtype
    whole.transformer.to(torch.bfloat16)
    tokens = policy.tokenize(["a red circle", "two blue squares"], guided=False)
    x = torch.randn(2, *policy.latent_shape)
    sigma = torch.tensor([0.6003, 0.3337])  # 600.3 and 333.7: bf16 rounds them to 600 and 334

    def timesteps(model) -> tuple[torch.Tensor, torch.Tensor]:
        seen: list[torch.Tensor] = []
        hook = model.transformer.time_text_embed.register_forward_pre_hook(
            lambda module, args: seen.append(args[0].detach().clone()))
        try:
            with torch.no_grad():
                velocity = model(x, sigma, tokens)
        finally:
            hook.remove()
        return seen[0], velocity

    sampled, sampled_velocity = timesteps(whole)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        sharded(policy, param_dtype=torch.bfloat16)
        trained, trained_velocity = timesteps(policy)
    finally:
        dist.destroy_process_group()
    assert sampled.dtype == trained.dtype == torch.float32
    torch.testing.assert_close(trained, 1000.0 * sigma, rtol=0, atol=0)
    # the same computation but for bf16 rounding (the whole copy's buffers are bf16 too, FSDP2's stay float32)
    torch.testing.assert_close(trained_velocity, sampled_velocity, rtol=0.05, atol=0.02)
