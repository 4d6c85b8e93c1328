"""A pipeline folder read as diffusers reads it (issue 48): each component's class comes from model_index.json.

transformers writes a text encoder's ``architectures`` (and ``model_type``) only when it saves a model, so a
folder assembled from configs lacks them; diffusers never reads them, nor a component config's ``_class_name``.
`spotlight plan` must count such a folder as it counts the same folder with the keys, and `spotlight train`
must run on one. A class that model_index.json names and the installed library lacks is one line.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from spotlight.cli import app

runner = CliRunner()
# keys published folders carry that diffusers does not need to pick or build a component's class
UNREQUIRED = ("architectures", "model_type", "_class_name", "transformers_version", "_diffusers_version")
SMALL_RUN = ["-s", "rollout.resolution=32", "-s", "rollout.prompts_per_iteration=2", "-s", "rollout.group_size=2",
             "-s", "rollout.num_steps=2", "-s", "rollout.sde_steps=null", "-s", "train.num_minibatches=1",
             "-s", "train.num_epochs=1", "-s", "eval.seeds_per_prompt=1", "-s", "eval.num_steps=2",
             "-s", "eval.grid_prompts=2", "-s", "eval.raw_model=false", "-s", "eval.prompts=4",
             "-s", "model.lora_rank=2", "-s", "pin_devices=false", "-s", "num_threads=1", "-s", "mode=vanilla"]

# a 20-iteration target: the plan's ~30 simulated mixes are 5x shorter; the counts compared do not depend on it
SHORT_TARGET = ["-s", "convergence.vanilla_iterations=20"]


def _configs_only(folder: Path, out: Path) -> Path:
    """``folder``'s JSON files alone (a hub snapshot without weights or tokenizers)."""
    for path in folder.rglob("*.json"):
        target = out / path.relative_to(folder)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
    return out


def _strip(folder: Path) -> Path:
    """Drop every key in UNREQUIRED from the components' config.json files; the folder."""
    for path in folder.glob("*/config.json"):
        config = json.loads(path.read_text())
        assert "architectures" not in config or path.parent.name.startswith("text_encoder")
        path.write_text(json.dumps({key: value for key, value in config.items() if key not in UNREQUIRED}))
    return folder


def _plan(folder: Path) -> dict:
    result = runner.invoke(app, ["plan", "24", "--json", "-s", f"model.pretrained={folder}", *SHORT_TARGET,
                                 "-s", "rollout.resolution=32"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_plan_counts_text_encoders_without_architectures_as_with_them(tiny_pipeline, tmp_path: Path,
                                                                      monkeypatch) -> None:
    monkeypatch.setenv("SPOTLIGHT_CACHE_DIR", str(tmp_path / "cache"))  # each folder counted, none from a cache
    with_keys = _configs_only(tiny_pipeline("sd3"), tmp_path / "with")
    assert all("architectures" in json.loads((with_keys / part / "config.json").read_text())
               for part in ("text_encoder", "text_encoder_2", "text_encoder_3"))
    without = _strip(_configs_only(tiny_pipeline("sd3"), tmp_path / "without"))
    expected, got = _plan(with_keys), _plan(without)
    for field in ("tflop_per_forward", "tflop_per_forward_backward", "parameters", "trainable_parameters",
                  "text_encoder_parameters", "vae_parameters"):
        assert got["workload"][field] == expected["workload"][field], field
    assert got["workload"]["text_encoder_parameters"] > 0
    assert got["per_gpu"]["memory_gib"] == expected["per_gpu"]["memory_gib"]
    assert got["iteration_s"] == expected["iteration_s"]


def test_train_runs_on_a_folder_whose_configs_lack_the_keys(tiny_pipeline, tmp_path: Path) -> None:
    folder = tmp_path / "stripped"
    shutil.copytree(tiny_pipeline("sd3"), folder)
    _strip(folder)
    run_dir = tmp_path / "run"
    result = runner.invoke(app, ["train", *SMALL_RUN, "-s", f"model.pretrained={folder}", "-s", "iterations=1",
                                 "-s", f"run_dir={run_dir}"])
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [record["iteration"] for record in records] == [0, 1]


def _unknown_text_encoder(folder: Path) -> Path:
    index = json.loads((folder / "model_index.json").read_text())
    index["text_encoder_2"] = ["transformers", "CLIPTextModelWithTelepathy"]
    (folder / "model_index.json").write_text(json.dumps(index))
    config = folder / "text_encoder_2" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "transformers_version": "99.0.0"}))
    return folder


def _one_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip() and not line.startswith("memory estimate")]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def test_a_class_the_installed_library_lacks_is_one_line_naming_it(tiny_pipeline, tmp_path: Path,
                                                                   monkeypatch) -> None:
    monkeypatch.setenv("SPOTLIGHT_CACHE_DIR", str(tmp_path / "cache"))
    folder = _unknown_text_encoder(_configs_only(tiny_pipeline("sd3"), tmp_path / "configs"))
    line = _one_line(runner.invoke(app, ["plan", "24", "-s", f"model.pretrained={folder}",
                                         "-s", "rollout.resolution=32"]))
    assert "transformers.CLIPTextModelWithTelepathy" in line and "text_encoder_2" in line
    assert "transformers>=99.0.0" in line and "lacks" in line


def test_train_refuses_a_class_the_installed_library_lacks_in_one_line(tiny_pipeline, tmp_path: Path) -> None:
    folder = tmp_path / "unknown"
    shutil.copytree(tiny_pipeline("sd3"), folder)
    line = _one_line(runner.invoke(app, ["train", *SMALL_RUN, "-s", f"model.pretrained={_unknown_text_encoder(folder)}",
                                         "-s", "iterations=1", "-s", f"run_dir={tmp_path / 'run'}"]))
    assert "transformers.CLIPTextModelWithTelepathy" in line and "transformers>=99.0.0" in line


def test_plan_reads_a_key_a_config_leaves_out_as_its_class_default(tmp_path: Path, monkeypatch) -> None:
    """SD3.5-Medium's published configs without every key whose value is the diffusers class's default
    (in_channels, patch_size, sample_size, ... ; the VAE's and scheduler's too) count the same."""
    from spotlight.models.folder_defaults import CLASS_DEFAULTS
    from spotlight.sim.planning.model_folders import model_folder

    monkeypatch.setenv("SPOTLIGHT_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "sparse"
    shutil.copytree(model_folder("sd3.5-medium"), folder)
    dropped = []
    for path in [*folder.glob("*/config.json"), folder / "scheduler" / "scheduler_config.json"]:
        config = json.loads(path.read_text())
        defaults = CLASS_DEFAULTS.get(config.get("_class_name", ""), {})
        dropped += [key for key, value in config.items() if defaults.get(key, object()) == value]
        path.write_text(json.dumps({key: value for key, value in config.items()
                                    if defaults.get(key, object()) != value}))
    assert {"in_channels", "patch_size", "sample_size", "num_train_timesteps"} <= set(dropped)
    arguments = ["plan", "24", "--json", "-s", "rollout.resolution=512", *SHORT_TARGET]
    expected = runner.invoke(app, [*arguments, "-s", "model.pretrained=sd3.5-medium"])
    got = runner.invoke(app, [*arguments, "-s", f"model.pretrained={folder}"])
    assert got.exit_code == 0, got.output
    expected_plan, got_plan = json.loads(expected.stdout), json.loads(got.stdout)
    for plan in (expected_plan, got_plan):
        plan["workload"].pop("from")
    assert got_plan["workload"] == expected_plan["workload"]
    assert got_plan["per_gpu"] == expected_plan["per_gpu"]
