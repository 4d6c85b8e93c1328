"""Fixtures shared by the runtime tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from spotlight.runtime.sp.agent import NodeAgent


@pytest.fixture(scope="module")
def agent() -> Iterator[NodeAgent]:
    """One node agent with 2 device processes and a warm spare, for the tests of one module."""
    node_agent = NodeAgent("n0", num_devices=2, num_spares=1, collective_timeout_s=20.0)
    try:
        yield node_agent
    finally:
        node_agent.shutdown()
