"""Preemption watchers: cloud detection, and a watcher against a real metadata server on 127.0.0.1."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from metadata_services import AwsImdsPerNode, FakeMetadata, iso

from spotlight.runtime.spot.watchers import NodeWatcher, WatchSettings, detect_cloud


def test_the_cloud_is_detected_from_the_dmi_vendor(tmp_path: Path) -> None:
    files = []
    for name, vendor in (("aws", "Amazon EC2\n"), ("gcp", "Google\n"), ("azure", "Microsoft Corporation\n"),
                         ("laptop", "LENOVO\n")):
        files.append(tmp_path / name)
        files[-1].write_text(vendor)
    assert [detect_cloud((str(path),)) for path in files] == ["aws", "gcp", "azure", None]
    assert detect_cloud((str(tmp_path / "missing"), str(files[1]))) == "gcp"  # the first file that exists


def wait_until(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    """Return once ``condition()`` holds (a bound for failing on a starved machine, not a wait)."""
    give_up = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < give_up, f"not within {timeout_s:.0f} s"
        time.sleep(0.01)


def test_a_watcher_hands_over_an_aws_notice_once_with_its_wall_clock_deadline() -> None:
    imds = AwsImdsPerNode()
    server = FakeMetadata(imds.respond)
    try:
        watcher = NodeWatcher("spot-a", "abc123", WatchSettings("aws", server.url + "/{node_id}", interval_s=0.05))
        deadline = time.time() + 120
        wait_until(lambda: imds.requests.get("abc123", 0) >= 2)  # a whole poll (token, then action) was answered
        assert watcher.take() == []
        imds.service("abc123").action = {"action": "terminate", "time": iso(deadline)}
        notices: list = []

        def noticed() -> bool:
            notices.extend(watcher.take())
            return bool(notices)

        wait_until(noticed)
        served = imds.actions_served["abc123"]
        wait_until(lambda: imds.actions_served["abc123"] >= served + 2)  # polled twice more after the hand-over
        assert watcher.take() == []  # the service keeps answering with it; it is handed over once
        watcher.stop()
    finally:
        server.close()
    assert [(node, source) for node, _, source in notices] == [("spot-a", "aws")]
    assert 0 <= notices[0][1] - deadline <= 1.0  # ISO time has whole seconds
    assert imds.requests["abc123"] >= 4 and imds.actions_served["abc123"] >= 2
