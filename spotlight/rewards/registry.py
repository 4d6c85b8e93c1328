"""From the `reward:` section to a `Reward`: the one function the loop and `serve-reward` call.

Built-in rewards are imported only when named, so a run of the shapes task never imports
onnxruntime or a CLIP model.
"""

from __future__ import annotations

from collections.abc import Callable

from spotlight.rewards.base import Reward, RewardError
from spotlight.rewards.section import BUILTIN_REWARDS, RewardSection

TaskReward = Callable[[float], Reward]  # a task's `make_reward(strict_weight)`


def build_reward(section: RewardSection, task_default: TaskReward | None = None) -> Reward:
    """The reward `section` names: `reward.weights` -> a composite; `reward.name` null -> the task's own.

    Model folders are checked here, so a missing or wrong folder fails at start-up in one line, not
    at the first rollout; an `http` reward's server must answer /health now, for the same reason.
    With `reward.overlap` and `reward.overlap_worker: process` it is built in a worker process instead
    (`pool.PooledReward`); the default, a background thread of the loop, is `build_loop_reward`'s.
    """
    if section.overlap and section.overlap_worker == "process":
        from spotlight.rewards.pool import PooledReward

        return PooledReward(build_reward, section, task_default, section.worker_core)
    if section.weights is not None:
        from spotlight.rewards.composite import CompositeReward

        return CompositeReward({term: (build_named(term, section, task_default), weight)
                                for term, weight in section.weights.items()})
    if section.name is None:
        if task_default is None:
            raise RewardError("reward.name is null and there is no task to take the reward from; set reward.name "
                              f"to one of {sorted(BUILTIN_REWARDS)}, 'http' or 'pkg.module:function'")
        return task_default(section.strict_weight)
    return build_named(section.name, section, task_default)


def build_loop_reward(section: RewardSection, task_default: TaskReward | None = None) -> Reward:
    """The reward a training loop scores its rollouts with: `build_reward`'s, on a background thread that scores
    each finished chunk while the next one samples when `reward.overlap` (the default) asks for a thread."""
    return overlapped(build_reward(section, task_default), section)


def overlapped(reward: Reward, section: RewardSection) -> Reward:
    """``reward`` on a background thread (`background.BackgroundReward`) if `reward.overlap` with
    `overlap_worker: thread`; as it is when overlap is off or it overlaps by itself (a worker process)."""
    if not section.overlap or section.overlap_worker != "thread" or callable(getattr(reward, "prefetch", None)):
        return reward
    from spotlight.rewards.background import BackgroundReward

    return BackgroundReward(reward)


def build_named(name: str, section: RewardSection, task_default: TaskReward | None = None) -> Reward:
    """One reward by its name (a built-in, `http` or `pkg.module:function`), configured from `section`."""
    del task_default  # the built-ins below cover the tasks' rewards by name
    if name == "http":
        from spotlight.rewards.server.remote import connect_http_reward

        assert section.url is not None  # RewardSection refuses http without a url
        return connect_http_reward(section.url, section.deadline_s, section.retries)
    if ":" in name:  # the user's code: each call bounded by reward.deadline_s (rewards/deadline.py)
        from spotlight.rewards.deadline import DeadlineReward
        from spotlight.rewards.function import FunctionReward

        return DeadlineReward(FunctionReward(name), section.deadline_s, section.retries)
    from spotlight.rewards.video import per_frame

    return per_frame(_BUILDERS[name](section), section.frames)  # a video's frames, one by one (rewards/video.py)


def _shapes(section: RewardSection) -> Reward:
    from spotlight.rewards.geneval.reward import GenEvalReward

    return GenEvalReward(section.strict_weight)


def _ocr_line(section: RewardSection) -> Reward:
    from spotlight.rewards.ocr.reward import OCRReward

    return OCRReward()


def _ocr_scene(section: RewardSection) -> Reward:
    from spotlight.rewards.ocr.scene import SceneOCRReward

    return SceneOCRReward(device=section.model_device, workers=section.workers)


def _geneval(section: RewardSection) -> Reward:
    from spotlight.rewards.geneval.detector import load_geneval_reward

    return load_geneval_reward(section.models, section.model_device, section.batch_size, section.strict_weight)


def _pickscore(section: RewardSection) -> Reward:
    from spotlight.rewards.preference import PickScoreReward

    return PickScoreReward.from_folder(section.models.pickscore, section.models.pickscore_processor,
                                       section.model_device, section.batch_size)


def _clipscore(section: RewardSection) -> Reward:
    from spotlight.rewards.preference import CLIPScoreReward

    return CLIPScoreReward.from_folder(section.models.clip, section.model_device, section.batch_size)


def _aesthetic(section: RewardSection) -> Reward:
    from spotlight.rewards.models.aesthetic import AestheticReward

    models = section.models
    return AestheticReward.from_files(models.aesthetic, models.aesthetic_clip or models.clip, section.model_device,
                                      section.batch_size)


def _hps(section: RewardSection) -> Reward:
    from spotlight.rewards.models.hps import HPSReward

    models = section.models
    return HPSReward.from_files(models.hps, models.hps_processor or models.pickscore_processor, section.model_device,
                                section.batch_size)


def _imagereward(section: RewardSection) -> Reward:
    from spotlight.rewards.models.imagereward import ImageRewardReward

    return ImageRewardReward.from_files(section.models.imagereward, section.models.imagereward_tokenizer,
                                        section.model_device, section.batch_size)


def _vlm_judge(section: RewardSection) -> Reward:
    from spotlight.rewards.models.vlm_judge import VLMJudgeReward

    return VLMJudgeReward.from_folder(section.models.vlm_judge, section.judge_question, section.model_device,
                                      section.batch_size)


def _temporal() -> Reward:
    from spotlight.rewards.video import TemporalConsistency

    return TemporalConsistency()


def _edit(section: RewardSection) -> Reward:
    from spotlight.rewards.edit import EditReward

    return EditReward(_clipscore(section))


def _edit_preserve(section: RewardSection) -> Reward:
    from spotlight.rewards.edit import EditReward

    return EditReward()


_BUILDERS: dict[str, Callable[[RewardSection], Reward]] = {
    "shapes": _shapes, "ocr-line": _ocr_line, "ocr": _ocr_scene, "geneval": _geneval,
    "pickscore": _pickscore, "clipscore": _clipscore,
    "aesthetic": _aesthetic, "hps": _hps, "imagereward": _imagereward,
    "vlm-judge": _vlm_judge, "temporal": lambda section: _temporal(),
    "edit": _edit, "edit-preserve": _edit_preserve,
}
assert set(_BUILDERS) == set(BUILTIN_REWARDS), "every documented built-in reward has a builder"
