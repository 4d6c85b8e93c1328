"""Durable checkpoint directories: every file fsynced and listed with its SHA-256 in ``manifest.json``.

A rename is atomic only for what reached the disk: without fsync, a power loss right after the rename
can leave a directory under its final name whose files are empty or torn. The manifest is written
last, after every other file is synced, so a directory whose manifest verifies is complete; one that
does not (a truncated file, a byte flipped on disk, a crash mid-copy) is known to be bad before any
of it is loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = 2  # format 1: the pickled training_state.pt of earlier versions, which had no manifest


def fsync_file(path: Path) -> None:
    """Force ``path``'s contents to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Force ``path``'s entries (creations, renames) to the disk, so a rename survives a power loss."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_of(path: Path) -> str:
    """The hex SHA-256 of a file, read in 1 MiB blocks (checkpoints are tens of MB)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(directory: Path) -> None:
    """Sync every file of ``directory`` and write ``manifest.json`` (their sizes and SHA-256), synced last.

    Files in sub-folders count too, under their relative path (a fully fine-tuned policy's
    ``transformer/`` folder, which diffusers loads), and the sub-folders' entries are synced.
    """
    files = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and p != directory / MANIFEST_FILE):
        fsync_file(path)
        files[path.relative_to(directory).as_posix()] = {"bytes": path.stat().st_size, "sha256": sha256_of(path)}
    for folder in sorted((p for p in directory.rglob("*") if p.is_dir()), reverse=True):
        fsync_dir(folder)
    manifest = directory / MANIFEST_FILE
    manifest.write_text(json.dumps({"format": MANIFEST_FORMAT, "files": files}, indent=1))
    fsync_file(manifest)
    fsync_dir(directory)


def manifest_problem(directory: Path) -> str | None:
    """Why ``directory`` is not a complete checkpoint (a short phrase), or None when every listed file verifies."""
    manifest = directory / MANIFEST_FILE
    if not manifest.is_file():
        return f"it has no {MANIFEST_FILE}"
    try:
        listed = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return f"its {MANIFEST_FILE} is unreadable"
    for name, expected in listed.items():
        path = directory / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != expected["bytes"]:
            return f"{name} has {path.stat().st_size} bytes, not {expected['bytes']} (truncated)"
        if sha256_of(path) != expected["sha256"]:
            return f"{name} does not match its checksum (corrupt)"
    return None


def write_text_durably(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically and durably (temporary file, fsync, rename, fsync of the folder)."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    fsync_file(temporary)
    os.replace(temporary, path)
    fsync_dir(path.parent)
