"""GPU profiles: the shipped ones carry their sources, a measured efficiency written to a user file drives the plan."""

from __future__ import annotations

import pytest

from spotlight.config import load_config
from spotlight.plan_config import PlanConfig
from spotlight.sim.planning.device_profiles import ProfileError, load_profiles, profile, write_measured_efficiency
from spotlight.sim.planning.folder_sim import simulation
from spotlight.sim.workload import device_times


def test_shipped_profiles_name_a_source_for_every_number() -> None:
    profiles = load_profiles()
    assert {"H100-SXM", "H200"} <= set(profiles)
    for gpu in profiles.values():
        assert gpu.peak_source and gpu.memory_source and gpu.link_source and gpu.efficiency_source
    assert profiles["H200"].memory_gb == 141 and profiles["H100-SXM"].memory_gb == 80
    assert profiles["H200"].hbm_tb_per_s > profiles["H100-SXM"].hbm_tb_per_s


def test_a_measured_efficiency_written_to_a_profile_file_is_what_the_plan_uses(tmp_path) -> None:
    path = write_measured_efficiency(tmp_path / "gpus.yaml", "H200", rollout_efficiency=0.31, update_efficiency=0.22,
                                     source="gpu_throughput.py, sd35m, commit abc", sustained_matmul_tflops=700)
    mine = profile("H200", path)
    assert (mine.rollout_efficiency, mine.update_efficiency, mine.sustained_matmul_tflops) == (0.31, 0.22, 700)
    assert mine.memory_gb == 141 and "commit abc" in mine.efficiency_source  # the rest is the shipped profile's
    overrides = ["model.pretrained=sd3.5-medium", "rollout.resolution=512", "plan.gpu=H200"]
    sim, work, device = simulation(load_config(PlanConfig, None, [*overrides, f"plan.profiles={path}"]))
    assert device == mine
    times = device_times(sim.workload)
    peak = mine.peak_bf16_dense_tflops * 1e12
    assert times.sample_step_device_s == pytest.approx(work.guidance_forwards * work.forward_flops / (0.31 * peak))
    assert times.train_sample_device_s == pytest.approx(work.update_flops_per_sample / (0.22 * peak))
    shipped, *_ = simulation(load_config(PlanConfig, None, overrides))
    assert device_times(shipped.workload).sample_step_device_s > times.sample_step_device_s  # 0.17 < 0.31


def test_a_missing_gpu_profile_is_one_line_naming_the_known_ones(tmp_path) -> None:
    with pytest.raises(ProfileError, match=r"plan.gpu 'B200' has no GPU profile: use one of H100-SXM, H200") as error:
        profile("B200", None)
    assert "\n" not in str(error.value)
    with pytest.raises(ProfileError, match="no such GPU profile file"):
        profile("H200", tmp_path / "missing.yaml")


def test_a_new_gpu_needs_every_field(tmp_path) -> None:
    path = write_measured_efficiency(tmp_path / "gpus.yaml", "B200", rollout_efficiency=0.3, update_efficiency=0.3,
                                     source="measured")
    with pytest.raises(ProfileError, match="GPU profile B200: .*Field required"):
        load_profiles(path)
    base = profile("H200").model_copy(update={"name": "B200", "price_gpu": "B200"})
    path = write_measured_efficiency(tmp_path / "full.yaml", "B200", rollout_efficiency=0.3, update_efficiency=0.3,
                                     source="measured", base=base)
    assert profile("B200", path).rollout_efficiency == 0.3
