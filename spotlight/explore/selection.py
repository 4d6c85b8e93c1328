"""Variance-maximising seed selection: keep the G candidate seeds whose rewards differ most.

GRPO learns from reward differences inside a group, so among N scored candidate seeds per prompt
we keep the G whose rewards have the largest population variance. Pure functions of tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["SelectionResult", "select_max_variance", "select_seeds"]


def select_max_variance(rewards: Tensor, group_size: int) -> Tensor:
    """Indices of the `group_size` rewards with the largest population variance.

    Returns an int64 tensor of shape (G,), in ascending index order. `rewards` is (N,) and finite.

    Exact in O(N log N + G), by a known structure of the optimum: some max-variance G-subset of
    reals is made of the i smallest and the G-i largest values for some i in 0..G, so scanning
    those G+1 splits of the sorted rewards finds it.

    Proof sketch. Write G·Var(S) = sum(x²) - (sum x)²/G. Replacing one member x of S by x' changes
    this by a quadratic in x' whose leading coefficient is 1 - 1/G >= 0, i.e. a convex function
    of x'; on an interval it is maximised at an endpoint. Let U be the N-G unchosen points (in
    sorted order, ties broken by position) and suppose a chosen x lies strictly between min(U)
    and max(U). Swapping x for min(U) or for max(U) - whichever is better - does not decrease the
    variance, and it strictly shrinks the rank span max(U) - min(U) of the unchosen set. The span
    is a non-negative integer, so after finitely many swaps an optimal S remains whose unchosen
    points are contiguous in sorted order: S = i smallest ∪ G-i largest.

    Among equally good splits the first (fewest smallest) wins, so the result is deterministic.
    """
    if rewards.ndim != 1:
        raise ValueError(f"rewards must be 1-D (N,) (got shape {tuple(rewards.shape)})")
    num_candidates = rewards.shape[0]
    _check_group_size(group_size, num_candidates)
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError("rewards must be finite; drop NaN/inf candidates first (select_seeds does this)")

    return _max_variance_rows(rewards.detach().to(torch.float64).unsqueeze(0), group_size)[0]


@dataclass(frozen=True)
class SelectionResult:
    """Seeds kept for each prompt's GRPO group.

    seeds: (P, G) int64 seed values; indices: (P, G) int64 positions among the N candidates;
    variance: (P,) float64 population variance of the kept finite rewards (0.0 if none is finite);
    degenerate: (P,) bool, True where the choice was random rather than variance-maximising
    (all candidates scored the same, or fewer than G had a finite reward).
    """

    seeds: Tensor
    indices: Tensor
    variance: Tensor
    degenerate: Tensor


def select_seeds(
    rewards: Tensor,
    seeds: Tensor | Sequence[Sequence[int]],
    group_size: int,
    generator: torch.Generator,
    eps: float = 1e-12,
) -> SelectionResult:
    """Per prompt, keep the G candidate seeds whose rewards have the largest variance.

    rewards: (P, N), NaN/inf where a reward sample failed; seeds: (P, N) seed of each candidate.
    Returns a SelectionResult with (P, G) seeds and indices, (P,) variance and degenerate flags.

    Guards, both flagged `degenerate` so metrics can count them:
    - non-finite rewards are excluded (a failed sample must never look like an outlier worth
      keeping); if fewer than G candidates are finite, all finite ones are kept and the rest of
      the group is filled with randomly chosen non-finite ones;
    - if the best variance is below `eps` (all candidates scored the same) the G seeds are drawn
      at random among the finite ones, since "max variance" would just pick by position.
    Randomness comes only from `generator`, and only for degenerate prompts, so the same inputs
    and generator state give the same seeds.
    """
    if rewards.ndim != 2:
        raise ValueError(
            f"rewards must be 2-D (num_prompts, num_candidates) (got shape {tuple(rewards.shape)})"
        )
    seeds = torch.as_tensor(seeds, dtype=torch.int64)
    if seeds.shape != rewards.shape:
        raise ValueError(
            f"seeds must have the shape of rewards {tuple(rewards.shape)} (got {tuple(seeds.shape)})"
        )
    num_prompts, num_candidates = rewards.shape
    _check_group_size(group_size, num_candidates)
    if eps < 0:
        raise ValueError(f"eps must be >= 0 (got {eps})")

    values = rewards.detach().to(torch.float64)
    finite = torch.isfinite(values)
    indices = torch.empty(num_prompts, group_size, dtype=torch.int64)
    degenerate = torch.zeros(num_prompts, dtype=torch.bool)
    complete = finite.all(dim=1)  # the common case, scanned for all prompts at once
    if bool(complete.any()):
        indices[complete] = _max_variance_rows(values[complete], group_size)
    for prompt in torch.nonzero(~complete).flatten().tolist():
        valid = torch.nonzero(finite[prompt]).flatten()
        if valid.numel() >= group_size:
            indices[prompt] = torch.sort(
                valid[_max_variance_rows(values[prompt, valid][None], group_size)[0]]
            ).values
        else:
            invalid = torch.nonzero(~finite[prompt]).flatten()
            fill = invalid[torch.randperm(invalid.numel(), generator=generator)[: group_size - valid.numel()]]
            indices[prompt] = torch.sort(torch.cat([valid, fill])).values
            degenerate[prompt] = True
    variance = _finite_variance(torch.gather(values, 1, indices))
    for prompt in torch.nonzero(~degenerate & (variance < eps)).flatten().tolist():
        valid = torch.nonzero(finite[prompt]).flatten()
        pick = torch.randperm(valid.numel(), generator=generator)[:group_size]
        indices[prompt] = torch.sort(valid[pick]).values
        degenerate[prompt] = True
    variance = _finite_variance(torch.gather(values, 1, indices))
    return SelectionResult(
        seeds=torch.gather(seeds, 1, indices), indices=indices, variance=variance, degenerate=degenerate
    )


def _max_variance_rows(values: Tensor, group_size: int) -> Tensor:
    """Row-wise split scan of select_max_variance: values (P, N) finite float64 -> (P, G) sorted indices."""
    num_candidates = values.shape[1]
    # Centring before the prefix sums keeps sum(x²) - (sum x)²/G from cancelling catastrophically
    # when rewards sit far from zero (e.g. 0.9 ± 1e-4).
    values = values - values.mean(dim=1, keepdim=True)
    sorted_values, order = torch.sort(values, dim=1, stable=True)
    zero = sorted_values.new_zeros(values.shape[0], 1)
    prefix_sum = torch.cat([zero, sorted_values.cumsum(1)], dim=1)  # (P, N+1): sums of the i smallest
    prefix_sq = torch.cat([zero, (sorted_values**2).cumsum(1)], dim=1)
    num_small = torch.arange(group_size + 1)  # i = how many of the smallest are kept
    num_large = group_size - num_small
    top = num_candidates - num_large
    total = prefix_sum[:, num_small] + (prefix_sum[:, -1:] - prefix_sum[:, top])
    total_sq = prefix_sq[:, num_small] + (prefix_sq[:, -1:] - prefix_sq[:, top])
    scaled_variance = total_sq - total**2 / group_size  # (P, G+1): G · Var of each split
    best = torch.argmax(scaled_variance, dim=1, keepdim=True)  # first maximum: deterministic
    # Sorted position k is kept when k < i (among the i smallest) or k >= N - (G - i).
    positions = torch.arange(num_candidates).unsqueeze(0)
    keep = (positions < best) | (positions >= num_candidates - group_size + best)
    chosen = order.masked_select(keep).view(values.shape[0], group_size)
    return torch.sort(chosen, dim=1).values


def _finite_variance(values: Tensor) -> Tensor:
    """Population variance of each row's finite entries, (P, G) -> (P,); 0.0 for rows with none."""
    finite = torch.isfinite(values)
    count = finite.sum(dim=1).clamp(min=1)
    filled = torch.where(finite, values, 0.0)
    mean = filled.sum(dim=1, keepdim=True) / count[:, None]
    return torch.where(finite, (filled - mean) ** 2, 0.0).sum(dim=1) / count


def _check_group_size(group_size: int, num_candidates: int) -> None:
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1 (got {group_size})")
    if group_size > num_candidates:
        raise ValueError(
            f"group_size must be <= the number of candidates (got {group_size} > {num_candidates}); "
            "explore more candidates or use a smaller group"
        )
