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

    values = rewards.detach().to(torch.float64)
    # Centring before the prefix sums keeps sum(x²) - (sum x)²/G from cancelling catastrophically
    # when rewards sit far from zero (e.g. 0.9 ± 1e-4).
    values = values - values.mean()
    sorted_values, order = torch.sort(values, stable=True)
    zero = sorted_values.new_zeros(1)
    prefix_sum = torch.cat([zero, sorted_values.cumsum(0)])  # (N+1,) sums of the i smallest
    prefix_sq = torch.cat([zero, (sorted_values**2).cumsum(0)])
    num_small = torch.arange(group_size + 1)  # i = how many of the smallest are kept
    num_large = group_size - num_small
    total = prefix_sum[num_small] + (prefix_sum[-1] - prefix_sum[num_candidates - num_large])
    total_sq = prefix_sq[num_small] + (prefix_sq[-1] - prefix_sq[num_candidates - num_large])
    scaled_variance = total_sq - total**2 / group_size  # G · Var for each split, (G+1,)
    best = int(torch.argmax(scaled_variance))
    chosen = torch.cat([order[:best], order[num_candidates - (group_size - best) :]])
    return torch.sort(chosen).values


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
    indices = torch.empty(num_prompts, group_size, dtype=torch.int64)
    variance = torch.zeros(num_prompts, dtype=torch.float64)
    degenerate = torch.zeros(num_prompts, dtype=torch.bool)
    for prompt in range(num_prompts):
        finite = torch.isfinite(values[prompt])
        valid = torch.nonzero(finite).flatten()
        if valid.numel() >= group_size:
            chosen = valid[select_max_variance(values[prompt, valid], group_size)]
            if float(values[prompt, chosen].var(unbiased=False)) < eps:
                pick = torch.randperm(valid.numel(), generator=generator)[:group_size]
                chosen = valid[pick]
                degenerate[prompt] = True
        else:
            invalid = torch.nonzero(~finite).flatten()
            fill = invalid[torch.randperm(invalid.numel(), generator=generator)[: group_size - valid.numel()]]
            chosen = torch.cat([valid, fill])
            degenerate[prompt] = True
        chosen = torch.sort(chosen).values
        indices[prompt] = chosen
        kept = values[prompt, chosen]
        kept = kept[torch.isfinite(kept)]
        variance[prompt] = kept.var(unbiased=False) if kept.numel() > 0 else 0.0
    return SelectionResult(
        seeds=torch.gather(seeds, 1, indices), indices=indices, variance=variance, degenerate=degenerate
    )


def _check_group_size(group_size: int, num_candidates: int) -> None:
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1 (got {group_size})")
    if group_size > num_candidates:
        raise ValueError(
            f"group_size must be <= the number of candidates (got {group_size} > {num_candidates}); "
            "explore more candidates or use a smaller group"
        )
