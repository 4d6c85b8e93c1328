import numpy as np
import pytest
import torch

from spotlight.rewards.base import guarded_score
from spotlight.rewards.geneval.reward import (
    Detection,
    GenEvalReward,
    classify_pixels,
    detect,
    detect_batch,
    judge,
    label_components,
    relation_holds,
)
from spotlight.tasks.render import render_batch
from spotlight.tasks.shapes import COLOURS, parse_prompt, train_val_split


def draw(image: np.ndarray, colour: str, shape: str, left: int, top: int, side: int) -> np.ndarray:
    """Draw a hard-edged shape in the box (left, top, side) by testing pixel centres: a second
    drawing path, independent of the renderer's anti-aliased masks."""
    y, x = np.mgrid[: image.shape[0], : image.shape[1]] + 0.5
    u, v = x - left, y - top  # box coordinates
    inside = {
        "square": (u >= 0) & (u <= side) & (v >= 0) & (v <= side),
        "circle": (u - side / 2) ** 2 + (v - side / 2) ** 2 <= (side / 2) ** 2,
        "triangle": (v <= side) & (v >= 2 * np.abs(u - side / 2)),
        "inverted_triangle": (v >= 0) & (side - v >= 2 * np.abs(u - side / 2)),
        "diamond": np.abs(u - side / 2) + np.abs(v - side / 2) <= side / 2,
    }[shape]
    image[inside] = COLOURS[colour]
    return image


def blank(size: int = 32) -> np.ndarray:
    return np.zeros((size, size, 3), dtype=np.uint8)


def box_blur(image: np.ndarray) -> np.ndarray:
    """3x3 box blur of a float image, edges replicated."""
    padded = np.pad(image.astype(np.float32) / 255, ((1, 1), (1, 1), (0, 0)), mode="edge")
    h, w = image.shape[:2]
    return sum(padded[dy : dy + h, dx : dx + w] for dy in range(3) for dx in range(3)) / 9


def detection(colour: str, shape: str, cx: float = 16.0, cy: float = 16.0) -> Detection:
    return Detection(colour, shape, cx, cy, area=50)


@pytest.mark.parametrize("shape", ["circle", "square", "triangle"])
@pytest.mark.parametrize("colour", list(COLOURS))
@pytest.mark.parametrize("side", [7, 10])
def test_detect_names_colour_and_shape_of_a_hand_drawn_object(shape, colour, side):
    image = draw(blank(), colour, shape, left=9, top=12, side=side)
    (found,) = detect(image)
    assert (found.colour, found.shape) == (colour, shape)
    assert found.area == int((image.max(axis=2) > 0).sum())
    assert found.cx == pytest.approx(9 + (side - 1) / 2)  # every shape is left-right symmetric
    if shape != "triangle":
        assert found.cy == pytest.approx(12 + (side - 1) / 2)


@pytest.mark.parametrize("shape", ["circle", "square", "triangle"])
@pytest.mark.parametrize("side", [7, 9, 11])
def test_detect_still_names_shapes_after_a_blur(shape, side):
    (found,) = detect(box_blur(draw(blank(), "blue", shape, left=10, top=8, side=side)))
    assert (found.colour, found.shape) == ("blue", shape)


def test_blobs_that_are_no_shape_of_the_task_are_unknown():
    image = draw(blank(), "red", "inverted_triangle", left=2, top=2, side=10)
    image[20:23, 2:18] = COLOURS["green"]  # a bar
    image[4:18, 20:23] = COLOURS["yellow"]  # an L
    image[15:18, 20:29] = COLOURS["yellow"]
    draw(image, "blue", "diamond", left=12, top=2, side=11)
    found = {d.colour: d.shape for d in detect(image)}
    assert found == {"red": "unknown", "green": "unknown", "yellow": "unknown", "blue": "unknown"}


def test_dark_grey_and_tiny_blobs_are_background():
    image = blank()
    image[2:10, 2:10] = (128, 128, 128)  # grey: no saturation
    image[2:10, 20:28] = (100, 0, 0)  # red, but darker than half the palette
    image[20:23, 20:23] = COLOURS["red"]  # 9 px: a speck, below the minimum area
    assert detect(image) == []
    assert detect(blank()) == []


def test_pixels_take_the_hue_of_their_palette_colour_whatever_the_coverage():
    colours = np.array(list(COLOURS.values()), dtype=np.float32)[None] / 255  # (1, 4, 3)
    assert classify_pixels(colours * 0.55).tolist() == [[0, 1, 2, 3]]
    assert classify_pixels(colours * 0.45).tolist() == [[-1, -1, -1, -1]]
    assert classify_pixels(np.array([[[0.9, 0.1, 0.05]]])).tolist() == [[0]]  # off-red is red


def test_components_join_four_neighbours_of_one_class_only():
    classes = np.array(
        [
            [0, 0, -1, 1],
            [-1, 0, -1, 1],
            [0, -1, 1, 2],
            [0, 0, 0, -1],
        ]
    )
    labels = label_components(classes)
    expected_groups = [
        {(0, 0), (0, 1), (1, 1)},
        {(0, 3), (1, 3)},
        {(2, 2)},
        {(2, 3)},
        {(2, 0), (3, 0), (3, 1), (3, 2)},
    ]
    for group in expected_groups:
        assert len({labels[p] for p in group}) == 1
    assert len({labels[next(iter(g))] for g in expected_groups}) == len(expected_groups)
    assert (labels[classes < 0] == -1).all()


def test_a_long_winding_component_is_one_label():
    classes = np.full((15, 15), -1)
    classes[::2, :] = 0  # rows joined alternately at the right and left ends: a serpentine
    classes[1::4, -1] = 0
    classes[3::4, 0] = 0
    labels = label_components(classes)
    assert len(np.unique(labels[classes == 0])) == 1


def test_labels_are_unique_across_a_batch():
    image = draw(blank(), "red", "square", 4, 4, 8)
    labels = label_components(classify_pixels(np.stack([image, image])))
    assert set(np.unique(labels[0])) & set(np.unique(labels[1])) == {-1}


def test_detect_batch_agrees_with_detect_per_image_and_uint8_with_float():
    images = render_batch(["two red circles", "a blue triangle above a green square"], seed=3)
    unit = ((images + 1) / 2).permute(0, 2, 3, 1).numpy()
    batched = detect_batch(unit)
    assert batched == [detect(unit[0]), detect(unit[1])]
    assert detect(np.rint(unit[1] * 255).astype(np.uint8)) == batched[1]


def test_relation_compares_centres_with_a_margin_and_leaves_the_other_axis_free():
    left, right = detection("red", "circle", cx=10, cy=5), detection("blue", "square", cx=14, cy=25)
    assert relation_holds("left of", left, right, image_size=32)  # 4 px apart > 3.2 px margin
    assert relation_holds("right of", right, left, image_size=32)
    assert not relation_holds("right of", left, right, image_size=32)
    assert relation_holds("above", left, right, image_size=32)
    near = detection("blue", "square", cx=13, cy=5)  # 3 px apart < 3.2 px margin
    assert not relation_holds("left of", left, near, image_size=32)
    assert not relation_holds("right of", near, left, image_size=32)


# Credits are max(0, matched - surplus) / required for objects, colours and shapes (+ the relation):
# one extra object costs exactly what one missing object costs, so over-drawing never pays.
@pytest.mark.parametrize(
    ("prompt", "found", "reward"),
    [
        ("a red circle", [("red", "circle")], 1.0),
        ("a red circle", [], 0.0),
        ("a red circle", [("red", "circle"), ("blue", "square")], 0.0),
        ("a red circle", [("red", "circle"), ("red", "unknown")], 0.0),
        ("a red circle", [("blue", "circle")], (0 + 0 + 1) / 3),
        ("a red circle", [("red", "unknown")], 0.0),
        ("three green triangles", [("green", "triangle")] * 2, (2 / 3 + 2 / 3 + 2 / 3) / 3),
        ("three green triangles", [("green", "triangle")] * 4, (2 / 3 + 2 / 3 + 2 / 3) / 3),  # = two drawn
        (
            "a red circle and a blue square",
            [("red", "circle"), ("blue", "triangle")],
            (0 + 1 + 0) / 3,
        ),
        ("a red circle and a blue square", [("blue", "square"), ("red", "circle")], 1.0),
    ],
)
def test_judge_gives_partial_credit_and_nothing_for_extra_objects(prompt, found, reward):
    judgement = judge(parse_prompt(prompt), [detection(c, s) for c, s in found], image_size=32)
    assert judgement.reward == pytest.approx(reward)
    assert judgement.strict == (reward == 1.0)


def test_judge_credits_the_relation_only_when_it_holds():
    spec = parse_prompt("a red circle left of a blue square")
    red, blue = detection("red", "circle", cx=6), detection("blue", "square", cx=24)
    assert judge(spec, [red, blue], image_size=32).strict
    swapped = judge(spec, [detection("red", "circle", cx=24), detection("blue", "square", cx=6)], 32)
    assert not swapped.strict and swapped.reward == pytest.approx(3 / 4)
    # Two red circles: one pair of the two holds; the extra circle also costs object credit.
    extra = judge(spec, [red, blue, detection("red", "circle", cx=28)], 32)
    assert extra.credits["relation"] == pytest.approx(1 / 2)
    assert extra.reward == pytest.approx((1 / 2 + 1 / 2 + 1 / 2 + 1 / 2) / 4)


VALIDATION = train_val_split()[1]


def rendered_validation(count: int, seed: int) -> tuple[torch.Tensor, list[str]]:
    texts = [VALIDATION[i % len(VALIDATION)] for i in range(count)]
    return (render_batch(texts, seed=seed) + 1) / 2, texts


def test_rendered_validation_images_are_judged_strictly_correct():
    images, texts = rendered_validation(1000, seed=2024)  # 12-13 per validation prompt, every kind
    out = GenEvalReward().score(images, texts)
    assert out.strict.float().mean() >= 0.99
    assert out.rewards.min() >= 0.0 and out.rewards.max() <= 1.0
    assert torch.equal(out.rewards[out.strict], torch.ones(int(out.strict.sum())))


def test_blurred_noisy_renders_are_still_mostly_correct():
    images, texts = rendered_validation(160, seed=7)
    blurred = torch.nn.functional.avg_pool2d(
        torch.nn.functional.pad(images, (1,) * 4, mode="replicate"), 3, 1
    )
    noise = 0.05 * torch.randn(images.shape, generator=torch.Generator().manual_seed(0))
    out = GenEvalReward().score((blurred + noise).clamp(0, 1), texts)
    assert out.strict.float().mean() >= 0.9


def test_noise_and_blank_images_score_low_and_never_strict():
    _, texts = rendered_validation(200, seed=0)
    generator = torch.Generator().manual_seed(0)
    reward = GenEvalReward()
    for images in (
        torch.randn(200, 3, 32, 32, generator=generator).clamp(0, 1),
        torch.rand(200, 3, 32, 32, generator=generator),
        torch.zeros(200, 3, 32, 32),
    ):
        out = reward.score(images, texts)
        assert out.rewards.mean() < 0.1 and not out.strict.any()


@pytest.mark.parametrize(
    ("drawn", "asked"),
    [
        ("a red circle and a blue square", "a red circle"),  # an extra object
        ("a red circle left of a blue square", "a red circle right of a blue square"),  # swapped
        ("a yellow square above a green circle", "a yellow square below a green circle"),
        ("three green triangles", "two green triangles"),
        ("a blue triangle", "a blue circle"),
        ("a blue triangle", "a yellow triangle"),
    ],
)
def test_an_image_of_another_prompt_is_not_strictly_correct(drawn, asked):
    images = (render_batch([drawn] * 8, seed=1) + 1) / 2
    wrong = GenEvalReward().score(images, [asked] * 8)
    right = GenEvalReward().score(images, [drawn] * 8)
    assert right.strict.all() and not wrong.strict.any()
    assert (wrong.rewards < 1.0).all()


def test_score_refuses_bad_inputs_with_the_cause():
    reward = GenEvalReward()
    with pytest.raises(ValueError, match=r"\(B, 3, H, W\)"):
        reward.score(torch.zeros(2, 32, 32, 3), ["a red circle"] * 2)
    with pytest.raises(ValueError, match="2 images but 1 prompts"):
        reward.score(torch.zeros(2, 3, 32, 32), ["a red circle"])
    with pytest.raises(ValueError, match="purple"):
        reward.score(torch.zeros(1, 3, 32, 32), ["a purple circle"])
    with pytest.raises(ValueError, match="NaN"):
        reward.score(torch.full((1, 3, 32, 32), float("nan")), ["a red circle"])


def test_guarded_geneval_marks_only_the_sample_with_a_bad_prompt():
    images, texts = rendered_validation(4, seed=5)
    out = guarded_score(GenEvalReward(), images, [texts[0], "a purple circle", texts[2], texts[3]])
    assert out.valid.tolist() == [True, False, True, True]
    assert out.strict.tolist() == [True, False, True, True]
    assert "purple" in out.errors[0]


def test_scores_are_deterministic():
    images, texts = rendered_validation(16, seed=9)
    noisy = (images + 0.1 * torch.randn(images.shape, generator=torch.Generator().manual_seed(1))).clamp(0, 1)
    first, second = GenEvalReward().score(noisy, texts), GenEvalReward().score(noisy, texts)
    assert torch.equal(first.rewards, second.rewards) and torch.equal(first.strict, second.strict)


def test_lattice_renders_of_every_validation_prompt_are_judged_strictly_correct():
    from spotlight.tasks.render import render_batch
    from spotlight.tasks.shapes import train_val_split

    prompts = train_val_split()[1]
    images = (render_batch(prompts, seed=11, lattice=8) + 1) / 2
    assert GenEvalReward().score(images, prompts).strict.all()


def test_strict_weight_mixes_the_exact_answer_into_the_reward():
    from spotlight.tasks.render import render_batch

    prompts = ["two red circles", "a blue square"]
    images = (render_batch(["three red circles", "a blue square"], seed=3) + 1) / 2  # one wrong count
    partial = GenEvalReward().score(images, prompts)
    mixed = GenEvalReward(strict_weight=0.5).score(images, prompts)
    assert partial.strict.tolist() == [False, True] == mixed.strict.tolist()
    assert mixed.rewards[0] == pytest.approx(0.5 * partial.rewards[0])  # no strict bonus for a wrong count
    assert mixed.rewards[1] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="strict_weight"):
        GenEvalReward(strict_weight=1.5)
