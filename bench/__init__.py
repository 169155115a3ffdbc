"""Benchmarks (see runtime_bench.py)."""
