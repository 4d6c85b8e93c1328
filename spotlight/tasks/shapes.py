"""The synthetic GenEval-style task: prompts over coloured shapes, their grammar, split and tokenizer.

A prompt asks for simple objects (a colour and a shape) in one of GenEval's kinds:

    single       "a red circle"
    counting     "three green triangles"             (counts 2-4; a count of 1 is `single`)
    two_object   "a red circle and a blue square"
    position     "a red circle left of a blue square" (left of / right of / above / below)

GenEval's `colors` kind is folded into all of these: every object names its colour. Everything here
is pure Python (plus `torch` for the token tensor) so that the renderer, the reward and the text
encoder agree on one grammar.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
# Fully saturated hues 60-120 degrees apart: after blur an object's edge is colour * coverage, which
# keeps its hue, so a chromaticity classifier separates them even when the generator is blurry.
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (255, 0, 0),
    "yellow": (255, 255, 0),
    "green": (0, 255, 0),
    "blue": (0, 0, 255),
}
RELATIONS: tuple[str, ...] = ("left of", "right of", "above", "below")
KINDS: tuple[str, ...] = ("single", "two_object", "counting", "position")

COUNT_WORDS: dict[int, str] = {2: "two", 3: "three", 4: "four"}
_WORD_COUNTS: dict[str, int] = {word: count for count, word in COUNT_WORDS.items()}
_PLURALS: dict[str, str] = {shape: shape + "s" for shape in SHAPES}
_SINGULARS: dict[str, str] = {plural: shape for shape, plural in _PLURALS.items()}

GRAMMAR = (
    "'a COLOUR SHAPE' | 'NUMBER COLOUR SHAPES' | 'a COLOUR SHAPE and a COLOUR SHAPE' | "
    "'a COLOUR SHAPE RELATION a COLOUR SHAPE' with "
    f"COLOUR in {{{', '.join(COLOURS)}}}, SHAPE in {{{', '.join(SHAPES)}}}, "
    f"NUMBER in {{{', '.join(COUNT_WORDS.values())}}}, RELATION in {{{', '.join(RELATIONS)}}}"
)

# Validation prompts per kind. Every kind is represented, and the split keeps most of each small kind
# for training (only 12 single prompts exist); position is the large kind, so it gives the most.
VALIDATION_PER_KIND: dict[str, int] = {"single": 4, "two_object": 24, "counting": 12, "position": 40}
# Position has 528 prompts against 66 two-object ones: training on all of them would make ~80% of the
# RL prompts positional. A fixed subset keeps the kinds roughly balanced.
TRAIN_POSITION_PROMPTS = 64
_SPLIT_SALT = "spotlight-shapes-split-v1"


@dataclass(frozen=True)
class ObjectSpec:
    """`count` objects of one colour and shape."""

    colour: str
    shape: str
    count: int = 1

    def __post_init__(self) -> None:
        if self.colour not in COLOURS:
            raise ValueError(f"ObjectSpec.colour must be one of {list(COLOURS)} (got {self.colour!r})")
        if self.shape not in SHAPES:
            raise ValueError(f"ObjectSpec.shape must be one of {list(SHAPES)} (got {self.shape!r})")
        if self.count != 1 and self.count not in COUNT_WORDS:
            raise ValueError(f"ObjectSpec.count must be 1 or one of {list(COUNT_WORDS)} (got {self.count})")

    @property
    def text(self) -> str:
        """The noun phrase: 'a red circle' or 'three red circles'."""
        if self.count == 1:
            return f"a {self.colour} {self.shape}"
        return f"{COUNT_WORDS[self.count]} {self.colour} {_PLURALS[self.shape]}"


@dataclass(frozen=True)
class PromptSpec:
    """One prompt: its kind, the objects it asks for (in prompt order) and, for `position`, the relation.

    For `position` the relation reads `objects[0] <relation> objects[1]`.
    """

    kind: str
    objects: tuple[ObjectSpec, ...]
    relation: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"PromptSpec.kind must be one of {list(KINDS)} (got {self.kind!r})")
        counts = [obj.count for obj in self.objects]
        if self.kind == "single" and counts != [1]:
            raise ValueError(f"a 'single' prompt has exactly one object with count 1 (got counts {counts})")
        if self.kind == "counting" and (len(counts) != 1 or counts[0] == 1):
            raise ValueError(f"a 'counting' prompt has one object with count 2-4 (got counts {counts})")
        if self.kind in ("two_object", "position"):
            if counts != [1, 1]:
                raise ValueError(f"a {self.kind!r} prompt has two objects of count 1 (got counts {counts})")
            first, second = self.objects
            if (first.colour, first.shape) == (second.colour, second.shape):
                raise ValueError(
                    f"a {self.kind!r} prompt needs two different objects (got {first.text!r} twice)"
                )
        if self.kind == "position":
            if self.relation not in RELATIONS:
                raise ValueError(
                    f"PromptSpec.relation must be one of {list(RELATIONS)} for 'position' "
                    f"(got {self.relation!r})"
                )
        elif self.relation is not None:
            raise ValueError(
                f"PromptSpec.relation must be None for kind {self.kind!r} (got {self.relation!r})"
            )

    @property
    def text(self) -> str:
        """The canonical English prompt; `parse_prompt(spec.text) == spec`."""
        if self.kind == "two_object":
            return f"{self.objects[0].text} and {self.objects[1].text}"
        if self.kind == "position":
            return f"{self.objects[0].text} {self.relation} {self.objects[1].text}"
        return self.objects[0].text


def _bad_prompt(text: str, why: str) -> ValueError:
    return ValueError(f"cannot parse prompt {text!r}: {why}; prompts follow {GRAMMAR}")


def _parse_object(text: str, words: list[str]) -> ObjectSpec:
    """Parse one noun phrase of three words: determiner/number, colour, shape (plural if counted)."""
    if len(words) != 3:
        phrase = " ".join(words)
        raise _bad_prompt(text, f"expected 'a COLOUR SHAPE' or 'NUMBER COLOUR SHAPES', got {phrase!r}")
    determiner, colour, noun = words
    if colour not in COLOURS:
        raise _bad_prompt(text, f"unknown colour {colour!r}")
    if determiner == "a":
        if noun not in SHAPES:
            raise _bad_prompt(text, f"expected a singular shape after 'a {colour}', got {noun!r}")
        return ObjectSpec(colour, noun, 1)
    if determiner in _WORD_COUNTS:
        if noun not in _SINGULARS:
            raise _bad_prompt(text, f"expected a plural shape after '{determiner} {colour}', got {noun!r}")
        return ObjectSpec(colour, _SINGULARS[noun], _WORD_COUNTS[determiner])
    raise _bad_prompt(text, f"expected 'a' or a number word, got {determiner!r}")


def parse_prompt(text: str) -> PromptSpec:
    """Parse a prompt of the task's grammar into its `PromptSpec` (the inverse of `PromptSpec.text`).

    Words are separated by single spaces and lower case, exactly as `.text` writes them; anything else
    raises ValueError naming the text and the grammar.
    """
    words = text.split(" ")
    if len(words) == 3:
        obj = _parse_object(text, words)
        return PromptSpec("single" if obj.count == 1 else "counting", (obj,))
    if len(words) == 7 and words[3] == "and":
        objects = (_parse_object(text, words[:3]), _parse_object(text, words[4:]))
        if any(obj.count != 1 for obj in objects):
            raise _bad_prompt(text, "two-object prompts name one of each object ('a ... and a ...')")
        return _spec_or_error(text, "two_object", objects, None)
    for relation in RELATIONS:
        relation_words = relation.split(" ")
        n = len(relation_words)
        if len(words) == 6 + n and words[3 : 3 + n] == relation_words:
            objects = (_parse_object(text, words[:3]), _parse_object(text, words[3 + n :]))
            if any(obj.count != 1 for obj in objects):
                raise _bad_prompt(text, "position prompts relate one object to one ('a ... above a ...')")
            return _spec_or_error(text, "position", objects, relation)
    raise _bad_prompt(text, "it matches none of the four prompt forms")


def _spec_or_error(text: str, kind: str, objects: tuple[ObjectSpec, ...], relation: str | None) -> PromptSpec:
    try:
        return PromptSpec(kind, objects, relation)
    except ValueError as error:
        raise _bad_prompt(text, str(error)) from None


def all_prompts() -> list[PromptSpec]:
    """Every prompt of the task, in a fixed order: kinds in `KINDS` order, then colours × shapes.

    Returns 642 specs: 12 single, 66 two-object (each unordered pair once), 36 counting and
    528 position (ordered pairs × 4 relations).
    """
    objects = [ObjectSpec(colour, shape) for colour in COLOURS for shape in SHAPES]
    prompts: list[PromptSpec] = [PromptSpec("single", (obj,)) for obj in objects]
    prompts += [
        PromptSpec("two_object", (first, second))
        for i, first in enumerate(objects)
        for second in objects[i + 1 :]
    ]
    prompts += [
        PromptSpec("counting", (ObjectSpec(obj.colour, obj.shape, count),))
        for obj in objects
        for count in COUNT_WORDS
    ]
    prompts += [
        PromptSpec("position", (first, second), relation)
        for first in objects
        for second in objects
        if first != second
        for relation in RELATIONS
    ]
    return prompts


def _split_key(text: str) -> str:
    # A salted hash orders prompts the same way on every machine and for every numpy/Python version,
    # which a seeded shuffle does not promise.
    return hashlib.sha256(f"{_SPLIT_SALT}:{text}".encode()).hexdigest()


def sample_prompts(generator: torch.Generator, batch_size: int) -> list[str]:
    """Pre-training prompts with every kind equally likely (position alone has 80% of the prompt space)."""
    by_kind: dict[str, list[str]] = {kind: [] for kind in KINDS}
    for spec in all_prompts():
        by_kind[spec.kind].append(spec.text)
    kinds = torch.randint(len(KINDS), (batch_size,), generator=generator).tolist()
    picks = torch.rand(batch_size, generator=generator).tolist()
    return [by_kind[KINDS[k]][int(p * len(by_kind[KINDS[k]]))] for k, p in zip(kinds, picks, strict=True)]


def train_val_split() -> tuple[list[str], list[str]]:
    """The fixed train / validation split of prompt texts.

    Returns (train, validation): validation takes `VALIDATION_PER_KIND` prompts of each kind (80 in
    all); train takes the rest of each kind, except position, which is capped at
    `TRAIN_POSITION_PROMPTS` so that the kinds stay roughly balanced (138 train prompts). Both lists
    are in `all_prompts()` order and disjoint; the choice depends only on the prompt texts.
    """
    train: list[str] = []
    validation: list[str] = []
    for kind in KINDS:
        texts = [spec.text for spec in all_prompts() if spec.kind == kind]
        ranked = sorted(texts, key=_split_key)
        held_out = set(ranked[: VALIDATION_PER_KIND[kind]])
        rest = ranked[VALIDATION_PER_KIND[kind] :]
        if kind == "position":
            rest = rest[:TRAIN_POSITION_PROMPTS]
        kept = set(rest)
        validation += [text for text in texts if text in held_out]
        train += [text for text in texts if text in kept]
    return train, validation


VOCAB: tuple[str, ...] = (
    "<pad>",
    "a",
    *COUNT_WORDS.values(),
    *COLOURS,
    *SHAPES,
    *_PLURALS.values(),
    "and",
    *sorted({word for relation in RELATIONS for word in relation.split(" ")}),
)
_TOKEN_IDS: dict[str, int] = {word: index for index, word in enumerate(VOCAB)}


def tokenize(texts: Sequence[str], max_len: int = 12) -> torch.Tensor:
    """Token ids of the prompts for the TinyDiT text encoder.

    Returns a LongTensor (B, max_len): word ids from `VOCAB`, right-padded with 0 ("<pad>"), so
    `ids != 0` is the attention mask. Raises ValueError on a word outside `VOCAB` or a prompt longer
    than `max_len` words (the longest prompt of the task has 8).
    """
    ids = torch.zeros(len(texts), max_len, dtype=torch.long)
    for row, text in enumerate(texts):
        words = text.split()
        if len(words) > max_len:
            raise ValueError(
                f"prompt {text!r} has {len(words)} words, more than max_len={max_len}; raise max_len"
            )
        for column, word in enumerate(words):
            if word not in _TOKEN_IDS or word == "<pad>":
                raise ValueError(
                    f"prompt {text!r} has the word {word!r}, which is not in the vocabulary; "
                    f"use only {list(VOCAB[1:])}"
                )
            ids[row, column] = _TOKEN_IDS[word]
    return ids
