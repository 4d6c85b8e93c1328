"""The HTTP reward server, its client and wire format, and the supervisor that keeps it alive."""
