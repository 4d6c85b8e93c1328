"""Sample grids: a PNG of images with their prompts, so that a person looks at samples, not only numbers."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw


def save_grid(
    images: torch.Tensor, prompts: Sequence[str], path: Path, columns: int, scale: int = 3, caption_width: int = 230
) -> None:
    """Write images (B, 3, H, W) in [0, 1] as rows of ``columns`` images, each row captioned with its prompt.

    Rows are prompt-major: images ``[r*columns, (r+1)*columns)`` share ``prompts[r*columns]``.
    """
    batch, _, height, width = images.shape
    rows = (batch + columns - 1) // columns
    cell_h, cell_w = height * scale, width * scale
    canvas = Image.new("RGB", (caption_width + columns * (cell_w + 2), rows * (cell_h + 2)), (40, 40, 40))
    draw = ImageDraw.Draw(canvas)
    pixels = (images.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    for index in range(batch):
        row, column = divmod(index, columns)
        tile = Image.fromarray(np.ascontiguousarray(pixels[index])).resize((cell_w, cell_h), Image.NEAREST)
        canvas.paste(tile, (caption_width + column * (cell_w + 2), row * (cell_h + 2)))
        if column == 0:
            draw.text((4, row * (cell_h + 2) + cell_h // 2 - 6), prompts[index], fill=(230, 230, 230))
    path.parent.mkdir(parents=True, exist_ok=True)
    canvas.save(path)
