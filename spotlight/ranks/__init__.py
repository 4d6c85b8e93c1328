"""Trainer ranks (`trainer.devices`): K devices that each sample and score their share of the rollout, then train
on it data-parallel (DDP) or sharded (FSDP2); where they run and how they talk (`placement`)."""
