"""A checkpoint's shards may take minutes to write; the ranks' short failure detection must not cut that short.

Two real gloo ranks (processes) write their shards with DCP, rank 1's write slowed past the group's timeout (shrunk
to 1.5 s here, 40 s in a run): inside `checkpoint_io` both finish; after it, a rank late to a collective by as much
still fails the other at once, so a dead rank is still noticed within the short timeout.
"""

from __future__ import annotations

import json
from pathlib import Path

from gloo_ranks import run_ranks

SHORT_S = 1.5  # the group's timeout in this test (COLLECTIVE_TIMEOUT_S)
SLOW_S = 4.0  # how much longer rank 1 takes than rank 0, to write and to reach the next collective


def rank_main(rank: int, address: str, folder: Path, out: Path) -> None:
    import datetime
    import time

    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.distributed_c10d import _set_pg_timeout

    import spotlight.ranks.group as group
    from spotlight.components.sharded_checkpoint import save_shards

    group.join_group("cpu", address, rank, 2)  # (the rendezvous keeps the real timeout: imports are slow here)
    dist.barrier()
    group.COLLECTIVE_TIMEOUT_S = SHORT_S  # the run's short failure detection, shrunk for the test
    _set_pg_timeout(datetime.timedelta(seconds=SHORT_S))
    if rank == 1:  # a large model's shards: this rank's write outlasts the short timeout
        write = FileSystemWriter.write_data

        def slow_write(self, *args, **kwargs):
            time.sleep(SLOW_S)
            return write(self, *args, **kwargs)

        FileSystemWriter.write_data = slow_write
    try:
        with group.checkpoint_io():
            save_shards(folder, {f"rank{rank}": torch.full((4,), float(rank))})
        saved = "saved"
    except Exception as error:  # noqa: BLE001 (what the test reports)
        saved = f"failed: {type(error).__name__}"
    if rank == 1:
        time.sleep(SLOW_S)  # late to the next collective, as a hung rank would be
    started = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1))
        after = "ok"
    except Exception as error:  # noqa: BLE001
        after = f"failed: {type(error).__name__}"
    (out / f"rank-{rank}.json").write_text(json.dumps([saved, after, time.monotonic() - started]))


def test_a_slow_shard_write_outlasts_the_collective_timeout_which_stays_short_after(tmp_path: Path) -> None:
    from spotlight.ranks.group import rendezvous_address

    run_ranks(rank_main, (rendezvous_address("cpu", 2), tmp_path / "ckpt", tmp_path), nprocs=2, timeout_s=240)
    found = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in range(2)]
    assert found[0][0] == found[1][0] == "saved", found  # rank 0 waited SLOW_S for rank 1's shards
    assert (tmp_path / "ckpt" / "dcp" / ".metadata").is_file()
    assert found[0][1].startswith("failed") and found[0][2] < SLOW_S, found  # the short timeout is back
