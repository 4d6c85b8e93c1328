import random

import pytest
import torch

from spotlight.disagg.groups import GroupAssembler
from spotlight.disagg.samples import GenerationId, ScoredSample
from spotlight.rl.advantages import group_advantages


def samples_of(rewards: torch.Tensor, invalid: set[tuple[int, int]] = frozenset()) -> list[ScoredSample]:
    empty = torch.zeros(0)
    return [ScoredSample(id=GenerationId(p, g, 0), latents=empty, log_probs=empty, tokens=empty,
                         reward=float(rewards[p, g]), valid=(p, g) not in invalid)
            for p in range(rewards.shape[0]) for g in range(rewards.shape[1])]


@pytest.mark.parametrize("std_mode", ["group", "global"])
def test_out_of_order_groups_get_the_one_shot_advantages_exactly(std_mode):
    rewards = torch.rand(5, 6, generator=torch.Generator().manual_seed(0))
    rewards[2] = 0.25  # a group of equal rewards: advantage 0
    invalid = {(1, 3)}
    valid = torch.ones(5, 6, dtype=torch.bool)
    valid[1, 3] = False
    expected = group_advantages(rewards, valid, std_mode, 3.0)
    arrival = samples_of(rewards, invalid)
    random.Random(1).shuffle(arrival)
    assembler = GroupAssembler(5, 6, std_mode, clip=3.0)
    released = [group for sample in arrival for group in assembler.add(sample)]
    assert assembler.done
    assert sorted(group.prompt_index for group in released) == list(range(5))
    for group in released:
        assert [s.id.sample_index for s in group.samples] == list(range(6))
        assert torch.equal(group.advantages, expected[group.prompt_index])


def test_a_group_is_released_the_moment_its_last_sample_is_scored():
    rewards = torch.rand(3, 2, generator=torch.Generator().manual_seed(2))
    assembler = GroupAssembler(3, 2)
    by_id = {(s.id.prompt_index, s.id.sample_index): s for s in samples_of(rewards)}
    assert assembler.add(by_id[1, 0]) == []
    assert assembler.add(by_id[2, 1]) == []
    assert [g.prompt_index for g in assembler.add(by_id[1, 1])] == [1]
    assert not assembler.done


def test_global_std_holds_every_group_until_the_batch_is_complete():
    rewards = torch.rand(3, 2, generator=torch.Generator().manual_seed(3))
    assembler = GroupAssembler(3, 2, "global")
    released = [len(assembler.add(sample)) for sample in samples_of(rewards)]
    assert released == [0, 0, 0, 0, 0, 3]


def test_a_duplicate_or_foreign_sample_is_refused():
    rewards = torch.rand(2, 2, generator=torch.Generator().manual_seed(4))
    samples = samples_of(rewards)
    assembler = GroupAssembler(2, 2)
    assembler.add(samples[0])
    with pytest.raises(ValueError, match="arrived twice"):
        assembler.add(samples[0])
    foreign = ScoredSample(id=GenerationId(5, 0, 0), latents=torch.zeros(0), log_probs=torch.zeros(0),
                           tokens=torch.zeros(0), reward=0.0)
    with pytest.raises(ValueError, match="another logical batch"):
        assembler.add(foreign)
