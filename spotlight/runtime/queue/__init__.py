"""The preemption-aware request queue: in-memory, durable (logged) and Ray-remote, and the rounds it serves."""
