"""A CUDA out-of-memory error raised in a Ray actor (a trainer rank, a spot device), handed back as the driver's own.

The driver turns its own ``torch.OutOfMemoryError`` into one line naming the start-up memory estimate and the
knobs that lower it (`spotlight.trainer.train`, `out_of_memory_message`). An actor's reaches the driver as a
``RayTaskError`` whose text is the whole remote traceback; re-raised as a ``torch.OutOfMemoryError`` whose
message names the actor, it ends the run in that same line.
"""

from __future__ import annotations

import re

import torch

__all__ = ["actor_out_of_memory"]


def actor_out_of_memory(error: BaseException, actor: str) -> torch.OutOfMemoryError | None:
    """The out-of-memory error ``actor`` (e.g. "trainer rank 1 of 2") raised, as Ray's ``error`` carries it, with
    its first line prefixed by the actor; None when ``error`` is something else."""
    cause = getattr(error, "cause", None)
    if isinstance(cause, torch.OutOfMemoryError):
        first = (str(cause).strip().splitlines() or ["out of memory"])[0]
        return torch.OutOfMemoryError(f"{actor}: {first}")
    if getattr(error, "actor_init_failed", False):  # Ray keeps only the text of an error in an actor's __init__
        found = _RAISED.search(str(error))
        if found is not None:
            return torch.OutOfMemoryError(f"{actor}: {found.group(1).strip()}")
    return None


# How a traceback's last line names torch's out-of-memory error (``torch.cuda.OutOfMemoryError`` is the same class).
_RAISED = re.compile(r"^\s*torch\.(?:cuda\.)?OutOfMemoryError: (.*)$", re.MULTILINE)
