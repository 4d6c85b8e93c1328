"""Where a diffusers transformer comes from: a tiny random one built from a config, or a local folder / Hub id.

diffusers and peft are imported here, on first use, so that configs and checkpoints can be read on a
machine without them; the error then says what to install.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from spotlight.models.pipelines.family_config import TINY_CONFIGS, TRANSFORMER_CLASSES, Family

if TYPE_CHECKING:
    from diffusers.models.modeling_utils import ModelMixin


@contextlib.contextmanager
def quiet_loading() -> Iterator[None]:
    """diffusers' and transformers' per-component progress bars off while loading (a run's terminal is the
    loop's progress bar); restored after."""
    from diffusers.utils import logging as diffusers_logging

    diffusers_logging.disable_progress_bar()
    try:
        from transformers.utils import logging as transformers_logging
    except ImportError:
        transformers_logging = None
    if transformers_logging is not None:
        transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        diffusers_logging.enable_progress_bar()
        if transformers_logging is not None:
            transformers_logging.enable_progress_bar()


class DiffusersLoadError(OSError):
    """A transformer or LoRA file that cannot be loaded; the message names it and the fix."""


def import_diffusers() -> Any:
    """The diffusers module, with peft importable (``add_adapter`` needs it); the ImportError names the fix."""
    try:
        import diffusers
        import peft  # noqa: F401  (add_adapter needs it)
    except ImportError as error:
        raise ImportError(
            f"the diffusers adapter needs diffusers and peft ({error.name} is missing): "
            "pip install 'diffusers>=0.42.1,<0.43' 'peft>=0.21.2,<0.22'"
        ) from None
    return diffusers


def build_tiny_transformer(family: Family, overrides: dict[str, Any] | None = None) -> ModelMixin:
    """A randomly initialised transformer of ``family`` from ``TINY_CONFIGS`` (no download), float32.

    Initialisation draws from torch's global RNG: seed it (``torch.manual_seed``) for a reproducible model.
    """
    diffusers = import_diffusers()
    cls = getattr(diffusers, TRANSFORMER_CLASSES[family])
    arguments = {**TINY_CONFIGS[family], **(overrides or {})}
    try:
        return cls(**arguments)
    except TypeError as error:
        raise ValueError(f"tiny_overrides for {family} do not fit {cls.__name__} ({error})") from None


def _check_pipeline_classes(folder: Path) -> str:
    """Every component of the pipeline folder resolves to the class its model_index.json names (what the
    text encoders and the VAE load as later, mid-run); the transformer's class name. DiffusersLoadError
    (one line) for a class, or a library, this install lacks."""
    from spotlight.models.pipelines.folder import PipelineFolderError, component_class, read_pipeline_folder

    try:
        pipeline = read_pipeline_folder(folder)
        for part in pipeline.components:
            component_class(pipeline, part)
        library, name = pipeline.class_name("transformer")
    except PipelineFolderError as error:
        raise DiffusersLoadError(str(error)) from None
    return name if library == "diffusers" else f"{library}.{name}"


def _looks_like_path(name: str) -> bool:
    """A Hub id is ``name`` or ``org/name``; anything with more parts or a path prefix is a folder."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or os.sep != "/" and os.sep in name


def load_transformer(family: Family, path_or_id: str, dtype: torch.dtype = torch.bfloat16) -> ModelMixin:
    """The transformer of a diffusers pipeline folder (its ``transformer/``), a transformer folder, or a Hub id.

    A local folder never touches the network. A Hub id is downloaded when the Hub is reachable;
    otherwise the error says to download it elsewhere and pass the folder.
    """
    diffusers = import_diffusers()
    cls = getattr(diffusers, TRANSFORMER_CLASSES[family])
    folder = Path(path_or_id).expanduser()
    if folder.is_dir():
        transformer_folder = folder / "transformer" if (folder / "transformer").is_dir() else folder
        config_path = transformer_folder / "config.json"
        if not config_path.is_file():
            raise DiffusersLoadError(
                f"{folder} has neither transformer/config.json nor config.json: pass a diffusers pipeline folder "
                f"or its transformer/ folder"
            )
        # the class diffusers builds is model_index.json's; a config's _class_name (not required) cross-checks it
        named = {config_path: json.loads(config_path.read_text()).get("_class_name", cls.__name__)}
        if (folder / "model_index.json").is_file():
            named[folder / "model_index.json"] = _check_pipeline_classes(folder)
        for source, stored_class in named.items():
            if stored_class != cls.__name__:  # diffusers would fail later on a weight shape, naming no family
                families = {name: family for family, name in TRANSFORMER_CLASSES.items()}
                fix = f"set family: {families[stored_class]}" if stored_class in families else "pass another folder"
                raise DiffusersLoadError(f"{source} describes a {stored_class} transformer, not the {cls.__name__} of "
                                         f"family {family}: {fix}")
        with quiet_loading():
            return cls.from_pretrained(str(transformer_folder), dtype=dtype)
    if _looks_like_path(path_or_id):
        raise DiffusersLoadError(
            f"cannot load {path_or_id!r}: no such folder; pass an existing diffusers pipeline folder or a Hub id"
        )
    try:
        return cls.from_pretrained(path_or_id, subfolder="transformer", dtype=dtype)
    except OSError as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise DiffusersLoadError(
            f"cannot load {path_or_id!r}: no local folder and the Hub is unreachable or did not serve it "
            f"({reason}); download it on a machine with access and pass the local folder"
        ) from None

