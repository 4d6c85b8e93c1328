"""A model folder known by its contents, not its path: the fingerprint a run records, and damaged files named.

``--resume`` must continue from the weights the run started from. A path says little: a folder can
be moved (another spelling of the same weights) or its files replaced by another model's (the same
spelling, other weights). At the start a run records in ``RUN_DIR/model_fingerprint.json``:

- each small file (configs, ``model_index.json``, tokenizers: up to `SMALL_FILE_BYTES`): its size and
  SHA-256;
- each larger file: its size, and the SHA-256 of its safetensors header (tensor names, dtypes, shapes,
  offsets) and of `SAMPLES` windows of `SAMPLE_BYTES` spread over its data, so weights replaced by
  others of the same architecture differ too. Reading them costs a few MiB per file, never the file:
  a 20 B model's folder is fingerprinted in well under a second.

A resume whose model folder has another fingerprint is refused in one line naming the first file
that differs. Reading the headers also finds damaged downloads before any library loads them: a
safetensors file shorter than its header says (truncated), a header that is not JSON (corrupt), a shard
named by an ``*.index.json`` that is missing, or a model folder with no weights file at all: each a
`ModelFilesError` naming it and saying to download it again.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

__all__ = ["FINGERPRINT_FILE", "ModelFilesError", "check_same_model", "model_fingerprint", "record_model"]

FINGERPRINT_FILE = "model_fingerprint.json"
SMALL_FILE_BYTES = 4 * 1024 * 1024
SAMPLE_BYTES = 64 * 1024
SAMPLES = 3  # windows at the start, middle and end of a large file's data
MAX_HEADER_BYTES = 100 * 1024 * 1024  # safetensors' own limit


class ModelFilesError(RuntimeError):
    """A model folder's file is damaged or missing; the message names it and says to download it again."""


def _damaged(path: Path, what: str) -> ModelFilesError:
    return ModelFilesError(f"{path} is unreadable, {what}: the download is incomplete or damaged; download it "
                           "again (or copy it again from a good copy) and retry")


def _safetensors_header(path: Path, size: int) -> tuple[bytes, int]:
    """The raw JSON header of a safetensors file and where its data starts; ModelFilesError if it is damaged."""
    with path.open("rb") as file:
        prefix = file.read(8)
        if len(prefix) < 8:
            raise _damaged(path, f"truncated ({size} bytes, shorter than a safetensors header)")
        (length,) = struct.unpack("<Q", prefix)
        if length > min(MAX_HEADER_BYTES, size - 8):
            raise _damaged(path, f"truncated or corrupt (its header claims {length} bytes, the file has {size})")
        header = file.read(length)
    try:
        tensors = json.loads(header)
        end = max((int(entry["data_offsets"][1]) for name, entry in tensors.items() if name != "__metadata__"),
                  default=0)
    except (ValueError, KeyError, TypeError, IndexError):
        raise _damaged(path, "corrupt (its safetensors header is not readable)") from None
    if 8 + length + end > size:
        raise _damaged(path, f"truncated ({size} bytes; its header describes {8 + length + end})")
    return header, 8 + length


def _file_print(path: Path) -> dict[str, Any]:
    """{size, sha256} of a small file; {size, header, samples} of a large one (safetensors checked whole)."""
    size = path.stat().st_size
    data_start = 0
    entry: dict[str, Any] = {"size": size}
    if path.suffix == ".safetensors":
        header, data_start = _safetensors_header(path, size)
        entry["header"] = hashlib.sha256(header).hexdigest()
    if size <= SMALL_FILE_BYTES:
        entry["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
        return entry
    span = size - data_start
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for k in range(SAMPLES):
            file.seek(data_start + (span - SAMPLE_BYTES) * k // (SAMPLES - 1))
            digest.update(file.read(SAMPLE_BYTES))
    entry["samples"] = digest.hexdigest()
    return entry


WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")


def _check_complete(folder: Path) -> None:
    """Every model of a pipeline folder (a component with a ``config.json``) has weights, and every shard an
    ``*.safetensors.index.json`` names is there."""
    if (folder / "model_index.json").is_file():
        for component in sorted(path.parent for path in folder.glob("*/config.json")):
            if not any(next(component.glob(pattern), None) for pattern in WEIGHT_PATTERNS):
                raise ModelFilesError(f"{component} has a config.json but no weights file (diffusion_pytorch_model."
                                      "safetensors or model.safetensors): the download is incomplete; download the "
                                      "model again and retry")
    for index in folder.rglob("*.safetensors.index.json"):
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (ValueError, KeyError, AttributeError):
            raise _damaged(index, "corrupt (not a shard index with a weight_map)") from None
        for shard in sorted(shards):
            if not (index.parent / shard).is_file():
                raise ModelFilesError(f"{index.parent / shard} is missing ({index.name} names it): the download is "
                                      "incomplete; download the model again and retry")


def model_fingerprint(folder: Path) -> dict[str, dict[str, Any]]:
    """{path relative to ``folder``: its print} for every file of a model folder (hidden ones left out).

    Raises ModelFilesError naming a truncated or corrupt safetensors file or a missing shard.
    """
    folder = Path(folder)
    _check_complete(folder)
    files = sorted(path for path in folder.rglob("*") if path.is_file()
                   and not any(part.startswith(".") for part in path.relative_to(folder).parts))
    return {path.relative_to(folder).as_posix(): _file_print(path) for path in files}


def _model_folder(config: Any) -> Path | None:
    """The folder of the run's starting weights: ``model.pretrained``, else the TinyDiT ``base_checkpoint``
    (None for a Hub id or a tiny random family, which have no folder)."""
    from spotlight.components.checkpoint import resolve_model_dir

    name = config.model.pretrained if config.model.pretrained is not None else config.base_checkpoint
    folder = Path(name).expanduser() if config.model.pretrained is not None else resolve_model_dir(name)
    if not folder.is_dir():
        return None
    if config.model.pretrained is not None and not any((folder / n).is_file() for n in ("model_index.json",
                                                                                        "config.json")):
        return None  # neither a pipeline nor a model folder: the loader's one line says what it lacks
    return folder


def record_model(run_dir: Path, config: Any) -> None:
    """At a run's start: check its model folder's files and keep their fingerprint in the run directory (not
    over a run's own: a start without --resume in a run's directory is refused after this)."""
    folder = _model_folder(config)
    if folder is None:
        return
    if (Path(run_dir) / "metrics.jsonl").exists():
        model_fingerprint(folder)  # the files are still checked
        return
    fingerprint = {"folder": str(folder.resolve()), "files": model_fingerprint(folder)}
    (Path(run_dir) / FINGERPRINT_FILE).write_text(json.dumps(fingerprint, indent=1, sort_keys=True))


def check_same_model(run_dir: Path, config: Any) -> bool:
    """At a resume: True if the model folder holds the weights the run started from (its path may differ),
    False if the run recorded none to compare; a one-line ModelFilesError if they differ or are damaged."""
    recorded_path = Path(run_dir) / FINGERPRINT_FILE
    folder = _model_folder(config)
    if folder is None:
        return False
    now = model_fingerprint(folder)  # damaged files are named even for a run that recorded no fingerprint
    if not recorded_path.is_file():
        return False
    recorded = json.loads(recorded_path.read_text())
    if now == recorded["files"]:
        return True
    changed = sorted(name for name in recorded["files"].keys() | now.keys()
                     if recorded["files"].get(name) != now.get(name))
    first = changed[0]
    how = "is missing" if first not in now else "is new" if first not in recorded["files"] else "differs"
    field = "model.pretrained" if config.model.pretrained is not None else "base_checkpoint"
    raise ModelFilesError(
        f"--resume: {field} {folder} does not hold the weights this run started from ({recorded['folder']}): "
        f"{first} {how}{f' (+{len(changed) - 1} more files)' if len(changed) > 1 else ''}; point {field} at the "
        "run's own model folder, or start a new run_dir")
