"""Real training processes for the end-to-end tests of tests/e2e/test_real_jobs.py, run as ``python -m
tests.support.realjobs.<job>``: tiny GPT-2-shaped models on the CPU, synthetic data, each framework's own logging.
Nothing here imports the exporter: the daemon reads these jobs from what they write, as it would a user's."""
