"""Benchmarks, tuning sweep and sanitizer driver for the kernels (run on a GPU; see reports/kernels)."""
