"""`reward:` section -> Reward: names, user functions, composites, and the one-line errors of bad inputs."""

import pytest
import torch
from pydantic import ValidationError

from spotlight.config import TrainConfig
from spotlight.rewards.base import RewardContractError, RewardError, guarded_score
from spotlight.rewards.composite import CompositeReward
from spotlight.rewards.ocr.scenes import render_scene
from spotlight.rewards.registry import build_reward
from spotlight.rewards.section import RewardSection
from spotlight.task_presets import get_task


def test_a_null_name_gives_the_tasks_own_reward_with_its_strict_weight():
    reward = build_reward(RewardSection(strict_weight=0.2), get_task("shapes").make_reward)
    assert reward.name == get_task("shapes").make_reward(0.2).name and reward.strict_weight == 0.2


@pytest.mark.parametrize("bad, message", [
    ({"name": "pikscore"}, "is not a reward: use one of"),
    ({"name": "http"}, "needs reward.url"),
    ({"name": "ocr", "weights": {"ocr": 1.0}}, "not both"),
    ({"weights": {}}, "is empty"),
    ({"weights": {"ocr": 1.0, "nope": 2.0}}, "'nope' is not a reward"),
    ({"models": {"detector_class": "NotAPath"}}, "must be 'pkg.module:Class'"),
])
def test_bad_reward_sections_are_refused_at_load_naming_the_field(bad, message):
    with pytest.raises(ValidationError, match=message):
        TrainConfig(reward=bad)


def test_a_user_function_gets_images_prompts_and_metadata():
    reward = build_reward(RewardSection(name="reward_functions:brightness"))
    images = torch.stack([torch.full((3, 8, 8), 0.25), torch.full((3, 8, 8), 0.75)])
    out = guarded_score(reward, images, ["a", "b"], [{}, {"bonus": 1}])
    torch.testing.assert_close(out.rewards, torch.tensor([0.25, 1.75]))
    out = guarded_score(reward, images, ["a", "b"])  # no metadata: empty records
    torch.testing.assert_close(out.rewards, torch.tensor([0.25, 0.75]))


def test_a_function_returning_the_wrong_number_of_scores_fails_in_one_line():
    reward = build_reward(RewardSection(name="reward_functions:one_short"))
    with pytest.raises(RewardContractError, match="returned 2 scores for 3 images; it must return one number"):
        guarded_score(reward, torch.rand(3, 3, 8, 8), ["a", "b", "c"])


@pytest.mark.parametrize("name, message", [("no_such_module:f", "cannot import 'no_such_module'"),
                                           ("reward_functions:missing", "has no 'missing'"),
                                           ("reward_functions:NOT_A_FUNCTION", "is a int, not a function")])
def test_a_function_that_cannot_be_loaded_fails_at_build(name, message):
    with pytest.raises(RewardError, match=message):
        build_reward(RewardSection(name=name))


def test_a_composite_sums_weighted_terms_and_keeps_each(tiny_clip):
    section = RewardSection(weights={"ocr": 1.0, "clipscore": 0.5}, models={"clip": str(tiny_clip)})
    reward = build_reward(section)
    assert isinstance(reward, CompositeReward)
    scenes = [render_scene(0), render_scene(1, correct=False)]
    out = guarded_score(reward, torch.stack([s.image for s in scenes]), [s.prompt for s in scenes])
    assert set(out.terms) == {"ocr", "clipscore"}
    torch.testing.assert_close(out.rewards, out.terms["ocr"] + 0.5 * out.terms["clipscore"])
    assert out.terms["ocr"].tolist()[0] == 1.0 and out.terms["ocr"].tolist()[1] < 0.5
    assert out.strict.tolist() == [True, False]  # clipscore has no strict flag: OCR's decides


def test_a_term_failing_on_one_sample_marks_that_sample_and_names_the_term():
    section = RewardSection(weights={"reward_functions:brightness": 1.0, "ocr": 1.0})
    reward = build_reward(section)
    scene = render_scene(0)
    out = guarded_score(reward, torch.stack([scene.image, scene.image]), [scene.prompt, "no quotes"])
    assert out.valid.tolist() == [True, False]
    assert out.errors and out.errors[0].startswith("sample 1") and out.errors[0].endswith("[ocr]")
    assert out.terms["ocr"][1] == 0 and out.rewards[1] == 0
