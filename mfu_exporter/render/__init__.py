"""Snapshots and the job model to metric families, and families to cached exposition bodies."""
