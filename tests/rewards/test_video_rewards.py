"""Rewards of videos (issue 45): a built-in image reward applied per frame (mean or min), the temporal term."""

from __future__ import annotations

import pytest
import torch

from spotlight.rewards.base import RewardOutput, guarded_score
from spotlight.rewards.registry import build_named
from spotlight.rewards.section import RewardSection
from spotlight.rewards.video import PerFrameReward, TemporalConsistency


class FrameBrightness:
    """An image reward: each image's mean pixel; refuses anything but (B, 3, H, W), as the built-ins do."""

    name = "brightness"
    image_size = (8, 8)

    def __init__(self) -> None:
        self.batches: list[tuple[int, ...]] = []
        self.prompts: list[list[str]] = []

    def score(self, images: torch.Tensor, prompts) -> RewardOutput:
        if images.dim() != 4:
            raise ValueError(f"images must be (B, 3, H, W) (got {tuple(images.shape)})")
        self.batches.append(tuple(images.shape))
        self.prompts.append(list(prompts))
        count = len(prompts)
        return RewardOutput(images.mean(dim=(1, 2, 3)), images.mean(dim=(1, 2, 3)) > 0.5,
                            torch.ones(count, dtype=torch.bool))


def videos() -> torch.Tensor:
    """Two videos of three 8 x 8 frames with frame brightness (0.2, 0.4, 0.9) and (0.6, 0.6, 0.6)."""
    levels = torch.tensor([[0.2, 0.4, 0.9], [0.6, 0.6, 0.6]])
    return levels[:, :, None, None, None].expand(2, 3, 3, 8, 8).clone()


@pytest.mark.parametrize(("reduce", "expected"), [("mean", [0.5, 0.6]), ("min", [0.2, 0.6])])
def test_an_image_reward_scores_every_frame_in_one_batch_and_reduces_per_video(reduce: str, expected) -> None:
    inner = FrameBrightness()
    out = guarded_score(PerFrameReward(inner, reduce), videos(), ["a", "b"])  # type: ignore[arg-type]
    assert inner.batches == [(6, 3, 8, 8)]  # all frames of all videos, one call
    assert inner.prompts == [["a", "a", "a", "b", "b", "b"]]  # each frame with its video's prompt
    torch.testing.assert_close(out.rewards, torch.tensor(expected))
    assert out.strict.tolist() == [False, True]  # strict only when every frame is
    assert PerFrameReward(inner).image_size == (8, 8)  # what else callers ask reaches the image reward


def test_images_pass_through_the_per_frame_reward_untouched() -> None:
    inner = FrameBrightness()
    images = torch.rand(2, 3, 8, 8)
    out = PerFrameReward(inner, "min").score(images, ["a", "b"])
    torch.testing.assert_close(out.rewards, images.mean(dim=(1, 2, 3)))


def test_temporal_consistency_is_one_for_a_still_video_and_lower_for_flicker() -> None:
    out = TemporalConsistency().score(videos(), ["a", "b"])
    torch.testing.assert_close(out.rewards, torch.tensor([1.0 - (0.2 + 0.5) / 2, 1.0]))
    assert TemporalConsistency().score(torch.rand(2, 3, 8, 8), ["a", "b"]).rewards.tolist() == [1.0, 1.0]


def test_the_registry_builds_temporal_and_wraps_built_in_image_rewards_per_frame() -> None:
    section = RewardSection(name="temporal", frames="min")
    assert isinstance(build_named("temporal", section), TemporalConsistency)  # it judges videos itself
    shapes = build_named("shapes", section)
    assert isinstance(shapes, PerFrameReward) and shapes.reduce == "min"


def test_videos_cross_the_reward_servers_wire_whole() -> None:
    from spotlight.rewards.server.wire import WireError, decode_request, encode_request

    clips = videos()
    decoded, prompts = decode_request(encode_request(clips, ["a", "b"]))
    assert decoded.shape == (2, 3, 3, 8, 8) and prompts == ["a", "b"]
    torch.testing.assert_close(decoded, clips, atol=1 / 255, rtol=0)
    with pytest.raises(WireError, match="does not match"):
        decode_request(encode_request(torch.rand(2, 3, 4, 8, 8), ["a", "b"]))  # channels must come third from last
