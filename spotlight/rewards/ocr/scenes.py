"""Rendered text scenes: the test and benchmark data of the whole-image OCR reward (`ocr_scene.py`).

A scene is a 512x512 image with a quoted phrase painted somewhere in it, in one of several fonts, at
a random size, position and rotation, over a random background (flat, gradient or noise) cluttered
with shapes and lines. The OCR reward must find the text before it can read it, which a generated
image of a sign or a poster asks of it too. A *negative* scene paints another phrase than the prompt
quotes, so the reward's gap between right and wrong renderings can be measured.

Fonts come from matplotlib's wheel (a dependency already): DejaVu, STIX and Computer Modern, in
regular, bold and italic cuts, so no font has to be downloaded.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from spotlight.tasks.text import WORDS

SIZE = 512
FONT_FILES = ("DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSans-Oblique.ttf", "DejaVuSansMono-Bold.ttf",
              "DejaVuSerif.ttf", "DejaVuSerif-BoldItalic.ttf", "STIXGeneral.ttf", "STIXGeneralBol.ttf",
              "STIXGeneralItalic.ttf", "cmss10.ttf", "cmr10.ttf", "cmtt10.ttf")
PROMPT_TEMPLATES = ('a photo of a sign that says "{}"', 'a poster with the words "{}" on it',
                    'a street scene, a shop front reading "{}"', 'a notebook page with "{}" written on it')


@dataclass(frozen=True)
class Scene:
    """One rendered scene: its image (3, 512, 512) in [0, 1], its prompt and what was painted."""

    image: torch.Tensor
    prompt: str
    painted: str
    correct: bool
    font: str
    font_size: int
    angle: float


def font_dir() -> Path:
    """matplotlib's folder of TrueType fonts."""
    import matplotlib

    return Path(matplotlib.get_data_path()) / "fonts" / "ttf"


@cache
def _font(name: str, size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(str(font_dir() / name), size)


def _phrase(rng: random.Random) -> str:
    """One word (70%) or two (30%) of the OCR task's vocabulary; a quarter in capitals or title case."""
    words = [rng.choice(WORDS) for _ in range(1 if rng.random() < 0.7 else 2)]
    phrase = " ".join(words)
    style = rng.random()
    return phrase.upper() if style < 0.12 else phrase.title() if style < 0.25 else phrase


def _wrong_phrase(rng: random.Random, right: str) -> str:
    """A phrase that neither equals nor contains the right one (normalised), so the reward cannot match it."""
    key = right.replace(" ", "").lower()
    while True:
        wrong = _phrase(rng)
        if key not in wrong.replace(" ", "").lower():
            return wrong


def _background(rng: random.Random) -> Image.Image:
    """Flat, a two-colour gradient or smoothed noise; then 6-20 shapes and lines as clutter."""
    kind = rng.choice(("flat", "gradient", "noise"))
    colour = np.array([rng.randrange(256) for _ in range(3)], dtype=np.float32)
    if kind == "flat":
        pixels = np.broadcast_to(colour, (SIZE, SIZE, 3)).copy()
    elif kind == "gradient":
        other = np.array([rng.randrange(256) for _ in range(3)], dtype=np.float32)
        ramp = np.linspace(0, 1, SIZE, dtype=np.float32)[:, None, None]
        pixels = colour * (1 - ramp) + other * ramp
        pixels = np.broadcast_to(pixels, (SIZE, SIZE, 3)) if rng.random() < 0.5 else pixels.transpose(1, 0, 2)
        pixels = np.broadcast_to(pixels, (SIZE, SIZE, 3)).copy()
    else:
        noise = np.random.default_rng(rng.randrange(2**32)).normal(0, 40, (SIZE // 8, SIZE // 8, 3))
        pixels = np.clip(colour + np.kron(noise, np.ones((8, 8, 1))), 0, 255)
    image = Image.fromarray(pixels.astype(np.uint8)).filter(ImageFilter.GaussianBlur(2 if kind == "noise" else 0))
    draw = ImageDraw.Draw(image)
    for _ in range(rng.randint(6, 20)):
        fill = tuple(rng.randrange(256) for _ in range(3))
        x0, y0 = rng.randrange(SIZE), rng.randrange(SIZE)
        x1, y1 = x0 + rng.randint(10, 160), y0 + rng.randint(10, 160)
        shape = rng.choice(("rectangle", "ellipse", "line"))
        if shape == "line":
            draw.line((x0, y0, rng.randrange(SIZE), rng.randrange(SIZE)), fill=fill, width=rng.randint(1, 6))
        else:
            getattr(draw, shape)((x0, y0, x1, y1), fill=fill)
    return image


def _text_colour(image: Image.Image, box: tuple[int, int, int, int], rng: random.Random) -> tuple[int, int, int]:
    """A colour that stands out against the mean luminance under `box`: dark on light, light on dark."""
    region = np.asarray(image.crop(box), dtype=np.float32)
    luminance = float((region @ np.array([0.299, 0.587, 0.114], dtype=np.float32)).mean())
    level = rng.randint(0, 50) if luminance > 128 else rng.randint(205, 255)
    tint = [min(255, max(0, level + rng.randint(-30, 30))) for _ in range(3)]
    return tint[0], tint[1], tint[2]


def render_scene(seed: int, correct: bool = True) -> Scene:
    """The scene of `seed`: a prompt quoting a phrase, and that phrase (`correct`) or another painted."""
    rng = random.Random(seed)
    right = _phrase(rng)
    painted = right if correct else _wrong_phrase(rng, right)
    prompt = rng.choice(PROMPT_TEMPLATES).format(right)
    image = _background(rng)
    font_name = rng.choice(FONT_FILES)
    angle = rng.uniform(-30, 30) if rng.random() < 0.7 else 0.0
    size = rng.randint(28, 80)
    font = _font(font_name, size)
    while font.getlength(painted) > SIZE * 0.85 and size > 20:  # long phrases shrink to fit the scene
        size -= 4
        font = _font(font_name, size)
    left, top, right_edge, bottom = font.getbbox(painted)
    pad = size // 4
    tile = Image.new("L", (right_edge - left + 2 * pad, bottom - top + 2 * pad), 0)
    ImageDraw.Draw(tile).text((pad - left, pad - top), painted, font=font, fill=255)
    mask = tile.rotate(angle, expand=True, resample=Image.BICUBIC)
    x = rng.randint(0, max(0, SIZE - mask.width))
    y = rng.randint(0, max(0, SIZE - mask.height))
    box = (x, y, x + mask.width, y + mask.height)
    if rng.random() < 0.35:  # a plate behind the text, like a sign
        plate = tuple(rng.randrange(256) for _ in range(3))
        ImageDraw.Draw(image).rectangle(box, fill=plate)
    colour = Image.new("RGB", mask.size, _text_colour(image, box, rng))
    image.paste(colour, (x, y), mask)
    pixels = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).permute(2, 0, 1).contiguous()
    return Scene(pixels, prompt, painted, correct, font_name, size, angle)
