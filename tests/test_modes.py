"""The Mode enum: what each mode means, as the config, the CLI and the backends read it."""

from __future__ import annotations

import pytest

from spotlight.config import TrainConfig, load_config
from spotlight.modes import Mode


def test_a_mode_is_its_config_string_and_parses_from_yaml_overrides() -> None:
    for mode in Mode:
        config = load_config(TrainConfig, None, [f"mode={mode.value}", "explore.num_candidates=8",
                                                 "rollout.group_size=8", "train.num_epochs=1",
                                                 "train.num_minibatches=1", "train.old_policy_decay=0",
                                                 "train.nft_kl_beta=0"])
        assert config.mode is mode and config.mode == mode.value
        assert config.model_dump(mode="json")["mode"] == mode.value  # config.yaml keeps the plain name


def test_which_modes_explore_with_which_weights() -> None:
    assert [m for m in Mode if m.explores] == [Mode.SYNC_EXPLORE, Mode.STALE_EXPLORE, Mode.SPOTLIGHT]
    assert [m for m in Mode if m.stale] == [Mode.STALE_EXPLORE, Mode.SPOTLIGHT]  # θ_{i-1}
    assert all(m.explores for m in Mode if m.stale)


def test_where_each_mode_runs() -> None:
    assert [m for m in Mode if m.on_ray] == [Mode.SPOT_ROLLOUT, Mode.SPOTLIGHT, Mode.DISAGGREGATED]
    assert [m for m in Mode if m.single_process_only] == [Mode.STALE_EXPLORE]
    assert not any(m.on_ray and m.single_process_only for m in Mode)
    assert [m for m in Mode if not m.rents_spot] == [Mode.VANILLA, Mode.STALE_EXPLORE, Mode.DISAGGREGATED]


@pytest.mark.parametrize(("mode", "use_ray", "expected"), [
    ("vanilla", False, False), ("vanilla", True, True), ("sync-explore", True, True),
    ("spot-rollout", False, True), ("spotlight", False, True), ("stale-explore", False, False),
])
def test_a_config_runs_on_ray_for_ray_modes_or_with_use_ray(mode: str, use_ray: bool, expected: bool) -> None:
    config = load_config(TrainConfig, None, [f"mode={mode}", f"runtime.use_ray={str(use_ray).lower()}",
                                             "explore.num_candidates=8", "rollout.group_size=8"])
    assert config.uses_ray is expected


def test_an_unknown_mode_is_refused_naming_the_field() -> None:
    from spotlight.config import ConfigError

    with pytest.raises(ConfigError, match="mode.*'fast'"):
        load_config(TrainConfig, None, ["mode=fast"])
