"""Readers of this machine (sysfs, procfs, ioctls, files): they return dataclasses and know nothing of Prometheus or the config."""
