"""The renderer of the OCR task: one line of dark text on a light background, e.g. 32x128.

It makes the pre-training data of the OCR base model and the ground truth the OCR reward is checked
against. The font is DejaVu Sans Mono Bold from matplotlib's wheel (a dependency already), so
nothing downloads at run time. A monospaced font puts character i at a fixed x for every text: the
i-th prompt token always maps to the same image columns, which a small DiT learns far more easily
than a proportional layout. Text is left-aligned for the same reason; bold strokes survive blur.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

from spotlight.tasks.text import MAX_LENGTH, target_text

HEIGHT = 32
WIDTH = 128
MARGIN = 4  # px left of the first character
FONT_FILE = "DejaVuSansMono-Bold.ttf"
INK = 0  # text grey level (uint8)
PAPER = 255  # background grey level


@cache
def font_path() -> Path:
    """DejaVu Sans Mono Bold as shipped inside matplotlib's wheel."""
    import matplotlib

    path = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / FONT_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: reinstall matplotlib (it ships the DejaVu fonts)")
    return path


@cache
def font_for(height: int, width: int) -> ImageFont.FreeTypeFont:
    """The largest font size whose MAX_LENGTH characters fit the width and whose glyphs fit the height."""
    for size in range(height, 4, -1):
        font = ImageFont.truetype(str(font_path()), size)
        left, top, right, bottom = font.getbbox("Mg" + "0" * (MAX_LENGTH - 2), anchor="lm")
        if MARGIN + right <= width - 2 and bottom - top <= height - 4:
            return font
    raise ValueError(f"no font size fits {MAX_LENGTH} characters in {height}x{width}; use a larger image")


def render_text(text: str, height: int = HEIGHT, width: int = WIDTH) -> np.ndarray:
    """Draw `text` left-aligned and vertically centred; uint8 (height, width) grey levels."""
    image = Image.new("L", (width, height), PAPER)
    ImageDraw.Draw(image).text((MARGIN, height / 2), text, font=font_for(height, width), fill=INK, anchor="lm")
    return np.asarray(image)


def render_batch(prompts: Sequence[str], seed: int = 0, height: int = HEIGHT, width: int = WIDTH) -> torch.Tensor:
    """Render each prompt's text, in model space: float32 (B, 3, height, width) in [-1, 1], grey as RGB.

    The rendering is deterministic (one image per text), so `seed` is unused; it is accepted so that
    both tasks' renderers share one call.
    """
    del seed
    grey = np.stack([render_text(target_text(prompt), height, width) for prompt in prompts])
    batch = torch.from_numpy(grey).float()[:, None].expand(-1, 3, -1, -1)
    return (batch / 127.5 - 1.0).contiguous()
