"""The reward server's supervisor: a SIGKILLed server is back at the same address, and a client rides it out."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch

from spotlight.rewards.server.client import HTTPReward
from spotlight.rewards.server.supervisor import RewardSupervisor, SupervisorError, free_port


def test_a_killed_reward_server_is_restarted_at_its_address_and_scoring_goes_on(tmp_path: Path) -> None:
    supervisor = RewardSupervisor("shapes", free_port(), log_path=tmp_path / "reward.log")
    try:
        reward = HTTPReward(supervisor.url, timeout_s=10.0, retries=60, backoff_s=0.25)
        images, prompts = torch.rand(2, 3, 32, 32), ["a red circle", "a blue square"]
        before = reward.score(images, prompts)
        first = supervisor.pid()
        os.kill(first, signal.SIGKILL)
        after = reward.score(images, prompts)  # retried until the restarted server answers
        assert supervisor.restarts == 1 and supervisor.pid() != first
        assert torch.equal(before.rewards, after.rewards)
    finally:
        supervisor.close()


def test_a_supervisor_needs_a_fixed_port() -> None:
    with pytest.raises(SupervisorError, match="fixed port"):
        RewardSupervisor("shapes", 0)
