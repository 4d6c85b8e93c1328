"""Spotlight: RL post-training of Diffusion Transformers on preemptible (spot) accelerators."""

__version__ = "0.1.0"
