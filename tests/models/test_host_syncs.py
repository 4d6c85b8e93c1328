"""No step of the denoising loop and no micro-batch of an update waits for the device.

On a GPU a host read of a device value (``.item()``, ``.tolist()``, ``.cpu()``, ``float(t)``, ``if t:``,
``nonzero``, an explicit synchronize) stalls the host until every queued kernel has run, so the next
launch starts late. This machine has no GPU, so the test counts the calls themselves: it wraps every
such entry point of ``torch.Tensor`` (and ``torch.cuda.synchronize``), runs a real tiny SD3 pipeline
policy through the sampler (SDE, true CFG) and through both updates (NFT with its sampling policy,
Flow-GRPO with its KL reference) in several micro-batches, and requires zero such calls between one
forward of the loop and the next. A fixed number per rollout or per minibatch (binding the prompts,
the one read of the logged sums) is allowed; one per step is what this pins down. Reintroducing,
say, ``float(loss)`` per micro-batch or ``cond.cpu()`` in the policy's forward fails it.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator

import pytest
import torch

from spotlight.config import TrainSection
from spotlight.diffusion.sampler import SamplingPlan, sample
from spotlight.models.generation import generate
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


@contextlib.contextmanager
def counting_syncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[collections.Counter]:
    """Count every call of a sync point while the block runs (the calls still happen)."""
    counts: collections.Counter = collections.Counter()

    def counted(name: str, original):
        def call(*args, **kwargs):
            counts[name] += 1
            return original(*args, **kwargs)
        return call

    with monkeypatch.context() as patch:
        for name in SYNC_POINTS:
            patch.setattr(torch.Tensor, name, counted(name, getattr(torch.Tensor, name)))
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


@pytest.fixture(scope="module")
def policy(tiny_pipeline) -> PipelinePolicy:
    config = DiffusersPolicyConfig(family="sd3", pretrained=str(tiny_pipeline("sd3")), pipeline=True,
                                   resolution=(32, 32), dtype="float32", guidance_scale=4.5, negative_prompt="blurry",
                                   max_sequence_length=32)
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
    with counting_syncs(monkeypatch) as counts:
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
            metrics = grpo_update(policy, reference, optimizer, batch, section, generator)
    # nft: 4 micro-batches x (sampling policy, policy, reference); flow-grpo: 2 steps x 4 x (policy, reference)
    assert len(marks.marks) == (12 if algorithm == "nft" else 16)
    assert set(marks.between()) == {0}, f"syncs inside the update's inner loop: {dict(counts)}"
    assert sum(counts.values()) <= 12, f"more than a fixed few syncs per update: {dict(counts)}"
    assert all(torch.isfinite(torch.tensor(value)) for value in metrics.values())
