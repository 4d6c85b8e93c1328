"""``rollout.sample_batch``: rows per sampling forward, carried in the rollout's `SamplingPlan`.

A row's float bits depend on the batch it is computed in, so the chunking travels with the plan that every
process sampling rollout rows receives (`generate` reads it there): the samples are a pure function of
(weights, prompts, seeds, plan) whoever draws them. The memory estimate sizes the sampling forward by
min(samples, sample_batch), and the Wan2.1 1.3B recipe's value fits an 80 GB H100 by that estimate.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from random_models import TINY_SHAPES_CONFIG, randomised_tinydit

from spotlight.config import TrainConfig, load_config
from spotlight.diffusion.sampler import SamplingPlan, sample
from spotlight.loop.rollout import rollout_plan
from spotlight.models.generation import generate, model_device, prompt_tokens, velocity_fn
from spotlight.models.pipelines.memory_estimate import GIB, MemoryEstimate, run_memory_estimate
from spotlight.plan_config import PlanConfig
from spotlight.runtime.queue.log import decode_request, encode_request
from spotlight.runtime.queue.request_queue import Request
from spotlight.sim.planning.device_profiles import profile
from spotlight.sim.planning.folder_workload import derive_workload
from spotlight.sim.planning.model_folders import model_folder

REPO = Path(__file__).resolve().parents[1]
PLAN = SamplingPlan(num_steps=3, shift=3.0, sampler="sde", noise_level=0.7, sde_steps=2)
PROMPTS = ["a red circle", "a blue square", "two green triangles", "a red square", "a blue circle"] * 2
SEEDS = list(range(10))
# Wan2.1-T2V-1.3B's published transformer config (the 14B folder's text encoder and VAE are the 1.3B's too)
WAN_1_3B = {"_class_name": "WanTransformer3DModel", "attention_head_dim": 128, "cross_attn_norm": True,
            "eps": 1e-06, "ffn_dim": 8960, "freq_dim": 256, "in_channels": 16, "num_attention_heads": 12,
            "num_layers": 30, "out_channels": 16, "patch_size": [1, 2, 2], "qk_norm": "rms_norm_across_heads",
            "rope_max_seq_len": 1024, "text_dim": 4096}


def _forward_rows(model: torch.nn.Module) -> list[int]:
    """The rows of every forward ``model`` takes from now on (a forward pre-hook)."""
    rows: list[int] = []
    model.register_forward_pre_hook(lambda module, args: rows.append(int(args[0].shape[0])))
    return rows


def test_chunks_of_sample_batch_rows_are_the_bits_of_each_chunk_sampled_alone() -> None:
    model = randomised_tinydit(TINY_SHAPES_CONFIG, 0, 0.2)
    for k in (1, 4):
        chunked = generate(model, PROMPTS, SEEDS, SamplingPlan(**{**PLAN.__dict__, "sample_batch": k}))
        alone = [generate(model, PROMPTS[start:start + k], SEEDS[start:start + k], PLAN)
                 for start in range(0, len(PROMPTS), k)]
        assert torch.equal(chunked.latents, torch.cat([part.latents for part in alone]))
        assert torch.equal(chunked.log_probs, torch.cat([part.log_probs for part in alone]))


def test_the_default_samples_every_row_in_one_forward_as_before() -> None:
    model = randomised_tinydit(TINY_SHAPES_CONFIG, 1, 0.2)
    rows = _forward_rows(model)
    trajectory = generate(model, PROMPTS, SEEDS, PLAN)
    assert PLAN.sample_batch == 256 and rows == [len(PROMPTS)] * PLAN.num_steps
    whole = sample(velocity_fn(model, prompt_tokens(model, PROMPTS)), SEEDS, PLAN, model.latent_shape,
                   device=model_device(model))
    assert torch.equal(trajectory.latents, whole.latents) and torch.equal(trajectory.log_probs, whole.log_probs)


def test_a_configs_sample_batch_bounds_the_rows_of_every_rollout_forward() -> None:
    config = load_config(TrainConfig, None, ["rollout.sample_batch=4", "rollout.num_steps=3"])
    plan = rollout_plan(config)
    assert plan.sample_batch == 4
    model = randomised_tinydit(TINY_SHAPES_CONFIG, 2, 0.2)
    rows = _forward_rows(model)
    generate(model, PROMPTS, SEEDS, plan)
    assert rows == [4] * 3 + [4] * 3 + [2] * 3  # 10 rows: two chunks of 4, one of 2, each its 3 steps
    assert rollout_plan(load_config(TrainConfig, None, [])).sample_batch == 256


def test_the_plan_carries_it_through_the_queue_log_and_an_old_log_still_loads() -> None:
    plan = SamplingPlan(num_steps=4, sample_batch=8)
    request = Request("r0", "a red circle", 3, plan, 0)
    assert decode_request(json.loads(json.dumps(encode_request(request)))) == request
    assert hash(plan) != hash(SamplingPlan(num_steps=4))  # keys the spot worker's groups
    old = encode_request(Request("r1", "a red circle", 3, SamplingPlan(num_steps=4), 0))
    del old["plan"]["sample_batch"]  # a log written before the field existed
    assert decode_request(old).plan == SamplingPlan(num_steps=4)
    with pytest.raises(ValueError, match="at least 1 row"):
        SamplingPlan(sample_batch=0)


def test_the_estimates_sampling_phase_falls_with_sample_batch(tiny_pipeline) -> None:
    folder = tiny_pipeline("sd3")

    def sampling(rows: int) -> int:
        config = load_config(TrainConfig, None, [f"model.pretrained={folder}", "rollout.resolution=32",
                                                 f"rollout.sample_batch={rows}"])
        return run_memory_estimate(config).phases["sampling"]

    # 16 prompts x group 8 = 128 samples: 256 rows per forward samples them at once, 8 in 16 forwards
    assert sampling(256) == sampling(128) == 16 * sampling(8) > 0
    assert sampling(8) == 8 * sampling(1)


def _wan_1_3b(tmp_path: Path) -> Path:
    """A config-only Wan2.1-T2V-1.3B folder: the shipped 14B configs with the 1.3B transformer's."""
    folder = tmp_path / "wan2.1-t2v-1.3b"
    shutil.copytree(model_folder("wan2.1-t2v-14b"), folder)
    (folder / "transformer" / "config.json").write_text(json.dumps(WAN_1_3B))
    return folder


def test_the_wan_recipe_fits_an_80_gb_h100_by_the_estimate(tmp_path: Path) -> None:
    recipe = yaml.safe_load((REPO / "configs" / "wan21-t2v-1.3b-lora.yaml").read_text())
    fields = {"dtype": recipe["dtype"], "rollout": recipe["rollout"], "train": recipe["train"],
              "model": {**recipe["model"], "pretrained": str(_wan_1_3b(tmp_path))}}
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(fields))
    h100 = profile("H100-SXM")

    def memory(*overrides: str) -> MemoryEstimate:
        return derive_workload(load_config(PlanConfig, tmp_path / "plan.yaml", list(overrides)), h100).memory

    shipped, at_once = memory(), memory("rollout.sample_batch=256")
    assert recipe["rollout"]["sample_batch"] == 8
    # 16 rows per forward with CFG instead of 64 (the merged LoRA weights, the same in both, on top)
    assert shipped.phases["sampling"] < at_once.phases["sampling"] / 3
    assert shipped.total < at_once.total and shipped.total <= 80e9 and shipped.total <= h100.memory_bytes
    assert shipped.total / GIB < 20  # 14.6 GiB (sampling 7.6 GiB; 31.2 GiB with every video in one forward)
