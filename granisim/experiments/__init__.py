"""What users run on top of the serving core: one scenario, policy comparisons, sweeps, capacity
searches, the paper's claims, benchmarks, the allocator fuzzer, and the plots."""
