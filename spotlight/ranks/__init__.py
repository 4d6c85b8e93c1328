"""Trainer ranks: the update on K devices (`trainer.devices`), data-parallel (DDP) or sharded (FSDP2)."""
