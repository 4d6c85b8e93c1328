"""Qwen-Image-Edit's ``processor`` without torchvision: transformers' own ``Qwen2VLProcessor``, images only.

``QwenImageEditPipeline`` shows its text encoder (Qwen2.5-VL) the source image: ``encode_prompt`` calls
``self.processor(text=..., images=..., padding=True, return_tensors="pt")``, which runs the image
processor (pixel patches and their ``image_grid_thw``), expands each ``<|image_pad|>`` of the chat
template into one token per merged patch and tokenizes. Videos never enter.

Why not ``Qwen2VLProcessor.from_pretrained`` itself: in transformers 5, a ``Qwen2VLProcessor`` is refused
at construction without torchvision: its ``video_processor`` slot is checked against
``VideoProcessorMixin``, whose lookup walks ``VIDEO_PROCESSOR_MAPPING``, a torchvision-only placeholder
there (``AttributeError: type object 'VIDEO_PROCESSOR_MAPPING' has no attribute '_extra_content'``). PyPI's
torchvision does not load beside a CPU torch build (``operator torchvision::nms does not exist``), and a
CPU install is what tests and laptops run. The image processor and the tokenizer, the only parts
``encode_prompt`` uses, need no torchvision: ``AutoImageProcessor`` picks the torchvision backend where
it is installed and the PIL one (``Qwen2VLImageProcessorPil``) where not, as the full processor would.
So `EditImageProcessor` is ``Qwen2VLProcessor`` with the video slot left out of its signature (transformers
takes a processor's parts from its ``__init__`` signature): the same class's ``__call__``, token expansion
and tokenizer call, loaded from the same ``processor/`` folder. It is a ``Qwen2VLProcessor``, so the
pipeline takes it as its own (``QwenImageEditPipeline.from_pretrained(folder, processor=...)``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["PROCESSOR_INDEX_ENTRY", "edit_processor", "load_edit_processor", "pipeline_parts", "portable_folder"]

# what model_index.json names for the processor: the class a torchvision install loads the folder with
PROCESSOR_INDEX_ENTRY = ["transformers", "Qwen2VLProcessor"]


def _processor_class() -> type:
    from transformers import Qwen2VLProcessor

    class EditImageProcessor(Qwen2VLProcessor):
        """``Qwen2VLProcessor`` over an image processor and a tokenizer: no video processor (module docstring)."""

        def __init__(self, image_processor: Any = None, tokenizer: Any = None, chat_template: str | None = None,
                     **kwargs: Any) -> None:
            super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    return EditImageProcessor


def edit_processor(image_processor: Any, tokenizer: Any) -> Any:
    """A processor over ``image_processor`` (Qwen2-VL's) and ``tokenizer`` (with Qwen's vision tokens)."""
    return _processor_class()(image_processor=image_processor, tokenizer=tokenizer)


def load_edit_processor(folder: str | Path) -> Any:
    """The processor of the pipeline folder ``folder`` (its ``processor/``), torchvision or not."""
    from transformers import AutoImageProcessor, AutoTokenizer

    where = str(Path(folder) / "processor")
    return edit_processor(AutoImageProcessor.from_pretrained(where), AutoTokenizer.from_pretrained(where))


def pipeline_parts(folder: Any) -> dict[str, Any]:
    """What ``from_pretrained`` of the `spotlight.models.pipelines.folder.PipelineFolder` ``folder``'s pipeline must be
    handed: Qwen-Image-Edit's processor, built here (module docstring); nothing for a folder without one."""
    if folder.index.get("processor") != PROCESSOR_INDEX_ENTRY:
        return {}
    return {"processor": load_edit_processor(folder.path)}


def portable_folder(folder: str | Path) -> None:
    """Make a saved pipeline folder name its processor as transformers does: ``save_pretrained`` recorded
    `EditImageProcessor` (a class of this module) in ``model_index.json`` and ``processor_config.json``;
    a folder for other installs names ``Qwen2VLProcessor`` and carries the video processor's settings it
    reads where torchvision is installed (the same patch sizes as the images'; never used by an edit)."""
    folder = Path(folder)
    index_file, config_file = folder / "model_index.json", folder / "processor" / "processor_config.json"
    index = json.loads(index_file.read_text())
    index["processor"] = PROCESSOR_INDEX_ENTRY
    index_file.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    config = json.loads(config_file.read_text())
    images = config["image_processor"]
    config["processor_class"] = PROCESSOR_INDEX_ENTRY[1]
    config["video_processor"] = {"video_processor_type": "Qwen2VLVideoProcessor",
                                 **{key: images[key] for key in ("patch_size", "merge_size", "temporal_patch_size",
                                                                 "image_mean", "image_std")}}
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
