"""Elastic sequence parallelism: SP groups of spot devices, Ulysses attention, re-forming after a preemption."""
