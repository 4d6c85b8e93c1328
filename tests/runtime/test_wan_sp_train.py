"""``spotlight train`` with ``runtime.sp_degree: 2`` on a tiny Wan2.1 folder: exploration served by elastic SP groups.

The run's spot node gets an agent whose two device processes load the folder and form one SP-2 group
(its reconfiguration log says so); the explored candidates' videos are denoised by that group through the
request queue and trained on. A degree the folder's transformer cannot shard is refused before any model
is loaded, in one line naming the field.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_wan_train import metrics, settings

from spotlight.config import TrainConfig, parse_config
from spotlight.loop.base_policy import policy_config
from spotlight.schema import ConfigError
from spotlight.trainer import train


def sp_settings(folder: Path, run_dir: Path, sp_degree: int = 2, **rollout) -> dict:
    config = settings(folder, run_dir, "spotlight")
    config["runtime"]["sp_degree"] = sp_degree
    config["rollout"].update(rollout)
    return config


@pytest.mark.slow
def test_spotlight_mode_explores_a_wan_folder_with_an_sp2_group(tiny_pipeline, tmp_path: Path) -> None:
    import ray

    run_dir = tmp_path / "run"
    summary = train(parse_config(TrainConfig, sp_settings(tiny_pipeline("wan"), run_dir)))
    records = metrics(run_dir)
    assert [record["iteration"] for record in records] == [0, 1, 2, 3]
    assert any(record.get("planner/num_candidates", 0) > 0 for record in summary.history[2:])  # explored
    formed = [json.loads(line) for line in (run_dir / "reconfigurations.jsonl").read_text().splitlines()]
    assert formed and formed[0]["new_groups"][0]["members"] == ["node0/0", "node0/1"]  # one SP-2 group
    queue_log = [json.loads(line) for line in (run_dir / "queue-log-0.jsonl").read_text().splitlines()]
    assert queue_log[-1]["counts"]["leases_granted"] > 0 and queue_log[-1]["counts"]["checkpoints"] > 0
    assert all(record["rollout/invalid_samples"] == 0 for record in records[1:])
    assert not ray.is_initialized()


def test_a_degree_the_wan_folder_cannot_shard_is_refused_in_one_line(tiny_pipeline, tmp_path: Path) -> None:
    folder = tiny_pipeline("wan")
    assert policy_config(parse_config(TrainConfig, sp_settings(folder, tmp_path / "a"))).pipeline
    with pytest.raises(ConfigError, match=r"^runtime.sp_degree=4: sp_degree 4 does not divide num_heads 2"):
        policy_config(parse_config(TrainConfig, sp_settings(folder, tmp_path / "b", sp_degree=4)))
    # 12 x 12 pixels: 6 x 6 latents, 3 x 3 patches in each of 3 latent frames = 27 video tokens
    with pytest.raises(ConfigError, match=r"^runtime.sp_degree=2: .*does not divide the sequence length 27"):
        policy_config(parse_config(TrainConfig, sp_settings(folder, tmp_path / "d", resolution=12)))


def test_an_image_folder_whose_prompt_tokens_would_be_sharded_is_refused_with_sp(tiny_pipeline, tmp_path: Path) -> None:
    config = settings(tiny_pipeline("flux"), tmp_path / "run", "spotlight")
    config["runtime"]["sp_degree"] = 2
    config["rollout"].update(num_frames=None, guidance_scale=1.0)
    with pytest.raises(ConfigError, match=r"^runtime.sp_degree=2: SP over a pipeline folder serves wan folders, not "
                                          r"flux .*model.family without model.pretrained"):
        policy_config(parse_config(TrainConfig, config))
