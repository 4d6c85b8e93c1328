import math

import pytest
import torch

from spotlight.explore.fidelity import preview_fidelity


def test_a_preview_that_ranks_the_seeds_as_the_rollout_does_scores_one_and_a_reversed_one_minus_one() -> None:
    rollout = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.2, 0.4, 0.6, 0.8]])
    assert preview_fidelity(rollout * 0.5 + 0.1, rollout) == pytest.approx(1.0)
    assert preview_fidelity(-rollout, rollout) == pytest.approx(-1.0)


def test_a_flat_preview_counts_zero_and_a_flat_rollout_is_skipped() -> None:
    preview = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 1.0], [0.1, 0.9, 0.2, 0.8]])
    rollout = torch.tensor([[0.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 1.0]])
    # row 0: the preview told nothing (0); row 1: nothing to rank (skipped); row 2: r = 0.99
    assert preview_fidelity(preview, rollout) == pytest.approx((0.0 + 0.9899) / 2, abs=1e-3)
    assert math.isnan(preview_fidelity(preview[1:2], rollout[1:2]))


def test_failed_scores_are_left_out_and_shapes_must_match() -> None:
    preview = torch.tensor([[0.0, 1.0, math.nan, 0.5]])
    rollout = torch.tensor([[0.0, 1.0, 1.0, math.nan]])
    assert preview_fidelity(preview, rollout) == pytest.approx(1.0)  # the two finite pairs agree
    with pytest.raises(ValueError, match="same seeds"):
        preview_fidelity(preview, rollout[:, :3])
