"""After start-up no text-encoder weight moves between devices during training iterations (issue 42 item 2).

Moving T5-XXL + two CLIPs (~10 GB) or Qwen2.5-VL-7B (~17 GB) to the GPU and back whenever an iteration
brought a new prompt cost more than the iteration. A run now places its encoders once at start
(``model.text_encoders``, `spotlight.loop.text_encoders`). This machine has no GPU, so
the tests watch what would cross on one: every ``.to()`` call on an encoder module (``nn.Module.to``,
which a pipeline's ``.to`` goes through), each encoder parameter's storage, and, under ``precompute``,
every forward of an encoder. A real tiny SD3 run trains three iterations on the CPU with every ``Trainer``
iteration watched; the start-up (building the policy, placing the encoders) is not.
"""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedModel

from spotlight.config import TrainConfig, load_config
from spotlight.loop.text_encoders import plan_text_encoders, resident_bytes
from spotlight.models.pipelines.memory_estimate import GIB, run_memory_estimate
from spotlight.models.pipelines.prompts import PromptCache
from spotlight.trainer import Trainer

SMALL = ["rollout.resolution=32", "rollout.prompts_per_iteration=2", "rollout.group_size=2", "rollout.num_steps=2",
         "rollout.sde_steps=null", "train.num_minibatches=1", "train.num_epochs=1", "eval.seeds_per_prompt=1",
         "eval.num_steps=2", "eval.grid_prompts=2", "eval.raw_model=false", "eval.prompts=4", "eval.every=100",
         "model.lora_rank=2", "pin_devices=false", "num_threads=1", "mode=vanilla", "iterations=3",
         "rollout.guidance_scale=2.0"]


def encoders_of(cache: PromptCache) -> list[torch.nn.Module]:
    """The text encoders a cache has loaded (CLIPs and T5 for SD3)."""
    return [module for module in cache._pipe.components.values() if isinstance(module, PreTrainedModel)]


def watched_run(tmp_path: Path, folder: Path, placement: str, monkeypatch: pytest.MonkeyPatch) -> dict:
    """Train three iterations; what the text encoders did inside them: ``.to()`` calls, forwards, and whether
    every parameter kept its device and storage."""
    config = load_config(TrainConfig, None, [*SMALL, f"model.pretrained={folder}", f"run_dir={tmp_path / 'run'}",
                                             f"model.text_encoders={placement}"])
    trainer = Trainer(config)
    cache = trainer.model.prompts
    assert cache._pipe is not None, "the start-up loaded and placed the encoders"
    encoders = encoders_of(cache)
    storage = {name: (parameter.device, parameter.data_ptr()) for module in encoders
               for name, parameter in module.named_parameters(prefix=type(module).__name__)}
    seen: collections.Counter = collections.Counter()
    inside = [False]
    module_to = torch.nn.Module.to

    def counted_to(module, *args, **kwargs):
        if inside[0] and any(module is encoder for encoder in encoders):
            seen["to"] += 1
        return module_to(module, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "to", counted_to)
    for encoder in encoders:
        encoder.register_forward_pre_hook(lambda *_: seen.update(["forward"] if inside[0] else []))
    iteration = trainer.iteration

    def watched(index: int):
        inside[0] = True
        try:
            return iteration(index)
        finally:
            inside[0] = False

    monkeypatch.setattr(trainer, "iteration", watched)
    summary = trainer.run()
    assert [record["iteration"] for record in summary.history] == [0, 1, 2, 3]
    after = {name: (parameter.device, parameter.data_ptr()) for module in encoders
             for name, parameter in module.named_parameters(prefix=type(module).__name__)}
    return {"to": seen["to"], "forward": seen["forward"], "same_storage": after == storage,
            "placement": cache.placement}


@pytest.mark.parametrize("placement", ["precompute", "resident"])
def test_no_text_encoder_weight_moves_inside_training_iterations(placement, tiny_pipeline, tmp_path,
                                                                 monkeypatch) -> None:
    watched = watched_run(tmp_path, tiny_pipeline("sd3"), placement, monkeypatch)
    assert watched["to"] == 0, f"text encoders moved inside iterations: {watched}"
    assert watched["same_storage"], "an encoder parameter changed device or storage during training"
    if placement == "precompute":  # every training and validation prompt was encoded before the loop
        assert watched["placement"] == "precomputed"
        assert watched["forward"] == 0, f"an encoder ran inside an iteration: {watched}"


def test_auto_keeps_them_resident_when_the_estimate_fits_and_precomputes_when_not(tiny_pipeline) -> None:
    config = load_config(TrainConfig, None, [*SMALL, f"model.pretrained={tiny_pipeline('flux')}", "device=cpu"])
    assert plan_text_encoders(config).placement == "resident"  # a CPU run: nothing crosses
    on_gpu = config.model_copy(update={"device": "cuda"})
    needed = resident_bytes(run_memory_estimate(on_gpu))
    roomy, tight = plan_text_encoders(on_gpu, 2 * needed), plan_text_encoders(on_gpu, needed)
    assert roomy.placement == "resident" and "fits 90%" in roomy.line
    assert tight.placement == "precompute" and "exceeds 90%" in tight.line
    assert f"{needed / GIB:.1f} GiB" in tight.line
    chosen = config.model_copy(update={"model": config.model.model_copy(update={"text_encoders": "precompute"})})
    assert plan_text_encoders(chosen).line.startswith("text encoders: precompute")
