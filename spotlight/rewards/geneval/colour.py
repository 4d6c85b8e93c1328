"""GenEval's colour classifier: zero-shot CLIP over each object's masked, cropped pixels.

As GenEval does it: the object's mask pastes the image onto a flat grey (#999) canvas, the result is
cropped to the object's box, and CLIP picks one of ten colours; a colour's text embedding is the
renormalised mean of three templates ("a photo of a {c} {object}", "a photo of a {c}-colored
{object}", "a photo of a {c} object"). GenEval runs OpenAI's ViT-L/14; transformers'
`openai/clip-vit-large-patch14` holds the same weights.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image

from spotlight.rewards.clip_embed import CLIP
from spotlight.rewards.geneval.rules import COLORS, Detection

TEMPLATES = ("a photo of a {c} {name}", "a photo of a {c}-colored {name}", "a photo of a {c} object")
BACKGROUND = (153, 153, 153)  # GenEval's bgcolor "#999"


def masked_crop(image: Image.Image, detection: Detection) -> Image.Image:
    """The object's pixels on grey outside its mask (if it has one), cropped to its box."""
    if detection.mask is not None:
        canvas = Image.new("RGB", image.size, BACKGROUND)
        image = Image.composite(image, canvas, Image.fromarray(detection.mask.astype(np.uint8) * 255))
    return image.crop(detection.box)


class CLIPColourClassifier:
    """Colours of detected objects, one of COLORS each; text classifiers cached per object name."""

    def __init__(self, clip: CLIP) -> None:
        self.clip = clip
        self._classifiers: dict[str, torch.Tensor] = {}

    def classifier(self, name: str) -> torch.Tensor:
        """(10, D) unit-norm colour embeddings for objects called `name`."""
        if name not in self._classifiers:
            rows = []
            for colour in COLORS:
                mean = self.clip.texts([t.format(c=colour, name=name) for t in TEMPLATES]).mean(dim=0)
                rows.append(torch.nn.functional.normalize(mean, dim=-1))
            self._classifiers[name] = torch.stack(rows)
        return self._classifiers[name]

    def colours(self, image: Image.Image, name: str, objects: Sequence[Detection]) -> list[str]:
        """The colour CLIP finds most likely for each object of class `name` in `image`."""
        if not objects:
            return []
        features = self.clip.images([masked_crop(image, obj) for obj in objects])
        return [COLORS[i] for i in (features @ self.classifier(name).T).argmax(dim=1).tolist()]
