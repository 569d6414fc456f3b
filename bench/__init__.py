"""Benchmarks of the exporter on a simulated full node: ``python -m bench.run`` (``make bench``), see docs/benchmarks.md."""
