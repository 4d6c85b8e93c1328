import hashlib
import math

import pytest
import torch

from spotlight.tasks.shapes import (
    COLOURS,
    KINDS,
    RELATIONS,
    SHAPES,
    VOCAB,
    ObjectSpec,
    PromptSpec,
    all_prompts,
    parse_prompt,
    sample_prompts,
    tokenize,
    train_val_split,
)


def test_canonical_texts_read_as_english():
    assert PromptSpec("single", (ObjectSpec("red", "circle"),)).text == "a red circle"
    assert PromptSpec("counting", (ObjectSpec("green", "triangle", 3),)).text == "three green triangles"
    two = PromptSpec("two_object", (ObjectSpec("red", "circle"), ObjectSpec("blue", "square")))
    assert two.text == "a red circle and a blue square"
    position = PromptSpec("position", (ObjectSpec("red", "circle"), ObjectSpec("blue", "square")), "left of")
    assert position.text == "a red circle left of a blue square"


def test_parse_inverts_text_for_every_prompt():
    for spec in all_prompts():
        assert parse_prompt(spec.text) == spec


def test_parse_keeps_the_order_of_two_objects():
    spec = parse_prompt("a blue square and a red circle")
    assert spec.objects == (ObjectSpec("blue", "square"), ObjectSpec("red", "circle"))
    assert spec.text == "a blue square and a red circle"


def test_prompt_space_has_the_size_of_its_combinatorics():
    objects = len(COLOURS) * len(SHAPES)  # 12 (colour, shape) pairs
    expected = {
        "single": objects,
        "two_object": math.comb(objects, 2),  # unordered pairs of different objects
        "counting": objects * 3,  # counts 2, 3, 4
        "position": objects * (objects - 1) * len(RELATIONS),  # ordered pairs x relations
    }
    prompts = all_prompts()
    assert {kind: sum(spec.kind == kind for spec in prompts) for kind in KINDS} == expected
    assert len({spec.text for spec in prompts}) == len(prompts)
    assert [spec.text for spec in all_prompts()] == [spec.text for spec in prompts]


@pytest.mark.parametrize(
    "text",
    [
        "a red circles",
        "two red circle",
        "one red circle",
        "a purple circle",
        "a red hexagon",
        "a red circle and a red circle",
        "a red circle near a blue square",
        "two red circles and a blue square",
        "a red circle left of two blue squares",
        "A red circle",
        "",
    ],
)
def test_parse_rejects_text_outside_the_grammar_naming_text_and_grammar(text):
    with pytest.raises(ValueError) as error:
        parse_prompt(text)
    message = str(error.value)
    assert repr(text) in message and "prompts follow" in message and "\n" not in message


@pytest.mark.parametrize(
    ("kind", "objects", "relation"),
    [
        ("counting", (ObjectSpec("red", "circle", 1),), None),
        ("single", (ObjectSpec("red", "circle", 2),), None),
        ("position", (ObjectSpec("red", "circle"), ObjectSpec("blue", "square")), None),
        ("two_object", (ObjectSpec("red", "circle"), ObjectSpec("blue", "square")), "above"),
        ("colors", (ObjectSpec("red", "circle"),), None),
    ],
)
def test_prompt_spec_rejects_objects_that_do_not_fit_its_kind(kind, objects, relation):
    with pytest.raises(ValueError, match="PromptSpec|prompt"):
        PromptSpec(kind, objects, relation)


def test_object_spec_rejects_unknown_colour_shape_and_count():
    with pytest.raises(ValueError, match="colour"):
        ObjectSpec("purple", "circle")
    with pytest.raises(ValueError, match="shape"):
        ObjectSpec("red", "hexagon")
    with pytest.raises(ValueError, match="count"):
        ObjectSpec("red", "circle", 5)


def test_split_is_disjoint_stratified_and_in_prompt_order():
    train, validation = train_val_split()
    kind_of = {spec.text: spec.kind for spec in all_prompts()}
    assert not set(train) & set(validation)
    assert {kind: sum(kind_of[t] == kind for t in validation) for kind in KINDS} == {
        "single": 4,
        "two_object": 24,
        "counting": 12,
        "position": 40,
    }
    # All that is left of the small kinds trains; position is capped so kinds stay balanced.
    assert {kind: sum(kind_of[t] == kind for t in train) for kind in KINDS} == {
        "single": 12 - 4,
        "two_object": 66 - 24,
        "counting": 36 - 12,
        "position": 64,
    }
    order = {spec.text: index for index, spec in enumerate(all_prompts())}
    assert train == sorted(train, key=order.get)
    assert validation == sorted(validation, key=order.get)


def test_split_follows_the_salted_hash_rule_so_it_is_stable_across_machines():
    # A second path to the split: per kind, the prompts with the smallest salted SHA-256 are held out.
    train, validation = train_val_split()
    held_out = {"single": 4, "two_object": 24, "counting": 12, "position": 40}
    expected: set[str] = set()
    for kind, count in held_out.items():
        texts = [spec.text for spec in all_prompts() if spec.kind == kind]
        digests = sorted(
            texts, key=lambda t: hashlib.sha256(f"spotlight-shapes-split-v1:{t}".encode()).hexdigest()
        )
        expected |= set(digests[:count])
    assert set(validation) == expected
    assert train_val_split() == (train, validation)


def test_tokenize_maps_words_to_vocab_ids_and_pads_with_zero():
    assert VOCAB[0] == "<pad>" and len(set(VOCAB)) == len(VOCAB)
    ids = tokenize(["a red circle left of a blue square", "three green triangles"], max_len=10)
    assert ids.dtype == torch.long and ids.shape == (2, 10)
    words = "a red circle left of a blue square".split()
    assert ids[0, :8].tolist() == [VOCAB.index(w) for w in words]
    assert ids[0, 8:].tolist() == [0, 0]
    assert ids[1].tolist() == [VOCAB.index(w) for w in ("three", "green", "triangles")] + [0] * 7


def test_every_prompt_tokenizes_within_the_default_length():
    texts = [spec.text for spec in all_prompts()]
    ids = tokenize(texts)
    assert ids.shape == (len(texts), 12)
    assert (ids != 0).sum(dim=1).tolist() == [len(text.split()) for text in texts]


def test_tokenize_rejects_unknown_words_and_long_prompts():
    with pytest.raises(ValueError, match="'purple'"):
        tokenize(["a purple circle"])
    with pytest.raises(ValueError, match="'<pad>'"):
        tokenize(["a <pad> circle"])
    with pytest.raises(ValueError, match="max_len=4"):
        tokenize(["a red circle and a blue square"], max_len=4)


def test_pretraining_prompts_cover_every_kind_evenly():
    prompts = sample_prompts(torch.Generator().manual_seed(0), 4000)
    counts = {kind: 0 for kind in KINDS}
    for prompt in prompts:
        counts[parse_prompt(prompt).kind] += 1
    assert all(abs(count / 4000 - 1 / len(KINDS)) < 0.03 for count in counts.values())
