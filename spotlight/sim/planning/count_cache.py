"""Meta-device counts kept on disk: a second `spotlight plan` of a config the walks do not model loads no model code.

`spotlight plan` counts from config.json numbers (`spotlight.sim.planning.analytic`: milliseconds, no
model code). A config those walks do not model (an image-to-video Wan, LoRA on a convolution, a text
encoder class not written out) is counted on the meta device instead, and importing diffusers, peft and
transformers to build it takes seconds, most of `plan`'s budget. Those counts depend only on the configs,
the shapes asked for, the counting code and the library versions, so each is stored under a hash of all
of them (a changed config, library or counting module is a miss, never a stale hit) in
``$SPOTLIGHT_CACHE_DIR`` (else ``$XDG_CACHE_HOME/spotlight``, else ``~/.cache/spotlight``)/counts.json.
An unreadable or unwritable cache is a miss, never an error.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["cache_path", "cached"]

_LIBRARIES = ("torch", "diffusers", "transformers", "peft")
_CODE = ("forward_flops.py", "forward_count.py", "meta_flops.py", "folder_workload.py", "count_cache.py")


def cache_path() -> Path:
    """The cache file (module docstring)."""
    if os.environ.get("SPOTLIGHT_CACHE_DIR"):
        return Path(os.environ["SPOTLIGHT_CACHE_DIR"]) / "counts.json"
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "spotlight" / "counts.json"


@lru_cache(maxsize=1)
def _code_version() -> str:
    """A hash of the counting code and the versions of the libraries whose classes are counted."""
    digest = hashlib.sha256()
    for name in _LIBRARIES:
        try:
            digest.update(f"{name}={metadata.version(name)};".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{name}=absent;".encode())
    here = Path(__file__).parent
    for name in _CODE:
        digest.update((here / name).read_bytes())
    return digest.hexdigest()


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def cached(kind: str, key: dict[str, Any], compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``compute()``'s JSON-able result for (``kind``, ``key``), from the cache file when it holds it."""
    text = json.dumps({"kind": kind, "key": key, "code": _code_version()}, sort_keys=True, default=str)
    digest = hashlib.sha256(text.encode()).hexdigest()
    path = cache_path()
    entries = _read(path)
    if digest in entries:
        return entries[digest]
    value = compute()
    entries[digest] = value
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp", encoding="utf-8") as out:
            json.dump(entries, out)
        os.replace(out.name, path)
    except OSError:
        pass  # a read-only home: the next plan counts again
    return value
