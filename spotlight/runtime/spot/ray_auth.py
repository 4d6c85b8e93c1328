"""Ray's token authentication: on for every local cluster a run starts, checked on a cluster it attaches to.

Ray 2.52 added token authentication (2.59 turns it on for a local ``ray.init()``): with
``RAY_AUTH_MODE=token`` every Ray gRPC server (GCS, raylets, workers) refuses a caller without the
cluster's token. A local cluster binds 127.0.0.1 alone (pools.py, ``_loopback_only``), which keeps other
machines out but not other users or processes of this machine: without a token any of them can
connect to its GCS and run code as the run's user, with its weights and data.

`LocalTokenAuth` turns token authentication on for the Ray nodes this process starts from then on:
every node of a `LocalCluster` (the head, each spot node added or re-added after a preemption, the SP
agents' nodes) is a process this one starts through ``ray.cluster_utils``, which hands it this process's
environment, and every worker (spot devices, trainer ranks, the queue actor, generators) inherits its
raylet's. The token is made for the run (``secrets.token_hex``) and kept in a file only the user can
read; only the file's path travels (``RAY_AUTH_TOKEN_PATH``), so the token is in no environment,
command line or log. The user's own ``RAY_AUTH_MODE``, ``RAY_AUTH_TOKEN`` or ``RAY_AUTH_TOKEN_PATH``
win, as Ray documents: a token of theirs is used instead of the run's, and their choice of Ray's
``disabled`` mode is obeyed, with one warning line.

`unauthenticated_cluster` asks an attached cluster's GCS, without a token, for its cluster id: it
answers only when the cluster lets anyone in, which `attach_cluster` reports in one warning line.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import tempfile
from pathlib import Path

import grpc
from ray._raylet import AuthenticationTokenLoader, Config
from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

__all__ = ["AUTH_ENV", "TOKEN_FIX", "LocalTokenAuth", "unauthenticated_cluster"]

logger = logging.getLogger(__name__)

AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")  # what Ray reads, in its order of precedence
TOKEN_FIX = ("start every node with RAY_AUTH_MODE=token and the cluster's token in RAY_AUTH_TOKEN_PATH (a file "
             "only you can read) or RAY_AUTH_TOKEN, and the driver with the same (configs/ray-cluster-spotlight.yaml, "
             "configs/kuberay-raycluster.yaml)")


class LocalTokenAuth:
    """Token authentication of the local cluster started after it (module docstring); `undo` when it is shut down.

    ``directory``: the private folder holding the run's token (None when the user's token or mode is used);
    the reaper removes it if the driver dies before `undo`.
    """

    def __init__(self) -> None:
        self._saved = {name: os.environ.get(name) for name in AUTH_ENV}
        self.directory: Path | None = None
        mode = self._saved["RAY_AUTH_MODE"]
        if mode is not None and mode.lower() == "disabled":  # the user's choice, as Ray documents
            logger.warning("%s=%s: this run's Ray cluster accepts any process on this machine; unset it to run "
                           "with a token", AUTH_ENV[0], mode)
        elif mode is None or mode.lower() == "token":
            os.environ["RAY_AUTH_MODE"] = mode or "token"
            if not self._saved["RAY_AUTH_TOKEN"] and not self._saved["RAY_AUTH_TOKEN_PATH"]:  # Ray skips empty ones
                self._make_token()
        _reload_ray_auth()

    def _make_token(self) -> None:
        """The run's token, in a file of a private folder; nodes get the file's path."""
        self.directory = Path(tempfile.mkdtemp(prefix="spotlight-ray-auth-"))  # mode 0700
        token_path = self.directory / "token"
        descriptor = os.open(token_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(secrets.token_hex(32))
        os.environ["RAY_AUTH_TOKEN_PATH"] = str(token_path)

    def undo(self) -> None:
        """Give back the environment as it was and remove the run's token (idempotent)."""
        saved, self._saved = self._saved, {}
        if not saved:
            return
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        _reload_ray_auth()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)


def _reload_ray_auth() -> None:
    """Make this process's Ray read the mode and token again: it caches both, and the driver is a Ray client too.

    The configuration first, then the token cache (Ray's own order: a gRPC thread that reloads the token
    in between must not find token mode without a token).
    """
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def unauthenticated_cluster(gcs_address: str, timeout_s: float = 5.0) -> bool:
    """Whether the GCS at ``gcs_address`` answers a caller that has no token (its cluster's authentication is off).

    False when it refuses (authentication on) and when the answer is anything else (TLS, a timeout):
    only a cluster seen to let anyone in is reported.
    """
    with grpc.insecure_channel(gcs_address) as channel:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        try:
            stub.GetClusterId(gcs_service_pb2.GetClusterIdRequest(), timeout=timeout_s)
        except grpc.RpcError:
            return False
    return True
