"""Where an iteration's sampling runs: in this process, or on the Ray device pools (see `protocol`)."""

from __future__ import annotations

from spotlight.backends.local import LocalBackend
from spotlight.backends.protocol import Backend, TrainerView
from spotlight.config import TrainConfig
from spotlight.run_error import RunError

__all__ = ["Backend", "TrainerView", "check_backend", "open_backend"]


def check_backend(config: TrainConfig, resume: bool) -> None:
    """Refuse, before anything is loaded or started, what the config's backend cannot run."""
    if not config.uses_ray:
        return
    if config.mode.single_process_only:
        raise RunError(f"mode {config.mode} runs in one process only: set runtime.use_ray=false, or use mode "
                       "spotlight (stale exploration hidden behind training on spot devices)")


def open_backend(view: TrainerView) -> Backend:
    """The config's backend: disaggregated generators or the Ray pools (started now), or this process."""
    if view.config.mode.streams_groups:
        from spotlight.backends.disaggregated import DisaggregatedBackend  # generators apart from the trainer

        return DisaggregatedBackend(view)
    if view.config.uses_ray:
        from spotlight.backends.ray import RayBackend  # Ray is imported only by runs that use it

        return RayBackend(view)
    return LocalBackend(view)
