"""The error that ends a run for a reason a person can fix (the loop's and its backends')."""

from __future__ import annotations

__all__ = ["RunError"]


class RunError(RuntimeError):
    """The run cannot go on; the message is one line naming the cause and the fix."""
