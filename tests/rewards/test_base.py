from collections.abc import Sequence

import pytest
import torch

from spotlight.rewards.base import RewardError, RewardOutput, guarded_score


class MeanBrightness:
    """A real, tiny reward: the mean pixel value; strict when it is above one half.

    It raises on the prompt "explode" and returns NaN for the prompt "nan", the way a detector or a
    remote model fails on one odd input."""

    name = "mean_brightness"

    def __init__(self) -> None:
        self.calls = 0

    def score(self, images: torch.Tensor, prompts: Sequence[str]) -> RewardOutput:
        self.calls += 1
        if "explode" in prompts:
            raise ValueError("cannot read the prompt 'explode'\nsecond line of detail")
        rewards = images.mean(dim=(1, 2, 3))
        rewards = torch.where(
            torch.tensor([p == "nan" for p in prompts]), torch.full_like(rewards, float("nan")), rewards
        )
        return RewardOutput(rewards, rewards > 0.5, torch.ones(len(prompts), dtype=torch.bool))


class AlwaysRaises:
    name = "broken"

    def score(self, images: torch.Tensor, prompts: Sequence[str]) -> RewardOutput:
        raise RuntimeError("model weights not found")


class OneRewardTooMany:
    name = "miscounting"

    def score(self, images: torch.Tensor, prompts: Sequence[str]) -> RewardOutput:
        n = len(prompts) + 1
        return RewardOutput(torch.zeros(n), torch.zeros(n, dtype=torch.bool), torch.ones(n, dtype=torch.bool))


class SelfInvalidating:
    """Marks its second sample invalid itself, with a reward that must not leak through."""

    name = "self_invalidating"

    def score(self, images: torch.Tensor, prompts: Sequence[str]) -> RewardOutput:
        valid = torch.tensor([i != 1 for i in range(len(prompts))])
        return RewardOutput(
            torch.full((len(prompts),), 0.7), torch.ones(len(prompts), dtype=torch.bool), valid
        )


def images_with_means(*means: float) -> torch.Tensor:
    return torch.stack([torch.full((3, 4, 4), m) for m in means])


def test_a_healthy_batch_passes_through_in_one_call():
    reward = MeanBrightness()
    out = guarded_score(reward, images_with_means(0.25, 0.75), ["a", "b"])
    assert reward.calls == 1
    assert out.rewards.tolist() == [0.25, 0.75]
    assert out.strict.tolist() == [False, True]
    assert out.valid.tolist() == [True, True]
    assert out.errors == []


def test_a_raising_sample_marks_only_itself():
    reward = MeanBrightness()
    out = guarded_score(reward, images_with_means(0.25, 0.9, 0.75), ["a", "explode", "c"])
    assert reward.calls == 1 + 3  # the batch, then each sample alone
    assert out.rewards.tolist() == [0.25, 0.0, 0.75]
    assert out.valid.tolist() == [True, False, True]
    assert out.strict.tolist() == [False, False, True]
    assert out.errors == ["sample 1 ('explode'): ValueError: cannot read the prompt 'explode'"]


def test_a_nan_reward_marks_only_its_sample():
    out = guarded_score(MeanBrightness(), images_with_means(0.25, 0.9), ["nan", "b"])
    assert out.valid.tolist() == [False, True]
    assert out.rewards.tolist() == [0.0, pytest.approx(0.9)]
    assert out.strict.tolist() == [False, True]
    assert len(out.errors) == 1 and out.errors[0].startswith("sample 0 ('nan'): reward is nan")


def test_samples_the_reward_marks_invalid_get_zero_reward_and_no_strict():
    out = guarded_score(SelfInvalidating(), images_with_means(0.1, 0.2, 0.3), ["a", "b", "c"])
    assert out.valid.tolist() == [True, False, True]
    assert out.rewards.tolist() == [pytest.approx(0.7), 0.0, pytest.approx(0.7)]
    assert out.strict.tolist() == [True, False, True]


def test_every_sample_failing_raises_one_line_naming_reward_exception_and_fix():
    with pytest.raises(RewardError) as error:
        guarded_score(AlwaysRaises(), images_with_means(0.1, 0.2), ["a", "b"])
    message = str(error.value)
    assert "'broken'" in message and "RuntimeError: model weights not found" in message
    assert "fix" in message and "\n" not in message


def test_every_reward_nan_raises():
    with pytest.raises(RewardError, match="mean_brightness.*non-finite"):
        guarded_score(MeanBrightness(), images_with_means(0.1, 0.2), ["nan", "nan"])


def test_a_reward_of_the_wrong_length_counts_as_a_failure():
    with pytest.raises(RewardError, match="miscounting.*one reward per image"):
        guarded_score(OneRewardTooMany(), images_with_means(0.1, 0.2), ["a", "b"])


def test_an_empty_batch_scores_to_empty_tensors():
    out = guarded_score(MeanBrightness(), torch.zeros(0, 3, 4, 4), [])
    assert out.rewards.shape == out.strict.shape == out.valid.shape == (0,)


def test_images_and_prompts_of_different_lengths_are_refused():
    with pytest.raises(ValueError, match="2 images but 1 prompts"):
        guarded_score(MeanBrightness(), images_with_means(0.1, 0.2), ["a"])


def test_reward_output_refuses_mismatched_shapes_and_dtypes():
    with pytest.raises(ValueError, match="shape"):
        RewardOutput(torch.zeros(2), torch.zeros(3, dtype=torch.bool), torch.ones(2, dtype=torch.bool))
    with pytest.raises(ValueError, match="bool"):
        RewardOutput(torch.zeros(2), torch.zeros(2), torch.ones(2, dtype=torch.bool))
