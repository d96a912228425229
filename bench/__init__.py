"""Benchmarks (not shipped): ``python3 -m bench.latency``, ``python bench/estimators.py``."""
