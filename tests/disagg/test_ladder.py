"""The simulated ladder: its cost model from first principles, its event model against hand-computed steps,
and the orderings the mechanisms must produce."""

import math

import pytest
from pydantic import ValidationError

from spotlight.disagg.ladder import RUNGS, Rung, at_split, colocated, ladder, overlap_ceiling
from spotlight.disagg.ladder_config import Batch, Costs, DiTModel, Grid, LadderConfig
from spotlight.disagg.ladder_costs import step_costs

MODEL = DiTModel(num_layers=4, hidden_size=256, params=50e6, text_tokens=32, resolution=256, guidance_forwards=2)


LARGE = DiTModel(num_layers=60, hidden_size=3072, params=20e9, text_tokens=128, resolution=1024, guidance_forwards=2)


def config(**costs) -> LadderConfig:
    return LadderConfig(models={"m": MODEL, "large": LARGE}, costs=Costs(**costs),
                        batch=Batch(prompts=4, group_size=4, unit_size=2, num_batches=5, warmup_batches=1),
                        grid=Grid(models=["m"], devices=[8], sampling_steps=[10], trained_fraction=[0.5]))


def test_generation_and_training_times_follow_the_mmdit_flop_count():
    c = config()
    costs = step_costs(MODEL, c.hardware, c.costs, sampling_steps=10, trained_fraction=0.5, trainer_devices=4)
    n, d, layers = (256 // 16) ** 2 + 32, 256, 4
    flops = 24 * layers * d * d * n + 4 * layers * n * n * d
    forward = 2 * flops  # two guidance forwards
    assert costs.generate_sample_s == pytest.approx(10 * forward / (0.40 * 989e12))
    assert costs.train_row_s == pytest.approx((3 + 1) * forward / (0.35 * 989e12))
    assert costs.trained_timesteps == 5
    # 5 timesteps: 5 passes one at a time, 2 packed by at most 4
    per_timestep, packed = costs.train_sample_s(False, 4), costs.train_sample_s(True, 4)
    assert per_timestep - packed == pytest.approx(3 * costs.pass_comm_s)


def test_the_colocated_step_is_the_sum_of_its_phases():
    c = config()
    costs = step_costs(MODEL, c.hardware, c.costs, 10, 0.5, 8)
    result = colocated(c, "m", 8, 10, 0.5)
    per_device = 16 / 8
    # 16 samples x 5 timesteps = 80 one-timestep passes over 8 devices: 10 passes each
    expected = per_device * (costs.generate_sample_s + 0.05) + 10 * costs.pass_s(False, 4) \
        + costs.offload_restore_s + costs.commit_s
    assert result.step_s == pytest.approx(expected)


def test_the_split_alone_step_is_generation_then_scoring_then_training_then_publishing():
    c = config(reward_latency_s=0.3)
    costs = step_costs(MODEL, c.hardware, c.costs, 10, 0.5, 5)
    result = at_split(c, RUNGS[0], "m", 8, 10, 0.5, generators=3)
    units = 16 / 2
    generate = math.ceil(units / 3) * 2 * costs.generate_sample_s
    train = math.ceil(16 * 5 / 5) * costs.pass_s(False, 4)
    assert result.step_s == pytest.approx(generate + 0.3 + train + costs.commit_s + costs.publish_s)


@pytest.mark.parametrize("generators", [2, 4, 6])
def test_each_mechanism_never_slows_the_step_at_a_fixed_split(generators):
    c = config()
    results = {rung.name: at_split(c, rung, "m", 8, 10, 0.5, generators).samples_per_s for rung in RUNGS}
    assert results["+ GAP"] >= results["disaggregated"]
    assert results["+ TSP"] >= results["+ GAP"]
    assert results["+ async"] >= results["+ TAG/BTS"] * (1 - 1e-9)


def test_bts_sends_the_trainer_to_generate_only_when_generation_is_the_bottleneck():
    c = config(reward_latency_s=0.0)
    tag = Rung("tag", gap=True, tsp=True, tag="bts")
    # a large model (seconds per sample, so offload/restore is worth paying): 1 generator and light training
    assert at_split(c, tag, "large", 8, 10, 0.1, generators=1).tag_units_per_step > 0
    assert at_split(c, tag, "large", 8, 10, 1.0, generators=7).tag_units_per_step == 0  # 1 trainer, every timestep
    # a small model: a step of milliseconds never pays the offload/restore of its training state
    assert at_split(c, tag, "m", 8, 10, 0.1, generators=1).tag_units_per_step == 0


def test_the_ladder_reports_ratios_to_colocated_and_the_overlap_ceiling():
    c = config()
    result = ladder(c, "m", 8, 10, 0.5)
    assert result["rungs"][0]["name"] == "colocated" and result["rungs"][0]["vs_colocated"] == 1.0
    assert [r["name"] for r in result["rungs"][1:6]] == [rung.name for rung in RUNGS]
    costs = step_costs(MODEL, c.hardware, c.costs, 10, 0.5, 8)
    generate, train = costs.generate_sample_s, costs.train_sample_s(False, 4)
    assert overlap_ceiling(c, "m", 8, 10, 0.5) == pytest.approx((generate + train) / max(generate, train))
    assert result["spotlight"]["candidates_per_prompt"] > 0


def test_a_grid_naming_an_undefined_model_is_refused():
    with pytest.raises(ValidationError, match="grid.models names"):
        LadderConfig(models={"m": MODEL}, grid=Grid(models=["other"], devices=[8], sampling_steps=[10],
                                                    trained_fraction=[0.5]))


def test_a_coarse_round_of_tag_every_step_costs_throughput_where_bts_declines():
    c = config(reward_latency_s=0.0)
    bts = Rung("bts", gap=True, tsp=True, tag="bts")
    coarse = Rung("coarse", gap=True, tsp=True, tag="coarse")
    # training-bound (2 trainer devices of 8, every timestep trained): BTS generates nothing, coarse TAG a round a step
    declined, forced = (at_split(c, rung, "large", 8, 10, 1.0, generators=6) for rung in (bts, coarse))
    assert declined.tag_units_per_step == 0 and forced.tag_units_per_step >= 1
    assert forced.samples_per_s < declined.samples_per_s


def test_tsp_picks_the_pack_size_that_trains_a_chunk_fastest():
    c = config()
    costs = step_costs(MODEL, c.hardware, c.costs, 10, 0.5, 4)  # 5 trained timesteps
    # one sample on 4 devices: packs of 2 give 3 passes over 4 devices, one round of a 2-timestep pass;
    # packs of 4 would give one round of a 4-timestep pass, one timestep at a time 2 rounds
    candidates = [math.ceil(math.ceil(5 / pack) / 4) * costs.pass_s(True, pack) for pack in (1, 2, 3, 4)]
    assert costs.train_chunk_s(1, 4, tsp=True, max_pack=4) == pytest.approx(min(candidates))
    assert costs.train_chunk_s(1, 4, tsp=False, max_pack=4) == pytest.approx(2 * costs.pass_s(False, 4))
