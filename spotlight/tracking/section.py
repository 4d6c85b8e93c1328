"""`log`: where a run's metrics go besides ``metrics.jsonl`` (always written): experiment trackers.

Each tracker is the real library, an optional extra (``pip install 'spotlight-rl[wandb]'``): TensorBoard
(`torch.utils.tensorboard`), Weights & Biases, MLflow. Only the driver (rank 0) logs, keyed by iteration.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from spotlight.schema import Section

TrackerName = Literal["tensorboard", "wandb", "mlflow"]


class WandbSection(Section):
    """W&B's run: offline unless ``mode`` (or the user's ``WANDB_MODE``) says otherwise; its id is kept in the run
    directory (``trackers.json``), so ``--resume`` continues the same W&B run."""

    project: str = "spotlight"
    entity: str | None = None
    group: str | None = None
    tags: list[str] = Field(default_factory=list)
    name: str | None = None  # null: the run directory's name
    # null: WANDB_MODE if the user set it, else offline (a run never needs a network or an account to start)
    mode: Literal["online", "offline", "disabled"] | None = None


class MlflowSection(Section):
    """MLflow's run: a tracking URI (null: a SQLite store in the run directory, which needs no server; MLflow's
    ``file:`` store is in maintenance mode) and an experiment; the run id is kept for ``--resume``."""

    tracking_uri: str | None = None
    experiment: str = "spotlight"
    run_name: str | None = None  # null: the run directory's name


class TensorBoardSection(Section):
    """TensorBoard's log directory (null: ``RUN_DIR/tensorboard``); ``--resume`` purges the steps it redoes."""

    log_dir: str | None = None


class LogSection(Section):
    """Experiment trackers a run logs to, besides metrics.jsonl: any of tensorboard, wandb, mlflow."""

    trackers: list[TrackerName] = Field(default_factory=list)
    # a validation's sample grid goes to the trackers with its prompts and rewards as captions
    images: bool = True
    wandb: WandbSection = WandbSection()
    mlflow: MlflowSection = MlflowSection()
    tensorboard: TensorBoardSection = TensorBoardSection()
