"""The prompt sets shipped with the package (`spotlight/assets/datasets`), named by their folder.

``data.dataset: ocr`` reads the shipped OCR set; anything that looks like a path (an existing
folder, an absolute path, or a name with a separator) is taken as a path, so a user's own folder
called ``ocr`` in the working directory wins over the shipped one, as with ``base_checkpoint``.
"""

from __future__ import annotations

from pathlib import Path

SHIPPED_DATASETS = Path(__file__).resolve().parents[1] / "assets" / "datasets"


def shipped_names() -> list[str]:
    """The names of the shipped prompt sets (``ocr``, ``geneval``)."""
    return sorted(path.name for path in SHIPPED_DATASETS.iterdir() if path.is_dir())


def resolve_dataset_folder(name_or_path: str | Path) -> Path:
    """The folder ``data.dataset`` names: an existing path, else a shipped set of that name, else the path."""
    path = Path(name_or_path).expanduser()
    if path.exists() or path.is_absolute() or len(path.parts) > 1:
        return path
    shipped = SHIPPED_DATASETS / path
    return shipped if shipped.is_dir() else path
