"""The adaptive trust term: its weight doubles while the policy is far from the base and relaxes back to its floor."""

from __future__ import annotations

import pytest

from spotlight.config import ConfigError, TrainConfig, load_config
from spotlight.rl.kl_control import AdaptiveTrust


def test_the_weight_doubles_over_the_band_halves_under_it_and_never_leaves_floor_and_ceiling():
    trust = AdaptiveTrust(floor=0.01, target=0.1, ceiling=0.08)
    trust.observe(0.12)  # inside the band (0.067-0.15): unchanged
    assert trust.beta == 0.01
    for expected in (0.02, 0.04, 0.08, 0.08):
        trust.observe(0.5)
        assert trust.beta == pytest.approx(expected)
    trust.observe(float("nan"))  # a failed measurement changes nothing
    assert trust.beta == pytest.approx(0.08)
    for expected in (0.04, 0.02, 0.01, 0.01):
        trust.observe(0.01)
        assert trust.beta == pytest.approx(expected)


def test_without_a_target_the_weight_stays_and_the_state_round_trips():
    fixed = AdaptiveTrust(floor=0.01, target=None)
    fixed.observe(100.0)
    assert fixed.beta == 0.01
    trust = AdaptiveTrust(floor=0.01, target=0.1)
    trust.observe(1.0)
    again = AdaptiveTrust(floor=0.01, target=0.1)
    again.load_state_dict(trust.state_dict())
    assert again.beta == trust.beta == pytest.approx(0.02)


def test_a_target_without_a_trust_term_is_one_line_naming_the_fix():
    with pytest.raises(ConfigError, match="set nft_kl_beta > 0"):
        load_config(TrainConfig, None, ["train.nft_kl_beta=0", "train.nft_kl_target=0.1"])
