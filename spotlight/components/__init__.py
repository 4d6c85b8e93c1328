"""The run's parts that the loop composes: checkpoints, manifest, guard, run directory, run log, progress line."""
