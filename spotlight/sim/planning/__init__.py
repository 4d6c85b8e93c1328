"""Pricing a run from a pipeline folder's configs: counted FLOPs, GPU profiles, the iteration's work, the plan."""
