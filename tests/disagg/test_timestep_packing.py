"""TSP: one packed forward/backward over several timesteps gives the per-timestep gradient, on one process
and under 2-rank gloo DDP with ``no_sync`` accumulation."""

import os
import sys

import torch
import torch.distributed as dist
from disagg_batches import PLAN, policy, scored_batch, twin
from gloo_ranks import run_ranks
from torch.nn.parallel import DistributedDataParallel

from spotlight.disagg.accumulate import LogicalBatchUpdate
from spotlight.disagg.group_loss import GrpoGroupLoss, NftGroupLoss, keyed_forward_noise
from spotlight.disagg.groups import GroupAssembler
from spotlight.disagg.timestep_packing import packed_velocity
from spotlight.rl.nft import nft_loss, optimality

GROUP_SIZE = 4
TIMESTEPS = 3


def groups_of(samples):
    assembler = GroupAssembler(len(samples) // GROUP_SIZE, GROUP_SIZE)
    return [group for sample in samples for group in assembler.add(sample)]


def gradients(model) -> list[torch.Tensor]:
    return [parameter.grad.clone() for parameter in model.parameters()]


PLAN_SHAPE = (3, 8, 8)


def nft_loss_of(old, pack: bool) -> NftGroupLoss:
    def noise(sample_id):
        return keyed_forward_noise(0, 0, sample_id, TIMESTEPS, PLAN_SHAPE)

    return NftGroupLoss({0: old}, noise, beta=1.0, adv_scale=2.0, num_timesteps=TIMESTEPS, pack_timesteps=pack)


def test_packed_velocities_equal_separate_forwards():
    model = policy(0)
    latents = [torch.randn(2, *PLAN_SHAPE), torch.randn(3, *PLAN_SHAPE)]
    sigmas = [torch.tensor([0.2, 0.9]), torch.tensor([0.5, 0.5, 0.1])]
    tokens = [torch.ones(2, 8, dtype=torch.long), torch.full((3, 8), 2, dtype=torch.long)]
    packed = packed_velocity(model, latents, sigmas, tokens)
    for block, x, sigma, token in zip(packed, latents, sigmas, tokens, strict=True):
        torch.testing.assert_close(block, model(x, sigma, token), rtol=1e-5, atol=1e-6)


def test_nft_packed_gradient_equals_a_per_timestep_loop():
    model = policy(0)
    old = twin(model)
    group = groups_of(scored_batch(model, GROUP_SIZE))[0]
    loss = nft_loss_of(old, pack=True)
    model.zero_grad()
    piece = loss.piece(model, group, 0)
    piece.loss_sum.backward()
    packed = gradients(model)

    # the reference, written from the loss's definition: one forward/backward per timestep
    model.zero_grad()
    x0 = torch.stack([s.latents[-1] for s in group.samples])
    tokens = torch.stack([s.tokens for s in group.samples])
    r = optimality(group.advantages, 2.0)
    draws = [keyed_forward_noise(0, 0, s.id, TIMESTEPS, PLAN_SHAPE) for s in group.samples]
    for t in range(TIMESTEPS):
        sigma = torch.stack([d.sigmas[t] for d in draws])
        noise = torch.stack([d.noise[t] for d in draws])
        noisy = (1 - sigma.view(-1, 1, 1, 1)) * x0 + sigma.view(-1, 1, 1, 1) * noise
        with torch.no_grad():
            old_velocity = old(noisy, sigma, tokens)
        nft_loss(model(noisy, sigma, tokens), old_velocity, noise - x0, r, 1.0).sum().backward()
    assert piece.rows == GROUP_SIZE * TIMESTEPS
    for a, b in zip(packed, gradients(model), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_grpo_packed_gradient_equals_the_per_timestep_gradient():
    sampler = policy(0)
    group = groups_of(scored_batch(sampler, GROUP_SIZE))[0]
    model = twin(sampler)
    results = []
    for pack in (True, False):
        loss = GrpoGroupLoss([0, 1, 2], PLAN.sigmas(), PLAN.noise_level, 1e-2, kl_beta=0.3, reference=policy(4),
                             pack_timesteps=pack)
        model.zero_grad()
        total = 0.0
        for index in range(loss.num_pieces(group)):
            piece = loss.piece(model, group, index)
            piece.loss_sum.backward()
            total += float(piece.loss_sum.detach())
        results.append((total, gradients(model)))
    (packed_loss, packed), (loop_loss, loop) = results
    assert abs(packed_loss - loop_loss) <= 1e-5 * abs(loop_loss)
    for a, b in zip(packed, loop, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def ddp_rank(rank: int, store: str, out: str) -> None:
    """One DDP rank: its share of the groups through a LogicalBatchUpdate with no_sync, packed and per
    timestep; rank 0 saves both gradients.

    The rank ends with ``os._exit`` once both ranks are past their last collective. A DDP wrapper keeps
    its gloo group alive after ``destroy_process_group`` (the group's sockets stay open; without DDP they
    close), so a normal exit left the group, its worker threads and the reducer's tensors to be torn down
    during interpreter finalization, where a gloo thread that releases a tensor takes the GIL of a dying
    interpreter: the process aborts (SIGABRT), now and then. Skipping finalization leaves nothing to race:
    the gradients are saved and both ranks have passed the barrier.
    """
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        model = policy(0)
        old = twin(model)
        groups = groups_of(scored_batch(model, GROUP_SIZE))
        # rank 0 holds three groups (the last prompt's is all ties: nothing to train) and so backward
        # passes under no_sync; each rank's last group has rows, so each reduces exactly once
        mine = [groups[3], groups[0], groups[2]] if rank == 0 else [groups[1]]

        def reduce_rows(rows: int) -> int:
            count = torch.tensor([rows])
            dist.all_reduce(count)
            return int(count)

        results = {}
        for pack in (True, False):
            ddp = DistributedDataParallel(model)
            update = LogicalBatchUpdate(ddp, nft_loss_of(old, pack), len(mine), no_sync=ddp.no_sync,
                                        reduce_rows=reduce_rows, world_size=2)
            for group in mine:
                update.add(group)
            update.finish_gradients()
            results[pack] = gradients(model)
        if rank == 0:
            torch.save(results, out)
        dist.barrier()  # neither rank leaves while the other may still be in a collective or saving
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def test_ddp_no_sync_accumulation_with_packing_equals_the_single_process_gradient(tmp_path):
    model = policy(0)
    old = twin(model)
    groups = groups_of(scored_batch(model, GROUP_SIZE))
    update = LogicalBatchUpdate(model, nft_loss_of(old, pack=False), len(groups))
    for group in groups:
        update.add(group)
    update.finish_gradients()
    reference = gradients(model)
    out = tmp_path / "grads.pt"
    # from the forkserver (gloo_ranks): the ranks start with torch and this module imported, as forked ones would,
    # without forking this multi-threaded test process; they take one thread before any op
    run_ranks(ddp_rank, (str(tmp_path / "store"), str(out)), nprocs=2, timeout_s=240)
    for pack, grads in torch.load(out).items():
        for a, b in zip(grads, reference, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7, msg=f"pack_timesteps={pack}")
