"""GraniKV GPU backend: Triton attention kernels and (later) the real engine.

Imports torch and triton; the simulator (`granisim`) never imports this package.
"""
