import pytest
import torch

from spotlight.diffusion.schedule import sigma_schedule, time_shift


@pytest.mark.parametrize("num_steps", [1, 2, 7, 50])
@pytest.mark.parametrize("shift", [0.5, 1.0, 3.0])
def test_schedule_runs_from_pure_noise_to_data(num_steps: int, shift: float) -> None:
    sigmas = sigma_schedule(num_steps, shift)
    assert sigmas.shape == (num_steps + 1,)
    assert sigmas.dtype == torch.float64
    assert sigmas[0].item() == 1.0
    assert sigmas[-1].item() == 0.0


@pytest.mark.parametrize("shift", [0.3, 1.0, 3.0, 10.0])
def test_schedule_is_strictly_decreasing(shift: float) -> None:
    sigmas = sigma_schedule(20, shift)
    assert bool((sigmas[1:] < sigmas[:-1]).all())


def test_unit_shift_is_the_uniform_grid() -> None:
    assert sigma_schedule(4, 1.0).tolist() == [1.0, 0.75, 0.5, 0.25, 0.0]
    t = torch.linspace(0, 1, 11, dtype=torch.float64)
    assert torch.equal(time_shift(t, 1.0), t)


@pytest.mark.parametrize(
    "t,shift,expected",
    [
        (0.5, 3.0, 0.75),  # 1.5 / (1 + 2 * 0.5)
        (0.25, 2.0, 0.4),  # 0.5 / (1 + 0.25)
        (0.5, 0.5, 1.0 / 3.0),  # 0.25 / (1 - 0.25)
        (0.1, 5.0, 5.0 / 14.0),  # 0.5 / (1 + 0.4)
    ],
)
def test_shift_matches_hand_values(t: float, shift: float, expected: float) -> None:
    got = time_shift(torch.tensor([t], dtype=torch.float64), shift)
    assert got.item() == pytest.approx(expected, rel=1e-14)


def test_shift_above_one_spends_more_steps_at_high_noise() -> None:
    uniform, shifted = sigma_schedule(10, 1.0), sigma_schedule(10, 3.0)
    assert bool((shifted[1:-1] > uniform[1:-1]).all())
    assert sigma_schedule(2, 3.0).tolist() == pytest.approx([1.0, 0.75, 0.0], abs=1e-15)


@pytest.mark.parametrize("num_steps", [0, -3])
def test_schedule_rejects_fewer_than_one_step(num_steps: int) -> None:
    with pytest.raises(ValueError, match="num_steps"):
        sigma_schedule(num_steps)


@pytest.mark.parametrize("shift", [0.0, -1.0])
def test_shift_must_be_positive(shift: float) -> None:
    with pytest.raises(ValueError, match="shift"):
        time_shift(torch.tensor([0.5]), shift)
    with pytest.raises(ValueError, match="shift"):
        sigma_schedule(4, shift)
