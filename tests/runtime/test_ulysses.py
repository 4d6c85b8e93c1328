"""Ulysses attention against single-device attention, in real gloo process groups.

One spawn of four processes serves every degree: the world (degree 4), two pairs (degree 2), four
singletons (degree 1) and a trio (degree 3, which 8 heads refuse). Each rank runs its checks and
saves its shards; the golden numbers are computed here, in the test process, by plain
``F.scaled_dot_product_attention`` over the whole sequence, a path that shares no code with the
sharding and the all-to-alls under test.
"""

from __future__ import annotations

import datetime
import os

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from gloo_ranks import run_ranks

from spotlight.models.ulysses import (
    UlyssesAttention,
    check_sp_degree,
    gather_sequence,
    shard_sequence,
    ulysses_attention,
    valid_sp_degrees,
)

WORLD = 4
TOLERANCE = 1e-5
# Attention case: 8 heads, 24 tokens (24 splits over 3 too, so degree 3 fails on heads alone).
BATCH, HEADS, TOKENS, HEAD_DIM = 2, 8, 24, 16
# Two-layer model case: 4 heads of width 8 over 16 tokens.
MODEL_TOKENS, MODEL_WIDTH, MODEL_HEADS = 16, 32, 4


def reference_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding_mask: torch.Tensor | None
) -> torch.Tensor:
    """Single-device attention over the whole sequence: the golden path."""
    mask = None if key_padding_mask is None else key_padding_mask[:, None, None, :]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class AttentionLayer(nn.Module):
    """Pre-norm self-attention plus a per-token linear, written like a DiT block (token dim = 1)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.mlp = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, attention_fn) -> torch.Tensor:
        batch, tokens, width = x.shape
        qkv = self.qkv(self.norm(x)).view(batch, tokens, 3, self.heads, width // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        attended = attention_fn(q, k, v, mask).transpose(1, 2).reshape(batch, tokens, width)
        x = x + self.proj(attended)
        return x + torch.tanh(self.mlp(x))


class TwoLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([AttentionLayer(MODEL_WIDTH, MODEL_HEADS) for _ in range(2)])

    def forward(self, x: torch.Tensor, mask: torch.Tensor, attention_fn) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, mask, attention_fn)
        return x


def make_case() -> dict:
    """Seeded inputs shared by every rank and the reference; padding masks a few keys per sample."""
    generator = torch.Generator().manual_seed(1234)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator)

    mask = torch.ones(BATCH, TOKENS, dtype=torch.bool)
    mask[0, -5:] = False  # trailing padding, all in the last shard
    mask[1, [3, 10, 17]] = False  # holes spread over several shards
    model_mask = torch.ones(BATCH, MODEL_TOKENS, dtype=torch.bool)
    model_mask[0, -3:] = False
    model_mask[1, [1, 6, 9]] = False
    torch.manual_seed(99)
    model = TwoLayers()
    return {
        "q": randn(BATCH, HEADS, TOKENS, HEAD_DIM),
        "k": randn(BATCH, HEADS, TOKENS, HEAD_DIM),
        "v": randn(BATCH, HEADS, TOKENS, HEAD_DIM),
        "mask": mask,
        "out_grad": randn(BATCH, HEADS, TOKENS, HEAD_DIM),
        "x": randn(BATCH, MODEL_TOKENS, MODEL_WIDTH),
        "model_mask": model_mask,
        "model_out_grad": randn(BATCH, MODEL_TOKENS, MODEL_WIDTH),
        "model_state": model.state_dict(),
    }


def _local_leaf(x: torch.Tensor, rank: int, world: int, dim: int) -> torch.Tensor:
    return shard_sequence(x, rank, world, dim=dim).clone().requires_grad_(True)


def _run_checks(case: dict, group: dist.ProcessGroup) -> dict:
    """Everything one rank does for one SP group; returns its shards for the test process to judge."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    attention = UlyssesAttention(group)

    # Attention alone: forward and the gradients of this rank's q, k, v shards.
    q, k, v = (_local_leaf(case[name], rank, world, dim=2) for name in ("q", "k", "v"))
    out = attention(q, k, v, case["mask"])
    out.backward(shard_sequence(case["out_grad"], rank, world, dim=2))

    # gather_sequence alone: its backward must hand back this rank's slice, not a sum over ranks.
    x_gather = _local_leaf(case["x"], rank, world, dim=1)
    gathered = gather_sequence(x_gather, group)
    (gathered * case["model_out_grad"]).sum().backward()

    # Two attention layers, sequence-parallel end to end; parameter gradients summed over the group.
    model = TwoLayers()
    model.load_state_dict(case["model_state"])
    x = _local_leaf(case["x"], rank, world, dim=1)
    model_out = gather_sequence(model(x, case["model_mask"], attention), group)
    (model_out * case["model_out_grad"]).sum().backward()
    param_grads = {}
    for name, param in model.named_parameters():
        dist.all_reduce(param.grad, group=group)
        param_grads[name] = param.grad
    return {
        "group_rank": rank,
        "out": out.detach(),
        "q_grad": q.grad,
        "k_grad": k.grad,
        "v_grad": v.grad,
        "gathered": gathered.detach(),
        "gather_input_grad": x_gather.grad,
        "model_out": model_out.detach(),
        "model_x_grad": x.grad,
        "model_param_grads": param_grads,
    }


def _spawned_rank(rank: int, store_path: str, case_path: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    store = dist.FileStore(store_path, WORLD)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=60)
    )
    case = torch.load(case_path)
    # new_group is collective over the world: every rank creates every group, in the same order.
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    singletons = [dist.new_group([r]) for r in range(WORLD)]
    trio = dist.new_group([0, 1, 2])
    results: dict = {
        4: _run_checks(case, dist.group.WORLD),
        2: _run_checks(case, pairs[rank // 2]),
        1: _run_checks(case, singletons[rank]),
    }
    if rank < 3:
        q = shard_sequence(case["q"], rank, 3, dim=2)
        try:
            ulysses_attention(q, q, q, case["mask"], trio)
            results["degree_3_error"] = None
        except ValueError as error:
            results["degree_3_error"] = str(error)
    dist.barrier()
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def case() -> dict:
    return make_case()


@pytest.fixture(scope="module")
def rank_results(case: dict, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Spawn the four gloo ranks once for the module; returns each rank's saved results."""
    folder = tmp_path_factory.mktemp("ulysses")
    case_path = folder / "case.pt"
    torch.save(case, case_path)
    run_ranks(_spawned_rank, (str(folder / "store"), str(case_path), str(folder)), WORLD, timeout_s=120)
    return [torch.load(folder / f"rank{rank}.pt") for rank in range(WORLD)]


def _groups(rank_results: list[dict], degree: int) -> list[list[dict]]:
    """Each SP group's results in group-rank order (groups are consecutive blocks of global ranks)."""
    starts = range(0, WORLD, degree)
    blocks = [[rank_results[r][degree] for r in range(start, start + degree)] for start in starts]
    for block in blocks:
        assert [member["group_rank"] for member in block] == list(range(degree))
    return blocks


def _gathered(block: list[dict], key: str, dim: int) -> torch.Tensor:
    return torch.cat([member[key] for member in block], dim=dim)


def _max_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    assert actual.shape == expected.shape
    return (actual - expected).abs().max().item()


@pytest.fixture(scope="module")
def reference(case: dict) -> dict:
    """Single-device forward and gradients of the attention case and of the two-layer model."""
    q, k, v = (case[name].clone().requires_grad_(True) for name in ("q", "k", "v"))
    out = reference_attention(q, k, v, case["mask"])
    out.backward(case["out_grad"])
    model = TwoLayers()
    model.load_state_dict(case["model_state"])
    x = case["x"].clone().requires_grad_(True)
    model_out = model(x, case["model_mask"], reference_attention)
    (model_out * case["model_out_grad"]).sum().backward()
    return {
        "out": out.detach(),
        "q_grad": q.grad,
        "k_grad": k.grad,
        "v_grad": v.grad,
        "model_out": model_out.detach(),
        "model_x_grad": x.grad,
        "model_param_grads": {name: p.grad for name, p in model.named_parameters()},
    }


def test_padding_mask_changes_the_reference(case: dict, reference: dict) -> None:
    # Guards the tests below: if the mask were dropped somewhere, they must notice.
    unmasked = reference_attention(case["q"], case["k"], case["v"], None)
    assert _max_error(unmasked, reference["out"]) > 1e-2


@pytest.mark.parametrize("degree", [1, 2, 4])
def test_forward_matches_single_device_attention(
    rank_results: list[dict], reference: dict, degree: int
) -> None:
    for block in _groups(rank_results, degree):
        assert _max_error(_gathered(block, "out", dim=2), reference["out"]) <= TOLERANCE


@pytest.mark.parametrize("degree", [1, 2, 4])
@pytest.mark.parametrize("name", ["q_grad", "k_grad", "v_grad"])
def test_qkv_gradients_match_single_device_attention(
    rank_results: list[dict], reference: dict, degree: int, name: str
) -> None:
    for block in _groups(rank_results, degree):
        assert _max_error(_gathered(block, name, dim=2), reference[name]) <= TOLERANCE


@pytest.mark.parametrize("degree", [2, 4])
def test_gather_sequence_returns_full_sequence_and_own_gradient_slice(
    rank_results: list[dict], case: dict, degree: int
) -> None:
    for block in _groups(rank_results, degree):
        for member in block:
            assert torch.equal(member["gathered"], case["x"])
        # Every rank computed the same loss on the gathered tensor: its input grad is its own slice.
        assert torch.equal(_gathered(block, "gather_input_grad", dim=1), case["model_out_grad"])


@pytest.mark.parametrize("degree", [1, 2, 4])
def test_two_layer_model_matches_single_device_output_and_gradients(
    rank_results: list[dict], reference: dict, degree: int
) -> None:
    for block in _groups(rank_results, degree):
        for member in block:
            assert _max_error(member["model_out"], reference["model_out"]) <= TOLERANCE
            for name, expected in reference["model_param_grads"].items():
                assert _max_error(member["model_param_grads"][name], expected) <= TOLERANCE, name
        assert _max_error(_gathered(block, "model_x_grad", dim=1), reference["model_x_grad"]) <= TOLERANCE


def test_degree_that_does_not_divide_heads_is_refused_on_every_rank(rank_results: list[dict]) -> None:
    expected = "sp_degree 3 does not divide num_heads 8: choose an SP degree among 1, 2, 4, 8"
    assert [rank_results[r]["degree_3_error"] for r in range(3)] == [expected] * 3


def test_no_group_is_plain_attention(case: dict, reference: dict) -> None:
    q, k, v = (case[name].clone().requires_grad_(True) for name in ("q", "k", "v"))
    attention = UlyssesAttention(None)
    out = attention(q, k, v, case["mask"])
    out.backward(case["out_grad"])
    assert attention.sp_degree == 1
    assert torch.equal(out, reference["out"])
    assert torch.equal(q.grad, reference["q_grad"])


def test_shard_sequence_splits_contiguously_in_rank_order(case: dict) -> None:
    x = case["x"]
    shards = [shard_sequence(x, rank, 4) for rank in range(4)]
    assert [tuple(s.shape) for s in shards] == [(BATCH, MODEL_TOKENS // 4, MODEL_WIDTH)] * 4
    assert torch.equal(shards[1], x[:, 4:8])
    assert torch.equal(torch.cat(shards, dim=1), x)


def test_shard_sequence_refuses_an_uneven_split(case: dict) -> None:
    expected = r"sp_degree 3 does not divide the sequence length 16: .* 1, 2, 4, 8, 16"
    with pytest.raises(ValueError, match=expected):
        shard_sequence(case["x"], 0, 3)


def test_mask_that_does_not_cover_the_full_sequence_is_refused(case: dict) -> None:
    q = case["q"][:, :, :12]
    with pytest.raises(ValueError, match="pass the full"):
        ulysses_attention(q, q, q, case["mask"], None)


def test_check_sp_degree_lists_the_allowed_degrees() -> None:
    check_sp_degree(4, num_heads=8, num_tokens=24)
    expected = r"sp_degree 5 does not divide num_heads 12: choose an SP degree among 1, 2, 3, 4, 6, 12$"
    with pytest.raises(ValueError, match=expected):
        check_sp_degree(5, num_heads=12)
    with pytest.raises(ValueError, match="≥ 1"):
        check_sp_degree(0, num_heads=8)
    assert valid_sp_degrees(8, num_tokens=12) == [1, 2, 4]
    assert valid_sp_degrees(6) == [1, 2, 3, 6]
