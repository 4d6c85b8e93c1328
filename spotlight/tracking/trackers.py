"""The three experiment trackers behind one small interface, each through its own library's API.

A tracker is opened once per process (`open`), takes an iteration's scalars and a validation's sample
grid keyed by iteration, and the run's final summary. What each needs to continue after ``--resume`` (a
W&B or MLflow run id) comes back from `open` and is kept in ``RUN_DIR/trackers.json`` by `TrackerHub`.

Resume without duplicated or missing steps: a resumed run redoes the iterations after its checkpoint.
TensorBoard rewinds: its writer purges every event from the first redone step on (``purge_step``), so the
redone iterations replace what the stopped run logged. W&B and MLflow runs are append-only, so the hub
skips the steps they already hold (``logged_through``), and the values logged before the stop stand.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from spotlight.tracking.section import LogSection, TrackerName

__all__ = ["EXTRAS", "Tracker", "TrackerStart", "make_tracker", "missing_library"]

# the import each tracker needs, and the extra that installs it
EXTRAS: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"),
}


def missing_library(name: TrackerName) -> str | None:
    """One line naming the fix when ``name``'s library is not installed; None when it is."""
    import importlib.util

    module, extra = EXTRAS[name]
    if importlib.util.find_spec(module) is not None:
        return None
    return (f"log.trackers lists {name}, but the {module} package is not installed: "
            f"pip install 'spotlight-rl[{extra}]', or remove {name} from log.trackers")


@dataclass(frozen=True)
class TrackerStart:
    """What every tracker is opened with."""

    run_dir: Path
    run_name: str
    config: dict[str, Any]  # the resolved config, flattened to dotted keys: the run's hyper-parameters
    config_yaml: str
    provenance: dict[str, str]  # commit, machine, torch, device
    first_step: int  # the first iteration this process logs (0 on a fresh run, the checkpoint's + 1 on resume)
    saved: dict[str, Any] = field(default_factory=dict)  # this tracker's entry in trackers.json (a run id)


class Tracker(Protocol):
    name: str

    def open(self, start: TrackerStart) -> dict[str, Any]: ...
    def scalars(self, step: int, values: dict[str, float]) -> None: ...
    def image(self, step: int, key: str, pixels: np.ndarray, caption: str) -> None: ...
    def finish(self, summary: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


class TensorBoardTracker:
    """One log directory per run; a resumed writer purges the steps the run redoes."""

    name = "tensorboard"

    def __init__(self, section: LogSection) -> None:
        self.section = section.tensorboard
        self.writer: Any = None

    def open(self, start: TrackerStart) -> dict[str, Any]:
        from torch.utils.tensorboard import SummaryWriter

        log_dir = Path(self.section.log_dir) if self.section.log_dir else start.run_dir / "tensorboard"
        # purge_step: events at or past it (the stopped run's iterations after its checkpoint) are dropped
        self.writer = SummaryWriter(str(log_dir), purge_step=start.first_step if start.first_step > 0 else None)
        if start.first_step == 0:
            self.writer.add_text("config", f"```\n{start.config_yaml}\n```", 0)
            self.writer.add_text("provenance", "\n".join(f"{k}: {v}" for k, v in start.provenance.items()), 0)
        return {"log_dir": str(log_dir)}

    def scalars(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)

    def image(self, step: int, key: str, pixels: np.ndarray, caption: str) -> None:
        self.writer.add_image(key, pixels, step, dataformats="HWC")
        self.writer.add_text(f"{key}/caption", caption, step)

    def finish(self, summary: dict[str, Any]) -> None:
        self.writer.add_text("summary", "\n".join(f"{k}: {v}" for k, v in summary.items()))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class WandbTracker:
    """A W&B run, offline unless configured otherwise, resumed by the id kept in the run directory."""

    name = "wandb"

    def __init__(self, section: LogSection) -> None:
        self.section = section.wandb
        self.run: Any = None

    def open(self, start: TrackerStart) -> dict[str, Any]:
        import wandb

        mode = self.section.mode or os.environ.get("WANDB_MODE") or "offline"
        run_id = start.saved.get("run_id") or _new_run_id()
        self.run = wandb.init(
            project=self.section.project, entity=self.section.entity, group=self.section.group,
            tags=list(self.section.tags) or None, name=self.section.name or start.run_name, id=run_id,
            resume="allow", mode=mode, dir=str(start.run_dir), config={**start.config, **start.provenance},
            settings=wandb.Settings(console="off", x_disable_stats=True, silent=True, disable_git=True))
        return {"run_id": self.run.id, "mode": mode}

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def image(self, step: int, key: str, pixels: np.ndarray, caption: str) -> None:
        import wandb

        self.run.log({key: wandb.Image(pixels, caption=caption)}, step=step)

    def finish(self, summary: dict[str, Any]) -> None:
        self.run.summary.update({f"final/{k}": v for k, v in summary.items()})

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()


class MlflowTracker:
    """An MLflow run (SQLite in the run directory unless a tracking URI is set), resumed by its kept run id."""

    name = "mlflow"

    def __init__(self, section: LogSection) -> None:
        self.section = section.mlflow
        self.client: Any = None
        self.run_id: str | None = None

    def open(self, start: TrackerStart) -> dict[str, Any]:
        from mlflow.entities import Param, RunTag
        from mlflow.tracking import MlflowClient

        uri = self.section.tracking_uri or f"sqlite:///{(start.run_dir / 'mlflow.db').resolve()}"
        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(self.section.experiment)
        if experiment is None:  # artifacts beside the store when it is the run directory's own
            location = None if self.section.tracking_uri else (start.run_dir / "mlflow-artifacts").resolve().as_uri()
            experiment_id = self.client.create_experiment(self.section.experiment, artifact_location=location)
        else:
            experiment_id = experiment.experiment_id
        self.run_id = start.saved.get("run_id")
        if self.run_id is None:
            run = self.client.create_run(experiment_id, run_name=self.section.run_name or start.run_name,
                                         tags={f"spotlight.{k}": v for k, v in start.provenance.items()})
            self.run_id = run.info.run_id
            params = [Param(key, str(value)[:6000]) for key, value in start.config.items()]
            for first in range(0, len(params), 100):  # MLflow takes at most 100 params a batch
                self.client.log_batch(self.run_id, params=params[first:first + 100])
            self.client.log_text(self.run_id, start.config_yaml, "config.yaml")
        else:
            self.client.update_run(self.run_id, status="RUNNING")
            self.client.log_batch(self.run_id, tags=[RunTag("spotlight.resumed_at", str(start.first_step))])
        return {"run_id": self.run_id, "tracking_uri": uri}

    def scalars(self, step: int, values: dict[str, float]) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(_mlflow_key(key), value, now, step) for key, value in values.items()]
        for first in range(0, len(metrics), 1000):  # MLflow takes at most 1,000 metrics a batch
            self.client.log_batch(self.run_id, metrics=metrics[first:first + 1000])

    def image(self, step: int, key: str, pixels: np.ndarray, caption: str) -> None:
        self.client.log_image(self.run_id, pixels, artifact_file=f"{key}/iter-{step:05d}.png")
        self.client.log_text(self.run_id, caption, f"{key}/iter-{step:05d}.txt")

    def finish(self, summary: dict[str, Any]) -> None:
        self.client.log_dict(self.run_id, summary, "summary.json")

    def close(self) -> None:
        if self.client is not None and self.run_id is not None:
            self.client.set_terminated(self.run_id)


def _new_run_id() -> str:
    """A W&B run id (8 of ``[a-z0-9]``, as W&B makes them), kept in trackers.json for ``--resume``."""
    import secrets
    import string

    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))


def _mlflow_key(key: str) -> str:
    """MLflow's metric names allow letters, digits and ``_-./ `` only (``util/spot (busy / held)`` passes)."""
    return "".join(c if c.isalnum() or c in "_-./ " else "_" for c in key)


def make_tracker(name: TrackerName, section: LogSection) -> Tracker:
    return {"tensorboard": TensorBoardTracker, "wandb": WandbTracker, "mlflow": MlflowTracker}[name](section)
