"""Sample grids: a PNG of images with their prompts, so that a person looks at samples, not only numbers.

Videos (B, F, 3, H, W) get a PNG of filmstrips and, beside it, an animated GIF of the same grid frame by
frame (``iter-*.gif``), which the report shows in place of the PNG.
"""

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

    Rows are prompt-major: images ``[r*columns, (r+1)*columns)`` share ``prompts[r*columns]``. Videos
    (B, F, 3, H, W) are shown as filmstrips (`filmstrips`) and played in ``path`` with suffix ``.gif``.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    if images.dim() == 5:
        frames = [_drawn(images[:, frame], prompts, columns, scale, caption_width) for frame in range(images.shape[1])]
        frames[0].save(path.with_suffix(".gif"), save_all=True, append_images=frames[1:], duration=GIF_FRAME_MS,
                       loop=0)
        images = filmstrips(images)
    _drawn(images, prompts, columns, scale, caption_width).save(path)


GIF_FRAME_MS = 125  # 8 frames a second


def _drawn(images: torch.Tensor, prompts: Sequence[str], columns: int, scale: int, caption_width: int) -> Image.Image:
    """The grid of images (B, 3, H, W) as one picture."""
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
    return canvas


FILMSTRIP_FRAMES = 8


def filmstrips(videos: torch.Tensor, frames: int = FILMSTRIP_FRAMES) -> torch.Tensor:
    """Videos (B, F, 3, H, W) as images (B, 3, H, n W): ``frames`` evenly spaced frames side by side, first
    and last included, so a grid cell shows how a video moves."""
    count = videos.shape[1]
    picked = torch.linspace(0, count - 1, min(frames, count)).round().long()
    chosen = videos[:, picked]  # (B, n, 3, H, W)
    return chosen.permute(0, 2, 3, 1, 4).flatten(3)  # frames along the width
