"""Source images as an edit pipeline's condition latents (FLUX.1 Kontext, Qwen-Image-Edit), encoded once per row.

What ``FluxKontextPipeline.__call__`` does with its ``image`` argument, for a row of an edit dataset:
the image is resized to the run's resolution (the pipeline keeps the source's own size, rounded to a
multiple of 16 pixels, or with ``_auto_resize`` one of Kontext's preferred sizes; Spotlight's samples
share one size so that a batch stacks, so the source takes the target's), preprocessed by the
pipeline's ``VaeImageProcessor`` to [-1, 1], encoded by the VAE at its distribution's mode (the
pipeline's ``sample_mode="argmax"``) and normalised as ``(z - shift_factor) * scaling_factor``. The
latents (1, C, h, w) join the row's text embeddings in `spotlight.models.pipelines.prompts.PromptCache`,
so each row pays for one VAE encode per process, as it pays for one text encode.

``QwenImageEditPipeline`` does the same with its own VAE: the resized image as one frame (B, 3, 1, H, W),
the mode of its distribution, normalised as ``(z - latents_mean) / latents_std``; the frame axis is dropped
here (the rollout's latents are (C, h, w)). Unlike Kontext it also shows the source to its text encoder:
``encode_prompt(prompt, image=...)`` takes the same resized PIL image (`text_encoder_images`), so an edit
row's text embeddings depend on its image; they are cached by the row's key, which names both.
``QwenImageEditPlusPipeline`` (Qwen-Image-Edit-2509) shows its text encoder the source resized to ~384 x 384
pixels of the source's own aspect (``CONDITION_IMAGE_SIZE``), whatever the output size, and numbers it
("Picture 1: ...") in a template that counts the images of the call, so its rows are encoded one at a time
(``encode_batch`` 1: a batch's images would all be read as pictures of every row).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from spotlight.data.edit_key import SOURCE_MARK, split_sample_key

__all__ = ["ConditionImages", "EditRowError", "area_size", "split_edit_rows", "text_encoder_images"]


TEXT_IMAGE_AREA = 384 * 384  # what QwenImageEditPlusPipeline's text encoder sees of a source (CONDITION_IMAGE_SIZE)


class EditRowError(ValueError):
    """An edit row where no edit can be made (a text-to-image folder) or a source image that cannot be read;
    one line naming the cause and the fix (a known error: the CLI prints it without a traceback)."""


def split_edit_rows(keys: Sequence[str], condition: ConditionImages | None,
                    folder: Any) -> tuple[list[str], list[str | None]]:
    """(what the text encoders see, each row's source path or None) of prompt strings ``keys``: an edit
    folder's split, a text-to-image folder's prompts as they are; an edit row given to a text-to-image folder
    is refused in one line (its encoders would read the path as words and never see the image)."""
    if condition is not None:
        return condition.split(keys)
    edit_rows = [key for key in keys if SOURCE_MARK in key]
    if edit_rows:
        raise EditRowError(f"data.dataset: {split_sample_key(edit_rows[0])[0]!r} is an edit row (with a source "
                           f"image) but {folder.path} holds a text-to-image pipeline: point model.pretrained at an "
                           "edit pipeline folder (FluxKontextPipeline), or use a dataset without \"image\" rows")
    return list(keys), [None] * len(keys)


def text_encoder_images(condition: ConditionImages | None, sources: Sequence[str | None]) -> dict[str, Any]:
    """What ``encode_prompt`` takes beside the instructions: Qwen-Image-Edit's ``image`` (the rows' resized
    sources, which its text encoder sees); nothing for Kontext or a text-to-image folder."""
    if condition is None or not condition.shows_text_encoder:
        return {}
    if any(path is None for path in sources):
        raise EditRowError("data.dataset: a plain prompt (no \"image\") given to a Qwen-Image-Edit folder, whose "
                           "text encoder reads every prompt beside its source image: use an edit dataset (each row "
                           "an instruction and an \"image\")")
    if condition.text_image_area is None:
        height, width = condition.resolution
        return {"image": [condition.processor.resize(condition.load(str(path)), height, width) for path in sources]}
    images = [condition.load(str(path)) for path in sources]
    return {"image": [condition.processor.resize(image, *area_size(condition.text_image_area, *image.size))
                      for image in images]}


def area_size(area: int, width: int, height: int) -> tuple[int, int]:
    """(height, width) of about ``area`` pixels at ``width / height``'s aspect, each a multiple of 32, as the Qwen
    edit pipelines' ``calculate_dimensions`` size an image."""
    ratio = width / height
    scaled_width = math.sqrt(area * ratio)
    return round(scaled_width / ratio / 32) * 32, round(scaled_width / 32) * 32


class ConditionImages:
    """The condition latents of edit keys at ``resolution`` (H, W), through ``decoder``'s VAE (shared, loaded once).

    ``shows_text_encoder``: the folder's text encoder reads the source image too (Qwen-Image-Edit); at
    ``text_image_area`` pixels (Qwen-Image-Edit-2509), else at ``resolution``; ``encode_batch``: rows per
    ``encode_prompt`` call the pipeline takes (None: any).
    """

    def __init__(self, decoder: Any, resolution: tuple[int, int], vae_scale_factor: int) -> None:
        from diffusers.image_processor import VaeImageProcessor

        self.decoder = decoder
        self.resolution = resolution
        self.processor = VaeImageProcessor(vae_scale_factor=vae_scale_factor * 2)  # as both edit pipelines build it
        self.framed = decoder.folder.family == "qwen-image"  # a video-shaped VAE: one frame, mean/std normalised
        self.shows_text_encoder = self.framed
        plus = decoder.folder.index.get("_class_name") == "QwenImageEditPlusPipeline"
        self.text_image_area = TEXT_IMAGE_AREA if plus else None
        self.encode_batch = 1 if plus else None

    @staticmethod
    def split(keys: Sequence[str]) -> tuple[list[str], list[str | None]]:
        """The instructions (what the text encoders see) and the source paths (None: a plain prompt) of ``keys``."""
        pairs = [split_sample_key(key) for key in keys]
        return [text for text, _ in pairs], [path for _, path in pairs]

    def load(self, path: str) -> Any:
        """The source image at ``path`` as RGB; a one-line error naming the file when it cannot be read."""
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(path) as image:
                return image.convert("RGB")
        except (OSError, UnidentifiedImageError) as error:
            raise EditRowError(f"edit source image {path} cannot be read ({error}): check the dataset row's "
                             "\"image\" path (relative to the dataset folder)") from None

    def encode(self, paths: Sequence[str]) -> list[torch.Tensor]:
        """One (1, C, h, w) latent per path, on the VAE's device, in the VAE's dtype, without gradients."""
        height, width = self.resolution
        vae = self.decoder.vae
        config = vae.config
        rows = []
        with torch.no_grad():
            for path in paths:
                image = self.processor.resize(self.load(path), height, width)
                pixels = self.processor.preprocess(image, height, width).to(self.decoder.device, vae.dtype)
                if self.framed:
                    latents = vae.encode(pixels.unsqueeze(2)).latent_dist.mode()[:, :, 0]
                    shape = (1, latents.shape[1], 1, 1)
                    mean = torch.tensor(config.latents_mean).view(shape).to(latents.device, latents.dtype)
                    std = torch.tensor(config.latents_std).view(shape).to(latents.device, latents.dtype)
                    rows.append((latents - mean) / std)
                    continue
                latents = vae.encode(pixels).latent_dist.mode()
                rows.append((latents - (config.shift_factor or 0.0)) * config.scaling_factor)
        return rows
