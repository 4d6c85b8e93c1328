"""The local Ray cluster is locked: Ray listens on every interface, so every call must carry the run's token."""

from __future__ import annotations

import os
import subprocess
import sys

import ray

from spotlight.runtime.pools import LocalCluster

PROBE = "import ray; ray.init(address={address!r}, logging_level='ERROR'); print('CONNECTED')"


def test_the_local_cluster_refuses_a_client_without_its_token() -> None:
    cluster = LocalCluster(object_store_mb=100)
    try:
        assert ray.get(ray.remote(lambda: 41 + 1).remote(), timeout=60) == 42  # the run itself holds the token
        token_path = os.environ["RAY_AUTH_TOKEN_PATH"]
        assert os.environ["RAY_AUTH_MODE"] == "token" and oct(os.stat(token_path).st_mode & 0o777) == "0o600"
        outsider = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
        probe = subprocess.run([sys.executable, "-c", PROBE.format(address=cluster.cluster.address)],
                               env={**outsider, "RAY_AUTH_MODE": "disabled"}, capture_output=True, text=True,
                               timeout=120)
        assert probe.returncode != 0 and "CONNECTED" not in probe.stdout
        assert "token" in probe.stderr.lower() or "auth" in probe.stderr.lower(), probe.stderr[-500:]
    finally:
        cluster.shutdown()
