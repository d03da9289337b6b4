"""Benchmark scripts and their shared helpers; run from the repository root with ``PYTHONPATH=.``."""
