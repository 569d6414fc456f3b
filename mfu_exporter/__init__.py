"""mfu-exporter: a Prometheus exporter and live MFU monitor for LLM training nodes.

This file and ``mfu_exporter.client`` are the client distribution (``mfu-exporter-client``, clients/python): a
training process installs only them. Standard library only, and nothing imported here.
"""

__version__ = "0.1.0"

# The header the daemon's ingest answers carry its version in; the client compares it with its own __version__.
VERSION_HEADER = "MFU-Exporter-Version"
