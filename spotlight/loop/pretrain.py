"""Pre-training of the base model: rectified-flow matching of TinyDiT on rendered (prompt, image) pairs.

The learning rate is constant after warm-up, so the checkpoint taken at step k is exactly what a run
with ``steps = k`` ends with: the shipped base model is reproduced by its config alone.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from spotlight.components.checkpoint import load_model, save_model
from spotlight.config import PretrainConfig, dump_config
from spotlight.loop.evaluation import evaluate
from spotlight.models.policy import Policy
from spotlight.models.tinydit import TinyDiT, TinyDiTConfig
from spotlight.schema import ConfigError
from spotlight.task_presets import get_task


def build_model(config: PretrainConfig) -> TinyDiT:
    """A freshly initialised TinyDiT of the configured size over the task's vocabulary."""
    section = config.model
    return TinyDiT(TinyDiTConfig(
        image_size=section.image_size, patch_size=section.patch_size, dim=section.dim, depth=section.depth,
        num_heads=section.num_heads, mlp_ratio=section.mlp_ratio, vocab_size=get_task(config.task).vocab_size,
        max_text_len=section.max_text_len, image_width=section.image_width, task=config.task,
    ))


def initial_model(config: PretrainConfig) -> TinyDiT:
    """The model pre-training starts from: fresh, or the weights of ``init_checkpoint`` (a later stage).

    A later stage restarts the optimizer (the shipped models keep no optimizer state) and must keep
    the model's geometry: a mismatch is a config error, not a silent re-initialisation.
    """
    model = build_model(config)
    if config.init_checkpoint is None:
        return model
    start = load_model(config.init_checkpoint)
    if start.config != model.config:
        raise ConfigError(f"init_checkpoint {config.init_checkpoint} has model {start.config}, but the config "
                          f"asks for {model.config}: make the 'model' section match the checkpoint")
    return start.float()


def sample_sigmas(batch: int, sampling: str, generator: torch.Generator) -> torch.Tensor:
    """Training noise levels (B,): ``uniform`` on (0, 1), or ``logit_normal`` (SD3's, centred on 0.5).

    Uniform is the default here: on 32x32 images with a few small objects, the layout (how many
    objects, where) is decided above sigma = 0.9, which logit-normal visits in ~3% of samples. A
    model trained that way samples colours right but scatters blobs.
    """
    if sampling == "uniform":
        return torch.rand(batch, generator=generator)
    return torch.sigmoid(torch.randn(batch, generator=generator))


def flow_matching_loss(model: TinyDiT, images: torch.Tensor, tokens: torch.Tensor, sigma: torch.Tensor,
                       generator: torch.Generator) -> torch.Tensor:
    """MSE between predicted and true velocity ``noise - x0`` at the given sigmas (B,)."""
    noise = torch.randn(images.shape, generator=generator)
    s = sigma[:, None, None, None]
    noisy = (1 - s) * images + s * noise
    return F.mse_loss(model(noisy, sigma, tokens), noise - images)


def ema_decay_at(step: int, decay: float) -> float:
    """EMA decay with warm-up, ``min(decay, (1 + step) / (10 + step))``.

    Without warm-up an EMA of decay 0.999 still weighs the (zero-output, adaLN-Zero) initial weights
    by 0.999**500 = 0.6 after 500 steps, so early checkpoints would sample pure noise.
    """
    return min(decay, (1.0 + step) / (10.0 + step))


@torch.no_grad()
def update_ema(ema: Policy, model: Policy, decay: float) -> None:
    """Move ``ema``'s trained tensors towards ``model``'s: ``ema <- decay ema + (1 - decay) model``.

    Over ``trainable_parameters()``, not every parameter: a LoRA policy's frozen copies
    (`spotlight.models.shadow`) hold only their LoRA tensors over the one shared base.
    """
    for ema_param, param in zip(ema.trainable_parameters(), model.trainable_parameters(), strict=True):
        ema_param.lerp_(param, 1.0 - decay)


def pretrain(config: PretrainConfig, on_step: Callable[[int, float], None] | None = None) -> Path:
    """Run flow-matching pre-training; evaluate and save the EMA model every ``eval_every`` steps.

    Writes ``out_dir/step-XXXXXX/`` model directories, ``out_dir/metrics.jsonl`` and ``out_dir/final``;
    returns the final directory.
    """
    torch.manual_seed(config.seed)
    torch.set_num_threads(config.num_threads)
    out_dir = Path(config.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dump_config(config, out_dir / "config.yaml")
    model = initial_model(config)
    ema = copy.deepcopy(model).requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    generator = torch.Generator().manual_seed(config.seed)
    task = get_task(config.task)
    _, validation = task.split()
    reward = task.make_reward(0.0)
    metrics_file = (out_dir / "metrics.jsonl").open("a")
    started = time.perf_counter()
    for step in range(1, config.steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = config.learning_rate * min(1.0, step / max(1, config.warmup_steps))
        prompts = task.pretrain_prompts(generator, config.batch_size)
        images = task.render_batch(prompts, config.seed * 1_000_000 + step, model.config.image_size,
                                   model.config.width, config.layout_lattice)
        sigma = sample_sigmas(len(prompts), config.sigma_sampling, generator)
        loss = flow_matching_loss(model, images, task.tokenize(prompts, config.model.max_text_len), sigma, generator)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        update_ema(ema, model, ema_decay_at(step, config.ema_decay))
        if on_step is not None:
            on_step(step, loss.item())
        if step % config.eval_every == 0 or step == config.steps:
            result = evaluate(ema, validation, reward, config.eval.seeds_per_prompt, config.eval.num_steps)
            record = {"step": step, "loss": loss.item(), "wall_s": time.perf_counter() - started, **result.metrics()}
            metrics_file.write(json.dumps(record) + "\n")
            metrics_file.flush()
            save_model(out_dir / f"step-{step:06d}", ema, {"pretrain_step": step, **record})
    metrics_file.close()
    final = out_dir / "final"
    save_model(final, ema, {"pretrain_step": config.steps, "pretrain_config": config.model_dump(mode="json")},
               dtype=getattr(torch, config.storage_dtype))
    return final
