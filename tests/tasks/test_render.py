import math
from collections import Counter, deque

import numpy as np
import pytest
import torch

from spotlight.tasks.render import coverage_mask, render, render_batch
from spotlight.tasks.shapes import COLOURS, all_prompts, parse_prompt

# The renderer's promises, written out rather than imported so that a changed constant fails here:
# sides of 7-11 px stay recognisable at 32x32, and 3 background pixels between objects keep a 3x3
# blur of one object from reaching the next.
SMALLEST, LARGEST, GAP = 7, 11, 3


def lit_components(image: np.ndarray) -> list[tuple[str, tuple[int, int, int, int]]]:
    """(colour, (top, left, bottom, right)) of each 8-connected group of lit pixels, by breadth-first
    search: a second path, independent of the reward's detector. The colour is read from the
    brightest pixel, which a coverage-scaled palette colour keeps exactly."""
    lit = image.max(axis=2) > 0
    seen = np.zeros_like(lit)
    found = []
    for start in zip(*np.nonzero(lit), strict=True):
        if seen[start]:
            continue
        seen[start] = True
        queue, pixels = deque([start]), []
        while queue:
            y, x = queue.popleft()
            pixels.append((y, x))
            for dy in (-1, 0, 1):
                for dx in (-1, 0, 1):
                    ny, nx = y + dy, x + dx
                    if 0 <= ny < lit.shape[0] and 0 <= nx < lit.shape[1] and lit[ny, nx] and not seen[ny, nx]:
                        seen[ny, nx] = True
                        queue.append((ny, nx))
        ys, xs = zip(*pixels, strict=True)
        brightest = max(pixels, key=lambda p: int(image[p].sum()))
        colour = next(name for name, rgb in COLOURS.items() if tuple(image[brightest]) == rgb)
        found.append((colour, (min(ys), min(xs), max(ys), max(xs))))
    return found


@pytest.mark.parametrize("size", [7, 9, 11])
def test_coverage_masks_have_the_areas_of_their_shapes(size):
    assert coverage_mask("square", size).sum() == size * size
    assert coverage_mask("circle", size).sum() == pytest.approx(math.pi * size**2 / 4, rel=0.02)
    assert coverage_mask("triangle", size).sum() == pytest.approx(size**2 / 2, rel=0.02)
    triangle = coverage_mask("triangle", size)
    assert triangle[:, : size // 2].sum() == pytest.approx(triangle[:, ::-1][:, : size // 2].sum())
    assert triangle[-1].sum() > triangle[0].sum()  # points up, base at the bottom


def test_render_is_deterministic_for_a_generator_seed():
    spec = parse_prompt("three green triangles")
    first = render(spec, np.random.default_rng(5))
    assert first.dtype == np.uint8 and first.shape == (32, 32, 3)
    assert np.array_equal(first, render(spec, np.random.default_rng(5)))
    assert not np.array_equal(first, render(spec, np.random.default_rng(6)))


def test_render_draws_exactly_the_objects_of_the_prompt_apart_from_each_other():
    prompts = all_prompts()[::7]  # every kind, 92 prompts
    for index, spec in enumerate(prompts):
        image = render(spec, np.random.default_rng(index))
        found = lit_components(image)
        assert Counter(colour for colour, _ in found) == Counter(
            obj.colour for obj in spec.objects for _ in range(obj.count)
        ), spec.text
        boxes = [box for _, box in found]
        for i, (t1, l1, b1, r1) in enumerate(boxes):
            assert min(t1, l1) >= 1 and max(b1, r1) <= 30, spec.text  # a pixel from the border
            assert SMALLEST - 1 <= max(b1 - t1, r1 - l1) + 1 <= LARGEST, spec.text
            for t2, l2, b2, r2 in boxes[i + 1 :]:
                apart = max(t2 - b1, t1 - b2, l2 - r1, l1 - r2) - 1  # background pixels between
                assert apart >= GAP, spec.text


def test_squares_fill_their_box_with_a_palette_colour():
    image = render(parse_prompt("four blue squares"), np.random.default_rng(0))
    for colour, (top, left, bottom, right) in lit_components(image):
        assert colour == "blue" and bottom - top == right - left
        assert (image[top : bottom + 1, left : right + 1] == COLOURS["blue"]).all()


@pytest.mark.parametrize("relation", ["left of", "right of", "above", "below"])
def test_position_prompts_put_the_first_object_wholly_on_the_relations_side(relation):
    spec = parse_prompt(f"a red circle {relation} a blue triangle")
    for seed in range(20):
        boxes = dict(lit_components(render(spec, np.random.default_rng(seed))))
        (top1, left1, bottom1, right1), (top2, left2, bottom2, right2) = boxes["red"], boxes["blue"]
        apart = {
            "left of": left2 - right1,
            "right of": left1 - right2,
            "above": top2 - bottom1,
            "below": top1 - bottom2,
        }[relation]
        assert apart > GAP


def test_render_batch_is_model_space_and_each_image_depends_only_on_seed_index_and_prompt():
    texts = ["a red circle", "two yellow squares", "a green triangle below a blue circle"]
    batch = render_batch(texts, seed=11)
    assert batch.dtype == torch.float32 and batch.shape == (3, 3, 32, 32)
    assert batch.min() == -1.0 and batch.max() == 1.0
    assert torch.equal(batch, render_batch(texts, seed=11))
    other = render_batch(["four red triangles", *texts[1:]], seed=11)
    assert torch.equal(other[1:], batch[1:]) and not torch.equal(other[0], batch[0])
    assert not torch.equal(render_batch(texts, seed=12), batch)
    expected = render(parse_prompt(texts[1]), np.random.default_rng([11, 1]))
    assert torch.equal(batch[1], torch.from_numpy(expected).permute(2, 0, 1).float() / 127.5 - 1)


def test_render_rejects_images_too_small_for_two_objects():
    with pytest.raises(ValueError, match="size 16"):
        render(parse_prompt("a red circle"), np.random.default_rng(0), size=16)


def test_lattice_layout_puts_each_object_in_its_own_cell_apart_from_the_others():
    lattice = 8
    for index, spec in enumerate(all_prompts()[::11]):
        image = render(spec, np.random.default_rng(index), lattice=lattice)
        found = lit_components(image)
        assert Counter(colour for colour, _ in found) == Counter(
            obj.colour for obj in spec.objects for _ in range(obj.count)
        ), spec.text
        for _, (top, left, bottom, right) in found:
            # side lattice - 1, starting one pixel into its cell: the box never crosses a cell edge
            assert top % lattice == 1 and left % lattice == 1, spec.text
            assert bottom - top + 1 <= lattice - 1 and right - left + 1 <= lattice - 1, spec.text
        boxes = [box for _, box in found]
        for i, (t1, l1, b1, r1) in enumerate(boxes):
            for t2, l2, b2, r2 in boxes[i + 1 :]:
                assert max(t2 - b1, t1 - b2, l2 - r1, l1 - r2) - 1 >= GAP, spec.text
