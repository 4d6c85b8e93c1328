"""Mode disaggregated through the one training loop, on the Ray runtime (generator actors, unit queue).

The module's fixture runs five short trainings in this process, on one Ray cluster it lends them, which
keeps the queue and generator actors from one run to the next (a generator rebuilds the run's policy; one
killed between runs is replaced): TinyDiT with GAP, the one-shot fallback, TAG and one-step async, and
sd3-tiny-lora with LoRA. The tests read what the runs wrote: final weights, metrics
and the per-sample log (step, id, version, per-step versions, device). The same samples are drawn in the
GAP, one-shot and TAG runs (a sample is a pure function of weights, prompt and seed), so their
updates must agree.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import ray
import torch
from safetensors.torch import load_file

from spotlight.backends import disaggregated
from spotlight.config import TrainConfig, load_config
from spotlight.runtime.spot.pools import LocalCluster
from spotlight.trainer import train

REPO = Path(__file__).resolve().parents[2]
BASE = ["mode=disaggregated", "iterations=2", "eval.every=100", "eval.seeds_per_prompt=1", "eval.num_steps=2",
        "eval.prompts=4", "eval.raw_model=false", "rollout.prompts_per_iteration=3", "rollout.group_size=4",
        "rollout.num_steps=4",
        "rollout.sde_steps=3", "train.num_epochs=1", "train.num_minibatches=1", "train.old_policy_decay=0",
        "train.nft_kl_beta=0", "checkpoint_every=100",
        "runtime.max_wall_s=null"]
RUNS = {
    "gap": (None, []),
    "one_shot": (None, ["disagg.gap=false", "disagg.tsp=false"]),
    "tag": (None, ["disagg.tag=true", "disagg.tag_min_fragments=1"]),
    "async": (None, ["disagg.async_one_step=true", "iterations=3"]),
    "sd3": ("configs/sd3-tiny-lora.yaml", ["rollout.num_steps=3"]),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """The five runs, in this process (no interpreter or import to pay again), on one lent cluster whose actors
    the runs reuse."""
    root = tmp_path_factory.mktemp("disaggregated")
    cluster = LocalCluster()
    try:
        for name, (config, overrides) in RUNS.items():
            if name == "async":  # a kept generator that died since is replaced, not reused
                kept = [actor for key, actor in disaggregated._IDLE_ACTORS.items() if key[1].startswith("generator")]
                assert kept
                for actor in kept:
                    ray.kill(actor)
            train(load_config(TrainConfig, None if config is None else str(REPO / config),
                              [*BASE, *overrides, f"run_dir={root / name}"]))
    finally:
        cluster.shutdown()
    assert not ray.is_initialized()
    return {name: root / name for name in RUNS}


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "checkpoints" / "iter-000002" / "model.safetensors")


def samples(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "disagg_samples.jsonl").read_text().splitlines()]


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][1:]


def assert_close_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=2e-6, msg=f"weight {name}")


@pytest.mark.slow  # the five runs of the module's fixture
def test_the_gap_update_equals_the_one_shot_update_on_the_same_samples(runs):
    gap, one_shot = runs["gap"], runs["one_shot"]
    assert [s for s in samples(gap)] == [s for s in samples(one_shot)]  # the same samples, rewards and versions
    assert all(m["train/rows"] > 0 for m in metrics(gap))  # both steps trained something
    for g, o in zip(metrics(gap), metrics(one_shot), strict=True):
        assert g["train/loss"] == pytest.approx(o["train/loss"], rel=1e-5)
    assert_close_weights(weights(gap), weights(one_shot))
    assert all(m["train/grad_norm"] > 0 for m in metrics(gap))  # the weights did move, so equality says something


@pytest.mark.slow  # the five runs of the module's fixture
def test_tag_changes_nothing_the_update_sees_but_which_device_drew_a_sample(runs):
    gap, tag = samples(runs["gap"]), samples(runs["tag"])
    assert sum(s["produced_by"] == "trainer" for s in tag) > 0  # the trainer did draw units in its bubbles
    assert [{**s, "produced_by": None} for s in tag] == [{**s, "produced_by": None} for s in gap]
    assert all(m["disagg/tag_units"] >= 1 for m in metrics(runs["tag"]))
    assert_close_weights(weights(runs["gap"]), weights(runs["tag"]))


@pytest.mark.slow  # the five runs of the module's fixture
def test_one_step_async_keeps_every_sample_within_one_version_and_one_version_per_trajectory(runs):
    logged = samples(runs["async"])
    assert {s["step"] for s in logged} == {0, 1, 2}
    for s in logged:
        assert s["step"] - 1 <= s["version"] <= s["step"], s
        assert set(s["step_versions"]) == {s["version"]}, s  # one snapshot for the whole trajectory
    assert any(s["version"] == s["step"] - 1 for s in logged)  # generators did run ahead on θ_{s-1}
    assert all(m["disagg/max_version_lag"] <= 1 for m in metrics(runs["async"]))
    on_policy = samples(runs["gap"])
    assert all(s["version"] == s["step"] for s in on_policy)  # off: strictly on-policy


@pytest.mark.slow  # the five runs of the module's fixture
def test_disaggregated_trains_a_diffusers_lora_policy(runs):
    run = runs["sd3"]
    logged = samples(run)
    assert len(logged) == 2 * 3 * 4 and all(s["version"] == s["step"] for s in logged)
    assert [m["iteration"] for m in metrics(run)] == [1, 2]
    assert (run / "checkpoints" / "iter-000002" / "model.safetensors").exists()


def test_disaggregated_refuses_an_update_of_several_optimizer_steps_in_one_line():
    from spotlight.config import ConfigError, TrainConfig, load_config

    with pytest.raises(ConfigError, match=r"train.num_epochs=1 and train.num_minibatches=1 \(got 2 and 4\)"):
        load_config(TrainConfig, None, ["mode=disaggregated"])
    with pytest.raises(ConfigError, match="turn one of them off"):
        load_config(TrainConfig, None, ["mode=disaggregated", "train.num_epochs=1", "train.num_minibatches=1",
                                        "train.old_policy_decay=0", "train.nft_kl_beta=0",
                                        "disagg.explore=true", "disagg.async_one_step=true"])
    with pytest.raises(ConfigError, match=r"set train.old_policy_decay=0 and train.nft_kl_beta=0"):
        load_config(TrainConfig, None, ["mode=disaggregated", "train.num_epochs=1", "train.num_minibatches=1"])
