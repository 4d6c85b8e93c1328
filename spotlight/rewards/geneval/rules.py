"""GenEval's scoring rules over detected objects: pure functions, no model (Ghosh et al. 2023, `evaluate_images.py`).

A prompt's metadata says what a correct image holds: `include` clauses (a class, at least `count`
of it, optionally a `color` and a `position` relative to an earlier clause's objects) joined by AND,
and `exclude` clauses (fewer than `count` of a class) joined by OR. GenEval's constants:

- a detection counts if its confidence is > 0.3, or > 0.9 for prompts tagged `counting`;
- at most 16 detections per class, most confident first; no non-maximum suppression (overlap 1.0);
- colour and position are judged on the `count` most confident objects of the clause's class only;
- position: B is "left of" A when the centres' offset, shrunk on each axis by 0.1 x (sum of the two
  boxes' sizes on that axis) and divided by the unshrunk offset's length, has x < -0.5 (right of:
  x > 0.5; above: y < -0.5; below: y > 0.5, image y pointing down); offsets within the margin are
  no relation at all.

`strict` is GenEval's `correct`. The partial credit (Spotlight's, for a denser RL signal) is the
share of clauses satisfied: an include clause counts when its count, colour and position all hold,
an exclude clause when it is not violated.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

THRESHOLD = 0.3
COUNTING_THRESHOLD = 0.9
MAX_OBJECTS = 16
POSITION_THRESHOLD = 0.1
COLORS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")
TAGS = ("single_object", "two_object", "counting", "colors", "position", "color_attr")


@dataclass(frozen=True)
class Detection:
    """One detected object: its class name, confidence, box (x0, y0, x1, y1) in pixels, and mask (H, W) bool."""

    label: str
    score: float
    box: tuple[float, float, float, float]
    mask: np.ndarray | None = None


@dataclass(frozen=True)
class Verdict:
    """GenEval's answer for one image: correct (strict), the share of clauses met, and why it failed."""

    correct: bool
    partial: float
    reasons: tuple[str, ...]


# ColourOf(class name, objects of that class) -> one colour name (of COLORS) per object
ColourOf = Callable[[str, Sequence[Detection]], list[str]]


def check_metadata(metadata: Mapping[str, Any]) -> None:
    """ValueError in one line if `metadata` is not a GenEval record ({tag, include: [{class, count, ...}]})."""
    if "tag" not in metadata or not isinstance(metadata.get("include"), list):
        raise ValueError(f"GenEval metadata needs 'tag' and an 'include' list (got keys {sorted(metadata)[:6]}); "
                         "use GenEval's evaluation_metadata.jsonl records")
    for clause in [*metadata["include"], *metadata.get("exclude", [])]:
        if "class" not in clause or "count" not in clause:
            raise ValueError(f"GenEval clause {clause} needs 'class' and 'count'")
        if clause.get("color") is not None and clause["color"] not in COLORS:
            raise ValueError(f"GenEval colour {clause['color']!r} is not one of {COLORS}")


def kept_objects(detections: Sequence[Detection], tag: str) -> dict[str, list[Detection]]:
    """Detections above the tag's confidence threshold, per class, most confident first, at most MAX_OBJECTS."""
    threshold = COUNTING_THRESHOLD if tag == "counting" else THRESHOLD
    by_class: dict[str, list[Detection]] = {}
    for detection in sorted(detections, key=lambda d: -d.score):
        if detection.score > threshold and len(by_class.get(detection.label, [])) < MAX_OBJECTS:
            by_class.setdefault(detection.label, []).append(detection)
    return by_class


def relative_position(a: Detection, b: Detection) -> set[str]:
    """Where `a` lies relative to `b`: a subset of {left of, right of, above, below} (module docstring)."""
    box_a, box_b = np.asarray(a.box, dtype=np.float64), np.asarray(b.box, dtype=np.float64)
    centre_a, centre_b = (box_a[:2] + box_a[2:]) / 2, (box_b[:2] + box_b[2:]) / 2
    size_a, size_b = np.abs(box_a[2:] - box_a[:2]), np.abs(box_b[2:] - box_b[:2])
    offset = centre_a - centre_b
    shrunk = np.maximum(np.abs(offset) - POSITION_THRESHOLD * (size_a + size_b), 0) * np.sign(offset)
    if np.all(np.abs(shrunk) < 1e-3):
        return set()
    dx, dy = shrunk / np.linalg.norm(offset)
    relations = set()
    if dx < -0.5:
        relations.add("left of")
    if dx > 0.5:
        relations.add("right of")
    if dy < -0.5:
        relations.add("above")
    if dy > 0.5:
        relations.add("below")
    return relations


def judge(metadata: Mapping[str, Any], objects: Mapping[str, Sequence[Detection]], colour_of: ColourOf) -> Verdict:
    """GenEval's verdict for one image's kept objects (`kept_objects`) against its metadata."""
    reasons: list[str] = []
    met = 0
    matched: list[Sequence[Detection] | None] = []
    for clause in metadata["include"]:
        name, count = clause["class"], int(clause["count"])
        found = list(objects.get(name, []))[:count]
        ok = len(found) >= count
        if not ok:
            reasons.append(f"expected {name}>={count}, found {len(found)}")
        if ok and clause.get("color") is not None:
            colours = colour_of(name, found)
            if colours.count(clause["color"]) < count:
                ok = False
                reasons.append(f"expected {clause['color']} {name}>={count}, found colours {colours}")
        if ok and clause.get("position") is not None:
            relation, target = clause["position"]
            targets = matched[target] if target < len(matched) else None
            if targets is None:
                ok = False
                reasons.append(f"no target for {name} to be {relation}")
            elif not all(relation in relative_position(obj, other) for obj in found for other in targets):
                ok = False
                reasons.append(f"expected {name} {relation} {metadata['include'][target]['class']}")
        matched.append(found if ok else None)
        met += ok
    excludes = metadata.get("exclude", [])
    for clause in excludes:
        present = len(objects.get(clause["class"], []))
        if present >= int(clause["count"]):
            reasons.append(f"expected {clause['class']}<{clause['count']}, found {present}")
        else:
            met += 1
    total = len(metadata["include"]) + len(excludes)
    return Verdict(not reasons, met / total if total else 1.0, tuple(reasons))
