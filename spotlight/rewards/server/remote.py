"""`reward.name: http`: the hardened HTTP client, after checking at start-up that its server answers.

A reward URL that is wrong or whose server is down would otherwise surface as every sample of the
first rollout marked invalid after the client's retries; checking /health once at start-up turns it
into one line before any GPU time is spent.
"""

from __future__ import annotations

import json

from spotlight.http_fetch import FetchError, fetch
from spotlight.rewards.base import RewardError
from spotlight.rewards.server.client import HTTPReward

HEALTH_DEADLINE_S = 10.0


def connect_http_reward(url: str, deadline_s: float, retries: int) -> HTTPReward:
    """An HTTPReward for the `spotlight serve-reward` at `url`; RewardError in one line if it does not answer."""
    url = url.rstrip("/")
    fix = "start `spotlight serve-reward -c <config> --port <port>` there, or fix reward.url"
    try:
        response = fetch(f"{url}/health", deadline_s=min(deadline_s, HEALTH_DEADLINE_S), max_body_bytes=4096)
    except FetchError as error:
        raise RewardError(f"reward.url {url} is unreachable at start-up ({error}); {fix}") from None
    if response.status != 200:
        raise RewardError(f"reward.url {url}/health answered HTTP {response.status}; {fix}")
    try:
        served = str(json.loads(response.body).get("reward", "?"))
    except (ValueError, AttributeError):
        raise RewardError(f"reward.url {url}/health is not a spotlight reward server; {fix}") from None
    return HTTPReward(url, name=f"http[{served}]", timeout_s=deadline_s, retries=retries)
