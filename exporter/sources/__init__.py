"""Node sources: each samples one subsystem into a snapshot. None of them knows about HTTP."""
