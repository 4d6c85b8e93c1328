"""Preemption watchers: cloud detection, and a watcher against a real metadata server on 127.0.0.1."""

from __future__ import annotations

import time
from pathlib import Path

from metadata_services import AwsImdsPerNode, FakeMetadata, iso

from spotlight.runtime.watchers import NodeWatcher, WatchSettings, detect_cloud


def test_the_cloud_is_detected_from_the_dmi_vendor(tmp_path: Path) -> None:
    files = []
    for name, vendor in (("aws", "Amazon EC2\n"), ("gcp", "Google\n"), ("azure", "Microsoft Corporation\n"),
                         ("laptop", "LENOVO\n")):
        files.append(tmp_path / name)
        files[-1].write_text(vendor)
    assert [detect_cloud((str(path),)) for path in files] == ["aws", "gcp", "azure", None]
    assert detect_cloud((str(tmp_path / "missing"), str(files[1]))) == "gcp"  # the first file that exists


def test_a_watcher_hands_over_an_aws_notice_once_with_its_wall_clock_deadline() -> None:
    imds = AwsImdsPerNode()
    server = FakeMetadata(imds.respond)
    try:
        watcher = NodeWatcher("spot-a", "abc123", WatchSettings("aws", server.url + "/{node_id}", interval_s=0.05))
        deadline = time.time() + 120
        time.sleep(0.2)
        assert watcher.take() == []
        imds.service("abc123").action = {"action": "terminate", "time": iso(deadline)}
        time.sleep(0.3)
        notices = watcher.take()
        time.sleep(0.2)
        assert watcher.take() == []  # the service keeps answering with it; it is handed over once
        watcher.stop()
    finally:
        server.close()
    assert [(node, source) for node, _, source in notices] == [("spot-a", "aws")]
    assert 0 <= notices[0][1] - deadline <= 1.0  # ISO time has whole seconds
    assert imds.requests["abc123"] >= 4 and imds.actions_served["abc123"] >= 2
