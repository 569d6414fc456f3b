"""The fabric and GPU checks a node runs before a job, shared by ``mfu-exporter check`` and the preflight source."""
