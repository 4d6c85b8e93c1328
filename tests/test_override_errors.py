"""A bad ``-s`` override is named as the ``-s`` the user typed, not as the defaults or the config file."""

from __future__ import annotations

import pytest

from spotlight.config import TrainConfig, load_config
from spotlight.schema import ConfigError


@pytest.mark.parametrize(("overrides", "named"), [
    (["seed=1", "rollout.group_size=0"], "-s rollout.group_size=0: rollout.group_size:"),
    (["rollout={group_size: 0}"], "-s rollout={group_size: 0}: rollout.group_size:"),
    (["rollout.group_sise=3"], "-s rollout.group_sise=3: rollout.group_sise: unknown field"),
    (["mode=disaggregated"], "-s: (top level): Value error, mode disaggregated"),  # a rule across fields
])
def test_an_override_error_names_the_override(overrides: list[str], named: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(TrainConfig, None, overrides)
    assert str(error.value).startswith(named)


def test_an_error_of_the_file_itself_still_names_the_file(tmp_path) -> None:
    config_file = tmp_path / "run.yaml"
    config_file.write_text("rollout:\n  group_size: 0\n")
    with pytest.raises(ConfigError, match=f"^{config_file}: rollout.group_size:"):
        load_config(TrainConfig, config_file, ["seed=3"])
