"""Network lockdown: what the elastic-SP runtime listens on must be reachable from this machine only."""

from __future__ import annotations

import datetime

import torch.distributed as dist
from listening_sockets import is_loopback, listening

from spotlight.runtime.sp.agent import NodeAgent, listening_store


def test_a_plain_master_tcpstore_listens_on_every_interface() -> None:
    # Why listening_store exists (and proof that the check below can fail).
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=5))
    assert not all(is_loopback(address) for address in listening()[store.port])


def test_the_agent_store_listens_on_loopback_only_and_serves_clients() -> None:
    store = listening_store("127.0.0.1", 5.0)
    assert listening()[store.port] == {"127.0.0.1"}
    client = dist.TCPStore("127.0.0.1", store.port, is_master=False, timeout=datetime.timedelta(seconds=5))
    client.set("generation", "3")
    assert store.get("generation") == b"3"


def test_a_node_agent_listens_on_loopback_only() -> None:
    agent = NodeAgent("n7", num_devices=1, collective_timeout_s=5.0)
    try:
        addresses = listening()[agent.store.port]
        assert addresses and all(is_loopback(address) for address in addresses)
    finally:
        agent.shutdown()
