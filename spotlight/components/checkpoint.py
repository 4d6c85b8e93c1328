"""Checkpoints: weights in safetensors, loop state in JSON, optimizer and RNG in a weights-only torch file.

The weights of a policy are its ``broadcast_state()`` and its ``describe()`` JSON (``model.json``):
every weight of a TinyDiT, but only the LoRA matrices of a diffusers policy, whose ``model.json``
names its base (a pretrained folder, or the tiny config and ``init_seed`` it is drawn from), so a
LoRA run's checkpoints stay a few hundred kilobytes however large the base. A policy that has a
format of its own for other tools (``save_for_diffusers``: a diffusers policy's
``pytorch_lora_weights.safetensors``, which ``pipe.load_lora_weights(folder)`` reads) writes it into
every model directory too, training checkpoints and ``checkpoints/best`` alike, listed in the manifest.

A checkpoint is a directory. It is written under a temporary name, every file fsynced and listed with
its checksum (`spotlight.components.manifest`), and renamed into place; the ``latest`` pointer is replaced
atomically after it. A run killed at any moment leaves either the previous checkpoint or the new one,
and one damaged later (a truncated file) is detected and skipped. Nothing is loaded in a way that can
run code from the run directory: ``--resume`` must be safe on a directory someone else wrote.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from spotlight.components.manifest import MANIFEST_FILE, fsync_dir, manifest_problem, write_manifest, write_text_durably
from spotlight.models.policy import Policy
from spotlight.models.rebuild import policy_from_description
from spotlight.run_error import RunError

logger = logging.getLogger(__name__)

MODEL_FILE = "model.safetensors"
MODEL_CONFIG_FILE = "model.json"


class CheckpointError(FileNotFoundError):
    """A checkpoint that is missing or unreadable; the message names the path and the fix."""


def _tensors_for_saving(state: dict[str, torch.Tensor], dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().to(dtype or tensor.dtype).contiguous().cpu() for name, tensor in state.items()}


def save_model(
    directory: Path, model: Policy, metadata: dict[str, Any] | None = None, dtype: torch.dtype | None = None
) -> None:
    """Write a self-describing model directory: the policy's broadcast state (safetensors) and its
    description + metadata (JSON), and the policy's file for other tools where it has one (module docstring).

    ``dtype`` stores the weights in another precision (float16 halves a shipped base model); loading
    casts them back to the model's float32 parameters.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(_tensors_for_saving(model.broadcast_state(), dtype), str(directory / MODEL_FILE))
    description = {**model.describe(), "metadata": metadata or {}}
    (directory / MODEL_CONFIG_FILE).write_text(json.dumps(description, indent=2))
    model.save_for_diffusers(directory)  # a no-op for a TinyDiT, which has no other format


def replace_model(directory: Path, model: Policy, metadata: dict[str, Any] | None = None) -> None:
    """`save_model` into ``directory`` by renames, so a crash leaves the old or the new model, never a mix.

    For a directory rewritten during a run (``checkpoints/best``): the new copy is written beside
    it, the old one moved aside, the new one renamed in, the old one removed.
    """
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".staging-{directory.name}-", dir=directory.parent))
    try:
        save_model(staging, model, metadata)
        _swap_in(staging, directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _swap_in(staging: Path, final: Path) -> None:
    """Rename a complete ``staging`` directory to ``final``; an old ``final`` is moved aside first and
    removed after, so that a complete directory exists at every moment."""
    if not final.exists():
        os.replace(staging, final)
        return
    retired = final.parent / f".retired-{final.name}"
    shutil.rmtree(retired, ignore_errors=True)
    os.replace(final, retired)
    os.replace(staging, final)
    shutil.rmtree(retired)


ASSETS = Path(__file__).resolve().parents[1] / "assets"


def resolve_model_dir(name_or_path: str | Path) -> Path:
    """A model directory: an existing path, else a base model shipped in the package (``shapes-base``)."""
    path = Path(name_or_path)
    if path.exists() or path.is_absolute() or len(path.parts) > 1:
        return path
    shipped = ASSETS / path
    return shipped if shipped.is_dir() else path


def load_model(directory: str | Path, weights_file: str = MODEL_FILE) -> Policy:
    """Rebuild a policy from a model directory written by :func:`save_model` (or a training checkpoint).

    ``directory`` may also name a base model shipped with the package (e.g. ``shapes-base``). A LoRA
    checkpoint's base is rebuilt from its description, then its LoRA tensors are loaded.
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
        model = policy_from_description(description)
        model.load_broadcast_state(load_file(str(weights_path)))
    except (OSError, ValueError, KeyError, RuntimeError, TypeError, SafetensorError) as error:
        detail = " ".join(str(error).split())[:200]
        raise CheckpointError(f"checkpoint {directory} is unreadable ({type(error).__name__}: {detail}): copy it "
                              "again in full, or point at another model directory") from None
    return model


def load_model_state(directory: str | Path) -> dict[str, torch.Tensor]:
    """The trained tensors of a model directory (its ``model.safetensors``), for ``load_broadcast_state``.

    What a process that already holds the policy needs (``--resume``, a rollback to ``best``):
    `load_model` would build a second policy, and with it a second copy of a LoRA policy's base.
    """
    path = resolve_model_dir(directory) / MODEL_FILE
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {path} is missing: point at a directory made by 'spotlight train' "
                              f"(it holds {MODEL_CONFIG_FILE} and {MODEL_FILE})")
    try:
        return load_file(str(path))
    except (OSError, SafetensorError) as error:
        raise CheckpointError(f"checkpoint file {path} is unreadable ({type(error).__name__}: "
                              f"{' '.join(str(error).split())[:200]}): copy it again in full") from None


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


TRAINING_STATE_FILE = "training_state.pt"  # optimizer state and RNG: tensors in plain containers only
STATE_FILE = "state.json"  # iteration and the loop's plain-data state (planner, monitor, budget)
EMA_FILE = "ema.safetensors"


def _is_state_dict(value: Any) -> bool:
    return isinstance(value, dict) and bool(value) and all(isinstance(v, torch.Tensor) for v in value.values())


def _write_training_files(staging: Path, iteration: int, model: Policy, optimizer: torch.optim.Optimizer | None,
                          ema: Policy | None, extra: dict[str, Any],
                          shards: Callable[[Path], None] | None = None) -> None:
    """Every file of a training checkpoint: tensors in safetensors, the optimizer and RNG in a torch file
    that loads with ``weights_only=True``, the rest in JSON; the manifest last.

    ``shards``: K FSDP2 ranks write their shards of the training state into the staging directory
    first (`spotlight.components.sharded_checkpoint`); the optimizer is then among them (None here).
    """
    if shards is not None:
        shards(staging)
    save_model(staging, model, {"iteration": iteration})
    if ema is not None:
        save_file(_tensors_for_saving(ema.broadcast_state()), str(staging / EMA_FILE))
    tensor_extras = sorted(key for key, value in extra.items() if _is_state_dict(value))
    for key in tensor_extras:
        save_file({name: t.detach().contiguous().cpu() for name, t in extra[key].items()},
                  str(staging / f"extra-{key}.safetensors"))
    optimizer_state = {} if optimizer is None else optimizer.state_dict()
    torch.save({"optimizer": optimizer_state, "rng": torch.get_rng_state(), "iteration": iteration},
               staging / TRAINING_STATE_FILE)
    plain = {key: value for key, value in extra.items() if key not in tensor_extras}
    (staging / STATE_FILE).write_text(json.dumps({"iteration": iteration, "extra": plain,
                                                  "tensor_extras": tensor_extras}))
    write_manifest(staging)


def save_training_checkpoint(
    run_dir: Path,
    iteration: int,
    model: Policy,
    optimizer: torch.optim.Optimizer | None,
    ema: Policy | None,
    extra: dict[str, Any],
    shards: Callable[[Path], None] | None = None,
) -> Path:
    """Atomically and durably write ``run_dir/checkpoints/iter-XXXXXX`` and point ``latest`` at it; returns its path.

    ``extra`` holds the loop's state: state dicts (name -> tensor) go to safetensors, everything else
    must be JSON. A write that fails (disk full, permissions) removes its staging directory and raises
    a one-line :class:`CheckpointError`; the previous checkpoint stays the newest complete one.
    """
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"iter-{iteration:06d}"
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root))
    try:
        _write_training_files(staging, iteration, model, optimizer, ema, extra, shards)
        _swap_in(staging, final)
        fsync_dir(root)
        write_text_durably(root / "latest", final.name)
    except BaseException as error:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(error, RunError):  # already one line (a trainer rank that died while writing its shards)
            raise
        if isinstance(error, OSError | SafetensorError | RuntimeError):  # the writers' ways of saying "disk full"
            detail = getattr(error, "strerror", None) or " ".join(str(error).split())[:200]
            raise CheckpointError(
                f"could not write checkpoint {final} ({detail}): free disk space or make "
                f"{root} writable, then continue with --resume from the previous checkpoint"
            ) from None
        raise
    for leftover in root.glob(".staging-*"):  # from an earlier crash mid-write
        shutil.rmtree(leftover, ignore_errors=True)
    return final


def checkpoint_problem(checkpoint: Path) -> str | None:
    """Why ``checkpoint`` cannot be resumed from (a short phrase), or None if it is complete and intact."""
    if not (checkpoint / MANIFEST_FILE).is_file() and (checkpoint / TRAINING_STATE_FILE).is_file():
        return ("it was written by an earlier Spotlight as a pickled training_state.pt, which --resume no longer "
                "loads because unpickling it can run code")
    if not (checkpoint / MANIFEST_FILE).is_file() and not (checkpoint / STATE_FILE).is_file():
        return f"it is not a training checkpoint (no {MANIFEST_FILE}, {STATE_FILE} or {TRAINING_STATE_FILE})"
    return manifest_problem(checkpoint)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete, intact checkpoint of a run; None if it has none.

    A newest checkpoint that fails its checksums (a torn write, a truncated file) is skipped with a
    warning naming it, and the one before it is used: losing a few iterations beats not resuming.
    Raises :class:`CheckpointError` when checkpoints exist but none is usable.
    """
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return None
    skipped: list[tuple[Path, str]] = []
    for checkpoint in sorted((p for p in root.glob("iter-*") if p.is_dir()), reverse=True):
        problem = checkpoint_problem(checkpoint)
        if problem is None:
            for bad, reason in skipped:
                logger.warning("checkpoint %s is not usable (%s); resuming from %s instead", bad, reason,
                               checkpoint.name)
            return checkpoint
        skipped.append((checkpoint, problem))
    if skipped:
        bad, reason = skipped[0]
        raise CheckpointError(f"--resume: no usable checkpoint in {root}: {bad.name}: {reason}; "
                              "start a new run_dir (or restore the checkpoint files)")
    return None


def load_training_state(checkpoint: Path) -> TrainingState:
    """Read the optimizer, EMA, RNG and loop state of a checkpoint written by :func:`save_training_checkpoint`.

    Nothing here can run code from the run directory: tensors come from safetensors, plain data from
    JSON, and the optimizer/RNG file is unpickled with ``weights_only=True`` (tensors and plain
    containers only); anything else in it is refused.
    """
    checkpoint = Path(checkpoint)
    problem = checkpoint_problem(checkpoint)
    if problem is not None:
        raise CheckpointError(f"checkpoint {checkpoint} cannot be resumed: {problem}; --resume needs a checkpoint "
                              f"written by this version of 'spotlight train' (or start a new run_dir)")
    state_path = checkpoint / TRAINING_STATE_FILE
    try:
        state = torch.load(state_path, weights_only=True, map_location="cpu")
        plain = json.loads((checkpoint / STATE_FILE).read_text())
        extra = dict(plain["extra"])
        for key in plain["tensor_extras"]:
            extra[key] = load_file(str(checkpoint / f"extra-{key}.safetensors"))
        ema = load_file(str(checkpoint / EMA_FILE)) if (checkpoint / EMA_FILE).is_file() else None
        optimizer, rng, iteration = state["optimizer"], state["rng"], int(plain["iteration"])
    except pickle.UnpicklingError:
        raise CheckpointError(
            f"{state_path} holds objects other than tensors and plain containers, which --resume refuses to "
            "unpickle because they could run code: restore the file 'spotlight train' wrote, or start a new run_dir"
        ) from None
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, SafetensorError) as error:
        raise CheckpointError(f"checkpoint {checkpoint} is unreadable ({type(error).__name__}: "
                              f"{' '.join(str(error).split())[:200]}); start a new run_dir") from None
    if not isinstance(rng, torch.Tensor) or not isinstance(optimizer, dict):
        raise CheckpointError(f"{state_path} does not hold an optimizer state and an RNG tensor: "
                              "restore the file 'spotlight train' wrote, or start a new run_dir")
    return TrainingState(iteration=iteration, optimizer=optimizer, ema=ema, rng={"torch": rng}, extra=extra)
