"""The `reward:` section of a training config: which reward, its weights, where its models and server are.

`reward.name` picks one reward: null (the task's own), a built-in name (`BUILTIN_REWARDS`), `http`
(a `spotlight serve-reward` at `reward.url`) or `pkg.module:function` (a user function of
(images float (N, 3, H, W) in [0, 1], prompts, metadata) returning N floats). `reward.weights` makes a
composite of several such names instead, each term logged on its own. Model-based rewards load from
local folders only (`reward.models`): a training job must not depend on a model hub being reachable.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from spotlight.schema import ConfigError, Section

# name -> what it judges; the registry (spotlight/rewards/registry.py) builds each
BUILTIN_REWARDS: dict[str, str] = {
    "shapes": "the shapes task's GenEval-style reward (pixel classifier, 32x32)",
    "ocr-line": "the OCR task's recogniser on one text line (32x128)",
    "ocr": "rapidocr detection + recognition over the whole image vs the prompt's quoted text",
    "geneval": "GenEval's rules over an instance-segmentation detector and CLIP colours (needs metadata)",
    "pickscore": "PickScore (a CLIP fine-tuned on Pick-a-Pic preferences)",
    "clipscore": "CLIPScore (Hessel et al. 2021): 2.5 * max(cos, 0) with 'A photo depicts '",
    "aesthetic": "the LAION aesthetic predictor (an MLP on CLIP ViT-L/14 image embeddings), AVA's 1-10 scale",
    "hps": "HPSv2.1 (an OpenCLIP ViT-H-14 fine-tuned on human preferences): 100 * cos(image, prompt)",
    "imagereward": "ImageReward (BLIP's image-grounded text encoder + an MLP head), normalised as released",
    "vlm-judge": "a Qwen2.5-VL asked a yes/no question about each image (reward.judge_question): P('yes')",
    "temporal": "videos: 1 - the mean absolute change between consecutive frames (images score 1)",
    "edit": "edits: 0.5 * CLIPScore(edit, instruction) + 0.5 * (1 - mean |edit - source|) (needs an edit dataset)",
    "edit-preserve": "edits: 1 - the mean absolute pixel difference from the row's source image (no model)",
}
FUNCTION_NAME = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def check_reward_name(name: str, field: str) -> str:
    """`name` if it is a built-in, `http` or `pkg.module:function`; ConfigError naming `field` otherwise."""
    if name in BUILTIN_REWARDS or name == "http" or FUNCTION_NAME.match(name):
        return name
    raise ConfigError(f"{field} {name!r} is not a reward: use one of {sorted(BUILTIN_REWARDS)}, 'http' or "
                      "'pkg.module:function'")


class RewardModelsSection(Section):
    """Local folders of the rewards' models (`save_pretrained` layout); null where a reward is not used."""

    clip: str | None = None  # clipscore: a CLIPModel + processor, e.g. openai/clip-vit-large-patch14
    pickscore: str | None = None  # pickscore: yuvalkirstain/PickScore_v1 (a CLIPModel)
    # pickscore's processor (laion/CLIP-ViT-H-14-laion2B-s32B-b79K); null: the pickscore folder's own
    pickscore_processor: str | None = None
    detector: str | None = None  # geneval: an instance-segmentation model (Mask2Former) + its processor
    # geneval: 'pkg.module:Class' with from_pretrained(folder) and detect(images)
    # (spotlight/rewards/geneval/detection.py);
    # null: transformers' Mask2FormerForUniversalSegmentation
    detector_class: str | None = None
    colour_clip: str | None = None  # geneval's colour classifier: a CLIPModel (ViT-L/14 in GenEval)
    aesthetic: str | None = None  # aesthetic: the predictor's file, sac+logos+ava1-l14-linearMSE.pth
    # aesthetic: a CLIP ViT-L/14 folder (CLIPModel or CLIPVisionModelWithProjection); null: reward.models.clip
    aesthetic_clip: str | None = None
    hps: str | None = None  # hps: HPS_v2.1_compressed.pt (an open_clip ViT-H-14 state dict)
    # hps: the CLIP processor of laion/CLIP-ViT-H-14-laion2B-s32B-b79K (its tokenizer); null: pickscore_processor
    hps_processor: str | None = None
    imagereward: str | None = None  # imagereward: ImageReward.pt, with the release's med_config.json beside it
    imagereward_tokenizer: str | None = None  # imagereward: bert-base-uncased's tokenizer folder
    vlm_judge: str | None = None  # vlm-judge: a Qwen2.5-VL folder (model + tokenizer with its chat template)

    @field_validator("detector_class")
    @classmethod
    def _class_path(cls, value: str | None) -> str | None:
        if value is not None and not FUNCTION_NAME.match(value):
            raise ValueError(f"reward.models.detector_class {value!r} must be 'pkg.module:Class'")
        return value


class RewardSection(Section):
    """The training reward (see the module docstring); the default is the task's own reward."""

    name: str | None = None
    # the shapes reward: GenEval partial credit mixed with the strict 0/1 flag
    strict_weight: float = Field(0.5, ge=0, le=1)
    weights: dict[str, float] | None = None  # composite: {ocr: 1.0, clipscore: 0.5}; the sum of weighted terms
    # advantages of a composite: joint (of the weighted sum) or per_term (each term normalised within its group
    # first, then weighted: spotlight/rl/advantages.per_term_advantages)
    normalize: Literal["joint", "per_term"] = "joint"
    url: str | None = None  # http: the `spotlight serve-reward` address, e.g. http://10.0.0.5:8765
    # http: one request's whole time (connect, send, score, read); pkg.module:function: one call's (rewards/deadline.py)
    deadline_s: float = Field(60.0, gt=0)
    retries: int = Field(2, ge=0)  # http and pkg.module:function: attempts after the first
    # where model-based rewards run: cpu, cuda, cuda:1; null: the policy's device (a training config's `device`)
    device: str | None = None
    batch_size: int = Field(32, ge=1)  # images per forward pass of a model-based reward
    # videos (a Wan folder): a built-in image reward scores every frame; a video's reward is their mean or min
    frames: Literal["mean", "min"] = "mean"
    models: RewardModelsSection = RewardModelsSection()
    # vlm-judge: the question asked of each image, {prompt} replaced by its prompt; the reward is P("yes")
    judge_question: str = "Does this image show {prompt}? Answer yes or no."
    # the OCR reward's pool of threads reading images in parallel (null: the cores this process may use, less one)
    workers: int | None = Field(None, ge=1)
    # score each finished chunk of a rollout while the next chunk is sampled (rewards/background.py, rewards/pool.py)
    overlap: bool = True
    overlap_groups: int = Field(4, ge=1)  # groups per chunk handed to the worker
    # thread: a background thread of the trainer's process scores (no start-up cost; the reward's models share
    # the policy's device, on their own CUDA stream); process: a worker process, on worker_core if set
    overlap_worker: Literal["thread", "process"] = "thread"
    worker_core: int | None = Field(None, ge=0)  # overlap_worker process: its core (null: not pinned)

    @field_validator("name")
    @classmethod
    def _known_name(cls, value: str | None) -> str | None:
        return None if value is None else check_reward_name(value, "reward.name")

    @field_validator("weights")
    @classmethod
    def _known_terms(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("reward.weights is empty; name at least one reward, e.g. {ocr: 1.0}")
        for term in value:
            check_reward_name(term, "reward.weights key")
        return value

    @field_validator("judge_question")
    @classmethod
    def _asks_about_the_prompt(cls, value: str) -> str:
        if "{prompt}" not in value:
            raise ValueError(f"reward.judge_question {value!r} has no {{prompt}}; put {{prompt}} where the image's "
                             "prompt goes, e.g. 'Does this image show {prompt}? Answer yes or no.'")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> RewardSection:
        if self.name is not None and self.weights is not None:
            raise ValueError(f"set reward.name ({self.name!r}) or reward.weights, not both: weights is a "
                             "composite of names")
        if self.normalize == "per_term" and self.weights is None:
            raise ValueError("reward.normalize per_term normalises each term of reward.weights; set reward.weights "
                             "(e.g. {hps: 1.0, aesthetic: 0.5}) or use normalize: joint")
        uses_http = self.name == "http" or "http" in (self.weights or {})
        if uses_http and not self.url:
            raise ValueError("reward.name http needs reward.url (the address of `spotlight serve-reward`)")
        return self

    @property
    def model_device(self) -> str:
        """Where the reward's models run: reward.device; unset outside a training config (which fills in the
        policy's device), the CPU."""
        return self.device or "cpu"
