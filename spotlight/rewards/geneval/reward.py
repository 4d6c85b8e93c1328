"""A GenEval-style compositional reward for the shapes task: detect objects, then check the prompt.

GenEval judges an image by detecting objects and checking the prompt's counts, colours and relative
positions. Here the objects are flat coloured shapes on black, so a pixel classifier and connected
components replace the object detector, which makes the reward exact on rendered images, fast on a
CPU, and hard to game: only blobs that look like one of the task's shapes earn credit, and every
blob that is not asked for costs credit.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from spotlight.rewards.base import RewardOutput
from spotlight.tasks.shapes import COLOURS, PromptSpec, parse_prompt

MIN_BRIGHTNESS = 0.5  # an object pixel is at least half as bright as the palette: half coverage
MIN_SATURATION = 0.5  # chroma / brightness; grey and white mush is background
MIN_AREA = 12  # px; the smallest rendered object (a blurred 7 px triangle) has ~22
# A blob's shape is measured on its pixels and the background within FRINGE_WIDTH px of them, whose
# faint blurred edge carries shape too; brightness below FRINGE_FLOOR there is noise, not edge.
FRINGE_WIDTH = 2  # px; objects are GAP = 3 px apart, so rings of neighbours share at most one pixel
FRINGE_FLOOR = 0.2
MIN_FILL = 0.45  # of its box; below this a blob is "unknown" (a triangle fills 1/2)
TRIANGLE_SKEW = 0.15  # |vertical skewness| that makes a blob a triangle (ideal -0.57, blurred ~-0.3)
MAX_SIDE_SKEW = 0.3  # horizontal skewness beyond which a blob is "unknown" (every shape has 0)
SQUARE_KURTOSIS_GAP = 0.18  # diagonal minus axis kurtosis: square 0.6 (~0.4 blurred), circle 0
DIAMOND_KURTOSIS_GAP = -0.28  # diamond -0.6 (~-0.33 blurred); a pixelated 7 px circle has -0.23
RELATION_MARGIN = 0.1  # of the image side: centres closer than this along an axis are "level"

_PALETTE_NAMES: tuple[str, ...] = tuple(COLOURS)
# Palette chromaticities: colour / max channel. A blurred edge is colour * coverage, so dividing a
# pixel by its max channel recovers its palette colour whatever the coverage.
_PALETTE = np.array([COLOURS[name] for name in _PALETTE_NAMES], dtype=np.float32) / 255.0


@dataclass(frozen=True)
class Detection:
    """One object found in an image.

    colour: a palette colour name; shape: "circle", "square", "triangle" or "unknown" (a blob that
    fits no shape); cx, cy: centroid in pixels (x right, y down); area: pixels.
    """

    colour: str
    shape: str
    cx: float
    cy: float
    area: int


def _as_unit_images(images: np.ndarray) -> np.ndarray:
    """Images as float32 (..., H, W, 3) in [0, 1]: uint8 is divided by 255, floats are clipped."""
    array = np.asarray(images)
    if array.ndim < 3 or array.shape[-1] != 3:
        raise ValueError(f"expected images (..., H, W, 3) (got shape {array.shape}); transpose CHW images")
    if array.dtype == np.uint8:
        return array.astype(np.float32) / 255.0
    if not np.issubdtype(array.dtype, np.floating):
        raise ValueError(f"expected uint8 or float pixels (got {array.dtype})")
    if not np.isfinite(array).all():
        raise ValueError("got an image with NaN or infinite pixels; check the generator's output")
    return np.clip(array, 0.0, 1.0).astype(np.float32)


def classify_pixels(images: np.ndarray) -> np.ndarray:
    """The palette colour index of each pixel, or -1 for background; int64 (..., H, W).

    `images` (..., H, W, 3), uint8 or float in [0, 1]. Background: brightness (max channel) below
    MIN_BRIGHTNESS or saturation below MIN_SATURATION. Other pixels take the palette colour nearest to
    their chromaticity (pixel / max channel).
    """
    unit = _as_unit_images(images)
    red, green, blue = unit[..., 0], unit[..., 1], unit[..., 2]
    # Element-wise over channel planes: numpy reduces a length-3 last axis far more slowly.
    brightness = np.maximum(np.maximum(red, green), blue)
    saturation = (brightness - np.minimum(np.minimum(red, green), blue)) / np.maximum(brightness, 1e-6)
    chromaticity = unit / np.maximum(brightness, 1e-6)[..., None]
    # |c - p|^2 = |c|^2 - 2 c.p + |p|^2, and |c|^2 is the same for every palette colour p.
    distances = (_PALETTE**2).sum(axis=1) - 2 * chromaticity @ _PALETTE.T
    foreground = (brightness >= MIN_BRIGHTNESS) & (saturation >= MIN_SATURATION)
    return np.where(foreground, distances.argmin(axis=-1), -1)


def label_components(classes: np.ndarray) -> np.ndarray:
    """Connected components (4-neighbour) of equal non-negative classes in each (H, W) plane.

    `classes` int (..., H, W), -1 for background. Returns int64 (..., H, W): each pixel gets the
    smallest flat index (into the whole array) of its component, so labels are unique across a
    batch; background gets -1. Labels spread by taking the minimum over same-class neighbours, with
    pointer jumping (a pixel adopts its label's label) so that the number of rounds grows with the
    log of a component's diameter, not linearly.
    """
    foreground = classes >= 0
    same_right = foreground[..., :, :-1] & (classes[..., :, :-1] == classes[..., :, 1:])
    same_down = foreground[..., :-1, :] & (classes[..., :-1, :] == classes[..., 1:, :])
    outside = classes.size
    labels = np.where(foreground, np.arange(outside).reshape(classes.shape), outside)
    while True:
        spread = labels.copy()
        for same, here, there in (
            (same_right, (..., slice(None), slice(None, -1)), (..., slice(None), slice(1, None))),
            (same_down, (..., slice(None, -1), slice(None)), (..., slice(1, None), slice(None))),
        ):
            np.minimum(spread[here], np.where(same, labels[there], outside), out=spread[here])
            np.minimum(spread[there], np.where(same, labels[here], outside), out=spread[there])
        flat = np.append(spread.ravel(), outside)
        spread = np.where(foreground, flat[spread], outside)
        if np.array_equal(spread, labels):
            return np.where(foreground, labels, -1)
        labels = spread


def classify_shapes(
    fill: np.ndarray,
    variance_ratio: np.ndarray,
    skew_x: np.ndarray,
    skew_y: np.ndarray,
    kurtosis_gap: np.ndarray,
) -> np.ndarray:
    """The shape name of each blob from its geometry; str array (n,) of circle/square/triangle/unknown.

    All inputs are float (n,). `fill` is the blob's pixel count over its box area; the others are
    moments of its brightness mass (`_blob_moments`): var_y / var_x, the skewness along x and
    along y (y down), and the diagonal minus the axis kurtosis.
    - An upright triangle's mass grows linearly towards its base: skew_y = -2*sqrt(2)/5 = -0.57
      (~-0.3 after a 3x3 blur); circles and squares are symmetric (0).
    - A square's side profile is flat (kurtosis 1.8) and its diagonal profile a tent (2.4): gap +0.6
      (~+0.4 blurred); a disc's profile is the same in every direction: gap 0; a diamond (a square
      turned 45 degrees, no shape of the task) has -0.6.
    A blob with a diamond's gap, skewed sideways or downwards, stretched (variance ratio outside
    [0.6, 2]; a triangle's is 4/3, a circle's and a square's 1), or filling less than 45% of its box
    (a triangle fills 1/2) is "unknown". NaN moments (a blob of zero width) also give "unknown".
    """
    plausible = (
        (fill >= MIN_FILL)
        & (variance_ratio >= 0.6)
        & (variance_ratio <= 2.0)
        & (np.abs(skew_x) <= MAX_SIDE_SKEW)
        & (skew_y < TRIANGLE_SKEW)
        & (kurtosis_gap > DIAMOND_KURTOSIS_GAP)
    )
    triangle = plausible & (skew_y <= -TRIANGLE_SKEW)
    square = plausible & ~triangle & (kurtosis_gap >= SQUARE_KURTOSIS_GAP)
    circle = plausible & ~triangle & ~square
    names = np.full(fill.shape, "unknown", dtype=object)
    names[triangle], names[square], names[circle] = "triangle", "square", "circle"
    return names


def _per_blob(ids: np.ndarray, values: np.ndarray, count: int) -> np.ndarray:
    return np.bincount(ids, weights=values, minlength=count)


def _blob_moments(region: np.ndarray, mass: np.ndarray, count: int) -> dict[str, np.ndarray]:
    """Moments of each blob's brightness mass; float (count,) arrays keyed by name.

    `region` int (B, H, W): the blob each pixel's mass belongs to, -1 for none; `mass` float
    (B, H, W). Shape measures are read from the mass, not from the thresholded pixels, because a
    symmetric blur keeps the mass's centroid and third moments and only adds variance, while a
    threshold on a blurred, noisy edge flips pixels at random (a blurred 7 px triangle thresholds to
    a near-square 5x5 blob).
    """
    inside = region >= 0
    ids = region[inside]
    weights = mass[inside].astype(np.float64)
    y, x = (coordinate[inside].astype(np.float64) for coordinate in np.indices(region.shape)[1:])
    total = _per_blob(ids, weights, count)
    dy = y - _per_blob(ids, weights * y, count)[ids] / total[ids]
    dx = x - _per_blob(ids, weights * x, count)[ids] / total[ids]

    def central(values: np.ndarray) -> np.ndarray:
        return _per_blob(ids, weights * values, count) / total

    diagonal, antidiagonal = (dx + dy) / np.sqrt(2), (dx - dy) / np.sqrt(2)
    with np.errstate(divide="ignore", invalid="ignore"):
        var_y, var_x = central(dy**2), central(dx**2)
        axis_kurtosis = (central(dy**4) / var_y**2 + central(dx**4) / var_x**2) / 2
        diagonal_kurtosis = (
            central(diagonal**4) / central(diagonal**2) ** 2
            + central(antidiagonal**4) / central(antidiagonal**2) ** 2
        ) / 2
        return {
            "variance_ratio": var_y / var_x,
            "skew_y": central(dy**3) / var_y**1.5,
            "skew_x": central(dx**3) / var_x**1.5,
            "kurtosis_gap": diagonal_kurtosis - axis_kurtosis,
        }


def _fringe_regions(blob: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """The blob whose shape each pixel's brightness counts for; int64 (B, H, W), -1 for none.

    A blob pixel counts for its blob; a background pixel within FRINGE_WIDTH px (chessboard distance)
    of a blob counts for it (for the highest-numbered one if two are that close); pixels of dropped
    small blobs count for none.
    """
    height, width = blob.shape[1:]
    r = FRINGE_WIDTH
    padded = np.pad(blob, ((0, 0), (r, r), (r, r)), constant_values=-1)
    nearby = blob.copy()
    for dy in range(2 * r + 1):
        for dx in range(2 * r + 1):
            np.maximum(nearby, padded[:, dy : dy + height, dx : dx + width], out=nearby)
    return np.where(blob >= 0, blob, np.where(classes < 0, nearby, -1))


def detect_batch(images: np.ndarray) -> list[list[Detection]]:
    """The objects in each image of a batch (B, H, W, 3), uint8 or float in [0, 1].

    Returns B lists of Detection, each in raster order of the objects' first pixels. Pixels are
    classified to the palette (`classify_pixels`), same-colour pixels grouped into 4-connected blobs
    (`label_components`), blobs smaller than MIN_AREA dropped as noise, and each blob gets a shape
    (`classify_shapes`) from the brightness of its pixels and of the background around them
    (`_fringe_regions`). Vectorised over the batch, since the RL loop scores thousands of images per
    iteration.
    """
    unit = _as_unit_images(images)
    if unit.ndim != 4:
        raise ValueError(f"detect_batch expects images (B, H, W, 3) (got shape {unit.shape}); use detect")
    batch, height, width = unit.shape[:3]
    classes = classify_pixels(unit)
    labels = label_components(classes).ravel()
    members = np.flatnonzero(labels >= 0)
    roots, inverse, areas = np.unique(labels[members], return_inverse=True, return_counts=True)
    kept = areas >= MIN_AREA
    count = int(kept.sum())
    renumbered = np.where(kept, np.cumsum(kept) - 1, -1)
    blob = np.full(labels.size, -1)
    blob[members] = renumbered[inverse]
    blob = blob.reshape(batch, height, width)

    region = _fringe_regions(blob, classes)
    brightness = np.maximum(np.maximum(unit[..., 0], unit[..., 1]), unit[..., 2])
    mass = np.clip(brightness - FRINGE_FLOOR, 0.0, None)
    moments = _blob_moments(region, mass, count)

    in_blob = blob >= 0
    ids = blob[in_blob]
    image_index, rows, columns = (axis[in_blob] for axis in np.indices(blob.shape))
    area = np.bincount(ids, minlength=count)
    top, left = np.full(count, height), np.full(count, width)
    bottom, right = np.full(count, -1), np.full(count, -1)
    np.minimum.at(top, ids, rows)
    np.maximum.at(bottom, ids, rows)
    np.minimum.at(left, ids, columns)
    np.maximum.at(right, ids, columns)
    fill = area / ((bottom - top + 1) * (right - left + 1))
    shapes = classify_shapes(fill, **moments)
    cx = _per_blob(ids, columns, count) / area
    cy = _per_blob(ids, rows, count) / area
    owner = np.zeros(count, dtype=np.int64)
    owner[ids] = image_index
    colour = np.zeros(count, dtype=np.int64)
    colour[ids] = classes[in_blob]

    detections: list[list[Detection]] = [[] for _ in range(batch)]
    for k in range(count):  # blobs are numbered in raster order of their first pixel
        detections[owner[k]].append(
            Detection(_PALETTE_NAMES[colour[k]], str(shapes[k]), float(cx[k]), float(cy[k]), int(area[k]))
        )
    return detections


def detect(image: np.ndarray) -> list[Detection]:
    """The objects in one image (H, W, 3), uint8 or float in [0, 1]; see `detect_batch`."""
    array = np.asarray(image)
    if array.ndim != 3:
        raise ValueError(f"detect expects one image (H, W, 3) (got shape {array.shape}); use detect_batch")
    return detect_batch(array[None])[0]


def relation_holds(relation: str, first: Detection, second: Detection, image_size: int) -> bool:
    """Whether `first` is `relation` (left of / right of / above / below) `second`.

    Compares centroids along the relation's axis with a margin of RELATION_MARGIN * image_size, as
    GenEval does; the other axis is free, so "left of" also holds when one object is a bit higher.
    """
    margin = RELATION_MARGIN * image_size
    if relation == "left of":
        return first.cx + margin < second.cx
    if relation == "right of":
        return first.cx > second.cx + margin
    if relation == "above":
        return first.cy + margin < second.cy
    if relation == "below":
        return first.cy > second.cy + margin
    raise ValueError(f"unknown relation {relation!r}; use left of, right of, above or below")


@dataclass(frozen=True)
class Judgement:
    """How an image meets its prompt: the credits (each in [0, 1]), the reward and strict correctness."""

    credits: dict[str, float]
    reward: float
    strict: bool


def _matched(required: Counter, found: Counter, detected: int) -> float:
    """(matched - surplus) / required, floored at 0: a missing and an extra item cost the same.

    ``detected`` counts every detection, unknown blobs included, so a blob that matches nothing is
    surplus. Dividing matches by max(required, detected) instead made drawing one too many pay more
    than one too few (asked 3: 4 drawn 0.75, 2 drawn 0.67), and RL learnt to over-draw every count.
    """
    matched = sum(min(count, found[key]) for key, count in required.items())
    surplus = detected - matched
    return max(0.0, matched - surplus) / sum(required.values())


def judge(spec: PromptSpec, detections: Sequence[Detection], image_size: int) -> Judgement:
    """Score detections against a prompt with GenEval-style partial credit.

    Credits, each (matched - surplus) / required (`_matched`), so that an object not asked for (an
    extra one or an "unknown" blob) costs exactly as much as a missing one:
    - objects: (colour, shape) pairs with their counts;
    - colour and shape: the same on colours alone and shapes alone (unknown blobs match neither);
    - relation (position prompts): the fraction of (first, second) object pairs that satisfy it.
    The reward is the mean credit; it is 1 exactly when the image is strictly correct: the detected
    objects are the prompt's multiset and the relation holds.
    """
    required = [(obj.colour, obj.shape) for obj in spec.objects for _ in range(obj.count)]
    known = [(found.colour, found.shape) for found in detections if found.shape != "unknown"]
    detected = len(detections)
    credits = {
        "objects": _matched(Counter(required), Counter(known), detected),
        "colour": _matched(Counter(c for c, _ in required), Counter(c for c, _ in known), detected),
        "shape": _matched(Counter(s for _, s in required), Counter(s for _, s in known), detected),
    }
    if spec.relation is not None:
        first, second = spec.objects
        firsts = [d for d in detections if (d.colour, d.shape) == (first.colour, first.shape)]
        seconds = [d for d in detections if (d.colour, d.shape) == (second.colour, second.shape)]
        pairs = [(a, b) for a in firsts for b in seconds]
        holding = sum(relation_holds(spec.relation, a, b, image_size) for a, b in pairs)
        credits["relation"] = holding / len(pairs) if pairs else 0.0
    strict = all(credit == 1.0 for credit in credits.values())
    reward = 1.0 if strict else sum(credits.values()) / len(credits)
    return Judgement(credits, reward, strict)


class GenEvalReward:
    """The compositional reward of the shapes task (implements `spotlight.rewards.base.Reward`).

    ``strict_weight`` w mixes the strict flag into the reward: ``(1 - w) * partial + w * strict``.
    Partial credit alone (w = 0) rewards near misses; measured on the shapes base model, GRPO on it
    turned "too few objects" (188 of 320 validation samples) into "too many" (168 of 320) and raised
    the partial reward while strict accuracy fell. Weighting the exact answer fixes the incentive.
    """

    name = "geneval"

    def __init__(self, strict_weight: float = 0.0) -> None:
        if not 0.0 <= strict_weight <= 1.0:
            raise ValueError(f"reward.strict_weight must be in [0, 1] (got {strict_weight})")
        self.strict_weight = strict_weight

    def score(self, images: torch.Tensor, prompts: Sequence[str]) -> RewardOutput:
        """Rewards for images float (B, 3, H, W) in [0, 1] (values outside are clipped) and B prompts.

        Returns RewardOutput with rewards in [0, 1] (B,), strict (B,) and valid all True. Raises
        ValueError on a prompt outside the task's grammar, a wrong image shape or non-finite pixels;
        `guarded_score` turns such a raise into one invalid sample.
        """
        if images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(f"images must be (B, 3, H, W) (got {tuple(images.shape)})")
        if images.shape[0] != len(prompts):
            raise ValueError(f"got {images.shape[0]} images but {len(prompts)} prompts; pass one per image")
        specs = [parse_prompt(prompt) for prompt in prompts]
        pixels = images.detach().float().cpu().permute(0, 2, 3, 1).numpy()
        rewards = torch.zeros(len(prompts), dtype=torch.float32)
        strict = torch.zeros(len(prompts), dtype=torch.bool)
        for index, (spec, found) in enumerate(zip(specs, detect_batch(pixels), strict=True)):
            judgement = judge(spec, found, image_size=pixels.shape[2])
            rewards[index] = (1.0 - self.strict_weight) * judgement.reward + self.strict_weight * judgement.strict
            strict[index] = judgement.strict
        return RewardOutput(rewards, strict, torch.ones(len(prompts), dtype=torch.bool))
