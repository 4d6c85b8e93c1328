import pytest
import torch

from spotlight.tasks.text import (
    MAX_LENGTH,
    MIN_LENGTH,
    VALIDATION_PER_KIND,
    VOCAB,
    TextSpec,
    all_prompts,
    kind_of,
    parse_prompt,
    random_prompts,
    tokenize,
    train_val_split,
)


def test_every_prompt_parses_back_to_its_spec() -> None:
    specs = all_prompts()
    assert len({spec.prompt for spec in specs}) == len(specs)
    for spec in specs:
        assert parse_prompt(spec.prompt) == spec
        assert MIN_LENGTH <= len(spec.text) <= MAX_LENGTH


def test_split_is_fixed_disjoint_and_covers_each_kind() -> None:
    train, validation = train_val_split()
    assert (train, validation) == train_val_split()
    assert not set(train) & set(validation)
    assert len(train) + len(validation) == len(all_prompts())
    for kind, count in VALIDATION_PER_KIND.items():
        assert sum(kind_of(prompt) == kind for prompt in validation) == count


def test_tokens_are_the_characters_of_the_quoted_text_then_padding() -> None:
    ids = tokenize(['the word "cab"', 'the number "90210"'], max_len=8)
    assert ids[0].tolist() == [VOCAB.index(c) for c in "cab"] + [0] * 5
    assert ids[1].tolist() == [VOCAB.index(c) for c in "90210"] + [0] * 3


@pytest.mark.parametrize("prompt", ['the word "Cat"', 'the word "ab"', "the word cat", 'the number "12a4"',
                                    'the word "abcdefghi"'])
def test_prompts_outside_the_task_are_refused(prompt: str) -> None:
    with pytest.raises(ValueError):
        tokenize([prompt])


def test_random_prompts_are_valid_seeded_and_use_both_kinds() -> None:
    first = random_prompts(torch.Generator().manual_seed(3), 200)
    assert first == random_prompts(torch.Generator().manual_seed(3), 200)
    specs = [parse_prompt(prompt) for prompt in first]
    assert {spec.kind for spec in specs} == {"word", "number"}
    assert {len(spec.text) for spec in specs} == set(range(MIN_LENGTH, MAX_LENGTH + 1))


def test_spec_rejects_letters_in_a_number() -> None:
    with pytest.raises(ValueError, match="number"):
        TextSpec("number", "12a")
