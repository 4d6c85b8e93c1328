"""The reconfiguration planner: pure rules on plain data (see spotlight/runtime/sp/reconfigure.py)."""

from __future__ import annotations

import pytest

from spotlight.runtime.sp.reconfigure import (
    ReconfigureError,
    SPGroup,
    device_id,
    node_of,
    plan_groups,
    requests_to_requeue,
    wanted_degrees,
)

HEADS = 8


def members(*ids: str) -> tuple[str, ...]:
    return tuple(ids)


def test_first_plan_forms_intra_node_groups_with_fresh_generations() -> None:
    diff = plan_groups({"spot0": [0, 1], "spot1": [0, 1]}, {256: 2}, HEADS)
    assert [g.members for g in diff.formed] == [members("spot0/0", "spot0/1"), members("spot1/0", "spot1/1")]
    assert [g.generation for g in diff.formed] == [0, 1]
    assert diff.kept == diff.dissolved == () and diff.idle == () and diff.unservable == ()
    assert diff.next_generation == 2 and diff.new_groups == diff.formed


def test_only_the_broken_group_is_reformed_and_the_other_keeps_its_generation() -> None:
    first = plan_groups({"spot0": [0, 1, 2], "spot1": [0, 1]}, {256: 2}, HEADS)
    assert [g.members for g in first.formed] == [members("spot1/0", "spot1/1"), members("spot0/0", "spot0/1")]
    assert first.idle == ("spot0/2",)
    # spot0/1 dies: its group dissolves; spot0/0 and the idle spot0/2 form a new group, spot1's stays.
    second = plan_groups({"spot0": [0, 2], "spot1": [0, 1]}, {256: 2}, HEADS, previous=first.new_groups)
    spot1_group = first.formed[0]
    assert second.kept == (spot1_group,)
    assert second.dissolved == (first.formed[1],)
    assert second.formed == (SPGroup(2, members("spot0/0", "spot0/2")),)
    assert second.old_groups == first.new_groups
    assert set(second.new_groups) == {spot1_group, SPGroup(2, members("spot0/0", "spot0/2"))}
    assert second.changed and not plan_groups(
        {"spot0": [0, 2], "spot1": [0, 1]}, {256: 2}, HEADS, previous=second.new_groups
    ).changed


def test_a_lost_node_dissolves_its_groups_and_its_requests_go_back_to_the_queue() -> None:
    first = plan_groups({"spot0": [0, 1], "spot1": [0, 1]}, {256: 2}, HEADS)
    second = plan_groups({"spot1": [0, 1]}, {256: 2}, HEADS, previous=first.new_groups)
    assert second.dissolved == (first.formed[0],) and second.kept == (first.formed[1],) and second.formed == ()
    in_flight = {first.formed[0].name: ["r1", "r4"], first.formed[1].name: ["r2"]}
    assert requests_to_requeue(second, in_flight) == ["r1", "r4"]


def test_intra_node_groups_come_first_then_cross_node_when_allowed() -> None:
    alive = {"a": [0], "b": [0], "c": [0, 1]}
    diff = plan_groups(alive, {512: 2}, HEADS)
    assert [g.members for g in diff.formed] == [members("c/0", "c/1"), members("a/0", "b/0")]
    assert diff.formed[1].nodes == ("a", "b")
    no_cross = plan_groups(alive, {512: 2}, HEADS, cross_node=False)
    assert [g.members for g in no_cross.formed] == [members("c/0", "c/1")]
    assert no_cross.idle == ("a/0", "b/0")


def test_best_fit_keeps_a_large_block_free_for_the_large_degree() -> None:
    # Degree 4 first takes the only node that holds it; degree 2 then fits the 2-device node.
    diff = plan_groups({"big": [0, 1, 2, 3], "small": [0, 1]}, {1024: 4, 512: 2}, HEADS)
    assert [g.members for g in diff.formed] == [
        members("big/0", "big/1", "big/2", "big/3"), members("small/0", "small/1"),
    ]


def test_every_resolution_gets_a_group_before_any_gets_a_second() -> None:
    diff = plan_groups({"n": [0, 1, 2, 3, 4, 5, 6]}, {1024: 4, 256: 1}, HEADS)
    assert [g.degree for g in diff.formed] == [4, 1, 1, 1]
    assert diff.unservable == ()


def test_too_few_devices_leaves_the_resolution_unservable_without_an_error() -> None:
    diff = plan_groups({"spot0": [1]}, {1024: 4, 256: 1}, HEADS)
    assert [g.degree for g in diff.formed] == [1]
    assert diff.unservable == (1024,)
    assert plan_groups({}, {256: 2}, HEADS).unservable == (256,)


def test_a_degree_that_does_not_divide_the_heads_is_refused_in_one_line() -> None:
    with pytest.raises(ReconfigureError) as error:
        plan_groups({"spot0": [0, 1, 2]}, {768: 3, 256: 2}, HEADS)
    assert str(error.value) == (
        "resolution 768 asks for sp_degree 3, which does not divide the model's 8 heads: "
        "choose an SP degree among 1, 2, 4, 8"
    )
    with pytest.raises(ReconfigureError, match="no resolution"):
        wanted_degrees({}, HEADS)


def test_a_group_of_a_degree_no_longer_wanted_is_dissolved() -> None:
    first = plan_groups({"n": [0, 1, 2, 3]}, {1024: 4}, HEADS)
    second = plan_groups({"n": [0, 1, 2, 3]}, {256: 2}, HEADS, previous=first.new_groups)
    assert second.dissolved == first.formed and [g.degree for g in second.formed] == [2, 2]
    assert [g.generation for g in second.formed] == [1, 2]


def test_generations_are_never_reused() -> None:
    group = SPGroup(5, members("n/0", "n/1"))
    with pytest.raises(ReconfigureError, match="already used"):
        plan_groups({"n": [0, 1]}, {256: 2}, HEADS, previous=[group], next_generation=5)
    diff = plan_groups({"n": [0, 2, 3]}, {256: 2}, HEADS, previous=[group], next_generation=9)
    assert diff.formed[0].generation == 9 and diff.formed[0].name == "sp-gen9" and diff.next_generation == 10


def test_device_ids_sort_by_index_and_refuse_bad_names() -> None:
    diff = plan_groups({"n": [10, 2, 1]}, {256: 2}, HEADS)
    assert diff.formed[0].members == members("n/1", "n/2") and diff.idle == ("n/10",)
    assert node_of(device_id("spot3", 7)) == "spot3"
    with pytest.raises(ReconfigureError, match="without slashes"):
        device_id("a/b", 0)
    with pytest.raises(ReconfigureError, match="node/index"):
        node_of("spot3")


def test_plan_diff_serialises_for_the_log() -> None:
    first = plan_groups({"spot0": [0, 1]}, {256: 2}, HEADS)
    record = plan_groups({}, {256: 2}, HEADS, previous=first.new_groups).to_json()
    assert record["old_groups"] == [{"name": "sp-gen0", "generation": 0, "members": ["spot0/0", "spot0/1"]}]
    assert record["new_groups"] == [] and record["dissolved"] == ["sp-gen0"] and record["unservable"] == [256]
