"""Kernel benchmarks and GPU checks: ``python -m benchmarks.kernels.<name>`` from the repository root."""
