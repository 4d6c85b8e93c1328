"""A request cancelled while still pending, then forgotten by compaction, leaves no place in line (issue 43).

The default run crashed at its checkpoint after iteration 20 (`KeyError: 'x20-0-42'` in `RequestQueue.pull`):
a round closing without waiting for its topped-up block cancels the block's pending requests, the
checkpoint's compaction (`forget_settled`) dropped their entries, and their ids were still queued for the
next pull. A timed-out round's cancelled requests did the same, less often.
"""

from __future__ import annotations

from spotlight.diffusion.sampler import SamplingPlan
from spotlight.runtime.queue.request_queue import Request, RequestQueue


def test_a_cancelled_pending_request_forgotten_by_compaction_is_never_pulled() -> None:
    queue = RequestQueue(lease_timeout_s=10.0)
    plan = SamplingPlan(num_steps=2)
    queue.submit([Request(f"x1-0-{c}", "a red circle", c, plan, weights_version=1) for c in range(3)])
    assert queue.cancel(["x1-0-1", "x1-0-2"]) == 2  # pending, never leased
    assert queue.forget_settled() == 2
    queue.submit([Request("x2-0-0", "a red circle", 7, plan, weights_version=2)])
    leases = queue.pull("spot-0", 4, weights_version=1)
    assert [lease.request.request_id for lease in leases] == ["x1-0-0"]
    assert [lease.request.request_id for lease in queue.pull("spot-1", 4, weights_version=2)] == ["x2-0-0"]
