import pytest

from spotlight.disagg.samples import cut_generation_units


def test_units_cut_along_the_generation_axis_cover_every_generation_once_in_prompt_major_order():
    units = cut_generation_units(num_prompts=3, group_size=4, unit_size=5)
    assert [len(unit.members) for unit in units] == [5, 5, 2]
    members = [pair for unit in units for pair in unit.members]
    assert members == [(p, g) for p in range(3) for g in range(4)]


def test_a_batch_of_few_prompts_still_gives_many_units():
    # cut by prompt, 2 prompts would give 2 units; cut by generation, 2 x 16 samples in units of 4 give 8
    assert len(cut_generation_units(num_prompts=2, group_size=16, unit_size=4)) == 8


def test_a_unit_size_below_one_is_refused():
    with pytest.raises(ValueError, match="gap.unit_size"):
        cut_generation_units(2, 2, 0)
