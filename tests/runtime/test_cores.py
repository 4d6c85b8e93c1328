import os

import pytest
import torch

from spotlight.config import TrainConfig, load_config
from spotlight.cores import CoreError, check_cores, pinned
from spotlight.schema import ConfigError


def test_pinned_runs_the_block_on_one_core_with_one_thread_then_restores_the_caller():
    mask, threads = os.sched_getaffinity(0), torch.get_num_threads()
    core = max(mask)
    with pinned(core, num_threads=4):
        assert os.sched_getaffinity(0) == {core}
        assert torch.get_num_threads() == 1
    assert os.sched_getaffinity(0) == mask
    assert torch.get_num_threads() == threads


def test_unpinned_keeps_the_mask_and_takes_the_thread_count():
    mask, threads = os.sched_getaffinity(0), torch.get_num_threads()
    with pinned(None, num_threads=3):
        assert os.sched_getaffinity(0) == mask
        assert torch.get_num_threads() == 3
    assert torch.get_num_threads() == threads


def test_repeated_or_missing_cores_are_refused_with_the_fix():
    with pytest.raises(CoreError, match="repeats a core"):
        check_cores([0, 0])
    with pytest.raises(CoreError, match="lacks"):
        check_cores([os.cpu_count()])
    with pytest.raises(ConfigError, match="device_cores"):
        load_config(TrainConfig, None, [f"device_cores=[{os.cpu_count() + 3}]"])


def test_trainer_takes_the_first_core_and_spot_devices_cycle_over_the_rest():
    config = load_config(TrainConfig, None, ["device_cores=[0]"])
    assert [config.device_core(k) for k in range(3)] == [0, None, None]  # one core: spot devices unpinned
    if os.cpu_count() >= 2:
        config = load_config(TrainConfig, None, ["device_cores=[1, 0]"])
        assert [config.device_core(k) for k in range(4)] == [1, 0, 0, 0]
    unpinned = load_config(TrainConfig, None, ["pin_devices=false"])
    assert [unpinned.device_core(k) for k in range(2)] == [None, None]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_inside_the_trainers_pinned_block_spot_devices_and_ray_still_go_to_the_other_cores():
    from spotlight.config import TrainConfig, load_config

    config = load_config(TrainConfig, None, [])  # device_cores null: this machine's cores
    cores = sorted(os.sched_getaffinity(0))
    with pinned(config.device_core(0)):  # as spotlight.trainer.train runs the trainer
        assert config.device_core(1) == cores[1]
        assert config.control_plane_cores() == cores[1:]
