import pytest

from spotlight.disagg.bubble import BubblePolicy, BubbleTimings, QueueState, rest_of_step_s


def timings(trainer_s: float = 1.0, train_s: float = 0.2, offload_s: float = 0.5, parallel: int = 1) -> BubbleTimings:
    return BubbleTimings(fragment_on_generator_s=1.0, fragment_on_trainer_s=trainer_s, train_fragment_s=train_s,
                         offload_restore_s=offload_s, trainer_parallel=parallel)


def brute_force_finish(left: int, k: int, gens: int, t: BubbleTimings) -> float:
    """The same step replayed by hand for idle generators: fragments go round-robin, the trainer's k are
    ready after offload + ceil(k / parallel) rounds, and the trainer trains everything in arrival order."""
    ready = [(i // gens + 1) * t.fragment_on_generator_s for i in range(left - k)]
    trainer = t.offload_restore_s + -(-k // t.trainer_parallel) * t.fragment_on_trainer_s if k else 0.0
    ready += [trainer] * k
    for arrival in sorted(ready):
        trainer = max(trainer, arrival) + t.train_fragment_s
    return trainer


@pytest.mark.parametrize("k", [0, 1, 3])
def test_the_step_replay_matches_a_hand_replay(k):
    t = timings()
    assert rest_of_step_s(7, k, (0, 0), 1e-3, t) == pytest.approx(brute_force_finish(7, k, 2, t))


def test_tag_pays_when_generators_are_the_bottleneck():
    # 12 fragments on 2 generators (6 s of generation); the trainer trains a fragment in 0.2 s
    policy = BubblePolicy(timings(), max_fragments=8)
    k = policy.fragments_for_trainer(QueueState(fragments_left=12, generator_free_in_s=(0.0, 0.0)))
    assert k > 0
    assert rest_of_step_s(12, k, (0, 0), 1e-3, policy.timings) < rest_of_step_s(12, 0, (0, 0), 1e-3, policy.timings)


def test_tag_is_refused_when_it_would_make_the_trainer_the_bottleneck():
    # training is the bottleneck already (1.5 s per fragment) and TAG is slow: every k > 0 finishes later
    policy = BubblePolicy(timings(trainer_s=3.0, train_s=1.5, offload_s=2.0))
    assert policy.fragments_for_trainer(QueueState(fragments_left=6, generator_free_in_s=(0.5, 0.9))) == 0


def test_the_search_never_picks_a_k_worse_than_no_tag_and_stays_within_its_bound():
    for trainer_s in (0.5, 1.0, 2.0, 4.0):
        for offload_s in (0.0, 1.0, 5.0):
            t = timings(trainer_s=trainer_s, offload_s=offload_s, parallel=2)
            policy = BubblePolicy(t, max_fragments=3)
            queue = QueueState(fragments_left=10, generator_free_in_s=(0.3, 0.0, 0.7))
            k = policy.fragments_for_trainer(queue)
            assert 0 <= k <= 3
            ticks = (0, 300, 700)
            assert rest_of_step_s(10, k, ticks, 1e-3, t) <= rest_of_step_s(10, 0, ticks, 1e-3, t)


def test_a_recurring_bubble_is_answered_from_the_memo():
    rest_of_step_s.cache_clear()
    policy = BubblePolicy(timings(), max_fragments=4)
    queue = QueueState(fragments_left=9, generator_free_in_s=(1.0, 1.0))
    first = policy.fragments_for_trainer(queue)
    misses = rest_of_step_s.cache_info().misses
    assert policy.fragments_for_trainer(queue) == first
    assert rest_of_step_s.cache_info().misses == misses


def test_unprofiled_timings_are_refused():
    with pytest.raises(ValueError, match="profile it first"):
        BubbleTimings(fragment_on_generator_s=0.0, fragment_on_trainer_s=1.0, train_fragment_s=1.0,
                      offload_restore_s=0.0)


def test_generators_waiting_for_weights_make_tag_worth_more():
    # the trainer holds the new weights at its commit; generators wait 3 s for the publish
    t = timings(offload_s=0.5)
    waiting = rest_of_step_s(4, 0, (0, 0), 1e-3, t, blocked_ticks=3000)
    assert waiting == pytest.approx(3.0 + brute_force_finish(4, 0, 2, t))
    policy = BubblePolicy(t, max_fragments=4)
    assert policy.fragments_for_trainer(QueueState(4, (0.0, 0.0), generators_blocked_for_s=3.0)) >= \
        policy.fragments_for_trainer(QueueState(4, (0.0, 0.0)))


def test_a_gain_below_the_margin_is_not_worth_a_tag_burst():
    t = timings()
    queue = QueueState(fragments_left=12, generator_free_in_s=(0.0, 0.0))
    eager = BubblePolicy(t, max_fragments=8)
    k = eager.fragments_for_trainer(queue)
    gain = (rest_of_step_s(12, 0, (0, 0), 1e-3, t) - rest_of_step_s(12, k, (0, 0), 1e-3, t)) \
        / rest_of_step_s(12, 0, (0, 0), 1e-3, t)
    assert k > 0
    assert BubblePolicy(t, max_fragments=8, min_gain_fraction=gain * 1.01).fragments_for_trainer(queue) == 0
