"""Tests for spotlight.market.traces: parsing, the step function, transforms and synthetic traces."""

from __future__ import annotations

import math
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from spotlight.market.traces import (
    Availability,
    NodeEvent,
    TraceError,
    default_trace_dir,
    diurnal_trace,
    find_trace,
    load_trace,
    poisson_trace,
    resolve_trace,
)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode())
    return path


def hand_trace() -> Availability:
    """a, b join; a is preempted; c joins; b is preempted (times in seconds)."""
    events = [
        NodeEvent(0.0, "add", "a"),
        NodeEvent(1.0, "add", "b"),
        NodeEvent(2.0, "remove", "a"),
        NodeEvent(3.0, "add", "c"),
        NodeEvent(4.0, "remove", "b"),
    ]
    return Availability(tuple(events), 5.0)


# --- event files ------------------------------------------------------------------------------


def test_event_file_with_crlf_gives_the_live_count_step_function(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "0,add,node1\r\n0,add,node2\r\n1000,add,node3\r\n2500,remove,node1\r\n")
    trace = load_trace(path)
    np.testing.assert_array_equal(trace.times_s, [0.0, 1.0, 2.5])
    np.testing.assert_array_equal(trace.counts, [2, 3, 2])
    assert trace.duration_s == 2.5
    assert trace.preemption_count == 1
    assert [trace.count_at(t) for t in (-1.0, 0.5, 1.0, 2.4, 2.5, 10.0)] == [0, 2, 3, 3, 2, 2]
    # (2 nodes × 1 s + 3 nodes × 1.5 s) / 2.5 s
    assert trace.mean_count == pytest.approx(6.5 / 2.5)


def test_event_file_times_are_shifted_so_the_first_line_is_zero(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path, "t.csv", "5000,add,node1\n7000,remove,node1\n"))
    assert trace.events == (NodeEvent(0.0, "add", "node1"), NodeEvent(2.0, "remove", "node1"))


def test_format_is_sniffed_from_content_not_extension(tmp_path: Path) -> None:
    events = load_trace(write(tmp_path, "events.txt", "0,add,node1\n"))
    samples = load_trace(write(tmp_path, "samples.csv", "2021-12-11, 11:00:00, 4\n"))
    assert events.count_at(0.0) == 1
    assert samples.count_at(0.0) == 4


# --- count-sampled files ----------------------------------------------------------------------


def test_sample_file_derives_one_event_per_node_change(tmp_path: Path) -> None:
    text = "2021-12-11, 11:00:00, 3\n2021-12-11, 11:01:00, 1\n\n2021-12-11, 11:02:30, 4\n"
    trace = load_trace(write(tmp_path, "s.txt", text))
    np.testing.assert_array_equal(trace.times_s, [0.0, 60.0, 150.0])
    np.testing.assert_array_equal(trace.counts, [3, 1, 4])
    assert sum(e.kind == "add" for e in trace.events) == 6  # 3 at first, 3 on the rise
    assert trace.preemption_count == 2
    assert trace.mean_count == pytest.approx((3 * 60 + 1 * 90) / 150)


def test_sample_file_crosses_midnight(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path, "s.txt", "2021-12-11, 23:59:30, 2\n2021-12-12, 00:00:30, 2\n"))
    assert trace.duration_s == 60.0


def test_sample_derivation_is_deterministic_for_a_seed(tmp_path: Path) -> None:
    path = write(tmp_path, "s.txt", "2021-12-11, 11:00:00, 64\n2021-12-11, 11:01:00, 59\n")
    traces = [load_trace(path, seed=seed) for seed in (0, 0, 1)]
    removed = [tuple(e.node for e in trace.events if e.kind == "remove") for trace in traces]
    assert removed[0] == removed[1]
    assert removed[0] != removed[2]


# --- bad files --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0,add,node1\n17,explode,node2\n", r"bad:2: expected 'milliseconds,add\|remove,nodeN', got '17,"),
        ("0,add,node1\n1000,rem", r"bad:2: expected 'milliseconds,add\|remove,nodeN', got '1000,rem'"),
        ("0,add,node1\n5,remove,node9\n", r"bad:2: removes node9, which is not live"),
        ("0,add,node1\n5,add,node1\n", r"bad:2: adds node1, which is already live \(added on line 1\)"),
        ("5,add,node1\n3,add,node2\n", r"bad:2: time goes backwards \(3 ms after 5 ms\)"),
        (
            "2021-12-11, 11:00:00, 3\n2021-12-11, 11:01:00, ?\n",
            r"bad:2: expected 'date, time, available_nodes'",
        ),
        ("2021-12-11, 11:0", r"bad:1: expected 'date, time, available_nodes'"),
        ("2021-12-11, 11:00:00, 3\n2021-12-10, 11:00:00, 3\n", r"bad:2: time goes backwards"),
        ("abc\n", r"bad:1: unknown trace format; expected 'milliseconds,add\|remove,nodeN' or 'date"),
        ("", r"bad: empty trace"),
        ("\n  \n# only a comment\n", r"bad: empty trace"),
    ],
)
def test_bad_file_raises_one_line_naming_file_line_and_cause(
    tmp_path: Path, text: str, expected: str
) -> None:
    with pytest.raises(TraceError, match=expected) as error:
        load_trace(write(tmp_path, "bad", text))
    assert "\n" not in str(error.value)


def test_missing_file_raises_trace_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such trace file"):
        load_trace(tmp_path / "nope.csv")


def test_shipped_traces_are_found_by_name_with_their_licence_inside_the_package() -> None:
    import spotlight

    package = Path(spotlight.__file__).resolve().parent
    for name in ("aws-p3-bamboo.csv", "gcp-a100x1-bamboo.txt"):
        path = find_trace(name)
        assert path.is_file() and package in path.parents
    assert "MIT License" in (default_trace_dir() / "LICENSE-bamboo").read_text()


def test_a_path_is_used_as_given_before_the_shipped_traces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    own = write(tmp_path, "aws-p3-bamboo.csv", "0,add,a\n")
    assert find_trace(own) == own
    monkeypatch.chdir(tmp_path)  # a relative name that exists here is the user's file, not the shipped one
    assert find_trace("aws-p3-bamboo.csv") == Path("aws-p3-bamboo.csv")


def test_an_unknown_trace_name_is_one_line_naming_the_shipped_traces() -> None:
    with pytest.raises(TraceError, match=r"'nope\.csv'.*aws-p3-bamboo\.csv, gcp-a100x1-bamboo\.txt") as error:
        find_trace("nope.csv")
    assert "\n" not in str(error.value)


def test_a_trace_named_by_a_setting_loads_and_a_missing_one_names_the_setting(tmp_path: Path) -> None:
    own = write(tmp_path, "own.csv", "0,add,a\n1000,add,b\n")
    assert resolve_trace(str(own), "cluster.trace").counts.tolist() == load_trace(own).counts.tolist()
    with pytest.raises(TraceError, match=r"^runtime\.trace: trace 'nope\.csv': no such file") as error:
        resolve_trace("nope.csv", "runtime.trace")
    assert "\n" not in str(error.value)


# --- the real Bamboo traces, checked against a second, naive reading of the file ------------------


def test_real_aws_trace_matches_a_naive_reading() -> None:
    path = default_trace_dir() / "aws-p3-bamboo.csv"
    rows = [line.strip().split(",") for line in path.read_text().splitlines() if line.strip()]
    trace = load_trace(path)
    assert trace.preemption_count == sum(kind == "remove" for _, kind, _ in rows)
    assert trace.duration_s == int(rows[-1][0]) / 1000 - int(rows[0][0]) / 1000
    live = 0
    for index, (ms, kind, _) in enumerate(rows):
        live += 1 if kind == "add" else -1
        if index + 1 == len(rows) or rows[index + 1][0] != ms:
            assert trace.count_at(int(ms) / 1000) == live


def test_real_gcp_trace_matches_its_samples() -> None:
    path = default_trace_dir() / "gcp-a100x1-bamboo.txt"
    rows = [[part.strip() for part in line.split(",")] for line in path.read_text().splitlines()]
    stamps = [datetime.strptime(f"{d} {t}", "%Y-%m-%d %H:%M:%S") for d, t, _ in rows]
    samples = [int(count) for _, _, count in rows]
    trace = load_trace(path)
    seconds = np.array([(s - stamps[0]).total_seconds() for s in stamps])
    np.testing.assert_array_equal(trace.count_at(seconds), samples)
    assert trace.duration_s == 27 * 3600 + 60 + 6  # 2021-12-11 11:11:30 → 2021-12-12 14:12:36
    assert trace.preemption_count == sum(max(a - b, 0) for a, b in zip(samples, samples[1:], strict=False))


# --- step function and transforms ---------------------------------------------------------------


def test_counts_equal_adds_minus_removes_up_to_each_time() -> None:
    trace = poisson_trace(6, 50.0, 20.0, 500.0, seed=3)
    grid = np.linspace(0.0, 500.0, 997)
    kinds = np.array([1 if e.kind == "add" else -1 for e in trace.events])
    times = np.array([e.time_s for e in trace.events])
    expected = [int(kinds[times <= t].sum()) for t in grid]
    np.testing.assert_array_equal(trace.count_at(grid), expected)


def test_events_between_is_half_open_so_ticks_see_each_event_once() -> None:
    trace = hand_trace()
    assert [e.node for e in trace.events_between(1.0, 3.0)] == ["b", "a"]
    ticks = np.arange(0.0, 6.0, 0.5)
    seen = [e for t in ticks for e in trace.events_between(t, t + 0.5)]
    assert tuple(seen) == trace.events


def test_scaled_multiplies_times_and_keeps_counts() -> None:
    trace = hand_trace().scaled(1 / 60)
    assert trace.duration_s == pytest.approx(5 / 60)
    np.testing.assert_allclose(trace.times_s, np.array([0.0, 1.0, 2.0, 3.0, 4.0]) / 60)
    np.testing.assert_array_equal(trace.counts, [1, 2, 1, 2, 1])
    assert trace.mean_count == pytest.approx(hand_trace().mean_count)
    with pytest.raises(ValueError, match="time_scale must be a finite number > 0"):
        hand_trace().scaled(0.0)


def test_window_starts_with_the_live_nodes_oldest_first() -> None:
    window = hand_trace().window(1.5, 3.5)
    assert window.events == (
        NodeEvent(0.0, "add", "a"),
        NodeEvent(0.0, "add", "b"),
        NodeEvent(0.5, "remove", "a"),
        NodeEvent(1.5, "add", "c"),
    )
    assert window.duration_s == 2.0


def test_window_reproduces_the_real_trace_inside_it() -> None:
    trace = load_trace(default_trace_dir() / "aws-p3-bamboo.csv")
    t0, t1 = 3 * 3600.0, 5 * 3600.0
    window = trace.window(t0, t1)
    grid = np.linspace(t0, t1, 500, endpoint=False)
    np.testing.assert_array_equal(window.count_at(grid - t0), trace.count_at(grid))
    with pytest.raises(ValueError, match="window needs 0 ≤ t0 < t1"):
        trace.window(t1, t0)


def test_clipped_logical_node_waits_for_the_next_real_node() -> None:
    events = [
        NodeEvent(0.0, "add", "n1"),
        NodeEvent(0.0, "add", "n2"),
        NodeEvent(1.0, "add", "n3"),  # both logical nodes taken: unseen
        NodeEvent(2.0, "remove", "n1"),  # node0 goes down ...
        NodeEvent(3.0, "add", "n4"),  # ... until the next real node joins
        NodeEvent(4.0, "remove", "n3"),  # unseen
        NodeEvent(5.0, "remove", "n2"),
        NodeEvent(6.0, "add", "n5"),
    ]
    clipped = Availability(tuple(events), 7.0).clipped(2)
    assert [(e.time_s, e.kind, e.node) for e in clipped.events] == [
        (0.0, "add", "node0"),
        (0.0, "add", "node1"),
        (2.0, "remove", "node0"),
        (3.0, "add", "node0"),
        (5.0, "remove", "node1"),
        (6.0, "add", "node1"),
    ]


def test_clipped_real_trace_never_exceeds_either_limit_and_still_preempts() -> None:
    trace = load_trace(default_trace_dir() / "aws-p3-bamboo.csv")
    clipped = trace.clipped(3)
    grid = np.linspace(0.0, trace.duration_s, 2000)
    assert np.all(clipped.count_at(grid) <= np.minimum(trace.count_at(grid), 3))
    assert clipped.preemption_count > 0
    roomy = trace.clipped(int(trace.counts.max()))
    np.testing.assert_array_equal(roomy.counts, trace.counts)


def test_inconsistent_events_are_rejected() -> None:
    with pytest.raises(ValueError, match="removes x at 1.0 s; it is not live"):
        Availability((NodeEvent(1.0, "remove", "x"),), 2.0)
    with pytest.raises(ValueError, match="duration_s must be finite and ≥ the last event time"):
        Availability((NodeEvent(3.0, "add", "x"),), 2.0)


def test_step_arrays_are_read_only() -> None:
    with pytest.raises(ValueError):
        hand_trace().counts[0] = 9


# --- synthetic traces ---------------------------------------------------------------------------


def test_poisson_uptime_fraction_is_lifetime_over_cycle() -> None:
    lifetime, restart, nodes, duration = 300.0, 100.0, 40, 20_000.0
    trace = poisson_trace(nodes, lifetime, restart, duration, seed=0)
    up_fraction = lifetime / (lifetime + restart)  # 0.75
    assert trace.mean_count / nodes == pytest.approx(up_fraction, abs=0.02)
    # preemptions arrive at rate 1/lifetime while up: nodes · T · 0.75 / 300 = 2000 expected
    expected = nodes * duration * up_fraction / lifetime
    assert trace.preemption_count == pytest.approx(expected, rel=0.08)


def test_poisson_starts_stationary() -> None:
    trace = poisson_trace(1000, 300.0, 100.0, 1.0, seed=1)
    # Binomial(1000, 0.75): mean 750, std ≈ 13.7
    assert abs(trace.count_at(0.0) - 750) < 55


def test_poisson_is_deterministic_for_a_seed() -> None:
    first, again, other = (poisson_trace(5, 60.0, 30.0, 600.0, seed=s) for s in (7, 7, 8))
    assert first.events == again.events
    assert first.events != other.events


def test_diurnal_follows_the_day_wave() -> None:
    nodes, period, amplitude = 400, 1000.0, 0.6
    trace = diurnal_trace(nodes, period, amplitude, 3 * period, seed=0)

    def wave(t: float) -> float:
        return 1 - amplitude * (1 - math.cos(2 * math.pi * t / period)) / 2

    assert trace.count_at(0.0) == nodes
    assert trace.count_at(period) == nodes  # every node is back at the top of the wave
    for t in (250.0, 500.0, 1500.0, 2750.0):
        std = math.sqrt(nodes * wave(t) * (1 - wave(t)))
        assert abs(trace.count_at(t) - nodes * wave(t)) < 5 * std
    # each period, a node is preempted iff its threshold u > 1 − amplitude: Binomial(1200, 0.6)
    assert abs(trace.preemption_count - 3 * nodes * amplitude) < 4 * math.sqrt(3 * nodes * 0.6 * 0.4)


def test_diurnal_with_zero_amplitude_never_preempts() -> None:
    assert diurnal_trace(5, 100.0, 0.0, 1000.0, seed=0).preemption_count == 0


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: poisson_trace(0, 1.0, 1.0, 1.0, seed=0), "num_nodes must be a finite number > 0"),
        (lambda: poisson_trace(2, -1.0, 1.0, 1.0, seed=0), "mean_lifetime_s must be a finite number > 0"),
        (lambda: diurnal_trace(2, 10.0, 1.5, 1.0, seed=0), r"amplitude must be in \[0, 1\]"),
        (lambda: diurnal_trace(2, 0.0, 0.5, 1.0, seed=0), "period_s must be a finite number > 0"),
    ],
)
def test_generators_name_the_bad_argument(make, expected: str) -> None:
    with pytest.raises(ValueError, match=expected):
        make()
