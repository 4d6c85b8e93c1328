"""TCSS: with asynchrony on no sample is more than one version stale and each trajectory has one version,
asserted from the versions the generators logged; off, generation waits for the newest weights."""

import pytest
import torch
from disagg_batches import PLAN, batch_seeds, batch_tokens, policy, score_by_brightness

from spotlight.disagg.generators import GenerationWorker, SnapshotStore, generate_fragment
from spotlight.disagg.samples import GenerationId, ScoredSample, cut_generation_units
from spotlight.disagg.versions import StalenessError, VersionGate

GROUP_SIZE = 2


def test_the_gate_allows_one_version_of_lag_only_when_asynchrony_is_on():
    on, off = VersionGate(async_one_step=True), VersionGate(async_one_step=False)
    assert [on.may_start(5, v) for v in (3, 4, 5, 6)] == [False, True, True, False]
    assert [off.may_start(5, v) for v in (3, 4, 5, 6)] == [False, False, True, False]


def sample_with(version: int, step_versions: tuple[int, ...]) -> ScoredSample:
    empty = torch.zeros(0)
    return ScoredSample(id=GenerationId(0, 0, version), latents=empty, log_probs=empty, tokens=empty, reward=0.0,
                        step_versions=step_versions)


@pytest.mark.parametrize(("version", "steps", "match"), [
    (2, (2, 2), "allowed versions are 3..4"), (5, (5, 5), "allowed versions"), (4, (3, 4), "mixes weight versions")])
def test_the_update_check_refuses_stale_future_and_mixed_samples(version, steps, match):
    with pytest.raises(StalenessError, match=match):
        VersionGate(async_one_step=True).check_update(4, [sample_with(version, steps)])


def test_a_weight_swap_mid_trajectory_is_caught_from_the_logged_step_versions():
    model = policy(0)
    reads = iter([0, 0, 1])  # θ_1 lands on the worker before the third denoising step
    samples = generate_fragment(model, 0, [(0, 0)], batch_tokens(), batch_seeds(GROUP_SIZE), PLAN,
                                score_by_brightness, "generator", version_now=lambda: next(reads))
    assert samples[0].step_versions == (0, 0, 1)
    with pytest.raises(StalenessError, match="mixes"):
        VersionGate(async_one_step=True).check_update(1, samples)


def run_steps(gate: VersionGate, num_updates: int) -> tuple[list[list[ScoredSample]], list[tuple[int, int]]]:
    """A trainer and one generator in lock-step events: while update s runs, the generator starts batch s+1
    with whatever the store lets it. Returns each update's samples and the (batch, version) of refused starts."""
    trainer = policy(0)
    store = SnapshotStore(gate)
    store.publish(0, trainer.broadcast_state())
    worker = GenerationWorker(policy(1))
    units = cut_generation_units(len(batch_tokens()), GROUP_SIZE, unit_size=3)
    batches: dict[int, list[ScoredSample]] = {0: []}
    for unit in units:  # batch 0 is generated before training starts
        worker.load(store.acquire(0))
        batches[0] += worker.generate(unit.members, batch_tokens(), batch_seeds(GROUP_SIZE), PLAN, score_by_brightness)
    refused = []
    for step in range(num_updates):
        batches[step + 1] = []
        half = len(units) // 2
        for unit in units[:half]:  # during update `step`: only what the gate allows
            snapshot = store.acquire(step + 1)
            if snapshot is None:
                refused.append((step + 1, step))
                break
            worker.load(snapshot)
            batches[step + 1] += worker.generate(unit.members, batch_tokens(), batch_seeds(GROUP_SIZE), PLAN,
                                                 score_by_brightness)
        with torch.no_grad():  # update `step` commits: θ_{step+1}
            for parameter in trainer.parameters():
                parameter.add_(0.01)
        store.publish(step + 1, trainer.broadcast_state())
        done = {(s.id.prompt_index, s.id.sample_index) for s in batches[step + 1]}
        for unit in units:  # the rest of batch step+1 after the publish
            members = [m for m in unit.members if m not in done]
            if members:
                worker.load(store.acquire(step + 1))
                batches[step + 1] += worker.generate(members, batch_tokens(), batch_seeds(GROUP_SIZE), PLAN,
                                                     score_by_brightness)
    return [batches[s] for s in range(num_updates + 1)], refused


def test_asynchronous_generation_is_at_most_one_version_stale_and_one_version_per_trajectory():
    gate = VersionGate(async_one_step=True)
    batches, refused = run_steps(gate, num_updates=3)
    assert refused == []
    stale = 0
    for step, samples in enumerate(batches):
        gate.check_update(step, samples)
        for sample in samples:  # from the logged versions, not from the gate
            assert 0 <= step - sample.id.policy_version <= 1
            assert set(sample.step_versions) == {sample.id.policy_version}
            stale += sample.id.policy_version == step - 1
    assert stale > 0  # asynchrony did happen


def test_strictly_on_policy_generation_waits_for_the_newest_weights():
    gate = VersionGate(async_one_step=False)
    batches, refused = run_steps(gate, num_updates=2)
    assert refused == [(1, 0), (2, 1)]
    for step, samples in enumerate(batches):
        assert {s.id.policy_version for s in samples} == {step}
        assert all(set(s.step_versions) == {step} for s in samples)


def test_snapshots_are_published_in_order_and_old_ones_dropped():
    store = SnapshotStore(VersionGate(async_one_step=True))
    for version in range(3):
        store.publish(version, {"w": torch.full((1,), float(version))})
    assert [store.acquire(step) for step in (0, 4)] == [None, None]  # θ_0 dropped; θ_2 too old for batch 4
    assert [store.acquire(step).version for step in (1, 2, 3)] == [1, 2, 2]
    with pytest.raises(ValueError, match="in order"):
        store.publish(5, {"w": torch.zeros(1)})
