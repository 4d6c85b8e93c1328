"""GenEval's rules, one category at a time, on images drawn so that the right answer is known.

Each test paints coloured rectangles, derives the detections (box, mask) from the painting, and
judges them with GenEval's metadata records. Colours come from a plain nearest-colour rule on the
masked pixels (an independent classifier: the rules take any), so the colour tests exercise GenEval's
crop-and-count logic, not CLIP. Expected verdicts come from GenEval's definitions in its paper and
evaluate_images.py, worked out by hand in each test.
"""

import numpy as np
import pytest

from spotlight.rewards.geneval.rules import (
    COLORS,
    MAX_OBJECTS,
    Detection,
    check_metadata,
    judge,
    kept_objects,
    relative_position,
)

RGB = {"red": (220, 20, 20), "green": (20, 180, 20), "blue": (20, 20, 220), "purple": (128, 0, 160),
       "black": (5, 5, 5), "white": (250, 250, 250), "yellow": (240, 230, 20), "orange": (255, 140, 0),
       "pink": (255, 150, 200), "brown": (120, 70, 20)}
assert set(RGB) == set(COLORS)


class Canvas:
    """A 256x256 grey image; `paint` adds a rectangle of a colour and returns its detection."""

    def __init__(self) -> None:
        self.pixels = np.full((256, 256, 3), 128, dtype=np.uint8)

    def paint(self, label: str, box: tuple[int, int, int, int], colour: str = "red", score: float = 0.95) -> Detection:
        x0, y0, x1, y1 = box
        self.pixels[y0 : y1 + 1, x0 : x1 + 1] = RGB[colour]
        mask = np.zeros((256, 256), dtype=bool)
        mask[y0 : y1 + 1, x0 : x1 + 1] = True
        return Detection(label, score, (float(x0), float(y0), float(x1), float(y1)), mask)

    def colour_of(self, name: str, objects) -> list[str]:
        names = list(RGB)
        refs = np.array([RGB[n] for n in names], dtype=np.float64)
        means = [self.pixels[obj.mask].reshape(-1, 3).mean(axis=0) for obj in objects]
        return [names[int(np.argmin(((refs - m) ** 2).sum(axis=1)))] for m in means]


def verdict(canvas: Canvas, detections: list[Detection], metadata: dict):
    check_metadata(metadata)
    return judge(metadata, kept_objects(detections, metadata["tag"]), canvas.colour_of)


def test_single_object_needs_one_detection_above_0_3():
    meta = {"tag": "single_object", "include": [{"class": "bench", "count": 1}], "prompt": "a photo of a bench"}
    canvas = Canvas()
    assert verdict(canvas, [canvas.paint("bench", (10, 10, 60, 60), score=0.31)], meta).correct
    result = verdict(canvas, [canvas.paint("bench", (10, 10, 60, 60), score=0.3)], meta)  # GenEval: strictly above
    assert not result.correct and result.partial == 0.0
    assert not verdict(canvas, [canvas.paint("cat", (10, 10, 60, 60))], meta).correct


def test_two_objects_need_both_and_earn_half_credit_for_one():
    meta = {"tag": "two_object", "include": [{"class": "bench", "count": 1}, {"class": "sports ball", "count": 1}]}
    canvas = Canvas()
    bench, ball = canvas.paint("bench", (10, 10, 100, 60)), canvas.paint("sports ball", (150, 150, 180, 180))
    assert verdict(canvas, [bench, ball], meta).correct
    one = verdict(canvas, [bench], meta)
    assert not one.correct and one.partial == pytest.approx(0.5)
    assert "sports ball>=1, found 0" in one.reasons[0]


def test_counting_uses_the_0_9_threshold_and_the_exclude_clause():
    meta = {"tag": "counting", "include": [{"class": "pizza", "count": 3}], "exclude": [{"class": "pizza", "count": 4}]}
    canvas = Canvas()
    pizzas = [canvas.paint("pizza", (10 + 60 * i, 10, 50 + 60 * i, 50), score=0.95) for i in range(4)]
    assert verdict(canvas, pizzas[:3], meta).correct
    four = verdict(canvas, pizzas, meta)  # 4 >= 4: the exclude clause fails, the include clause holds
    assert not four.correct and four.partial == pytest.approx(0.5)
    weak = [*pizzas[:2], canvas.paint("pizza", (10, 100, 50, 140), score=0.85)]  # 0.85 counts elsewhere, not here
    assert not verdict(canvas, weak, meta).correct
    single = {"tag": "single_object", "include": [{"class": "pizza", "count": 1}]}
    assert verdict(canvas, weak[2:], single).correct


def test_colors_judge_the_most_confident_object_only():
    meta = {"tag": "colors", "include": [{"class": "clock", "count": 1, "color": "green"}]}
    canvas = Canvas()
    green = canvas.paint("clock", (10, 10, 80, 80), "green", score=0.9)
    red = canvas.paint("clock", (120, 120, 200, 200), "red", score=0.5)
    assert verdict(canvas, [green, red], meta).correct
    canvas = Canvas()
    green = canvas.paint("clock", (10, 10, 80, 80), "green", score=0.5)
    red = canvas.paint("clock", (120, 120, 200, 200), "red", score=0.9)  # the red one is judged
    result = verdict(canvas, [green, red], meta)
    assert not result.correct and "expected green clock" in result.reasons[0]


def test_position_uses_centre_offsets_shrunk_by_a_tenth_of_the_sizes():
    # B left of A: centres 100 px apart on x, boxes 20 px wide: shrunk offset 100 - 0.1*(20+20) = 96 -> dx -0.96
    a, b = Detection("couch", 0.9, (150, 100, 170, 120)), Detection("bird", 0.9, (50, 100, 70, 120))
    assert relative_position(b, a) == {"left of"}
    assert relative_position(a, b) == {"right of"}
    # straight above (y down): dy = -(100 - 4) / 100
    above = Detection("bird", 0.9, (150, 0, 170, 20))
    assert relative_position(above, a) == {"above"}
    # a 45-degree diagonal is both left of and above (|dx| = |dy| ~ 0.68 > 0.5)
    assert relative_position(Detection("bird", 0.9, (50, 0, 70, 20)), a) == {"left of", "above"}
    # overlapping boxes whose centres differ by less than the margin have no relation at all
    assert relative_position(Detection("bird", 0.9, (152, 100, 172, 120)), a) == set()
    meta = {"tag": "position", "include": [{"class": "couch", "count": 1},
                                           {"class": "bird", "count": 1, "position": ["left of", 0]}]}
    canvas = Canvas()
    couch, bird = canvas.paint("couch", (150, 100, 170, 120)), canvas.paint("bird", (50, 100, 70, 120))
    assert verdict(canvas, [couch, bird], meta).correct
    wrong = verdict(canvas, [couch, canvas.paint("bird", (200, 100, 220, 120))], meta)
    assert not wrong.correct and wrong.partial == pytest.approx(0.5)
    missing = verdict(canvas, [bird], meta)  # no couch: no target for the bird
    assert not missing.correct and any("no target" in r for r in missing.reasons)


def test_color_attribution_binds_each_colour_to_its_object():
    meta = {"tag": "color_attr", "include": [{"class": "tennis racket", "count": 1, "color": "purple"},
                                             {"class": "sink", "count": 1, "color": "black"}]}
    canvas = Canvas()
    ok = [canvas.paint("tennis racket", (10, 10, 80, 80), "purple"),
          canvas.paint("sink", (120, 120, 200, 200), "black")]
    assert verdict(canvas, ok, meta).correct
    canvas = Canvas()
    swapped = [canvas.paint("tennis racket", (10, 10, 80, 80), "black"),
               canvas.paint("sink", (120, 120, 200, 200), "purple")]
    result = verdict(canvas, swapped, meta)
    assert not result.correct and result.partial == 0.0


def test_at_most_16_objects_per_class_are_kept_most_confident_first():
    detections = [Detection("cup", 0.31 + i / 100, (i, i, i + 5, i + 5)) for i in range(20)]
    kept = kept_objects(detections, "single_object")["cup"]
    assert len(kept) == MAX_OBJECTS
    assert [d.score for d in kept] == sorted((d.score for d in detections), reverse=True)[:MAX_OBJECTS]


def test_metadata_without_tag_or_include_is_refused_in_one_line():
    with pytest.raises(ValueError, match="needs 'tag' and an 'include' list"):
        check_metadata({"prompt": "a photo of a cat"})
    with pytest.raises(ValueError, match="colour 'teal'"):
        check_metadata({"tag": "colors", "include": [{"class": "cat", "count": 1, "color": "teal"}]})
