"""Snapshots and the job model to metric families, published as immutable fragments, and fragments to /metrics."""
