"""No step of the denoising loop and no micro-batch of an update waits for the device.

On a GPU a host read of a device value (``.item()``, ``.tolist()``, ``.cpu()``, ``float(t)``, ``if t:``,
``nonzero``, an explicit synchronize) stalls the host until every queued kernel has run, so the next
launch starts late; so does a blocking copy between host and device (``.to(device)`` without
``non_blocking``, ``torch.tensor(values, device=...)``), which waits for the copy and, from pageable
memory, for the stream. This machine has no GPU, so the test counts the calls themselves: it wraps every
such entry point of ``torch.Tensor`` (and ``torch.cuda.synchronize``), counts each ``.to()`` in Spotlight's
code that names a device without ``non_blocking=True`` (a CPU run cannot tell a no-op from a copy, so any
such call is one; `spotlight.diffusion.sampler.to_device`, pinned and non-blocking on CUDA, is the
sanctioned way and not counted, nor are the libraries' same-device ``t.to(x.device)``), and runs real
tiny SD3, FLUX and Qwen-Image pipeline policies, with the LoRA as adapters and folded into the base
weights (merged sampling), through the sampler (SDE, CFG) and through both updates (NFT with its sampling
policy, Flow-GRPO with its KL reference and θ_old re-scoring a merged rollout) in several micro-batches.
It requires zero such calls between one forward of the loop and the next. A fixed number per rollout or
per minibatch (binding the prompts, the one read of the logged sums) is allowed; one per step is what this
pins down. Reintroducing, say, ``float(loss)`` per micro-batch, ``cond.cpu()`` or ``x.to(device)`` in the
policy's forward, or FLUX's image ids built on the CPU and copied over at every forward, fails it.
"""

from __future__ import annotations

import collections
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import spotlight
from spotlight.config import TrainSection
from spotlight.diffusion import sampler as sampler_module
from spotlight.diffusion.sampler import SamplingPlan, sample
from spotlight.models.generation import generate
from spotlight.models.lora_merge import sampling_weights
from spotlight.models.pipelines.family_config import DiffusersPolicyConfig
from spotlight.models.pipelines.policy import PipelinePolicy
from spotlight.models.pipelines.prompts import bind_prompts
from spotlight.models.rebuild import policy_from_config
from spotlight.models.shadow import frozen_base, frozen_copy
from spotlight.rl.grpo import RolloutBatch, grpo_update
from spotlight.rl.nft import nft_update

# what makes the host wait for the device on CUDA (the ops that read a value back, or need its size)
SYNC_POINTS = ("item", "tolist", "cpu", "numpy", "nonzero", "__bool__", "__float__", "__int__", "__index__")
PROMPTS = ["a red circle", "a blue square"]
SPOTLIGHT = str(Path(spotlight.__file__).parent)


def names_a_device(args: tuple, kwargs: dict) -> bool:
    """Whether a ``Tensor.to`` call names a device (a device, a device string, another tensor)."""
    if kwargs.get("device") is not None or isinstance(kwargs.get("other"), torch.Tensor):
        return True
    return any(isinstance(arg, torch.device | str | torch.Tensor) for arg in args)


def blocking(args: tuple, kwargs: dict) -> bool:
    """Whether a ``Tensor.to`` call waits: no ``non_blocking=True`` (keyword, or nn.Module.to's positional bool)."""
    flags = [arg for arg in args if isinstance(arg, bool)]
    return not kwargs.get("non_blocking", flags[0] if flags else False)


@contextlib.contextmanager
def counting_syncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[collections.Counter]:
    """Count every call of a sync point and every blocking copy while the block runs (the calls still happen)."""
    counts: collections.Counter = collections.Counter()

    def counted(name: str, original):
        def call(*args, **kwargs):
            counts[name] += 1
            return original(*args, **kwargs)
        return call

    tensor_to, tensor_of = torch.Tensor.to, torch.tensor
    sanctioned = sampler_module.to_device.__code__

    def spotlights(caller) -> bool:
        """A call from Spotlight's code other than `to_device` (the libraries' ``t.to(x.device)`` inside a forward,
        diffusers' RoPE or torch's grad clipping, are same-device no-ops by construction)."""
        return caller.f_code is not sanctioned and caller.f_code.co_filename.startswith(SPOTLIGHT)

    def to(self, *args, **kwargs):
        if names_a_device(args, kwargs) and blocking(args, kwargs) and spotlights(sys._getframe(1)):
            counts["to(device)"] += 1
        return tensor_to(self, *args, **kwargs)

    def tensor(*args, **kwargs):
        if kwargs.get("device") is not None and spotlights(sys._getframe(1)):
            counts["tensor(device=)"] += 1
        return tensor_of(*args, **kwargs)

    with monkeypatch.context() as patch:
        for name in SYNC_POINTS:
            patch.setattr(torch.Tensor, name, counted(name, getattr(torch.Tensor, name)))
        patch.setattr(torch.Tensor, "to", to)
        patch.setattr(torch.Tensor, "cuda", counted("cuda", torch.Tensor.cuda))
        patch.setattr(torch, "tensor", tensor)
        patch.setattr(torch, "nonzero", counted("torch.nonzero", torch.nonzero))
        patch.setattr(torch.cuda, "synchronize", counted("cuda.synchronize", torch.cuda.synchronize))
        yield counts


def uncounted(call, counts: collections.Counter):
    """``call()`` with what it adds to ``counts`` taken off again."""
    before = collections.Counter(counts)
    result = call()
    counts.clear()
    counts.update(before)
    return result


class ForwardMarks:
    """Wraps a policy's forward: the sync count at each call, so the calls between two forwards are known."""

    def __init__(self, counts: collections.Counter) -> None:
        self.counts = counts
        self.marks: list[int] = []

    def wrap(self, module: torch.nn.Module, monkeypatch: pytest.MonkeyPatch) -> None:
        original = module.forward

        def forward(*args, **kwargs):
            self.marks.append(sum(self.counts.values()))
            return original(*args, **kwargs)

        monkeypatch.setattr(module, "forward", forward)

    def between(self) -> list[int]:
        return [after - before for before, after in zip(self.marks, self.marks[1:], strict=False)]


# (family, LoRA folded into the base weights for sampling): every family's forward, both sampling paths (the
# update's forwards are the adapter's in every case; a merged rollout adds Flow-GRPO's re-scoring by θ_old)
CASES = [("sd3", False), ("flux", True), ("qwen-image", True)]


@pytest.fixture(scope="module", params=CASES, ids=[f"{family}-{'merged' if merged else 'adapter'}"
                                                   for family, merged in CASES])
def policy(tiny_pipeline, request) -> PipelinePolicy:
    family, merged = request.param
    # the tiny FLUX is guidance-distilled (the scale is an input); SD3 and Qwen-Image run true CFG
    config = DiffusersPolicyConfig(family=family, pretrained=str(tiny_pipeline(family)), pipeline=True,
                                   resolution=(32, 32), dtype="float32", guidance_scale=4.5, negative_prompt="blurry",
                                   max_sequence_length=32, merge_lora=merged)
    model = policy_from_config(config)
    assert isinstance(model, PipelinePolicy)
    with torch.no_grad():  # LoRA B away from zero, so the adapters take part in every forward
        for parameter in model.trainable_parameters():
            parameter.normal_(0.0, 0.02, generator=torch.Generator().manual_seed(1))
    return model


def test_the_denoising_loop_reads_nothing_back_between_steps(policy, monkeypatch) -> None:
    tokens = policy.tokenize([prompt for prompt in PROMPTS for _ in range(2)])
    plan = SamplingPlan(num_steps=4, sampler="sde", noise_level=0.7)
    cond = bind_prompts(policy, tokens)
    with counting_syncs(monkeypatch) as counts, sampling_weights(policy):  # merged: the rollout's weights
        marks = ForwardMarks(counts)
        marks.wrap(policy, monkeypatch)
        trajectory = sample(lambda x, sigma: policy(x, sigma, cond), [0, 1, 2, 3], plan, policy.latent_shape)
        after = sum(counts.values())
    assert len(marks.marks) == 4
    assert marks.between() == [0, 0, 0], f"syncs between denoising steps: {dict(counts)}"
    assert after - marks.marks[-1] == 0, f"syncs in the last step: {dict(counts)}"
    assert trajectory.latents.shape[1] == 5


def test_generate_costs_a_fixed_number_of_syncs_whatever_the_step_count(policy, monkeypatch) -> None:
    prompts = [prompt for prompt in PROMPTS for _ in range(2)]
    totals = []
    for steps in (2, 5):
        policy.tokenize(prompts)  # encoded before counting: the text encoders are not the loop
        with counting_syncs(monkeypatch) as counts:
            generate(policy, prompts, [0, 1, 2, 3], SamplingPlan(num_steps=steps, sampler="sde"))
        totals.append(dict(counts))
    assert totals[0] == totals[1], f"generate's syncs grow with the steps: {totals}"


def rollout_batch(policy: PipelinePolicy, guided: bool) -> RolloutBatch:
    prompts = [prompt for prompt in PROMPTS for _ in range(2)]
    plan = SamplingPlan(num_steps=2, sampler="sde", noise_level=0.7)
    trajectory = generate(policy, prompts, list(range(4)), plan)
    return RolloutBatch(latents=trajectory.latents, log_probs=trajectory.log_probs,
                        tokens=policy.tokenize(prompts, guided=guided), advantages=torch.tensor([1.0, -1.0, 0.5, -0.5]),
                        sigmas=plan.sigmas(), noise_level=0.7, stochastic_steps=2)


@pytest.mark.parametrize("algorithm", ["nft", "flow-grpo"])
def test_the_update_reads_nothing_back_between_micro_batches(policy, monkeypatch, algorithm) -> None:
    batch = rollout_batch(policy, guided=algorithm == "flow-grpo")
    section = TrainSection(algorithm=algorithm, num_epochs=1, num_minibatches=1, micro_batch_size=1, nft_timesteps=1,
                           timestep_fraction=1.0, kl_beta=0.1, nft_kl_beta=0.1)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-4)
    previous, reference = frozen_copy(policy), frozen_base(policy)
    step = optimizer.step
    with counting_syncs(monkeypatch) as counts:
        # AdamW reads its step counters with .item(): CPU tensors on CUDA too (not capturable), so no sync
        monkeypatch.setattr(optimizer, "step", lambda: uncounted(step, counts))
        marks = ForwardMarks(counts)
        marks.wrap(policy, monkeypatch)
        generator = torch.Generator().manual_seed(0)
        if algorithm == "nft":
            metrics = nft_update(policy, previous, optimizer, batch, section, generator, reference)
        else:
            metrics = grpo_update(policy, reference, optimizer, batch, section, generator, previous)
    # nft: 4 micro-batches x (sampling policy, policy, reference); flow-grpo: 2 steps x 4 x (policy, reference),
    # and θ_old re-scoring each micro-batch of a merged rollout
    rescored = algorithm == "flow-grpo" and policy.config.merge_lora
    assert len(marks.marks) == {"nft": 12, "flow-grpo": 24 if rescored else 16}[algorithm]
    assert set(marks.between()) == {0}, f"syncs inside the update's inner loop: {dict(counts)}"
    assert sum(counts.values()) <= 12, f"more than a fixed few syncs per update: {dict(counts)}"
    assert all(torch.isfinite(torch.tensor(value)) for value in metrics.values())
