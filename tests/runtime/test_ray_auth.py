"""Ray's token authentication on the clusters Spotlight starts, and the check on a cluster it attaches to.

A run's local cluster binds 127.0.0.1 only, which keeps other machines out but not other users or
processes of this machine: here a second process connects to it as a stranger would, without the run's
token and with a made-up one (refused), and with the run's token (accepted). The run side is a
`LocalCluster` with a spot node, as `spotlight train` starts it.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
from local_ray_node import LEAN_HEAD  # nothing autoscales these clusters: no monitor processes

from spotlight.runtime.spot import ray_auth
from spotlight.runtime.spot.pools import LocalCluster, PoolError, attach_cluster
from spotlight.runtime.spot.ray_auth import AUTH_ENV, LocalTokenAuth
from spotlight.runtime.spot.ray_nodes import start_node

NODE_START_S = 240.0  # a bound for failing on a machine too busy to start Ray at all, not a wait

# A stranger on this machine: ray.init to the run's GCS address. Ray's client retries a refused connection
# for ~20 s; RAY_gcs_server_port_wait_time_s shortens that (the server's refusal is the same).
CONNECT = """
import sys, ray
try:
    ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
except Exception as error:
    print("REFUSED", type(error).__name__, error, error.__cause__)
else:
    print("CONNECTED", len([node for node in ray.nodes() if node["Alive"]]))
"""


@pytest.fixture
def own_auth_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """No RAY_AUTH_* of the user's (or of earlier tests' ray.init); Ray's cached view is reloaded after the test."""
    for name in AUTH_ENV:
        monkeypatch.delenv(name, raising=False)
    yield monkeypatch
    monkeypatch.undo()
    ray_auth._reload_ray_auth()


def connect(address: str, home: Path, *auths: dict[str, str]) -> list[str]:
    """What separate processes that connect to ``address``, each with one of ``auths`` (RAY_AUTH_* variables), get."""
    processes = []
    for auth in auths:  # at once: each refusal takes seconds
        env = {name: value for name, value in os.environ.items() if name not in AUTH_ENV}
        env.update(auth, HOME=str(home), RAY_gcs_server_port_wait_time_s="3")  # no ~/.ray/auth_token of the user's
        processes.append(subprocess.Popen([sys.executable, "-c", CONNECT, address], env=env, text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
    return [process.communicate(timeout=180)[0].strip() for process in processes]


def test_a_runs_cluster_refuses_a_process_without_its_token_and_accepts_one_with_it(
        own_auth_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cluster = LocalCluster(node_timeout_s=NODE_START_S)
    try:
        cluster.add_spot_node("node0")
        token_path = Path(os.environ["RAY_AUTH_TOKEN_PATH"])
        token = token_path.read_text()
        assert os.environ["RAY_AUTH_MODE"] == "token" and len(token) == 64
        assert stat.S_IMODE(token_path.stat().st_mode) == 0o600  # only the user reads it
        assert stat.S_IMODE(token_path.parent.stat().st_mode) == 0o700

        @ray.remote(num_cpus=0, resources={"spot": 0.01})
        def on_the_spot_node() -> str:  # a worker of a node the run added works with the token
            return ray.get_runtime_context().get_node_id()

        assert ray.get(on_the_spot_node.remote(), timeout=120) in {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        address = cluster.cluster.address
        without, made_up, with_it = connect(address, tmp_path, {},
                                            {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)},
                                            {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_path)})
        assert without.startswith("REFUSED") and "InvalidAuthToken" in without, without
        assert made_up.startswith("REFUSED") and "InvalidAuthToken" in made_up, made_up
        assert with_it == "CONNECTED 2", with_it
        logs = Path(cluster.cluster.head_node.get_logs_dir_path())
        leaks = [p.name for p in logs.rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
        assert not leaks  # Ray logs where the token is, never what it is
        raylet = cluster.cluster.head_node.all_processes["raylet"][0].process.pid
        environ = Path(f"/proc/{raylet}/environ").read_bytes().split(b"\0")
        assert f"RAY_AUTH_TOKEN_PATH={token_path}".encode() in environ  # a node has the path, not the token
        assert not [entry for entry in environ if token.encode() in entry]
    finally:
        cluster.shutdown()
    assert not token_path.parent.exists()  # the run's token goes with its cluster
    assert all(name not in os.environ for name in AUTH_ENV)  # and the environment is the user's again


def test_the_users_own_token_and_mode_win(own_auth_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    own_auth_env.setenv("RAY_AUTH_TOKEN", "f" * 64)
    auth = LocalTokenAuth()
    assert auth.directory is None and os.environ["RAY_AUTH_MODE"] == "token" and "RAY_AUTH_TOKEN_PATH" not in os.environ
    auth.undo()
    assert "RAY_AUTH_MODE" not in os.environ and os.environ["RAY_AUTH_TOKEN"] == "f" * 64
    own_auth_env.delenv("RAY_AUTH_TOKEN")
    own_auth_env.setenv("RAY_AUTH_TOKEN_PATH", "/somewhere/token")
    auth = LocalTokenAuth()
    assert auth.directory is None and os.environ["RAY_AUTH_TOKEN_PATH"] == "/somewhere/token"
    auth.undo()
    own_auth_env.setenv("RAY_AUTH_MODE", "disabled")
    with caplog.at_level(logging.WARNING):
        auth = LocalTokenAuth()
    assert auth.directory is None and os.environ["RAY_AUTH_MODE"] == "disabled"
    assert [r.getMessage() for r in caplog.records] == ["RAY_AUTH_MODE=disabled: this run's Ray cluster accepts any "
                                                        "process on this machine; unset it to run with a token"]
    auth.undo()


def test_the_reaper_removes_the_runs_token_when_the_driver_is_sigkilled(tmp_path: Path) -> None:
    folder = tmp_path / "token-folder"
    folder.mkdir()
    (folder / "token").write_text("x")
    driver = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom spotlight.runtime.spot.reaper import Reaper\n"
         "reaper = Reaper('session_none', sys.argv[1]); print('up', flush=True); time.sleep(300)", str(folder)],
        stdout=subprocess.PIPE, text=True)
    assert driver.stdout.readline().strip() == "up"
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    deadline = time.monotonic() + 30
    while folder.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not folder.exists()


@pytest.fixture
def cluster_without_auth(own_auth_env: pytest.MonkeyPatch) -> Iterator[str]:
    """A one-node cluster of separate node processes with Ray's authentication off: on-demand and spot."""
    from ray.cluster_utils import Cluster

    own_auth_env.setenv("RAY_AUTH_MODE", "disabled")
    ray_auth._reload_ray_auth()
    cluster = Cluster()
    start_node(cluster, NODE_START_S, "head", num_cpus=1, resources={"on_demand": 1, "spot": 1},
               include_dashboard=False, object_store_memory=200 << 20, **LEAN_HEAD)
    own_auth_env.delenv("RAY_AUTH_MODE")  # the driver's environment says nothing: Ray's default
    ray_auth._reload_ray_auth()
    try:
        yield cluster.address
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_attaching_to_a_cluster_without_authentication_warns_once_and_names_the_fix(
        cluster_without_auth: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="spotlight"):
        spot = attach_cluster(cluster_without_auth)
    assert len(spot) == 1
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("spotlight")]
    assert len(lines) == 1 and "without Ray's token authentication" in lines[0], lines
    assert "RAY_AUTH_MODE=token" in lines[0] and "RAY_AUTH_TOKEN_PATH" in lines[0]


@pytest.fixture
def cluster_with_auth(own_auth_env: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    """A one-node cluster of separate node processes started with a token: (address, token)."""
    from ray.cluster_utils import Cluster

    token = secrets.token_hex(32)
    own_auth_env.setenv("RAY_AUTH_MODE", "token")
    own_auth_env.setenv("RAY_AUTH_TOKEN", token)
    ray_auth._reload_ray_auth()
    cluster = Cluster()
    start_node(cluster, NODE_START_S, "head", num_cpus=1, resources={"on_demand": 1, "spot": 1},
               include_dashboard=False, object_store_memory=200 << 20, **LEAN_HEAD)
    try:
        yield cluster.address, token
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_attaching_to_a_cluster_with_authentication_needs_its_token(
        cluster_with_auth: tuple[str, str], own_auth_env: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    address, _ = cluster_with_auth
    own_auth_env.delenv("RAY_AUTH_MODE")  # a driver without the token
    own_auth_env.delenv("RAY_AUTH_TOKEN")
    own_auth_env.setenv("RAY_gcs_server_port_wait_time_s", "3")  # refused at once, not after Ray's ~20 s of retries
    ray_auth._reload_ray_auth()
    with pytest.raises(PoolError, match="requires Ray's token authentication and refused this driver: run it with "
                                        "RAY_AUTH_MODE=token"):
        attach_cluster(address)
    own_auth_env.setenv("RAY_AUTH_MODE", "token")
    own_auth_env.setenv("RAY_AUTH_TOKEN", cluster_with_auth[1])
    ray_auth._reload_ray_auth()
    with caplog.at_level(logging.WARNING, logger="spotlight"):
        assert len(attach_cluster(address)) == 1
    assert not [r for r in caplog.records if r.name.startswith("spotlight")]  # nothing to warn about
