"""K = 2 trainer ranks on gloo take the update one process takes on the union batch.

Two processes join a gloo group; each holds the whole rollout, computes its share of every minibatch's
rows (`spotlight.rl.micro_batch`) and the gradients are summed (`spotlight.ranks.data_parallel`): DDP
over a TinyDiT's weights and over a tiny SD3 pipeline folder's LoRA, FSDP2 over a TinyDiT's weights and
a pipeline transformer fine-tuned in full. The reference is the same update in one process, without
ranks: the weights after the step must match within float tolerance, and must have moved.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from gloo_ranks import run_ranks
from random_models import TINY_SHAPES_CONFIG, randomised_tinydit

from spotlight.config import TrainSection
from spotlight.models.pipelines.family_config import DiffusersPolicyConfig
from spotlight.models.rebuild import policy_from_config
from spotlight.models.shadow import frozen_base, frozen_copy
from spotlight.ranks.data_parallel import RankShare, data_parallel, full_state, sharded
from spotlight.rl.grpo import RolloutBatch, grpo_update
from spotlight.rl.micro_batch import micro_batches, rank_rows
from spotlight.rl.nft import nft_update
from spotlight.tasks.shapes import tokenize

PROMPTS = ["a red circle", "two blue squares", "a green circle above a yellow triangle", "a yellow square",
           "a red square", "three green circles"]
ADVANTAGES = torch.tensor([1.0, -0.5, 2.0, -1.5, 0.7, -1.7])
# (name, model, algorithm, sharding, micro_batch_size)
CASES = [
    ("tinydit-nft-ddp", "tinydit", "nft", "ddp", None),
    ("tinydit-grpo-ddp-micro", "tinydit", "flow-grpo", "ddp", 2),
    ("sd3-lora-nft-ddp", "sd3-lora", "nft", "ddp", None),
    ("tinydit-nft-fsdp-micro", "tinydit", "nft", "fsdp", 2),
    ("sd3-full-nft-fsdp", "sd3-full", "nft", "fsdp", None),
]


def build(kind: str, folder: Path):
    """The policy, and a rollout batch of six samples for it (random latents: NFT and Flow-GRPO read them as given)."""
    if kind == "tinydit":
        model = randomised_tinydit(TINY_SHAPES_CONFIG, seed=3, std=0.05)
        tokens = tokenize(PROMPTS, TINY_SHAPES_CONFIG.max_text_len)
        shape = (3, 8, 8)
    else:
        config = DiffusersPolicyConfig(family="sd3", pretrained=str(folder), pipeline=True, resolution=(16, 16),
                                       dtype="float32", max_sequence_length=32, lora_rank=2,
                                       finetune="full" if kind == "sd3-full" else "lora")
        model = policy_from_config(config).eval()
        with torch.no_grad():  # LoRA B starts at 0: move it so that A carries gradient too
            for parameter in model.trainable_parameters():
                parameter.add_(0.01 * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(5)))
        tokens = model.tokenize(PROMPTS, guided=False)
        shape = model.latent_shape
    generator = torch.Generator().manual_seed(11)
    steps = 3
    batch = RolloutBatch(latents=torch.randn(len(PROMPTS), steps, *shape, generator=generator),
                         log_probs=-torch.rand(len(PROMPTS), steps - 1, generator=generator) - 1.0,
                         tokens=tokens, advantages=ADVANTAGES, sigmas=torch.linspace(1.0, 0.0, steps),
                         noise_level=0.7, stochastic_steps=steps - 1)
    return model, batch


def update(kind: str, algorithm: str, sharding: str, micro_batch_size: int | None, folder: Path,
           rank: int, world_size: int) -> dict[str, torch.Tensor]:
    """The weights after one update step of a fresh policy, on this rank (world_size 1: no process group)."""
    model, batch = build(kind, folder)
    old, reference = frozen_copy(model), frozen_base(model)
    section = TrainSection(algorithm=algorithm, num_minibatches=1, num_epochs=1, nft_timesteps=2, nft_kl_beta=0.3,
                           kl_beta=0.0, clip_range=0.2, micro_batch_size=micro_batch_size)
    trained = model
    config = section
    if world_size > 1:
        config = RankShare(section, rank, world_size)
        trained = data_parallel(model, world_size) if sharding == "ddp" else sharded(model)
    optimizer = torch.optim.SGD([p for p in trained.parameters() if p.requires_grad], lr=0.5)
    generator = torch.Generator().manual_seed(7)
    if algorithm == "nft":
        nft_update(trained, old, optimizer, batch, config, generator, reference)
    else:
        grpo_update(trained, None, optimizer, batch, config, generator)
    state = full_state(model) if sharding == "fsdp" and world_size > 1 else model.state_dict()
    names = {name for name, parameter in build(kind, folder)[0].named_parameters() if parameter.requires_grad}
    return {name: value.detach().clone() for name, value in state.items() if name in names}


def rank_main(rank: int, world_size: int, port: int, folder: Path, out: Path) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        results = {name: update(kind, algorithm, sharding, size, folder, rank, world_size)
                   for name, kind, algorithm, sharding, size in CASES}
    finally:
        dist.destroy_process_group()
    torch.save(results, out / f"rank-{rank}.pt")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def two_rank_updates(tiny_pipeline, tmp_path_factory) -> tuple[dict, dict, Path]:
    folder = tiny_pipeline("sd3")
    out = tmp_path_factory.mktemp("ranks")
    run_ranks(rank_main, (2, free_port(), folder, out), nprocs=2, timeout_s=240,
              preload=("peft", "diffusers.models.transformers"))
    return torch.load(out / "rank-0.pt"), torch.load(out / "rank-1.pt"), folder


@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
def test_two_ranks_take_the_update_one_process_takes_on_the_union_batch(two_rank_updates, case) -> None:
    name, kind, algorithm, sharding, size = case
    rank0, rank1, folder = two_rank_updates
    torch.set_num_threads(1)
    alone = update(kind, algorithm, sharding, size, folder, 0, 1)
    start = {name: value for name, value in build(kind, folder)[0].state_dict().items() if name in alone}
    assert alone.keys() == rank0[name].keys() == rank1[name].keys() and alone
    moved = max(float((alone[key] - start[key]).abs().max()) for key in alone)
    assert moved > 1e-3  # the update did something
    for key in alone:
        torch.testing.assert_close(rank0[name][key], alone[key], rtol=1e-5, atol=1e-6, msg=f"{name} {key}")
        torch.testing.assert_close(rank1[name][key], rank0[name][key], rtol=0, atol=0, msg=f"{name} {key}")


def test_each_rank_takes_a_contiguous_share_in_equal_numbers_of_micro_batches() -> None:
    assert [rank_rows(5, rank, 2) for rank in range(2)] == [slice(0, 3), slice(3, 5)]
    shares = [micro_batches(10, RankShare(TrainSection(micro_batch_size=2), rank, 3)) for rank in range(3)]
    assert [len(share) for share in shares] == [2, 2, 2]  # 4, 3, 3 rows: two slices each
    assert [row for share in shares for part in share for row in range(part.start, part.stop)] == list(range(10))
    with pytest.raises(ValueError, match="lower train.num_minibatches or trainer.devices"):
        micro_batches(3, RankShare(TrainSection(micro_batch_size=1), 1, 2))
