"""mfu-exporter: a Prometheus exporter and live MFU monitor for LLM training nodes."""

__version__ = "0.1.0"
