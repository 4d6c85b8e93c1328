"""TAG: lossless offload/restore around a trainer-generated fragment, no optimizer step, the right version,
and an update that sees the same samples as if a generator had drawn them."""

import pytest
import torch
from disagg_batches import PLAN, batch_seeds, batch_tokens, policy, score_by_brightness, twin

from spotlight.disagg.accumulate import LogicalBatchUpdate
from spotlight.disagg.assisted import trainer_assisted_fragment
from spotlight.disagg.generators import generate_fragment
from spotlight.disagg.group_loss import GrpoGroupLoss
from spotlight.disagg.groups import GroupAssembler
from spotlight.disagg.samples import cut_generation_units
from spotlight.disagg.versions import VersionGate

GROUP_SIZE = 2
UNITS = cut_generation_units(4, GROUP_SIZE, unit_size=2)


def state_bytes(model, optimizer) -> dict[str, bytes]:
    """Every byte of weights, gradients and optimizer state, by name."""
    out = {}
    for name, parameter in model.named_parameters():
        out[f"w/{name}"] = parameter.detach().numpy().tobytes()
        out[f"g/{name}"] = b"" if parameter.grad is None else parameter.grad.numpy().tobytes()
    for index, state in optimizer.state_dict()["state"].items():
        for key, value in state.items():
            out[f"o/{index}/{key}"] = value.numpy().tobytes() if torch.is_tensor(value) else repr(value).encode()
    return out


def generator_fragment(model, unit, version):
    return generate_fragment(model, version, unit.members, batch_tokens(), batch_seeds(GROUP_SIZE), PLAN,
                             score_by_brightness, "generator")


def mid_batch_trainer(version: int):
    """A trainer one committed step in, with half a logical batch of GRPO gradients accumulated."""
    model = policy(0).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.zeros(1, 3, 8, 8), torch.ones(1), torch.ones(1, 8, dtype=torch.long)).sum().backward()
    optimizer.step()
    samples = [s for unit in UNITS for s in generator_fragment(model, unit, version)]
    assembler = GroupAssembler(4, GROUP_SIZE)
    groups = [g for s in samples for g in assembler.add(s)]
    update = LogicalBatchUpdate(model, GrpoGroupLoss([0, 2], PLAN.sigmas(), PLAN.noise_level, 1e-2), 4)
    update.add(groups[0])
    update.add(groups[1])
    return model, optimizer, update, groups


def test_tag_leaves_weights_gradients_and_optimizer_state_byte_identical_and_takes_no_step():
    model, optimizer, _, _ = mid_batch_trainer(version=1)
    before = state_bytes(model, optimizer)
    steps = []
    optimizer.register_step_pre_hook(lambda *args: steps.append(1))
    samples = trainer_assisted_fragment(model, optimizer, 1, 1, VersionGate(), UNITS[2].members, batch_tokens(),
                                        batch_seeds(GROUP_SIZE), PLAN, score_by_brightness)
    assert len(samples) == 2 and steps == []
    assert state_bytes(model, optimizer) == before
    assert model.training  # TAG samples in eval mode and gives the trainer back in train mode


def test_a_tag_sample_is_the_generator_sample_with_the_trainers_version_and_only_its_producer_differs():
    model, optimizer, _, _ = mid_batch_trainer(version=1)
    expected = generator_fragment(twin(model), UNITS[3], version=1)
    got = trainer_assisted_fragment(model, optimizer, 1, 2, VersionGate(async_one_step=True), UNITS[3].members,
                                    batch_tokens(), batch_seeds(GROUP_SIZE), PLAN, score_by_brightness)
    for tag, generated in zip(got, expected, strict=True):
        assert tag.produced_by == "trainer" and generated.produced_by == "generator"
        assert tag.id == generated.id and tag.id.policy_version == 1 and tag.step_versions == (1,) * PLAN.num_steps
        assert torch.equal(tag.latents, generated.latents) and torch.equal(tag.log_probs, generated.log_probs)
        assert tag.reward == generated.reward


def test_an_update_with_tag_fragments_equals_the_update_without():
    results = []
    for tag_units in ((), (1, 3)):
        model = policy(0)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        assembler = GroupAssembler(4, GROUP_SIZE)
        update = LogicalBatchUpdate(model, GrpoGroupLoss([0, 2], PLAN.sigmas(), PLAN.noise_level, 1e-2), 4)
        for index, unit in enumerate(UNITS):  # TAG in the middle of the batch, with gradients accumulated
            if index in tag_units:
                fragment = trainer_assisted_fragment(model, optimizer, 0, 0, VersionGate(), unit.members,
                                                     batch_tokens(), batch_seeds(GROUP_SIZE), PLAN,
                                                     score_by_brightness)
            else:
                fragment = generator_fragment(model, unit, 0)
            for sample in fragment:
                for group in assembler.add(sample):
                    update.add(group)
        update.commit(optimizer, 1.0)
        results.append([p.detach().clone() for p in model.parameters()])
    for without, with_tag in zip(*results, strict=True):
        assert torch.equal(without, with_tag)


def test_tag_refuses_a_fragment_the_version_gate_forbids():
    model, optimizer, _, _ = mid_batch_trainer(version=1)
    with pytest.raises(ValueError, match="only fragments the version gate allows"):
        trainer_assisted_fragment(model, optimizer, 1, 2, VersionGate(async_one_step=False), UNITS[0].members,
                                  batch_tokens(), batch_seeds(GROUP_SIZE), PLAN, score_by_brightness)
