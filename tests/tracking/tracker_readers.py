"""Reading back what each tracker wrote, through each library's own reader (tests only).

TensorBoard: `EventAccumulator`. MLflow: `MlflowClient`. W&B keeps an offline run in a ``.wandb`` file: a
LevelDB-style log of W&B's own protobuf `Record`s (wandb 0.31 ships no Python reader for it); `wandb_records`
walks the log's blocks and parses each record with ``wandb.proto``.
"""

from __future__ import annotations

import json
import struct
from collections import Counter
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = 7  # ":W&B", a 2-byte magic, a version byte
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def wandb_records(path: Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    records, position, pending = [], HEADER, b""
    while position + 7 <= len(data):
        if BLOCK - position % BLOCK < 7:  # a block's tail too short for a header is padding
            position += BLOCK - position % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[position:position + 7])
        position += 7
        if kind == 0 and length == 0:
            position += BLOCK - position % BLOCK
            continue
        pending += data[position:position + length]
        position += length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_run(run_dir: Path) -> dict[str, Any]:
    """Every offline W&B run under ``run_dir``: their ids, the steps each history key was logged at (all
    files together, so a resumed run's second file counts), its config and the image captions."""
    files = sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    ids, steps, config, captions = set(), Counter(), {}, []
    for path in files:
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                ids.add(record.run.run_id)
                config.update({item.key: json.loads(item.value_json) for item in record.run.config.update})
            elif kind == "history":
                items = {item.key or "/".join(item.nested_key): item.value_json for item in record.history.item}
                step = int(items["_step"])
                for key, value in items.items():
                    if not key.startswith("_"):
                        steps[(key, step)] += 1
                    if key.endswith("/caption"):
                        captions.append(json.loads(value))
    return {"files": files, "ids": ids, "steps": steps, "config": config, "captions": captions}


def tensorboard_run(log_dir: Path) -> Any:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    accumulator.Reload()
    return accumulator


def mlflow_client(run_dir: Path) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{(run_dir / 'mlflow.db').resolve()}")
