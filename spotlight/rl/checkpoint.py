"""Checkpoints: model weights as safetensors, optimizer and RNG as torch files, written atomically.

A checkpoint is a directory. It is written under a temporary name and renamed into place, and the
``latest`` pointer is replaced atomically after it, so a run killed at any moment leaves either the
previous checkpoint or the new one, never a torn one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from spotlight.models.tinydit import TinyDiT, TinyDiTConfig

MODEL_FILE = "model.safetensors"
MODEL_CONFIG_FILE = "model.json"


class CheckpointError(FileNotFoundError):
    """A checkpoint that is missing or unreadable; the message names the path and the fix."""


def _state_dict_for_saving(model: torch.nn.Module, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().to(dtype or tensor.dtype).contiguous().cpu()
            for name, tensor in model.state_dict().items()}


def save_model(
    directory: Path, model: TinyDiT, metadata: dict[str, Any] | None = None, dtype: torch.dtype | None = None
) -> None:
    """Write a self-describing model directory: weights (safetensors) and architecture + metadata (JSON).

    ``dtype`` stores the weights in another precision (float16 halves a shipped base model); loading
    casts them back to the model's float32 parameters.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(_state_dict_for_saving(model, dtype), str(directory / MODEL_FILE))
    description = {"architecture": "TinyDiT", "config": model.config.to_dict(), "metadata": metadata or {}}
    (directory / MODEL_CONFIG_FILE).write_text(json.dumps(description, indent=2))


ASSETS = Path(__file__).resolve().parents[1] / "assets"


def resolve_model_dir(name_or_path: str | Path) -> Path:
    """A model directory: an existing path, else a base model shipped in the package (``shapes-base``)."""
    path = Path(name_or_path)
    if path.exists() or path.is_absolute() or len(path.parts) > 1:
        return path
    shipped = ASSETS / path
    return shipped if shipped.is_dir() else path


def load_model(directory: str | Path, weights_file: str = MODEL_FILE) -> TinyDiT:
    """Rebuild a TinyDiT from a model directory written by :func:`save_model` (or a training checkpoint).

    ``directory`` may also name a base model shipped with the package (e.g. ``shapes-base``).
    """
    directory = resolve_model_dir(directory)
    config_path, weights_path = directory / MODEL_CONFIG_FILE, directory / weights_file
    for path in (config_path, weights_path):
        if not path.is_file():
            raise CheckpointError(
                f"checkpoint file {path} is missing: point base_checkpoint / --checkpoint at a directory "
                f"made by 'spotlight pretrain' or 'spotlight train' (it holds {MODEL_CONFIG_FILE} and {MODEL_FILE})"
            )
    try:
        description = json.loads(config_path.read_text())
        model = TinyDiT(TinyDiTConfig(**description["config"]))
        model.load_state_dict(load_file(str(weights_path)))
    except (ValueError, KeyError, RuntimeError, TypeError) as error:
        raise CheckpointError(f"checkpoint {directory} is unreadable ({type(error).__name__}: {error})") from None
    return model


def read_model_metadata(directory: str | Path) -> dict[str, Any]:
    """The metadata dict stored beside a model's weights."""
    return json.loads((Path(directory) / MODEL_CONFIG_FILE).read_text()).get("metadata", {})


@dataclass
class TrainingState:
    """What a training checkpoint restores besides the model weights."""

    iteration: int
    optimizer: dict[str, Any]
    ema: dict[str, torch.Tensor] | None
    rng: dict[str, Any]
    extra: dict[str, Any]


def save_training_checkpoint(
    run_dir: Path,
    iteration: int,
    model: TinyDiT,
    optimizer: torch.optim.Optimizer,
    ema: torch.nn.Module | None,
    extra: dict[str, Any],
) -> Path:
    """Atomically write ``run_dir/checkpoints/iter-XXXXXX`` and point ``latest`` at it; returns its path."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"iter-{iteration:06d}"
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root))
    save_model(staging, model, {"iteration": iteration})
    if ema is not None:
        save_file(_state_dict_for_saving(ema), str(staging / "ema.safetensors"))
    torch.save(
        {"optimizer": optimizer.state_dict(), "rng": {"torch": torch.get_rng_state()}, "extra": extra,
         "iteration": iteration},
        staging / "training_state.pt",
    )
    if final.exists():  # move the old copy aside first, so that a complete directory always exists
        retired = root / f".retired-{final.name}"
        shutil.rmtree(retired, ignore_errors=True)
        os.replace(final, retired)
        os.replace(staging, final)
        shutil.rmtree(retired)
    else:
        os.replace(staging, final)
    for leftover in root.glob(".staging-*"):  # from an earlier crash mid-write
        if leftover != final:
            shutil.rmtree(leftover, ignore_errors=True)
    pointer_tmp = root / ".latest.tmp"
    pointer_tmp.write_text(final.name)
    os.replace(pointer_tmp, root / "latest")
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run, or None if it has none."""
    pointer = Path(run_dir) / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    path = pointer.parent / pointer.read_text().strip()
    if (path / "training_state.pt").is_file():
        return path
    # A crash while re-writing the latest iteration: fall back to the newest complete checkpoint
    # (directories only ever appear under their final name by rename, so they are complete).
    complete = sorted(p for p in pointer.parent.glob("iter-*") if (p / "training_state.pt").is_file())
    return complete[-1] if complete else None


def load_training_state(checkpoint: Path) -> TrainingState:
    """Read the optimizer, EMA, RNG and loop state of a checkpoint written by :func:`save_training_checkpoint`."""
    state_path = Path(checkpoint) / "training_state.pt"
    if not state_path.is_file():
        raise CheckpointError(f"{state_path} is missing: --resume needs a checkpoint written by 'spotlight train'")
    state = torch.load(state_path, weights_only=False)
    ema_path = Path(checkpoint) / "ema.safetensors"
    ema = load_file(str(ema_path)) if ema_path.is_file() else None
    return TrainingState(
        iteration=state["iteration"], optimizer=state["optimizer"], ema=ema, rng=state["rng"], extra=state["extra"]
    )
