import itertools

import torch

from spotlight.diffusion.noise import INITIAL_STEP, initial_latents, seeded_normal, stream_key


def test_stream_keys_of_nearby_seeds_and_steps_are_distinct() -> None:
    pairs = list(itertools.product(range(-3, 40), range(INITIAL_STEP, 40)))
    keys = [stream_key(seed, step) for seed, step in pairs]
    assert len(set(keys)) == len(keys)
    assert all(0 <= key < 2**63 for key in keys)


def test_stream_key_is_not_a_linear_mix_of_seed_and_step() -> None:
    # seed * K + step would collide for (s, k) and (s + 1, k - K); check a few K
    for shift in (1, 2, 10, 1000):
        assert stream_key(5, 1000) != stream_key(5 + 1, 1000 - shift)
        assert stream_key(5, 1000) != stream_key(5 - 1, 1000 + shift)


def test_stream_key_is_a_fixed_function() -> None:
    assert stream_key(123, 4) == stream_key(123, 4)
    assert stream_key(123, 4) != stream_key(4, 123)


def test_seeded_normal_is_deterministic() -> None:
    first = seeded_normal([3, 1, 4], 2, (2, 5))
    second = seeded_normal([3, 1, 4], 2, (2, 5))
    assert first.shape == (3, 2, 5)
    assert first.dtype == torch.float32
    assert torch.equal(first, second)


def test_each_row_depends_only_on_its_own_seed() -> None:
    seeds = [7, 11, 13, 17]
    rows = seeded_normal(seeds, 3, (4, 4))
    permutation = [2, 0, 3, 1]
    permuted = seeded_normal([seeds[i] for i in permutation], 3, (4, 4))
    assert torch.equal(permuted, rows[permutation])
    alone = seeded_normal([13], 3, (4, 4))
    assert torch.equal(alone[0], rows[2])


def test_a_row_is_a_torch_generator_keyed_by_seed_and_step() -> None:
    generator = torch.Generator().manual_seed(stream_key(9, 5))
    expected = torch.randn(3, 2, generator=generator, dtype=torch.float64)
    assert torch.equal(seeded_normal([9], 5, (3, 2), dtype=torch.float64)[0], expected)


def test_steps_and_seeds_give_different_noise() -> None:
    base = seeded_normal([1], 0, (64,))
    assert not torch.equal(base, seeded_normal([1], 1, (64,)))
    assert not torch.equal(base, seeded_normal([2], 0, (64,)))
    assert not torch.equal(initial_latents([1], (64,)), base)


def test_initial_latents_are_the_stream_before_step_zero() -> None:
    assert torch.equal(initial_latents([5, 6], (3, 4, 4)), seeded_normal([5, 6], INITIAL_STEP, (3, 4, 4)))


def test_seeded_noise_is_standard_normal() -> None:
    samples = seeded_normal(range(200), 0, (100,), dtype=torch.float64).flatten()
    assert abs(samples.mean().item()) < 0.02  # 20000 draws: std of the mean is 0.007
    assert abs(samples.std().item() - 1.0) < 0.02
