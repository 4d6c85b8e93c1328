"""`trainer:` at load: a bad K is one line naming the field, the cause and the fix; ranks and spot devices get cores."""

from __future__ import annotations

import pytest

from spotlight.config import ConfigError, TrainConfig, parse_config


def one_line(data: dict) -> str:
    with pytest.raises(ConfigError) as error:
        parse_config(TrainConfig, data)
    message = str(error.value)
    assert "\n" not in message
    return message


def test_fewer_than_one_trainer_device_is_refused_naming_the_field() -> None:
    assert "trainer.devices" in one_line({"trainer": {"devices": 0}})


def test_more_ranks_than_pinned_cores_names_the_cores_and_the_fix() -> None:
    message = one_line({"device_cores": [0], "trainer": {"devices": 2}})
    assert "trainer.devices=2 pins one rank per core, but only 1 core(s) [0]" in message
    assert "lower trainer.devices to 1, or set pin_devices false" in message
    parse_config(TrainConfig, {"device_cores": [0], "pin_devices": False, "trainer": {"devices": 2}})


def test_disaggregated_and_what_fsdp_cannot_keep_are_refused_with_k_ranks() -> None:
    disaggregated = {"mode": "disaggregated", "device_cores": [0, 1], "trainer": {"devices": 2},
                     "train": {"num_epochs": 1, "num_minibatches": 1, "old_policy_decay": 0, "nft_kl_beta": 0}}
    assert "set trainer.devices 1" in one_line(disaggregated)
    fsdp = {"device_cores": [0, 1], "trainer": {"devices": 2, "sharding": "fsdp"}}
    assert "set trainer.sharding ddp" in one_line({**fsdp, "mode": "stale-explore"})
    assert "set trainer.whole_dtype null" in one_line({**fsdp, "trainer": {**fsdp["trainer"],
                                                                              "whole_dtype": "bfloat16"}})
    parse_config(TrainConfig, fsdp)  # a TinyDiT trained in full, sharded in the loop: accepted


def test_ranks_take_the_first_cores_and_spot_devices_the_rest() -> None:
    config = parse_config(TrainConfig, {"device_cores": [0, 1], "trainer": {"devices": 2}})
    assert [config.rank_core(rank) for rank in range(2)] == [0, 1]
    assert config.device_core(0) == 0
    assert config.device_core(1) == 1  # no core left past the ranks': a spot device shares rank 1's
    one = parse_config(TrainConfig, {"device_cores": [0, 1]})
    assert [one.device_core(device) for device in range(3)] == [0, 1, 1]  # K = 1 as before
