"""Triton kernels; each module holds one private `_kernel` (or two) and its launcher."""
