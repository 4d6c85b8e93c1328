"""Spot devices and their cluster: pools, device processes and workers, preemption sources and watchers, usage."""
