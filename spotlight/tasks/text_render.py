"""The renderer of the OCR task: one line of dark text on a light background, e.g. 32x128.

It makes the pre-training data of the OCR base model and the ground truth the OCR reward is checked
against. The font is DejaVu Sans Mono Bold from matplotlib's wheel (a dependency already), so
nothing downloads at run time. Character i is centred in the i-th of MAX_LENGTH equal cells from the
left (16 px at width 128: two columns of 8-px patches), so the i-th prompt token always maps to the
same patches, which a small DiT learns far more easily than a proportional, centred layout (the
shapes task's lattice does the same for objects). Bold strokes survive blur.
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
    """The largest font size whose glyphs leave a 1-px gap in their cell and fit the height."""
    cell = width // MAX_LENGTH
    for size in range(height, 4, -1):
        font = ImageFont.truetype(str(font_path()), size)
        left, top, right, bottom = font.getbbox("Mg", anchor="lm")
        if font.getlength("M") <= cell - 1 and bottom - top <= height - 4:
            return font
    raise ValueError(f"no font size fits {MAX_LENGTH} characters in {height}x{width}; use a larger image")


def render_text(text: str, height: int = HEIGHT, width: int = WIDTH) -> np.ndarray:
    """Draw `text` one character per cell from the left, vertically centred; uint8 (height, width) grey levels."""
    if len(text) > MAX_LENGTH:
        raise ValueError(f"text {text!r} has more than {MAX_LENGTH} characters, the cells of one line")
    cell = width // MAX_LENGTH
    font = font_for(height, width)
    image = Image.new("L", (width, height), PAPER)
    draw = ImageDraw.Draw(image)
    for index, char in enumerate(text):
        draw.text((cell * index + cell / 2, height / 2), char, font=font, fill=INK, anchor="mm")
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
