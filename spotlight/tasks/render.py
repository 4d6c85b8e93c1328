"""The renderer: images that show exactly what a prompt of the shapes task describes.

It makes the pre-training data of the base models and the reference images that the reward is
checked against. Objects are drawn from anti-aliased coverage masks on a black background (black
carries no hue, so an object's blurred edge keeps its colour's hue and the background never looks
like an object), never overlap, keep a gap between their boxes, and satisfy a position relation with
a clear margin.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import numpy as np
import torch

from spotlight.tasks.shapes import COLOURS, PromptSpec, parse_prompt

MIN_OBJECT_SIZE = 7  # px: below this a triangle's apex and a circle's curve vanish at 32x32
MAX_OBJECT_SIZE = 11  # px: four objects of this size with gaps still fit a 32x32 image
GAP = 3  # px between object boxes: a 3x3 blur of one object never reaches the next
BORDER = 1  # px from the image edge, so that a blur does not clip an object
_SUPERSAMPLING = 8  # sub-pixels per pixel side for the coverage masks
_PLACEMENT_TRIES = 64  # candidate places per object before the whole layout is drawn again
_LAYOUT_TRIES = 1000  # whole layouts before giving up (four objects at 32x32 need ~1.3 on average)


@cache
def coverage_mask(shape: str, size: int) -> np.ndarray:
    """The fraction of each pixel that a shape of `size` px covers, float32 (size, size) in [0, 1].

    The shape fills its box: a square is the box, a circle is inscribed in it, and a triangle points
    up with its base on the bottom edge (base = height = size). Coverage is measured on an 8x8
    sub-pixel grid, which anti-aliases the edges; results are cached (there are 15 masks).
    """
    samples = (np.arange(size * _SUPERSAMPLING) + 0.5) / _SUPERSAMPLING
    x = samples[None, :]
    y = samples[:, None]
    half = size / 2
    if shape == "square":
        inside = np.ones((samples.size, samples.size), dtype=bool)
    elif shape == "circle":
        inside = (x - half) ** 2 + (y - half) ** 2 <= half**2
    elif shape == "triangle":
        inside = y >= 2 * np.abs(x - half)
    else:
        raise ValueError(f"unknown shape {shape!r}; use one of circle, square, triangle")
    blocks = inside.reshape(size, _SUPERSAMPLING, size, _SUPERSAMPLING)
    mask = blocks.mean(axis=(1, 3), dtype=np.float32)
    mask.setflags(write=False)
    return mask


def _relation_holds(
    relation: str, first: tuple[int, int, int], x: np.ndarray, y: np.ndarray, side: np.ndarray
) -> np.ndarray:
    """Which candidate boxes (x, y, side) have box `first` (x, y, side) wholly on the `relation` side.

    Boxes apart in projection put the centres at least 7 + GAP px apart along the relation's axis,
    far above the reward's margin; the other axis is left free. Returns bool (n,).
    """
    x1, y1, s1 = first
    if relation == "left of":
        return x1 + s1 + GAP <= x
    if relation == "right of":
        return x + side + GAP <= x1
    if relation == "above":
        return y1 + s1 + GAP <= y
    if relation == "below":
        return y + side + GAP <= y1
    raise ValueError(f"unknown relation {relation!r}")


def _apart(box: tuple[int, int, int], x: np.ndarray, y: np.ndarray, side: np.ndarray) -> np.ndarray:
    """Which candidate boxes keep at least GAP px from `box` along some axis; bool (n,)."""
    xb, yb, sb = box
    return (x + side + GAP <= xb) | (xb + sb + GAP <= x) | (y + side + GAP <= yb) | (yb + sb + GAP <= y)


def _candidates(rng: np.random.Generator, size: int, lattice: int | None) -> tuple[np.ndarray, ...]:
    """Candidate (x, y, side) arrays: free placement, or cells of a ``lattice``-px grid."""
    if lattice is None:
        largest = min(MAX_OBJECT_SIZE, size - 2 * BORDER)
        side = rng.integers(MIN_OBJECT_SIZE, largest + 1, size=_PLACEMENT_TRIES)
        room = size - 2 * BORDER - side + 1  # positions where the object fits
        x = BORDER + (rng.random(_PLACEMENT_TRIES) * room).astype(np.int64)
        y = BORDER + (rng.random(_PLACEMENT_TRIES) * room).astype(np.int64)
        return x, y, side
    cells = size // lattice
    order = rng.permutation(cells * cells)  # every cell once, so a free cell is never missed
    x = BORDER + lattice * (order % cells)
    y = BORDER + lattice * (order // cells)
    return x, y, np.full(order.size, lattice - BORDER)


def _layout(
    spec: PromptSpec, rng: np.random.Generator, size: int, lattice: int | None = None
) -> list[tuple[str, str, int, int, int]]:
    """Draw (colour, shape, x, y, object size) for every object the prompt asks for.

    Rejection sampling, vectorised: each object draws a batch of candidate sizes and positions and
    takes the first that keeps its gap to the objects already placed (and, for the second object of
    a position prompt, satisfies the relation). If none does, the whole layout is drawn again, since
    earlier objects may block every place. With ``lattice`` set, objects of side ``lattice - 1`` sit
    in the cells of a grid (see :func:`render`).
    """
    wanted = [(obj.colour, obj.shape) for obj in spec.objects for _ in range(obj.count)]
    for _ in range(_LAYOUT_TRIES):
        placed: list[tuple[str, str, int, int, int]] = []
        for colour, shape in wanted:
            x, y, side = _candidates(rng, size, lattice)
            ok = np.ones(x.size, dtype=bool)
            for other in placed:
                ok &= _apart(other[2:], x, y, side)
            if spec.relation is not None and placed:
                ok &= _relation_holds(spec.relation, placed[0][2:], x, y, side)
            if not ok.any():
                break
            pick = int(np.argmax(ok))
            placed.append((colour, shape, int(x[pick]), int(y[pick]), int(side[pick])))
        if len(placed) == len(wanted):
            return placed
    raise RuntimeError(f"found no layout for {spec.text!r} on a {size}x{size} image; use a larger size")


def render(spec: PromptSpec, rng: np.random.Generator, size: int = 32, lattice: int | None = None) -> np.ndarray:
    """Draw exactly the objects of `spec` on black, uint8 (size, size, 3).

    Object sides are uniform in [7, 11] px, positions uniform where they fit; `rng` decides both.
    For a position prompt, objects[0] is on the relation's side of objects[1] with their boxes apart
    along that axis (the other axis is free).

    ``lattice`` (e.g. 8) instead puts each object, of side ``lattice - 1``, in a cell of a
    ``size/lattice`` grid, still with the gap between boxes (so objects never sit in neighbouring
    cells). This is the base models' pre-training layout: aligned with an 8-px patch DiT, a
    1-3 M-parameter model learns counts and relations within a CPU budget, while the reward judges the
    images exactly as it judges free placements.
    """
    if size < MIN_OBJECT_SIZE * 2 + GAP + 2 * BORDER:
        raise ValueError(f"image size {size} is too small for the shapes task; use size >= 24")
    image = np.zeros((size, size, 3), dtype=np.float32)
    for colour, shape, x, y, side in _layout(spec, rng, size, lattice):
        mask = coverage_mask(shape, side)
        image[y : y + side, x : x + side] = mask[:, :, None] * np.asarray(COLOURS[colour], dtype=np.float32)
    return np.rint(image).astype(np.uint8)


def render_batch(texts: Sequence[str], seed: int, size: int = 32, lattice: int | None = None) -> torch.Tensor:
    """Render one image per prompt text, in model space: float32 (B, 3, size, size) in [-1, 1].

    Image i uses its own generator keyed by (seed, i), so it depends only on the seed, its index and
    its prompt, never on the other prompts of the batch.
    """
    images = np.empty((len(texts), size, size, 3), dtype=np.uint8)
    for index, text in enumerate(texts):
        images[index] = render(parse_prompt(text), np.random.default_rng([seed, index]), size, lattice)
    batch = torch.from_numpy(images).permute(0, 3, 1, 2).float()
    return batch / 127.5 - 1.0
