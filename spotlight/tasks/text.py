"""The text-rendering (OCR) task: prompts that ask for a short word or number, their split and tokenizer.

A prompt asks for one line of text of 3-8 characters, lower-case letters or digits:

    word     'the word "garden"'      (from a fixed list of common English words)
    number   'the number "48213"'     (fixed digit strings drawn once from a salted hash)

The text encoder of TinyDiT is small and learned from scratch, so the tokenizer is character-level:
the model sees the characters of the quoted text (one token each, in order), which is all the
prompt's template adds nothing to. Unseen validation words are then new combinations of known
characters rather than unknown tokens.
"""

from __future__ import annotations

import hashlib
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass

import torch

KINDS: tuple[str, ...] = ("word", "number")
ALPHABET: str = string.digits + string.ascii_lowercase
MIN_LENGTH = 3
MAX_LENGTH = 8

# Common English words of 3-8 letters (no proper nouns), grouped by length for easy review.
WORDS: tuple[str, ...] = (
    # 3
    "cat", "dog", "sun", "red", "big", "box", "car", "cup", "day", "egg", "fox", "hat", "ice", "jam", "key",
    "map", "net", "owl", "pen", "run", "sky", "tea", "van", "web", "zoo", "arm", "bag", "bed", "bus", "art",
    # 4
    "book", "tree", "fish", "bird", "rain", "snow", "moon", "star", "door", "lamp", "milk", "road", "ship",
    "song", "wind", "gold", "blue", "cake", "desk", "farm", "game", "hill", "king", "lake", "leaf", "nest",
    "open", "park", "ring", "sand", "time", "wave", "yard", "zero", "code", "data", "fire", "home", "jump",
    # 5
    "apple", "bread", "chair", "dream", "earth", "field", "glass", "house", "light", "music", "night", "ocean",
    "paper", "queen", "river", "stone", "table", "water", "world", "zebra", "cloud", "green", "happy", "lemon",
    "mouse", "plant", "smile", "tiger", "train", "voice", "spark", "sugar", "robot", "pixel", "flame", "grape",
    # 6
    "garden", "window", "orange", "yellow", "bridge", "castle", "dinner", "forest", "guitar", "island",
    "jungle", "kitten", "letter", "market", "number", "object", "pencil", "rabbit", "silver", "summer",
    "travel", "valley", "winter", "animal", "button", "camera", "flower", "hammer", "planet", "rocket",
    "signal", "spring", "sunset", "tomato", "puzzle", "circle",
    # 7
    "balloon", "blanket", "chicken", "diamond", "fortune", "harvest", "journey", "kitchen", "library",
    "morning", "network", "pattern", "picture", "rainbow", "science", "seaside", "thunder", "village",
    "weather", "dolphin", "freedom", "general", "history", "machine", "monster", "penguin", "running",
    "shadow", "teacher", "volcano", "lantern", "sparrow",
    # 8
    "airplane", "birthday", "champion", "daylight", "elephant", "festival", "football", "hospital",
    "language", "mountain", "notebook", "painting", "question", "sandwich", "sunshine", "treasure",
    "umbrella", "vacation", "whistler", "yourself", "keyboard", "lighting", "midnight", "starfish",
    "dinosaur", "computer", "building", "together",
)
NUMBER_COUNT = 200
VALIDATION_PER_KIND: dict[str, int] = {"word": 32, "number": 32}
_NUMBER_SALT = "spotlight-ocr-numbers-v1"
_SPLIT_SALT = "spotlight-ocr-split-v1"
_TEMPLATES: dict[str, str] = {"word": 'the word "{}"', "number": 'the number "{}"'}
_PROMPT_PATTERN = re.compile(r'^the (word|number) "([0-9a-z]+)"$')
VOCAB: tuple[str, ...] = ("<pad>", *ALPHABET)
_TOKEN_IDS: dict[str, int] = {char: index for index, char in enumerate(VOCAB)}


@dataclass(frozen=True)
class TextSpec:
    """One prompt of the task: its kind and the text to render (the OCR target)."""

    kind: str
    text: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"TextSpec.kind must be one of {list(KINDS)} (got {self.kind!r})")
        if not MIN_LENGTH <= len(self.text) <= MAX_LENGTH:
            raise ValueError(f"TextSpec.text must have {MIN_LENGTH}-{MAX_LENGTH} characters (got {self.text!r})")
        allowed = string.digits if self.kind == "number" else string.ascii_lowercase
        if any(char not in allowed for char in self.text):
            raise ValueError(f"a {self.kind!r} prompt's text may use only {allowed!r} (got {self.text!r})")

    @property
    def prompt(self) -> str:
        """The canonical prompt; `parse_prompt(spec.prompt) == spec`."""
        return _TEMPLATES[self.kind].format(self.text)


def parse_prompt(prompt: str) -> TextSpec:
    """The `TextSpec` of a prompt written as `TextSpec.prompt` writes it; ValueError naming the form otherwise."""
    match = _PROMPT_PATTERN.match(prompt)
    if match is None:
        raise ValueError(
            f"cannot parse OCR prompt {prompt!r}: prompts read 'the word \"TEXT\"' or 'the number \"DIGITS\"' "
            f"with {MIN_LENGTH}-{MAX_LENGTH} lower-case letters or digits"
        )
    return TextSpec(match.group(1), match.group(2))


def target_text(prompt: str) -> str:
    """The text a prompt asks the image to show (what the OCR reward compares against)."""
    return parse_prompt(prompt).text


def _numbers() -> list[str]:
    """`NUMBER_COUNT` distinct digit strings of 3-8 digits, the same on every machine (hash-derived)."""
    numbers: list[str] = []
    counter = 0
    while len(numbers) < NUMBER_COUNT:
        digest = hashlib.sha256(f"{_NUMBER_SALT}:{counter}".encode()).digest()
        counter += 1
        length = MIN_LENGTH + digest[0] % (MAX_LENGTH - MIN_LENGTH + 1)
        text = "".join(str(byte % 10) for byte in digest[1 : 1 + length])
        if text not in numbers:
            numbers.append(text)
    return numbers


def all_prompts() -> list[TextSpec]:
    """Every prompt of the task: the words in `WORDS` order, then the numbers (len(WORDS) + 200 specs)."""
    return [TextSpec("word", word) for word in WORDS] + [TextSpec("number", number) for number in _numbers()]


def _split_key(prompt: str) -> str:
    # A salted hash orders prompts identically on every machine and Python version (a seeded shuffle does not).
    return hashlib.sha256(f"{_SPLIT_SALT}:{prompt}".encode()).hexdigest()


def train_val_split() -> tuple[list[str], list[str]]:
    """The fixed train / validation split of prompts: (train, validation), disjoint, in `all_prompts()` order.

    Validation takes `VALIDATION_PER_KIND` prompts of each kind (64 in all); train takes the rest.
    """
    train: list[str] = []
    validation: list[str] = []
    for kind in KINDS:
        prompts = [spec.prompt for spec in all_prompts() if spec.kind == kind]
        held_out = set(sorted(prompts, key=_split_key)[: VALIDATION_PER_KIND[kind]])
        validation += [prompt for prompt in prompts if prompt in held_out]
        train += [prompt for prompt in prompts if prompt not in held_out]
    return train, validation


def kind_of(prompt: str) -> str:
    """The prompt's kind ("word" or "number"), for per-kind validation numbers."""
    return parse_prompt(prompt).kind


def random_prompts(generator: torch.Generator, count: int) -> list[str]:
    """`count` prompts of random strings (letters for words, digits for numbers), for pre-training.

    Random strings make every character appear at every position, so the base model learns glyphs
    rather than memorising the train words; held-out prompts are then new combinations it can draw.
    """
    kinds = torch.randint(len(KINDS), (count,), generator=generator).tolist()
    lengths = torch.randint(MIN_LENGTH, MAX_LENGTH + 1, (count,), generator=generator).tolist()
    prompts = []
    for kind_index, length in zip(kinds, lengths, strict=True):
        kind = KINDS[kind_index]
        letters = string.digits if kind == "number" else string.ascii_lowercase
        picks = torch.randint(len(letters), (length,), generator=generator).tolist()
        prompts.append(TextSpec(kind, "".join(letters[i] for i in picks)).prompt)
    return prompts


def tokenize(prompts: Sequence[str], max_len: int = 12) -> torch.Tensor:
    """Character token ids (B, max_len) of each prompt's quoted text, right-padded with 0 ("<pad>").

    Only the text is encoded: the template is the same for every prompt of a kind, and the kind is
    visible in the characters (digits or letters). Raises ValueError on a prompt outside the task or
    a text longer than `max_len`.
    """
    ids = torch.zeros(len(prompts), max_len, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        text = target_text(prompt)
        if len(text) > max_len:
            raise ValueError(f"prompt {prompt!r} has {len(text)} characters, more than max_len={max_len}")
        ids[row, : len(text)] = torch.tensor([_TOKEN_IDS[char] for char in text])
    return ids
