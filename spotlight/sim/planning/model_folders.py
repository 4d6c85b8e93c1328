"""Config-only pipeline folders of published models, so `spotlight plan` can price them with no download.

Each folder under ``model_configs/`` holds what a hub snapshot of the model holds minus its weights and
tokenizers: ``model_index.json`` and the ``config.json`` of every part, with the published values
(``stabilityai/stable-diffusion-3.5-medium``; ``Qwen/Qwen-Image``, its text encoder that of
``Qwen/Qwen2.5-VL-7B-Instruct``). Where a published file has keys that change no shape (a diffusers
version, the VAE's latent statistics), they are left out. `spotlight plan -s model.pretrained=NAME`
takes a name here as well as a folder.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["MODEL_CONFIGS", "model_folder", "resolve_model_folder", "shipped"]

MODEL_CONFIGS = Path(__file__).with_name("model_configs")


def model_folder(name: str) -> Path:
    """The shipped config-only folder ``name``; ValueError naming the shipped ones otherwise."""
    path = MODEL_CONFIGS / name
    if not (path / "model_index.json").is_file():
        raise ValueError(f"no shipped model config {name!r}: use one of {', '.join(shipped())} or a pipeline folder")
    return path


def shipped() -> list[str]:
    """Names of the shipped config-only folders."""
    return sorted(path.parent.name for path in MODEL_CONFIGS.glob("*/model_index.json"))


def resolve_model_folder(pretrained: str) -> Path:
    """``pretrained`` as a folder: an existing path, else a shipped config name, else the path as given."""
    path = Path(pretrained).expanduser()
    if path.exists() or pretrained not in shipped():
        return path
    return model_folder(pretrained)
