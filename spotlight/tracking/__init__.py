"""Experiment trackers (TensorBoard, W&B, MLflow): the run's metrics where a team already watches runs."""

from spotlight.tracking.hub import TrackerHub, check_trackers
from spotlight.tracking.section import LogSection

__all__ = ["LogSection", "TrackerHub", "check_trackers"]
